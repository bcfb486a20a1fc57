"""Loader: parallel, ordered, bounded batches from an image folder or any indexable source.

The owner of a loading job: it checks the options (`prefetch.options`), plans the epochs
(`prefetch.plan`), builds and owns the backend and its slot ring (`prefetch.backends`), and
makes one `Stream` (`prefetch.stream`) per epoch. Contract:

- Batches come in epoch order; at most `depth` batches are being decoded at once, each into a
  preallocated slot, so memory is bounded by `ring_capacity(depth)` batches.
- `with loader:` owns the workers across epochs; without it, each epoch starts them and stops
  them when it ends or is dropped. `close()` is idempotent. A loader that is dropped, or still
  open when the interpreter exits, is closed quietly (`weakref.finalize`, an exit hook).
- An error in a worker is raised at the batch where it happened, with its original type and
  traceback and a note naming the file. Errors that TensorFlow swallowed are re-raised by
  `close()` and by leaving the `with` block.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from types import TracebackType
from typing import Any

import numpy as np

from prefetch.autoscale import WorkerTuner, tuner_for, usable_cores
from prefetch.backends import make_backend
from prefetch.backends.base import Backend
from prefetch.backends.choose import choose_backend
from prefetch.backends.reader import SampleReader, Transform
from prefetch.backends.ring import SlotRing, ring_capacity
from prefetch.backends.shm import sweep_stale
from prefetch.coordinator import Coordinator
from prefetch.decode import COLOR_MODES, DecodeOptions, Decoder, decoder_name, get_decoder
from prefetch.options import LoaderOptions, ProcessOptions, check_shard, one_of
from prefetch.plan import Cursor, EpochPlan
from prefetch.sources import ImageFolder, Source
from prefetch.stats import LoaderStats, StatsRecorder
from prefetch.stream import Batch, SkipCounter, Stream

__all__ = ["Batch", "Loader", "Stream"]

log = logging.getLogger(__name__)


class _Workers:
    """What a started loader owns: the backend, its ring and the coordinator; `close` frees them.

    Kept apart from the Loader so that a finalizer and the exit hook can close it without
    holding the Loader alive.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.backend: Backend | None = None
        self.ring: SlotRing | None = None
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            backend, self.backend, self.ring = self.backend, None, None
            _OPEN.discard(self)
        if backend is None:
            return
        self.coordinator.request_stop()
        backend.close()
        self.coordinator.join(stop_grace_period_secs=1.0, ignore_live_threads=True)


# The workers of every started loader, closed at interpreter exit. Registered after
# multiprocessing's own exit hook (imported above), so it runs first: the workers stop on our
# message, not on multiprocessing's SIGTERM (which a process backend would report as a crash).
_OPEN: set[_Workers] = set()


def _close_quietly(workers: _Workers) -> None:
    """Close a loader nobody closed (dropped, or open at exit): no traceback, nothing left."""
    try:
        workers.close()
    except BaseException as error:  # an undelivered worker error: nobody is left to see it
        log.debug("prefetch: closing an abandoned loader: %r", error)


def _close_all_at_exit() -> None:
    for workers in list(_OPEN):
        _close_quietly(workers)


atexit.register(_close_all_at_exit)


