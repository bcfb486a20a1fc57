"""prefetch.keras.dataset(loader): a Loader as a `keras.utils.PyDataset`, for any Keras backend.

Keras 3 takes a PyDataset under every backend (TensorFlow, PyTorch, JAX) and imports no other
framework for it, so this module imports Keras only. Contract:

- `__getitem__` ignores its index and returns the next batch of the loader's running epoch,
  in the loader's order (Keras asks for indices in a shuffled order under `fit`'s default
  `shuffle=True`; the loader shuffles itself, by `(seed, epoch)`). When that epoch is done the
  next `__getitem__` begins the loader's next epoch, so a Keras epoch shorter than the loader's
  (`steps_per_epoch`) goes on where the previous one stopped, as Keras does with a tf.data
  iterator. `num_batches` is `len(loader)`.
- Keras's adapter calls `on_epoch_begin` and `on_epoch_end` around each epoch it runs. When
  Keras drops an iterator mid-epoch (`EpochIterator.reset`, as the next `fit` or `evaluate`
  starts after a callback stopped training; also a second `on_epoch_begin` without an
  `on_epoch_end`), the dropped epoch's stream is closed and the next batch begins the loader's
  next epoch, as a new iterator of `prefetch.tf.dataset` does; the loader's `state_dict()`
  keeps where the dropped one stopped.
- Outside an epoch, `__getitem__` answers with zero batches of the loader's shapes and dtypes:
  the TensorFlow backend asks for two batches to learn the tensor spec before any epoch begins,
  and must not take them from the loader. Their batch sizes differ unless every batch of the
  loader is full, so the spec's batch dimension is left open for a short last batch.
- Before its first epoch, `fit` and `evaluate` take one batch to build the model, then drop
  their iterator (`EpochIterator.reset`, which calls `on_epoch_end`): a batch taken so is
  handed out again as the first of the next epoch, so no batch is lost to that look.
- An error raised by the loader is recorded on its Coordinator before it propagates, so that
  `with loader:` re-raises the original when TensorFlow has wrapped it in its own type.
- `state_dict()` is the loader's state naming the first batch not handed to Keras (a batch
  taken for the model's build, to be handed again, is not counted; `prefetch.plan.Handoff`).
  Keras's own input pipeline may read ahead of its steps: under the TensorFlow backend a
  `prefetch(AUTOTUNE)` buffer, under JAX on an accelerator one batch; what it holds counts as
  handed. Under torch, and JAX on the CPU, it reads none ahead.
- In a multi-process JAX job (`jax.distributed.initialize()`, Keras's `keras.distribution`
  across hosts) the loader is sharded by process (`jax.process_index()` of
  `jax.process_count()`, `Loader.shard`) when the dataset is made, as `prefetch.torch` shards
  by `torch.distributed` rank, so every process feeds its own share of each epoch, with the
  same number of batches (`jax_processes`).
"""

from __future__ import annotations

import sys
from typing import Any

import keras
import numpy as np

from prefetch.plan import Handoff
from prefetch.runtime import Loader
from prefetch.sources import is_file_source, label_spec


