"""Loader: parallel, ordered, bounded batches from an image folder or any indexable source.

The owner of a loading job: it checks the options (`LoaderOptions`, `prefetch.runtime._options`),
plans the epochs (`prefetch.plan`), builds the per-sample reader and the worker set
(`prefetch.backends`, `Workers`), and hands them to one `Epochs` (`prefetch.runtime._epochs`),
the only part of it that the `Stream` of each epoch uses. Contract:

- Batches come in epoch order; `depth` batches are in flight at once (with many workers,
  enough batches for two rows per worker: `Workers.in_flight`; both backends share each
  batch's rows among their workers), each into a preallocated slot, so memory is bounded by
  `ring_capacity` of that many batches (`Workers.ring_bytes`).
- `with loader:` owns the workers across epochs, and the next epoch's first batches are
  submitted as the current epoch's last are consumed (the loader's one `Window` of batches in
  flight); without it, each epoch starts them and stops them when it ends or is dropped.
  `close()` is idempotent. A loader that is dropped, or still open when the interpreter exits,
  is closed quietly (`weakref.finalize`, an exit hook).
- An error in a worker is raised at the batch where it happened, with its original type and
  traceback and a note naming the file. Errors that TensorFlow swallowed are re-raised by
  `close()` and by leaving the `with` block.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

import numpy as np

from prefetch._checks import check_shard
from prefetch._messages import moved_keywords, suggest_keywords
from prefetch.backends import ProcessOptions, RayOptions
from prefetch.coordinator import Coordinator
from prefetch.decode import Decoder, image_size_pair
from prefetch.io import RemoteOptions
from prefetch.plan import Augment, LoaderState
from prefetch.runtime._epochs import make_epochs
from prefetch.runtime._options import (
    MOVED,
    Autotune,
    ErrorPolicy,
    LoaderOptions,
    as_error_policy,
    as_workers,
    backend_groups,
    check_group,
    prepared_source,
)
from prefetch.runtime._stats import LoaderStats
from prefetch.runtime._stream import Batch, Stream
from prefetch.sources import (
    Source,
    check_label_mode,
)

__all__ = ["Batch", "Loader", "Stream"]


@moved_keywords(MOVED)
@suggest_keywords
class Loader:
    """Load a source in parallel, in order, in batches, ahead of the consumer.

    Iterating a loader gives a `Stream` of `Batch(images, labels)` for one epoch; each iteration
    is the next epoch. `images` is uint8 `(N, height, width, channels)`; `labels` follows
    `label_mode`. `with loader:` keeps the workers running across epochs and closes them at the
    end of the block; meanwhile each epoch's last batches overlap the next epoch's first (the
    same batches, within the in-flight bound), so a loader iterated only once decodes at most
    `depth` batches (`stats().in_flight`) that it never delivers and `close()` cancels. The
    keywords mirror Keras's `image_dataset_from_directory` where it has them and stay flat;
    options that travel together come as one option object (`augment=Augment(...)`,
    `on_error=ErrorPolicy(...)`, `workers=Autotune(...)`, `backend=ProcessOptions(...)`,
    `remote=RemoteOptions(...)`). `loader.options` reads them all back (`LoaderOptions`). The
    API guide (docs/api.md, "The Loader's options and behaviour") explains each at length, with
    batch lifetime, determinism, transforms and errors.

    Parameters:

    - `source`: what to load: an `ImageFolder`, a `FileList`, a folder path (`str` or
      `os.PathLike`, read as `ImageFolder(path)`), or any `Source` (`__len__` and
      `__getitem__(index) -> (image, label)`). An empty source raises ValueError.
    - `batch_size`: samples per batch, an int >= 1.
    - `image_size`: the size of every image: `(height, width)`, or one int for a square
      (`224` is `(224, 224)`). Images are resized to it.
    - `shuffle`: shuffle the samples every epoch, in an order derived from `(seed, epoch)`
      only; `False` keeps the source's order.
    - `seed`: the seed of the shuffle order, of the crops and flips, of the transform's
      generators and of the validation split; `None` draws one (read it as
      `loader.options.seed`).
    - `validation_split`: the fraction of the files to hold out, in (0, 1), as in Keras: with
      `subset`, this loader reads one side of the split, the same files as Keras's
      `image_dataset_from_directory(validation_split=..., subset=..., seed=...)` (with its
      default `shuffle=True`) for the same folder. Needs `seed` and a file source.
    - `subset`: `"training"` or `"validation"`: which side of `validation_split` to read.
      Make one Loader per side, with the same `seed` (a validation loader may pass
      `shuffle=False`: the split does not change).
    - `label_mode`: `"int"` (int32, shape `(N,)`), `"categorical"` (one-hot float32,
      `(N, classes)`), `"binary"` (float32, `(N, 1)`, two classes) or `None` (no labels).
    - `color_mode`: `"rgb"` (3 channels), `"grayscale"` (1) or `"rgba"` (4).
    - `interpolation`: the resize filter, by Keras name: `"bilinear"`, `"nearest"`,
      `"bicubic"`, `"area"`, `"lanczos3"`, `"lanczos5"`, `"hamming"` (see `DecodeOptions`).
    - `crop_to_aspect_ratio`: crop the largest centred region with the aspect ratio of
      `image_size` before resizing, instead of stretching.
    - `pad_to_aspect_ratio`: instead resize the whole image to fit and pad the rest with zeros.
      At most one of the two.
    - `drop_remainder`: leave out the last batch of every epoch when it is short.
    - `antialias`: `False` (Keras's resize: pixels equal Keras's up to rounding) or `True`
      (filters that widen when shrinking, after JPEG DCT scaling: smoother, and faster on
      large JPEGs).
    - `augment`: an `Augment(crop=, flip=, transform=)`: the crop window each sample becomes
      (only the window is decoded), a random left-right flip, and your own
      `transform(image, rng)`, all drawn per sample from `(seed, epoch, index)`; None for
      none.
    - `decoder`: how files are decoded: `"auto"` (the `fast` extra's libjpeg-turbo decoder
      when installed, else Pillow), `"pillow"`, `"turbo"`, or your own
      `decoder(path, options) -> array`. Used for file sources only.
    - `workers`: worker threads or processes: an int >= 1 (above this rank's cores it warns,
      `TooManyWorkersWarning`); `None` for one per core of this rank's share of the usable
      cores (shared among the ranks on this host, which the launcher's variables or
      `PREFETCH_RANKS_PER_HOST` give: docs/tuning.md), less one from 4 cores on (tuned on
      remote URLs); `"auto"` to grow or shrink the count while it runs, or
      `Autotune(memory_budget=...)` to do so within that many bytes.
    - `depth`: how many decoded batches may wait for the consumer, an int >= 1: the batches
      kept in flight (being decoded or waiting), or more when the workers need more rows to
      all be busy (two per worker).
    - `backend`: how workers run: `"auto"` (processes for files, else threads or processes
      as a short measurement says), `"thread"`, `"process"`, a `ProcessOptions` (restarts,
      start method, reader threads) or `RayOptions` (Ray actors too: docs/beyond-the-host.md).
    - `on_error`: `"raise"`: a sample that fails to load raises at its batch, with a note
      naming it; `"skip"`: it is dropped, logged and counted in `stats()`; or an
      `ErrorPolicy("skip", max_skipped=..., sample_timeout_s=...)`: with a cap on skipped
      files and a time limit per sample.
    - `remote`: a `RemoteOptions`: the deadlines, size caps and redirect policy of remote
      reads (and the caps of listing a folder URL), and its `cache_dir`, a local folder that
      keeps each remote object after its first read (at most `cache_limit` bytes of them;
      by default only copies nobody read in this epoch or the last are evicted,
      `cache_policy`); `None` for those of an
      `ImageFolder(url, remote=...)` source, else the defaults. Its `max_object_bytes` also
      bounds local files read whole.
    A bad value raises ValueError naming the option, the value and what is accepted; a keyword
    that moved into an option object raises TypeError naming its new spelling.
    """

    def __init__(
        self,
        source: Source | str | os.PathLike[str],
        *,
        batch_size: int = 32,
        image_size: int | tuple[int, int] = (256, 256),
        shuffle: bool = True,
        seed: int | None = None,
        validation_split: float | None = None,
        subset: str | None = None,
        label_mode: str | None = "int",
        color_mode: str = "rgb",
        interpolation: str = "bilinear",
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
        drop_remainder: bool = False,
        antialias: bool = False,
        augment: Augment | None = None,
        decoder: Decoder | str | None = "auto",
        workers: int | str | Autotune | None = None,
        depth: int = 2,
        backend: str | ProcessOptions | RayOptions = "auto",
        on_error: str | ErrorPolicy = "raise",
        remote: RemoteOptions | None = None,
    ) -> None:
        check_group("augment", augment, Augment, "Augment(crop=..., flip=..., transform=...)")
        policy = as_error_policy(on_error)
        self.source, remote = prepared_source(
            source, remote, policy, validation_split, subset, seed
        )
        self.class_names: list[str] = list(getattr(self.source, "class_names", []) or [])
        self._seed_is_random = seed is None  # then another process cannot draw the same order
        options = LoaderOptions(
            batch_size=batch_size,
            image_size=image_size_pair(image_size),
            shuffle=bool(shuffle),
            seed=int(seed) if seed is not None else int(np.random.default_rng().integers(2**63)),
            validation_split=validation_split,
            subset=subset,
            label_mode=label_mode,
            color_mode=color_mode,
            interpolation=interpolation,
            crop_to_aspect_ratio=bool(crop_to_aspect_ratio),
            pad_to_aspect_ratio=bool(pad_to_aspect_ratio),
            drop_remainder=bool(drop_remainder),
            antialias=bool(antialias),
            augment=augment if augment is not None else Augment(),
            decoder=decoder,
            workers=as_workers(workers),
            depth=depth,
            **backend_groups(backend),
            on_error=policy,
            remote=remote,
        )
        check_label_mode(self.source, label_mode, self.class_names)
        self._epochs = make_epochs(self, self.source, options, self.class_names)
        self._lock = threading.Lock()

    options = property(
        lambda self: self._epochs.options, doc="What it was made with (`LoaderOptions`)."
    )

    # ---- the state of its workers ------------------------------------------------------

    autotune = property(
        lambda self: self._epochs.workers.tuned,
        doc='Whether the worker count is tuned: workers="auto", or workers=None on remote URLs.',
    )
    workers = property(lambda self: self._epochs.workers.count, doc="The worker count now.")
    backend_name = property(
        lambda self: self._epochs.workers.backend_name, doc='"thread", "process" or "ray".'
    )
    backend_reason = property(lambda self: self._epochs.workers.backend_reason, doc="Why.")

    @property
    def coordinator(self) -> Coordinator:
        """The Coordinator that stops this loader's workers and keeps its first error."""
        return self._epochs.workers.coordinator

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels) of each image."""
        return self._epochs.workers.reader.options.shape

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce (0 for the first)."""
        return self._epochs.cursor.next_epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._epochs.plan)

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The source indices of each batch of `epoch` in this shard (derived from seed, epoch;
        for an epoch resumed from another layout's state, the batches it has left).

        Every shard takes every `num_shards`-th sample of the same epoch permutation, padded
        so that every shard has `len(loader)` batches (`shard`), so the shards together cover
        the epoch.
        """
        return self._epochs.plan.batches(epoch)

    def shard(self, num_shards: int, shard_index: int) -> None:
        """From now on yield shard `shard_index` of `num_shards` (`loader.options` says which).

        One loader per rank: each process makes the same Loader and calls `shard` with its
        own index (the `prefetch.torch`, `.tf` and `.keras` adapters do it). Every shard gets
        `ceil(samples / num_shards)` samples, so `len(loader)` batches: the first
        `-samples % num_shards` of the epoch's order come again at its end (padding, as
        torch's `DistributedSampler`; no sample is ever left out). Allowed until the first
        epoch begins (a loaded state then continues on the new shards), or at any time with
        the values it has; otherwise RuntimeError. Shuffling on num_shards > 1 needs a `seed`.
        """
        num_shards, shard_index = check_shard(num_shards, shard_index, self._epochs.plan.size)
        if num_shards > 1 and self.options.shuffle and self._seed_is_random:
            raise ValueError(
                "sharding a shuffling loader needs an explicit seed: every shard must draw the "
                f"same epoch order, but this loader picked a random seed ({self.options.seed}). "
                "Pass the same seed= to the Loader in every process"
            )
        with self._lock:
            self._epochs.shard(num_shards, shard_index)

    # ---- lifetime ----------------------------------------------------------------------

    def __enter__(self) -> Loader:
        self._epochs.enter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._epochs.leave()
        except BaseException as undelivered:
            if undelivered is not exc:
                raise  # the original of an error that TensorFlow (or a thread) swallowed

    def close(self) -> None:
        """Stop the workers, join them, free the buffers. Idempotent.

        Raises the first worker error that was recorded but never delivered to the consumer
        (for example one that TensorFlow wrapped in its own error type).
        """
        self._epochs.close()

    def record_undelivered_error(self, error: BaseException) -> None:
        """Keep `error` to re-raise at `close()`: it reached a consumer that wrapped it (TF)."""
        self.coordinator.request_stop(error)

    def __iter__(self) -> Stream:
        """One epoch. It begins (takes its epoch number, starts workers) at the first next()."""
        return Stream(self._epochs)

    # ---- resume ------------------------------------------------------------------------

    def state_dict(self, *, held_back: int = 0) -> dict[str, int]:
        """Where the loader is: a dict of ints (JSON-safe), the same on every rank.

        `"epoch"` and `"position"` (batches this shard delivered) name the next batch: taken
        mid-epoch, the epoch in progress; at an epoch's end, the next epoch at position 0.
        `"samples"` is the epoch's global position (samples all ranks together have read, in
        lockstep) with `"num_shards"`, `"batch_size"` and the dataset's `"size"`; then
        `"version"`, `"seed"`. Save one rank's. `load_state_dict` (any process, number of
        ranks or batch size) continues the epoch exactly.

        - `held_back`: batches delivered that a consumer of your own, reading ahead, has not
          taken yet (0 to those the running epoch delivered); the state names the first.
          The adapters keep their own state (`DeviceLoader.state_dict`, `ds.state_dict`).
        """
        return self._epochs.state(held_back)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state` (from `state_dict`): the next iteration resumes that epoch.

        Taken with other ranks or another batch size, the state continues at its global
        position: this loader's shard of the rest of that epoch's order (the rest split among
        the new ranks, padded as `shard` pads), then whole epochs; across the ranks, before and
        after, every sample of the epoch is read once, besides the padding. A later `shard`
        re-applies it. `shuffle="batches"` and streamed shard sources continue mid-epoch only
        on the same ranks and batch size (ValueError naming it otherwise). A version-1 state
        (`{"seed", "epoch", "position"}`) loads on the layout it was saved with.
        """
        restored = LoaderState.of(state)
        with self._lock:
            self._epochs.load(restored)
            self._seed_is_random = False

    # ---- reporting ---------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Throughput, consumer wait, busy time, skips; where batches were decoded (Ray)."""
        return self._epochs.snapshot()

    def reset_stats(self) -> None:
        """Start counting afresh (for example at the start of each epoch)."""
        self._epochs.stats.reset()

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.options.batch_size}, "
            f"image_size={self.options.image_size}, workers={self.workers}, "
            f"depth={self.options.depth}, backend={self.backend_name!r})"
        )