class Loader:
    """Load a source in parallel, in order, in batches, ahead of the consumer.

    `source` is an `ImageFolder`, a `FileList`, a folder path (read as an ImageFolder), or any
    object with `__len__` and `__getitem__(index) -> (image, label)` (just the image with
    `label_mode=None`). Iterating gives a `Stream` of `Batch(images, labels)` (labels None with
    `label_mode=None`); each iteration is a new epoch. The keyword options mirror Keras
    `image_dataset_from_directory`; `LoaderOptions` checks them. `backend` is "auto", "thread",
    "process" or a `ProcessOptions` (the process backend with those options); `max_restarts`
    and `start_method` are the older spelling of the latter's fields.
    """

    def __init__(
        self,
        source: Source | str | os.PathLike[str],
        *,
        batch_size: int = 32,
        image_size: tuple[int, int] = (256, 256),
        workers: int | str | None = None,
        depth: int = 2,
        shuffle: bool = True,
        seed: int | None = None,
        drop_remainder: bool = False,
        label_mode: str | None = "int",
        color_mode: str = "rgb",
        interpolation: str = "bilinear",
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
        antialias: bool = False,
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
    ) -> None:
        self.source = _as_source(source)
        process = _process_options(backend, max_restarts, start_method)
        self._options = LoaderOptions(
            batch_size=batch_size,
            workers=workers,
            depth=depth,
            shuffle=bool(shuffle),
            seed=seed,
            drop_remainder=bool(drop_remainder),
            label_mode=label_mode,
            on_error=on_error,
            max_skipped=max_skipped,
            copy=bool(copy),
            num_shards=num_shards,
            shard_index=shard_index,
            backend="process" if isinstance(backend, ProcessOptions) else backend,
            process=process,
            memory_budget=memory_budget,
        )
        self.class_names: list[str] = list(getattr(self.source, "class_names", []) or [])
        _check_label_mode(self.source, label_mode, self.class_names)
        one_of("color_mode", color_mode, tuple(COLOR_MODES))
        height, width = (int(v) for v in image_size)
        self.options = DecodeOptions(
            (height, width),
            COLOR_MODES[color_mode],
            interpolation,
            bool(crop_to_aspect_ratio),
            pad_to_aspect_ratio=bool(pad_to_aspect_ratio),
            antialias=bool(antialias),
        )
        self._reader = SampleReader(
            source=self.source,
            decoder=get_decoder(decoder),
            options=self.options,
            transform=transform,
            skip_errors=on_error == "skip",
            labelled=label_mode is not None,
            num_classes=len(self.class_names) or None,
        )
        self._seed_is_random = seed is None  # then another process cannot draw the same order
        self._plan = EpochPlan(
            size=len(self.source),
            batch_size=batch_size,
            seed=int(seed) if seed is not None else int(np.random.default_rng().integers(2**63)),
            shuffle=bool(shuffle),
            drop_remainder=bool(drop_remainder),
            num_shards=num_shards,
            shard_index=shard_index,
        )
        if len(self._plan) == 0:
            raise ValueError(
                f"drop_remainder=True with {len(self.source)} samples and batch_size "
                f"{batch_size} leaves no batch; lower batch_size"
            )
        self.autotune = workers == "auto"
        self.workers = usable_cores() if self.autotune or workers is None else int(workers)
        self.backend_name = self._options.backend
        self.backend_reason = (
            "" if backend == "auto" else f"backend={self.backend_name!r} was asked for"
        )
        self.coordinator = Coordinator()
        self._workers = _Workers(self.coordinator)
        weakref.finalize(self, _close_quietly, self._workers)
        self._cursor = Cursor()
        self._stats = StatsRecorder()
        self._skips = SkipCounter(max_skipped)
        self._tuner: WorkerTuner | None = None
        self._lock = threading.Lock()
        self._entered = 0
        self._streams = 0

    # ---- options (read-only; set them when making the Loader) ----------------------------

    batch_size = property(lambda self: self._plan.batch_size, doc="Samples per batch.")
    depth = property(lambda self: self._options.depth, doc="Batches decoded ahead at most.")
    shuffle = property(lambda self: self._options.shuffle, doc="Whether epochs are shuffled.")
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
    max_restarts = property(
        lambda self: self._options.process.max_restarts, doc="Process worker restarts allowed."
    )
    start_method = property(
        lambda self: self._options.process.method, doc="Process workers' start method."
    )

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
                    f"shard {shard_index} of {num_shards} has {plan.shard_size} samples, "
                    f"{len(plan)} batches of {self.batch_size}: too few for an epoch (or for the "
                    f"resume position {self._cursor.next_position}); lower batch_size or the "
                    "number of shards"
                )
            self._plan = plan

    # ---- lifetime ----------------------------------------------------------------------

    def __enter__(self) -> Loader:
        self._entered += 1
        self._start()
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

    def _start(self) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run; returns the backend and its ring."""
        owned = self._workers
        with owned.lock:
            if owned.backend is not None and owned.ring is not None:
                return owned.backend, owned.ring
            self.coordinator.clear_stop()
            sweep_stale()  # segments of loaders that died, of this user only
            if self.backend_name == "auto":
                first = self._plan.batches(self._cursor.next_epoch)[0]
                choice = choose_backend(self._reader, first)
                self.backend_name, self.backend_reason = choice.name, choice.reason
                log.info("prefetch %s", choice.reason)
            backend = make_backend(
                self.backend_name,
                self._reader,
                workers=self.workers,
                batch_size=self.batch_size,
                depth=self.depth,
                coordinator=self.coordinator,
                process=self._options.process,
            )
            backend.start()
            if self.autotune and self._tuner is None:
                height, width, channels = self.image_shape
                batch_bytes = self.batch_size * (height * width * channels + 4)
                self._tuner = tuner_for(
                    process=self.backend_name == "process",
                    workers=self.workers,
                    depth=self.depth,
                    ring_bytes=ring_capacity(self.depth) * batch_bytes,
                    memory_budget=self.memory_budget,
                )
            owned.backend, owned.ring = backend, SlotRing(backend)
            _OPEN.add(owned)
            return owned.backend, owned.ring

    def _owns(self, backend: Backend | None) -> bool:
        """Whether `backend` is still this loader's running backend (not closed meanwhile)."""
        return backend is not None and self._workers.backend is backend

    def close(self) -> None:
        """Stop the workers, join them, free the buffers. Idempotent.

        Raises the first worker error that was recorded but never delivered to the consumer
        (for example one that TensorFlow wrapped in its own error type).
        """
        self._workers.close()

    def record_undelivered_error(self, error: BaseException) -> None:
        """Keep `error` to re-raise at `close()`: it reached a consumer that wrapped it (TF)."""
        self.coordinator.request_stop(error)

    # ---- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Stream:
        """One epoch. It begins (takes its epoch number, starts workers) at the first next()."""
        return Stream(self)

    def _begin_stream(self) -> tuple[int, int]:
        """A stream begins: its (epoch, first batch)."""
        with self._lock:
            self._streams += 1
        return self._cursor.begin()

    def _end_stream(self) -> None:
        """A stream ended; the last one closes the workers unless `with loader:` owns them."""
        with self._lock:
            self._streams -= 1
            owner_left = self._streams == 0 and self._entered == 0
        if owner_left:
            self.close()
            _forget_dummy_thread()

    def _observe(self, waited_s: float, ready: int, outcome: Any) -> None:
        """A batch was delivered: let workers="auto" decide the worker count."""
        if self._tuner is None or self._workers.backend is None:
            return
        blocked_s = outcome.busy_s - outcome.cpu_s - outcome.runnable_s
        count = self._tuner.observe(waited_s, ready, outcome.busy_s, blocked_s)
        if count is not None:
            log.info("prefetch %s", self._tuner.decisions[-1])
            self._workers.backend.set_workers(count)
            self.workers = count

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
        decisions = tuple(map(str, self._tuner.decisions)) if self._tuner is not None else ()
        return self._stats.snapshot(
            self.backend_name,
            self.workers,
            self.depth,
            self.backend_reason,
            decisions,
            decoder_name(self._reader.decoder),
        )

    def reset_stats(self) -> None:
        """Start counting afresh (for example at the start of each epoch)."""
        self._stats.reset()

    def __repr__(self) -> str:
        return (
            f"Loader({self.source!r}, batch_size={self.batch_size}, "
            f"image_size={self.options.image_size}, workers={self.workers}, depth={self.depth}, "
            f"backend={self.backend_name!r})"
        )