class LoaderPyDataset(keras.utils.PyDataset):  # type: ignore[misc]
    """A `Loader` as a `keras.utils.PyDataset`: `model.fit(prefetch.keras.dataset(loader))`.

    Made by `prefetch.keras.dataset`. Each Keras epoch reads the loader's next epoch in order;
    `len()` and `num_batches` are the loader's batches per epoch. Batches are numpy
    `(images, labels)` as the loader gives them (uint8 NHWC images), or the images alone with
    `label_mode=None`. Like Keras's `image_dataset_from_directory` datasets it has
    `class_names` and `file_paths` (see `prefetch.tf.dataset`). `distributed`: as
    `prefetch.keras.dataset` takes it (sharding by JAX process).
    """

    def __init__(self, loader: Loader, distributed: bool | None = None) -> None:
        # One worker and no multiprocessing: Keras then calls __getitem__ in its own loop, in
        # order; the loader's workers do the decoding.
        super().__init__(workers=1, use_multiprocessing=False)
        if not isinstance(loader, Loader):
            raise TypeError(
                f"prefetch.keras.dataset reads a prefetch.Loader, got {type(loader).__name__}"
            )
        self.loader = loader
        _shard_by_process(loader, distributed)
        self.class_names: list[str] | None = list(loader.class_names) or None
        self.file_paths: list[str] | None = (
            loader.source.paths.tolist() if is_file_source(loader.source) else None
        )
        self._stream: Any = None
        self._in_epoch = False
        self._taken = 0  # batches handed out in this Keras epoch
        self._first: Any = None  # the first of them
        self._looked = False  # whether Keras took that first one to build the model
        self._again: Any = None  # such a batch, to hand out again
        self._handoff = Handoff(loader.state_dict)  # the first batch not handed to Keras
        self._run = 0  # the handoff's run of `_stream`

    @property
    def num_batches(self) -> int:
        """The loader's batches per epoch."""
        return len(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, int]:
        """The loader's `state_dict()`, naming the first batch not handed to Keras (see
        `prefetch.keras.dataset` for Keras's own read-ahead)."""
        return self._handoff.state()

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The loader's `load_state_dict(state)`: its next epoch resumes there."""
        self.loader.load_state_dict(state)
        self._handoff.begin()  # what the last epoch handed out is no longer the state

    def on_epoch_begin(self) -> None:
        """Called by Keras as an epoch begins."""
        if self._in_epoch:  # the previous iteration was abandoned mid-epoch
            self._end_stream()
        self._in_epoch = True
        self._taken = 0

    def on_epoch_end(self) -> None:
        """Called by Keras as an epoch ends: a stream that delivered its epoch is closed."""
        dropped = self._in_epoch and _called_from_keras("reset", 4)
        first, self._first, self._in_epoch = self._first, None, False
        if dropped and self._taken == 1 and self._looked:  # Keras built the model from it
            again = tuple(np.copy(part) for part in first)
            self._again = again if self.loader.options.label_mode is not None else again[0]
            self._handoff.given_back()
            return
        stream = self._stream
        if stream is not None and stream.epoch is not None and stream.position >= len(self):
            next(stream, None)  # ends the delivered epoch as plain iteration does (its stats)
            self._stream = None
            self._handoff.end(self._run)
        elif dropped:  # Keras dropped its iterator mid-epoch: a new one starts the next epoch
            self._end_stream()

    def _end_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
            self._handoff.end(self._run)

    def __getitem__(self, index: int) -> Any:
        """The next batch of the loader's running epoch (the index is not used)."""
        if not self._in_epoch:
            return self._spec_batch(index)
        self._taken += 1
        if self._taken == 1:
            self._looked = _called_from_keras("_symbolic_build", 16)
        if self._again is not None:
            again, self._again = self._again, None
            self._handoff.handed()
            return again
        try:
            batch = self._next_batch()
        except Exception as error:
            self._stream = None
            self._handoff.end(self._run)
            self.loader.record_undelivered_error(error)
            raise
        self._handoff.handed()
        if self._looked and self._taken == 1:  # kept only while Keras builds the model
            self._first = batch if self.loader.options.label_mode is not None else (batch.images,)
        return tuple(batch) if self.loader.options.label_mode is not None else batch.images

    def _next_batch(self) -> Any:
        """The next batch of the running stream, or the first of a new one if it has ended."""
        if self._stream is not None:
            self._handoff.asking(self._run)
            batch = next(self._stream, None)
            if batch is not None:
                return batch
            self._handoff.end(self._run)
        self._stream = iter(self.loader)
        self._run = self._handoff.begin()
        self._handoff.asking(self._run)
        return next(self._stream)

    def _spec_batch(self, index: int) -> Any:
        """Zeros of the loader's shapes and dtypes, for Keras's look at the tensor spec."""
        loader = self.loader
        full = loader.options.drop_remainder and loader.options.on_error.action == "raise"
        if full:
            size = loader.options.batch_size
        elif index == 0:  # the first batch as it will be (a single batch may be short)
            size = len(loader.batch_indices(loader.epoch)[0])
        else:
            size = max(1, loader.options.batch_size - 1)
        images = np.zeros((size, *loader.image_shape), np.uint8)
        spec = label_spec(loader.options.label_mode, len(loader.class_names))
        if spec is None:
            return images
        tail, dtype = spec
        return images, np.zeros((size, *tail), dtype)


