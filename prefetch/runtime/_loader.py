"""Loader: parallel, ordered, bounded batches from an image folder or any indexable source.

The owner of a loading job: it checks the options (`prefetch.runtime._options`), plans the epochs
(`prefetch.plan._epochs`), builds and owns the backend and its slot ring (`prefetch.backends`), and
makes one `Stream` (`prefetch.runtime._stream`) per epoch. Contract:

- Batches come in epoch order; at most `depth` batches are being decoded at once (with many
  thread workers, enough batches for two rows per worker: `Session.in_flight`), each into a
  preallocated slot, so memory is bounded by `ring_capacity` of that many batches.
- `with loader:` owns the workers across epochs; without it, each epoch starts them and stops
  them when it ends or is dropped. `close()` is idempotent. A loader that is dropped, or still
  open when the interpreter exits, is closed quietly (`weakref.finalize`, an exit hook).
- An error in a worker is raised at the batch where it happened, with its original type and
  traceback and a note naming the file. Errors that TensorFlow swallowed are re-raised by
  `close()` and by leaving the `with` block.
"""

from __future__ import annotations

import os
import threading
import weakref
from types import TracebackType

import numpy as np

from prefetch._checks import check_shard
from prefetch._messages import counted, suggest_keywords
from prefetch.backends._options import ProcessOptions
from prefetch.backends._base import Backend
from prefetch.backends._reader import SampleReader, Transform
from prefetch.backends._ring import SlotRing
from prefetch.coordinator import Coordinator
from prefetch.decode._decoders import Decoder, decoder_name, get_decoder
from prefetch.decode._window import window_engine_name
from prefetch.io._cache import cache_for
from prefetch.io._storage import RemoteOptions
from prefetch.plan._crops import Augment, Crop
from prefetch.plan._epochs import Cursor, EpochPlan
from prefetch.runtime._autoscale import usable_cores
from prefetch.runtime._options import (
    LoaderOptions,
    check_crop,
    check_validation_split,
    decode_options,
    process_options,
)
from prefetch.runtime._spool import streaming_parts
from prefetch.runtime._stats import LoaderStats, StatsRecorder
from prefetch.runtime._stream import Batch, SkipCounter, Stream
from prefetch.runtime._workers import Workers, close_quietly, forget_dummy_thread
from prefetch.sources._folders import ImageFolder, Source, as_source, is_file_source, split_files
from prefetch.sources._labels import check_label_mode

__all__ = ["Batch", "Loader", "Stream"]