def _as_source(source: Any) -> Source:
    if isinstance(source, (str, os.PathLike)):
        source = ImageFolder(source)
    if not isinstance(source, Source):
        raise TypeError(
            f"source must have __len__ and __getitem__ (or be a folder path), "
            f"got {type(source).__name__}"
        )
    if len(source) == 0:
        raise ValueError(f"source {source!r} is empty: there is nothing to load")
    return source


def _process_options(
    backend: str | ProcessOptions, max_restarts: int | None, start_method: str | None
) -> ProcessOptions:
    """The process options from `backend=ProcessOptions(...)` or the older keywords."""
    if isinstance(backend, ProcessOptions):
        if max_restarts is not None or start_method is not None:
            raise ValueError(
                "pass max_restarts and start_method inside ProcessOptions, not beside it"
            )
        return backend
    return ProcessOptions(
        max_restarts=3 if max_restarts is None else max_restarts, start_method=start_method
    )


def _check_label_mode(source: Source, label_mode: str | None, class_names: list[str]) -> None:
    if label_mode is None:
        return
    if getattr(source, "has_labels", True) is False:
        raise ValueError("this source has no labels: pass label_mode=None")
    if label_mode == "categorical" and not class_names:
        raise ValueError(
            "label_mode='categorical' needs the number of classes: give the source a "
            "class_names attribute, or use label_mode='int'"
        )
    if label_mode == "binary" and len(class_names) not in (0, 2):
        raise ValueError(
            f"label_mode='binary' needs exactly 2 classes, found {len(class_names)}: "
            f"{class_names}; use 'int' or 'categorical'"
        )


def _forget_dummy_thread() -> None:
    """Remove the current thread's `_DummyThread` entry, if it has one (a foreign thread).

    An epoch without `with loader:` joins its workers on the thread that iterates it, for
    `prefetch.tf.dataset` a thread of tf.data. Joining asks for `threading.current_thread()`,
    which registers a `_DummyThread` for a thread Python did not start, and Python 3.11 never
    removes it: one stale entry in `threading.enumerate()` per epoch.
    """
    dummy_type = getattr(threading, "_DummyThread", None)
    active: dict[int, threading.Thread] | None = getattr(threading, "_active", None)
    lock = getattr(threading, "_active_limbo_lock", None)
    if dummy_type is None or active is None or lock is None:
        return
    ident = threading.get_ident()
    with lock:
        if isinstance(active.get(ident), dummy_type):
            del active[ident]