def jax_processes() -> tuple[int, int] | None:
    """`(jax.process_count(), jax.process_index())` in a multi-process JAX job, else None.

    A job is multi-process when `jax.distributed` is initialised
    (`jax.distributed.is_initialized()`, JAX 0.5.1 on) or, under Keras's JAX backend, when
    `jax.process_count()` is above 1 (an older JAX, or a TPU pod that initialised itself).
    JAX is never imported here (a process that has not imported it runs no JAX job), and
    `process_count` is asked only in those two cases: it starts JAX's backend, which takes
    accelerator memory, in a process that may use JAX for something else. What JAX returns is
    checked: ValueError naming it unless the count is an int >= 1 and the index an int below
    it.
    """
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    initialized = getattr(getattr(jax, "distributed", None), "is_initialized", None)
    if not (callable(initialized) and initialized()) and keras.backend.backend() != "jax":
        return None
    count = _asked(jax, "process_count", 1, None)
    return (count, _asked(jax, "process_index", 0, count)) if count > 1 else None


def _asked(jax: Any, function: str, least: int, bound: int | None) -> int:
    """`jax.<function>()`, checked: an int >= `least` (and below `bound`), else ValueError
    naming what JAX returned (a count taken as it comes would shard by a wrong one)."""
    value = getattr(jax, function)()
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not integral or value < least or (bound is not None and value >= bound):
        wanted = f"an int >= {least}" if bound is None else f"an int in [0, {bound})"
        raise ValueError(
            f"jax.{function}() returned {value!r}, not {wanted}: prefetch.keras.dataset shards "
            "the loader by JAX process with it. Check the JAX installation and "
            "jax.distributed.initialize(), or pass distributed=False (then shard yourself "
            "with loader.shard(num_shards, shard_index))"
        )
    return int(value)


def _shard_by_process(loader: Loader, distributed: bool | None) -> None:
    """Shard `loader` by JAX process as `distributed` asks (see `dataset`)."""
    if distributed is False:
        return
    processes = jax_processes()
    if processes is None:
        if distributed:
            raise RuntimeError(
                "distributed=True needs a multi-process JAX job: call "
                "jax.distributed.initialize() first (or pass distributed=None to shard only in "
                "one). Keras shards by process only on JAX; under torch.distributed use "
                "prefetch.torch.DeviceLoader, under tf.distribute "
                "prefetch.tf.dataset(loader, input_context=...)"
            )
        return
    loader.shard(*processes)


def _called_from_keras(function: str, depth: int) -> bool:
    """Whether Keras's `function` is among our caller's `depth` nearest callers."""
    frame: Any = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == function and "keras" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def dataset(loader: Loader, *, distributed: bool | None = None) -> LoaderPyDataset:
    """The loader as a `keras.utils.PyDataset` that `fit`, `evaluate` and `predict` take under
    every Keras backend (TensorFlow, PyTorch, JAX), without importing TensorFlow for the others.

    Each Keras epoch reads the loader's next epoch in order; `validation_data=` takes a second
    one, of another loader. `steps_per_epoch` shorter than the loader's epoch continues it in
    the next Keras epoch. Use `with loader:` around training: it keeps the workers across
    epochs and re-raises a worker's error with its original type where TensorFlow wrapped it.

    Parameters:

    - `loader`: the `Loader` whose epochs the dataset yields. Keep one dataset per loader.
    - `distributed`: shard the loader by JAX process: `None` (the default) does in a
      multi-process JAX job (`jax_processes`: `jax.distributed.initialize()` was called),
      `True` requires one, `False` never. Each process then yields its own share of every
      epoch, `len(loader)` batches on every process (`Loader.shard`): the loader's
      `batch_size` is the batch of one process; give every process the same `seed`. Keras's
      distribution must not shard it again: `keras.distribution.DataParallel(
      auto_shard_dataset=False)` (Keras 3.15 refuses any dataset but a `tf.data.Dataset`
      across processes otherwise), and every process must start from the same weights
      (`keras.utils.set_random_seed` before the model is built), as docs/many-gpus.md shows.

    To resume mid-epoch, restore the loader (`loader.load_state_dict(state)`), finish its epoch
    with `fit(ds, steps_per_epoch=len(loader) - loader.state_dict()["position"],
    epochs=state["epoch"] + 1, initial_epoch=state["epoch"])`, then go on with a plain
    `fit(ds, initial_epoch=...)`.
    """
    return LoaderPyDataset(loader, distributed)
