"""prefetch.tf.dataset(loader): a Loader as a tf.data.Dataset of (images, labels).

Each iteration of the dataset is a new epoch of the loader, so `model.fit(ds, epochs=N)` works.
The loader already runs ahead of the consumer, so tf.data's autotuning is off and only a
one-batch prefetch is added, which moves the numpy-to-tensor handoff off the training step.
With `device`, the pipeline ends with `prefetch_to_device`, so the next batch is copied to that
device while the current one trains. With `input_context` (tf.distribute), the loader is
re-sharded so that each input pipeline reads its own disjoint part of every epoch.

TensorFlow wraps Python errors raised in a generator in its own error types; the original is
recorded on the loader and re-raised when `with loader:` exits (or by `loader.close()`).
The dataset does not own the loader. Like Keras's datasets, it carries `class_names` and
`file_paths` (None where the loader has none), and `state_dict()`: the loader's state naming
the first batch the dataset's consumer has not been handed (`prefetch.plan.Handoff`). The
loader's own state counts the batch in the `prefetch(1)` buffer; a map stage after that buffer
counts each element as the consumer takes it (a `py_function`, run in the consumer's own call
for the element, in order).

TensorFlow calls the generator from its own threads (a py_func, in the `prefetch(1)` thread here
or in any asynchronous stage added after it), and after delivering an error it still calls it
twice (the next element, then the finalizer). Once the interpreter starts to finalize, CPython
ends any thread that waits for the GIL: a py_func caught there never returns, and the iterator's
destructor, run by the interpreter's last garbage collection, waits for it forever. So an
`atexit` hook, which runs while other threads may still take the GIL, ends every epoch tf.data
runs and waits (within one deadline) until no TensorFlow thread is inside one or still owes one
a call.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import platform
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import tensorflow as tf

from prefetch._messages import suggest_keywords
from prefetch.coordinator import Deadline
from prefetch.errors import add_note
from prefetch.plan import Handoff
from prefetch.runtime import Loader
from prefetch.sources import is_file_source, label_spec
from prefetch.tf._device import check_device

log = logging.getLogger(__name__)

# glibc's own ceiling for its dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX),
# and the trim threshold it pairs with it (twice the mmap threshold).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# At interpreter exit, how long to wait for TensorFlow's threads to finish with the loaders.
EXIT_QUIESCE_S = 5.0
_EXIT_POLL_S = 0.005


class _EpochRun:
    """One tf.data iterator's pass over a loader epoch, called from TensorFlow's threads.

    `busy` while a TensorFlow thread is inside `__next__`; `ended` once it raised (an error, or
    StopIteration), after which TensorFlow still makes its closing calls.
    """

    def __init__(self, epoch: Generator[Any, None, None], loader: Loader) -> None:
        self._epoch = epoch
        self._loader = loader
        self._lock = threading.Lock()
        self.ended = False

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def __iter__(self) -> _EpochRun:
        return self

    def __next__(self) -> Any:
        with self._lock:
            if _EXITING.is_set():
                self._epoch.close()
                self.ended = True
                raise StopIteration
            try:
                return next(self._epoch)
            except BaseException:
                self.ended = True
                raise

    def end_at_exit(self) -> None:
        """End the loader epoch while its workers still run; wake a TensorFlow thread inside."""
        if self._lock.acquire(blocking=False):
            try:
                self._epoch.close()
            finally:
                self._lock.release()
        else:
            self._loader.coordinator.request_stop()


def _handed_to_tensorflow(run: _EpochRun) -> Iterator[Any]:
    """What TensorFlow holds for one iterator and drops when it has finalized it.

    A generator, so that it is freed then even while a kept error's traceback holds `run`.
    """
    yield from run


# The runs TensorFlow has not finalized yet, keyed by what it holds.
_RUNS: weakref.WeakKeyDictionary[Iterator[Any], _EpochRun] = weakref.WeakKeyDictionary()
_EXITING = threading.Event()


def _start_run(epoch: Generator[Any, None, None], loader: Loader) -> Iterator[Any]:
    run = _EpochRun(epoch, loader)
    handed = _handed_to_tensorflow(run)
    _RUNS[handed] = run
    return handed


def _quiesce_at_exit() -> None:
    """End the epochs tf.data runs; wait until no TensorFlow thread is in or owes one a call."""
    _EXITING.set()
    for run in list(_RUNS.values()):
        run.end_at_exit()
    deadline = Deadline(EXIT_QUIESCE_S)
    while True:
        time.sleep(_EXIT_POLL_S)  # lets a TensorFlow thread that waits for the GIL take it
        owing = [run for run in list(_RUNS.values()) if run.busy or run.ended]
        if not owing or deadline.expired():
            break
    if owing:
        log.warning("prefetch: %d tf.data iterators still owed calls at exit", len(owing))


atexit.register(_quiesce_at_exit)


def restore_malloc_thresholds() -> bool:
    """Undo TensorFlow's process-wide `M_TRIM_THRESHOLD=128 kb` malloc patch (glibc only).

    A running `from_generator` dataset sets glibc's trim threshold to 128 KiB, which also pins
    the mmap threshold at 128 KiB: every later image-sized malloc becomes mmap + munmap with
    fresh page faults, and Pillow decode in threads slows by about a quarter. This sets the
    thresholds to where glibc's dynamic tuning would have taken them (32 MiB mmap, 64 MiB trim).
    Returns True if it applied them.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied &= libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return bool(applied)