@suggest_keywords
class Loader:
    """Load a source in parallel, in order, in batches, ahead of the consumer.

    Iterating a loader gives a `Stream` of `Batch(images, labels)` for one epoch; each iteration
    is the next epoch. `images` is uint8 `(N, height, width, channels)`; `labels` follows
    `label_mode`. `with loader:` keeps the workers running across epochs and closes them at
    the end of the block. The keyword options mirror Keras's `image_dataset_from_directory`
    where it has them; the API guide (docs/api.md, "The Loader's options and behaviour")
    explains each at length, with batch lifetime, determinism, transforms and errors.

    Parameters:

    - `source`: what to load: an `ImageFolder`, a `FileList`, a folder path (`str` or
      `os.PathLike`, read as `ImageFolder(path)`), or any `Source` (`__len__` and
      `__getitem__(index) -> (image, label)`). An empty source raises ValueError.
    - `batch_size`: samples per batch, an int >= 1.
    - `image_size`: the size of every image: `(height, width)`, or one int for a square
      (`224` is `(224, 224)`). Images are resized to it.
    - `workers`: worker threads or processes: an int >= 1; `None` for one per usable core
      (tuned as `"auto"` on remote URLs); `"auto"` to grow or shrink the count while it runs.
    - `depth`: the window: the most batches in flight at once (being decoded, or decoded and
      waiting for the consumer), an int >= 1.
    - `shuffle`: shuffle the samples every epoch, in an order derived from `(seed, epoch)`
      only; `False` keeps the source's order.
    - `seed`: the seed of the shuffle order, of the crops and flips, of the transform's
      generators and of the validation split; `None` draws one (read it as `loader.seed`).
    - `validation_split`: the fraction of the files to hold out, in (0, 1), as in Keras: with
      `subset`, this loader reads one side of the split, the same files as Keras's
      `image_dataset_from_directory(validation_split=..., subset=..., seed=...)` (with its
      default `shuffle=True`) for the same folder. Needs `seed` and a file source.
    - `subset`: `"training"` or `"validation"`: which side of `validation_split` to read.
      Make one Loader per side, with the same `seed` (a validation loader may pass
      `shuffle=False`: the split does not change).
    - `drop_remainder`: leave out the last batch of every epoch when it is short.
    - `label_mode`: `"int"` (int32, shape `(N,)`), `"categorical"` (one-hot float32,
      `(N, classes)`), `"binary"` (float32, `(N, 1)`, two classes) or `None` (no labels).
    - `color_mode`: `"rgb"` (3 channels), `"grayscale"` (1) or `"rgba"` (4).
    - `interpolation`: the resize filter, by Keras name: `"bilinear"`, `"nearest"`,
      `"bicubic"`, `"area"`, `"lanczos3"`, `"lanczos5"`, `"hamming"` (see `DecodeOptions`).
    - `crop_to_aspect_ratio`: crop the largest centred region with the aspect ratio of
      `image_size` before resizing, instead of stretching.
    - `pad_to_aspect_ratio`: instead resize the whole image to fit and pad the rest with zeros.
      At most one of the two.
    - `antialias`: `False` (Keras's resize: pixels equal Keras's up to rounding) or `True`
      (filters that widen when shrinking, after JPEG DCT scaling: smoother, and faster on
      large JPEGs).
    - `crop`: the window of the original image each sample becomes, then resized to
      `image_size`: `RandomResizedCrop()` for training (a new window every epoch),
      `CenterCrop(0.875)` for evaluation. Only the window is decoded. `None`: the whole image.
    - `flip`: flip each sample left-right with probability 0.5, drawn from the sample's own
      generator (after its crop).
    - `on_error`: `"raise"`: a sample that fails to load raises at its batch, with a note
      naming it; `"skip"`: it is dropped, logged and counted in `stats()`.
    - `max_skipped`: with `on_error="skip"`, the most distinct files that may fail before
      `TooManySkippedError`; `None` for no cap.
    - `transform`: `transform(image, rng) -> image`, run in the workers on each image at
      `image_size`, with a generator seeded from `(seed, epoch, index)`; it must keep the
      shape and return uint8.
    - `decoder`: how files are decoded: `"auto"` (the `fast` extra's libjpeg-turbo decoder
      when installed, else Pillow), `"pillow"`, `"turbo"`, or your own
      `decoder(path, options) -> array`. Used for file sources only.
    - `copy`: hand out a private copy of every batch instead of a view into a reused buffer.
    - `num_shards`: split every epoch into this many disjoint shards (one per process under
      tf.distribute); this loader yields one of them.
    - `shard_index`: which shard this loader yields, in `[0, num_shards)`.
    - `backend`: how workers run: `"auto"` (threads or processes, chosen from a short
      measurement), `"thread"`, `"process"`, or a `ProcessOptions` (processes, with options).
    - `max_restarts`: the older spelling of `ProcessOptions(max_restarts=...)`: crashed worker
      processes restarted before `WorkerCrashedError` (`None`: 3).
    - `start_method`: the older spelling of `ProcessOptions(start_method=...)`: `"spawn"` or
      `"forkserver"`.
    - `memory_budget`: with `workers="auto"`, the bytes the workers and batch buffers may use;
      `None` for a quarter of the memory available at the start.
    - `sample_timeout_s`: a time limit per sample, in seconds, past which it raises
      `SampleTimeoutError`; `None` for none.
    - `cache_dir`: for a source of remote URLs, a local folder that keeps each object after
      its first read, so later epochs and runs read local disk.
    - `remote`: a `RemoteOptions`: the deadlines, size caps and redirect policy of remote
      reads (and the caps of listing a folder URL); `None` for those of an
      `ImageFolder(url, remote=...)` source, else the defaults. Its `max_object_bytes` also
      bounds local files read whole.

    A bad value raises ValueError naming the option, the value and what is accepted.
    """

    def __init__(
        self,
        source: Source | str | os.PathLike[str],
        *,
        batch_size: int = 32,
        image_size: int | tuple[int, int] = (256, 256),
        workers: int | str | None = None,
        depth: int = 2,
        shuffle: bool = True,
        seed: int | None = None,
        validation_split: float | None = None,
        subset: str | None = None,
        drop_remainder: bool = False,
        label_mode: str | None = "int",
        color_mode: str = "rgb",
        interpolation: str = "bilinear",
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
        antialias: bool = False,
        crop: Crop | None = None,
        flip: bool = False,
        on_error: str = "raise",
        max_skipped: int | None = None,
        transform: Transform | None = None,
        decoder: Decoder | str | None = "auto",
        copy: bool = False,
        num_shards: int = 1,
        shard_index: int = 0,
        backend: str | ProcessOptions = "auto",
        max_restarts: int | None = None,
        start_method: str | None = None,
        memory_budget: int | None = None,
        sample_timeout_s: float | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(
                f"remote must be a prefetch.RemoteOptions or None, got {type(remote).__name__}: "
                "pass remote=prefetch.RemoteOptions(...)"
            )
        self.source = as_source(source, remote=remote, on_error=on_error)
        listed = self.source.remote if isinstance(self.source, ImageFolder) else None
        self._remote = remote or listed or RemoteOptions()
        check_validation_split(validation_split, subset, seed, self.source)
        if validation_split is not None and subset is not None and is_file_source(self.source):
            self.source = split_files(self.source, validation_split, subset, seed)
        self.validation_split = validation_split
        self.subset = subset
        self._options = LoaderOptions(
            batch_size=batch_size,
            workers=workers,
            depth=depth,
            label_mode=label_mode,
            on_error=on_error,
            max_skipped=max_skipped,
            copy=bool(copy),
            backend="process" if isinstance(backend, ProcessOptions) else backend,
            process=process_options(backend, max_restarts, start_method),
            memory_budget=memory_budget,
            sample_timeout_s=sample_timeout_s,
        )
        self.class_names: list[str] = list(getattr(self.source, "class_names", []) or [])
        check_label_mode(self.source, label_mode, self.class_names)
        self.options = decode_options(
            image_size,
            color_mode,
            interpolation,
            crop_to_aspect_ratio,
            pad_to_aspect_ratio,
            antialias,
        )
        self._seed_is_random = seed is None  # then another process cannot draw the same order
        plan = EpochPlan(
            size=len(self.source),
            batch_size=batch_size,
            seed=int(seed) if seed is not None else int(np.random.default_rng().integers(2**63)),
            shuffle=bool(shuffle),
            drop_remainder=bool(drop_remainder),
            num_shards=num_shards,
            shard_index=shard_index,
        )
        self._plan, self._spool = streaming_parts(self.source, plan, cache_dir, self._remote)
        if self._spool is not None:
            weakref.finalize(self, self._spool.close)
        if len(self._plan) == 0:
            raise ValueError(
                f"drop_remainder=True with {counted(len(self.source), 'sample')} and batch_size "
                f"{batch_size} leaves no batch; lower batch_size"
            )
        augment = Augment(crop=crop, flip=flip)
        if crop is not None:
            check_crop(self.options, decoder)
        reader = SampleReader(
            source=self.source,
            decoder=get_decoder(decoder),
            options=self.options,
            transform=transform,
            skip_errors=on_error == "skip",
            labelled=label_mode is not None,
            num_classes=len(self.class_names) or None,
            cache=None if self._spool else cache_for(self.source, cache_dir),
            augment=augment,
            window_engine="pillow" if decoder == "pillow" else "turbo",
            remote=self._remote,
            spool_folder=self._spool.folder if self._spool else None,
        )
        count = usable_cores() if workers in ("auto", None) else int(workers)
        self._session = Workers(self._options, reader, count)
        weakref.finalize(self, close_quietly, self._session)
        self._cursor = Cursor()
        self._stats = StatsRecorder()
        self._skips = SkipCounter(max_skipped)
        self._lock = threading.Lock()
        self._entered = 0
        self._streams = 0
        self._running: weakref.WeakSet[Stream] = weakref.WeakSet()  # begun, for stats()

    # ---- options (read-only; set them when making the Loader) ----------------------------

    batch_size = property(lambda self: self._plan.batch_size, doc="Samples per batch.")
    depth = property(lambda self: self._options.depth, doc="Batches decoded ahead at most.")
    shuffle = property(lambda self: bool(self._plan.shuffle), doc="Whether epochs are shuffled.")
    seed = property(lambda self: self._plan.seed, doc="The seed of the epoch order.")
    drop_remainder = property(
        lambda self: self._plan.drop_remainder, doc="Whether a last, short batch is dropped."
    )
    label_mode = property(lambda self: self._options.label_mode, doc="The labels' encoding.")
    on_error = property(lambda self: self._options.on_error, doc='"raise" or "skip".')
    max_skipped = property(lambda self: self._options.max_skipped, doc="The skip cap.")
    copy = property(lambda self: self._options.copy, doc="Whether batches are private copies.")
    num_shards = property(lambda self: self._plan.num_shards, doc="Shards of each epoch.")
    shard_index = property(lambda self: self._plan.shard_index, doc="This loader's shard.")
    memory_budget = property(lambda self: self._options.memory_budget, doc="Tuner budget.")
    sample_timeout_s = property(
        lambda self: self._options.sample_timeout_s, doc="The per-sample time limit, or None."
    )
    remote = property(
        lambda self: self._remote, doc="The `RemoteOptions` of its remote reads and listing."
    )
    cache_dir = property(
        lambda self: self._session.reader.cache and self._session.reader.cache.folder,
        doc="The folder of local copies of remote objects, or None.",
    )
    max_restarts = property(
        lambda self: self._options.process.max_restarts, doc="Process worker restarts allowed."
    )
    crop = property(
        lambda self: self._session.reader.augment.crop,
        doc="The crop drawn per sample (`RandomResizedCrop`, `CenterCrop`) or None.",
    )
    flip = property(
        lambda self: bool(self._session.reader.augment.flip),
        doc="Whether samples are flipped left-right at random (probability 0.5).",
    )
    start_method = property(
        lambda self: self._options.process.method, doc="Process workers' start method."
    )

    autotune = property(
        lambda self: self._session.tuned,
        doc='Whether the worker count is tuned: workers="auto", or workers=None on remote URLs.',
    )
    workers = property(lambda self: self._session.count, doc="The worker count now.")
    backend_name = property(
        lambda self: self._session.backend_name, doc='"thread" or "process" ("auto" before start).'
    )
    backend_reason = property(lambda self: self._session.backend_reason, doc="Why that backend.")

    @property
    def coordinator(self) -> Coordinator:
        """The Coordinator that stops this loader's workers and keeps its first error."""
        return self._session.coordinator

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels) of each image."""
        return self.options.shape

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce (0 for the first)."""
        return self._cursor.next_epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._plan)

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The source indices of each batch of `epoch` in this shard (derived from seed, epoch).

        Every shard takes every `num_shards`-th sample of the same epoch permutation, so the
        shards are disjoint and together cover the epoch.
        """
        return self._plan.batches(epoch)

    def shard(self, num_shards: int, shard_index: int) -> None:
        """From now on yield shard `shard_index` of `num_shards` (as the constructor's options).

        For one input pipeline per process (tf.distribute): each process makes the same Loader
        and calls `shard` with its own index. Allowed until the loader's first epoch begins
        (also after `load_state_dict`), or at any time with the values it already has;
        otherwise RuntimeError. A shuffling loader needs an explicit `seed` for num_shards > 1.
        """
        num_shards, shard_index = check_shard(num_shards, shard_index)
        if num_shards > 1 and self.shuffle and self._seed_is_random:
            raise ValueError(
                "sharding a shuffling loader needs an explicit seed: every shard must draw the "
                f"same epoch order, but this loader picked a random seed ({self.seed}). Pass the "
                "same seed= to the Loader in every process"
            )
        with self._lock:
            if (num_shards, shard_index) == (self.num_shards, self.shard_index):
                return
            if self._cursor.started:
                raise RuntimeError(
                    f"cannot re-shard a loader that has begun an epoch (it yields shard "
                    f"{self.shard_index} of {self.num_shards}): create the Loader with "
                    f"num_shards={num_shards}, shard_index={shard_index}, or call shard() before "
                    "iterating it"
                )
            plan = self._plan.replace(num_shards=num_shards, shard_index=shard_index)
            if len(plan) < max(1, self._cursor.next_position):
                raise ValueError(
                    f"shard {shard_index} of {num_shards} has "
                    f"{counted(plan.shard_size, 'sample')}, {counted(len(plan), 'batch')} of "
                    f"{self.batch_size}: too few for an epoch (or for the resume position "
                    f"{self._cursor.next_position}); lower batch_size or the number of shards"
                )
            self._plan = plan

    # ---- lifetime ----------------------------------------------------------------------

    def __enter__(self) -> Loader:
        self._entered += 1
        try:
            self._start()
        except BaseException:  # `with` calls no __exit__ after a failed __enter__
            self._entered -= 1
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered -= 1
        try:
            self.close()
        except BaseException as undelivered:
            if undelivered is not exc:
                raise  # the original of an error that TensorFlow (or a thread) swallowed

    def _start(
        self, epoch: int | None = None, position: int = 0, batches: list[np.ndarray] | None = None
    ) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run; returns the backend and its ring. The first of
        `batches` (default: the plan's for `epoch` from `position`, where the next iteration
        begins) is what backend="auto" measures; for a streamed source, its shards are fetched
        first."""
        if epoch is None:
            epoch, position = self._cursor.next_epoch, self._cursor.next_position
        if batches is None:
            batches = self._plan.batches(epoch, position)
        batches = batches or self._plan.batches(epoch)
        if self._spool is not None:
            self._spool.begin(epoch, batches, position)
            self._spool.ready(position)
        return self._session.start(batches[0])

    def close(self) -> None:
        """Stop the workers, join them, free the buffers. Idempotent.

        Raises the first worker error that was recorded but never delivered to the consumer
        (for example one that TensorFlow wrapped in its own error type).
        """
        if self._spool is not None:
            self._spool.end()  # its folder goes with the loader (the finalizer)
        self._session.close()

    def record_undelivered_error(self, error: BaseException) -> None:
        """Keep `error` to re-raise at `close()`: it reached a consumer that wrapped it (TF)."""
        self.coordinator.request_stop(error)

    # ---- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Stream:
        """One epoch. It begins (takes its epoch number, starts workers) at the first next()."""
        return Stream(self)

    def _begin_stream(self, stream: Stream) -> tuple[int, int]:
        """A stream begins: its (epoch, first batch)."""
        with self._lock:
            self._streams += 1
            self._running.add(stream)
        return self._cursor.begin()

    def _end_stream(self) -> None:
        """A stream ended; the last one closes the workers unless `with loader:` owns them."""
        with self._lock:
            self._streams -= 1
            owner_left = self._streams == 0 and self._entered == 0
        if owner_left:
            self.close()
            forget_dummy_thread()

    # ---- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Where the loader is: {"seed", "epoch", "position"}, position in batches delivered.

        Taken mid-epoch, it names the epoch in progress; at an epoch's end, the next epoch at
        position 0. Restore it with `load_state_dict` (in this or a fresh process) and the
        following batches equal those of an uninterrupted run.
        """
        epoch, position = self._cursor.state(len(self))
        return {"seed": self.seed, "epoch": epoch, "position": position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from `state` (from `state_dict`): the next iteration resumes that epoch."""
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise ValueError(
                f"position {position} is outside this loader's epoch of {len(self)} batches; "
                "was the state saved with another batch_size or dataset?"
            )
        with self._lock:
            self._plan = self._plan.replace(seed=int(state["seed"]))
            self._seed_is_random = False
            self._cursor.restore(int(state["epoch"]), position)

    # ---- reporting ---------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """A snapshot of throughput, consumer wait, producer busy time and skipped samples."""
        tuner = self._session.tuner
        decisions = tuple(map(str, tuner.decisions)) if tuner is not None else ()
        return self._stats.snapshot(
            self.backend_name,
            self.workers,
            self.depth,
            self.backend_reason,
            decisions,
            self._decoder_name(),
            sum(stream.reads_in_flight() for stream in list(self._running)),
            self._session.in_flight(),
        )

    def _decoder_name(self) -> str:
        """What decodes: the decoder's name, or with a crop the window decoder's."""
        reader = self._session.reader
        if reader.augment.crop is not None:
            return window_engine_name(reader.window_engine)
        return decoder_name(reader.decoder)

    def reset_stats(self) -> None:
        """Start counting afresh (for example at the start of each epoch)."""
        self._stats.reset()

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.batch_size}, "
            f"image_size={self.options.image_size}, workers={self.workers}, depth={self.depth}, "
            f"backend={self.backend_name!r})"
        )