def output_signature(loader: Loader) -> Any:
    """The `tf.TensorSpec` structure of the loader's batches: `(images, labels)`, or the
    images alone with `label_mode=None`; the batch dimension is fixed only when every batch
    is full (`drop_remainder=True` and `on_error="raise"`).

    Parameters:

    - `loader`: the `Loader` whose batches are described.
    """
    height, width, channels = loader.image_shape
    fixed = loader.options.drop_remainder and loader.options.on_error.action == "raise"
    batch = loader.options.batch_size if fixed else None
    images = tf.TensorSpec((batch, height, width, channels), tf.uint8, name="images")
    spec = label_spec(loader.options.label_mode, len(loader.class_names))
    if spec is None:
        return images
    tail, dtype = spec
    labels = tf.TensorSpec((batch, *tail), tf.as_dtype(dtype), name="labels")
    return (images, labels)


@suggest_keywords
def dataset(
    loader: Loader,
    *,
    device: str | None = None,
    input_context: tf.distribute.InputContext | None = None,
    malloc_fix: bool = True,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of the loader's batches, with a static `output_signature`.

    Each iteration runs one epoch of `loader`; elements are `(images, labels)`, or the images
    alone with `label_mode=None` (as Keras's). When the loader raises on every bad file
    (`on_error="raise"`), starts at an epoch's beginning and no `device` is given, the dataset
    knows its length, so Keras shows epoch progress. The dataset does not own the loader: use
    `with loader:` around training, which also re-raises a worker error that TensorFlow
    wrapped as the original.

    Parameters:

    - `loader`: the `Loader` whose epochs the dataset yields.
    - `device`: a device name such as `"/gpu:0"` (a CPU device is accepted too): the pipeline
      ends with `tf.data.experimental.prefetch_to_device(device, 1)`, so the next batch is
      copied to the device while the current one trains. `None`: batches stay in host memory.
    - `input_context`: the `tf.distribute.InputContext` that
      `strategy.distribute_datasets_from_function` passes to your dataset function: the
      loader is re-sharded with `loader.shard` to shard `input_pipeline_id` of
      `num_input_pipelines`, and its `batch_size` is the per-replica batch. Not with `device`
      (the strategy places the batches itself).
    - `malloc_fix`: apply `restore_malloc_thresholds()` as each epoch starts (after
      TensorFlow has applied its malloc patch).

    `ds.state_dict()` is the loader's `state_dict()` naming the first batch this dataset has
    not handed to its consumer (a loop over it, or Keras's `fit`), however that consumer
    stopped (a `break`, an exception, a callback that stops `fit`): the batch waiting in the
    dataset's buffer is not counted, as `loader.state_dict()` counts it. Save it to resume
    (`loader.load_state_dict(state)` before making the dataset). What reads ahead of the
    consumer outside the dataset is counted as handed: stages you add that read ahead
    (`prefetch`, a parallel `map`) and a `tf.distribute` strategy's own input pipeline. With
    `device`, one batch waits in the device's buffer out of the dataset's sight: the state then
    names the first batch not handed or the one before it (never a later one), so a resume
    reads at most that one batch again, and loses none.

    The dataset has two more attributes, as Keras's `image_dataset_from_directory` gives them:

    - `class_names`: the loader's class names (a list of str), or None when its source has
      none.
    - `file_paths`: the loader's files as a list of str, for a file source (an
      `ImageFolder` or `FileList`; None for other sources): `file_paths[i]` is the file of
      source index `i`, so `loader.batch_indices(epoch)` gives, for each batch, the indices
      into `file_paths` of its samples. With `shuffle=False` (and one shard) the batches
      take the files in this order; with shuffling, as in Keras, each epoch takes them in an
      order of its own, not this one. It lists the whole source, also when the loader yields
      one shard of it. With `validation_split`, it is the files of the loader's subset, equal
      to Keras's `file_paths` for the same split and seed.
    """
    if device is not None and input_context is not None:
        raise ValueError(
            "pass device or input_context, not both: under tf.distribute the strategy copies "
            "each replica's batches to its device itself (tf.distribute.InputOptions("
            "experimental_fetch_to_device=True), the default); leave device=None"
        )
    if device is not None:
        check_device(device)
    if input_context is not None:
        _apply_input_context(loader, input_context)
    shard = (loader.options.num_shards, loader.options.shard_index)
    # A batch in prefetch_to_device's buffer is counted as handed as it leaves for it.
    handoff = Handoff(loader.state_dict, lag=0 if device is None else 1)

    def batches() -> Generator[Any, None, None]:
        run, stream = handoff.begin(), iter(loader)
        try:
            if (loader.options.num_shards, loader.options.shard_index) != shard:
                raise RuntimeError(
                    f"this dataset was made for shard {shard[1]} of {shard[0]}, but the loader "
                    f"was re-sharded to shard {loader.options.shard_index} of "
                    f"{loader.options.num_shards} since; "
                    "use one Loader per input pipeline"
                )
            if malloc_fix:
                restore_malloc_thresholds()
            while True:
                handoff.asking(run)
                batch = next(stream, None)
                if batch is None:
                    return
                yield tuple(batch) if loader.options.label_mode is not None else batch.images
        except Exception as error:
            loader.record_undelivered_error(error)
            raise
        finally:
            stream.close()
            handoff.end(run)

    ds = tf.data.Dataset.from_generator(
        lambda: _start_run(batches(), loader), output_signature=output_signature(loader)
    )
    # Every epoch has len(loader) batches, except one resumed mid-way (load_state_dict).
    if loader.options.on_error.action == "raise" and loader.state_dict()["position"] == 0:
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(loader)))
    ds = ds.prefetch(1).map(_counting(handoff.handed))
    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = 1
    options.experimental_optimization.inject_prefetch = False
    ds = ds.with_options(options)
    if device is not None:
        # Last, as TensorFlow requires. It copies elements with a remote call into the pipeline
        # above, whose iterator is finalized with the options set here.
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device, buffer_size=1))
    ds.class_names = list(loader.class_names) or None
    ds.file_paths = loader.source.paths.tolist() if is_file_source(loader.source) else None
    ds.state_dict = handoff.state
    return ds


def _counting(handed: Callable[[], None]) -> Callable[..., Any]:
    """A map function that passes each element on unchanged after calling `handed()`.

    A `py_function`, which tf.data runs in order, in the call that takes the element from the
    stage (nothing in this dataset reads ahead of it but `prefetch_to_device`)."""

    def count() -> bool:
        handed()
        return True

    def passed_on(*element: Any) -> Any:
        done = tf.py_function(count, [], tf.bool)
        with tf.control_dependencies([done]):
            parts = tuple(tf.identity(part) for part in element)
        return parts if len(parts) > 1 else parts[0]

    return passed_on


def _apply_input_context(loader: Loader, context: tf.distribute.InputContext) -> None:
    """Shard the loader for this input pipeline and check the per-replica batch fits."""
    if not isinstance(context, tf.distribute.InputContext):
        raise TypeError(
            "input_context must be the tf.distribute.InputContext that "
            "strategy.distribute_datasets_from_function passes to your dataset function, got "
            f"{type(context).__name__}"
        )
    pipelines, pipeline = context.num_input_pipelines, context.input_pipeline_id
    try:
        loader.shard(pipelines, pipeline)
    except (RuntimeError, ValueError) as error:
        add_note(
            error,
            f"prefetch.tf.dataset: input_context asks for shard {pipeline} of {pipelines} "
            "(input_pipeline_id of num_input_pipelines)",
        )
        raise
    replicas = max(1, context.num_replicas_in_sync // pipelines)
    if len(loader) < replicas:
        raise ValueError(
            f"input pipeline {pipeline} of {pipelines} has {len(loader)} batches of "
            f"{loader.options.batch_size} per epoch for its {replicas} replicas, so a replica "
            "would get no batch. The loader's batch_size is the batch of one replica: use "
            "input_context.get_per_replica_batch_size(global_batch_size)"
        )
    log.info(
        "prefetch: input pipeline %d of %d reads %d batches of %d per epoch for %d replicas "
        "(global batch %d)",
        pipeline,
        pipelines,
        len(loader),
        loader.options.batch_size,
        replicas,
        loader.options.batch_size * context.num_replicas_in_sync,
    )
