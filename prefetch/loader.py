"""Loader: parallel, ordered, bounded batches from an image folder or any indexable source.

Contract:
- Batches come in epoch order; at most `depth` batches are being decoded at once, each into a
  preallocated slot, so memory is bounded by (depth + a few) batches.
- A delivered batch is a view into its slot. The slot is reused only after the consumer has
  asked for the next batch *and* nobody holds a view of it any more (checked by reference
  count), so keeping a batch is always safe; `copy=True` hands out private copies instead.
- `with loader:` owns the workers across epochs; without it, each iteration starts workers and
  stops them when the epoch ends or the iterator is dropped. `close()` is idempotent.
- An error in a worker is raised at the batch where it happened, with its original type and
  traceback and a note naming the file. Errors that TensorFlow swallowed are re-raised by
  `close()` and by leaving the `with` block.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np

from prefetch.autoscale import (
    PROCESS_WORKER_BYTES,
    THREAD_WORKER_BYTES,
    WorkerTuner,
    available_memory_bytes,
    usable_cores,
)
from prefetch.backends.base import Backend, BatchTask, PendingBatch, Slot
from prefetch.backends.choose import choose_backend
from prefetch.backends.processes import ProcessBackend
from prefetch.backends.reader import SampleReader, Transform
from prefetch.backends.ring import SlotRing, ring_capacity
from prefetch.backends.threads import ThreadBackend
from prefetch.coordinator import POLL_S, Coordinator
from prefetch.decode import COLOR_MODES, DecodeOptions, Decoder, decoder_name, get_decoder
from prefetch.errors import ClosedError, TooManySkippedError
from prefetch.sources import ImageFolder, Source, epoch_order
from prefetch.stats import LoaderStats, StatsRecorder

log = logging.getLogger(__name__)

LABEL_MODES = ("int", "categorical", "binary", None)
ON_ERROR = ("raise", "skip")
BACKENDS = ("thread", "process", "auto")
START_METHODS = ("spawn", "forkserver")
# How long an abandoned epoch waits for each in-flight batch before forgetting its slot.
SLOT_DRAIN_S = 5.0


class Batch(NamedTuple):
    """A batch: `images` uint8 (N, H, W, C) and `labels` (int32 (N,), or float32 one-hot)."""

    images: np.ndarray
    labels: np.ndarray


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


class Loader:
    """Load a source in parallel, in order, in batches, ahead of the consumer.

    `source` is an `ImageFolder`, a `FileList`, a folder path (read as an ImageFolder), or any
    object with `__len__` and `__getitem__(index) -> (image, label)`. Iterating gives
    `Batch(images, labels)` per batch (images only when `label_mode=None`); each iteration is a
    new epoch. The keyword options mirror Keras `image_dataset_from_directory`; see
    docs/api.md for each.
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
        backend: str = "auto",
        max_restarts: int = 3,
        start_method: str | None = None,
        memory_budget: int | None = None,
    ) -> None:
        if isinstance(source, (str, os.PathLike)):
            source = ImageFolder(source)
        if not isinstance(source, Source):
            raise TypeError(
                f"source must have __len__ and __getitem__ (or be a folder path), "
                f"got {type(source).__name__}"
            )
        if len(source) == 0:
            raise ValueError(f"source {source!r} is empty: there is nothing to load")
        self.source = source
        self.batch_size = _positive("batch_size", batch_size)
        if isinstance(workers, str) and workers != "auto":
            raise ValueError(f"workers must be an int >= 1 or 'auto', got {workers!r}")
        self.autotune = workers == "auto"
        self.workers = _positive(
            "workers", usable_cores() if self.autotune or workers is None else workers
        )
        if memory_budget is not None and memory_budget < 1:
            raise ValueError(
                f"memory_budget must be a positive number of bytes, got {memory_budget}"
            )
        self.memory_budget = memory_budget
        self._tuner: WorkerTuner | None = None
        self.depth = _positive("depth", depth)
        self.shuffle = bool(shuffle)
        self.seed = int(seed) if seed is not None else int(np.random.default_rng().integers(2**63))
        self._seed_is_random = seed is None  # then another process cannot draw the same order
        self.drop_remainder = bool(drop_remainder)
        self.label_mode = _one_of("label_mode", label_mode, LABEL_MODES)
        self.on_error = _one_of("on_error", on_error, ON_ERROR)
        self.backend_name = _one_of("backend", backend, BACKENDS)
        self.backend_reason = "" if backend == "auto" else f"backend={backend!r} was asked for"
        self.start_method = _start_method(start_method)
        _one_of("color_mode", color_mode, tuple(COLOR_MODES))
        if max_skipped is not None and max_skipped < 0:
            raise ValueError(f"max_skipped must be >= 0 or None, got {max_skipped}")
        self.max_skipped = max_skipped
        self.copy = bool(copy)
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.max_restarts = int(max_restarts)
        self.num_shards = _positive("num_shards", num_shards)
        if not 0 <= shard_index < self.num_shards:
            raise ValueError(
                f"shard_index must be in [0, num_shards={self.num_shards}), got {shard_index}"
            )
        self.shard_index = int(shard_index)
        self.class_names: list[str] = list(getattr(source, "class_names", []) or [])
        self._check_labels()
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
            source=source,
            decoder=get_decoder(decoder),
            options=self.options,
            transform=transform,
            skip_errors=self.on_error == "skip",
            labelled=self.label_mode is not None,
        )
        if len(self) == 0:
            raise ValueError(
                f"drop_remainder=True with {len(source)} samples and batch_size "
                f"{self.batch_size} leaves no batch; lower batch_size"
            )
        self.coordinator = Coordinator()
        self._stats = StatsRecorder()
        self._skipped_files: set[str] = set()
        self._lock = threading.Lock()
        self._backend: Backend | None = None
        self._ring: SlotRing | None = None
        self._entered = 0
        self._active_epochs = 0
        self._next = (0, 0)  # (epoch, first batch) of the next iteration
        self._current: list[int] | None = None  # [epoch, batches delivered] of the latest one

    def _check_labels(self) -> None:
        if self.label_mode is None:
            return
        if getattr(self.source, "has_labels", True) is False:
            raise ValueError("this source has no labels: pass label_mode=None")
        if self.label_mode == "categorical" and not self.class_names:
            raise ValueError(
                "label_mode='categorical' needs the number of classes: give the source a "
                "class_names attribute, or use label_mode='int'"
            )
        if self.label_mode == "binary" and len(self.class_names) not in (0, 2):
            raise ValueError(
                f"label_mode='binary' needs exactly 2 classes, found {len(self.class_names)}: "
                f"{self.class_names}; use 'int' or 'categorical'"
            )

    # ---- sizes -------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self._shard_size(), self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def _shard_size(self) -> int:
        """Samples per epoch in this loader's shard."""
        return len(range(self.shard_index, len(self.source), self.num_shards))

    def shard(self, num_shards: int, shard_index: int) -> None:
        """From now on yield shard `shard_index` of `num_shards` (as the constructor's options).

        For one input pipeline per process (tf.distribute): each process makes the same Loader
        and calls `shard` with its own index. Allowed until the loader's first epoch begins
        (also after `load_state_dict`), or at any time with the values it already has;
        otherwise RuntimeError. A shuffling loader needs an explicit `seed` for num_shards > 1.
        """
        num_shards = _positive("num_shards", num_shards)
        if not 0 <= shard_index < num_shards:
            raise ValueError(
                f"shard_index must be in [0, num_shards={num_shards}), got {shard_index}"
            )
        if num_shards > 1 and self.shuffle and self._seed_is_random:
            raise ValueError(
                "sharding a shuffling loader needs an explicit seed: every shard must draw the "
                f"same epoch order, but this loader picked a random seed ({self.seed}). Pass the "
                "same seed= to the Loader in every process"
            )
        with self._lock:
            if (num_shards, shard_index) == (self.num_shards, self.shard_index):
                return
            if self._current is not None:
                raise RuntimeError(
                    f"cannot re-shard a loader that has begun an epoch (it yields shard "
                    f"{self.shard_index} of {self.num_shards}): create the Loader with "
                    f"num_shards={num_shards}, shard_index={shard_index}, or call shard() before "
                    "iterating it"
                )
            size = len(range(shard_index, len(self.source), num_shards))
            full, rest = divmod(size, self.batch_size)
            batches = full + (1 if rest and not self.drop_remainder else 0)
            if batches < max(1, self._next[1]):
                raise ValueError(
                    f"shard {shard_index} of {num_shards} has {size} samples, {batches} batches of "
                    f"{self.batch_size}: too few for an epoch (or for the resume position "
                    f"{self._next[1]}); lower batch_size or the number of shards"
                )
            self.num_shards, self.shard_index = num_shards, int(shard_index)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(height, width, channels) of each image."""
        return self.options.shape

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce (0 for the first)."""
        return self._next[0]

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

    def _start(self) -> None:
        with self._lock:
            if self._backend is not None:
                return
            self.coordinator.clear_stop()
            if self.backend_name == "auto":
                first = self.batch_indices(self._next[0])[0]
                choice = choose_backend(self._reader, first)
                self.backend_name, self.backend_reason = choice.name, choice.reason
                log.info("prefetch %s", choice.reason)
            backend: Backend
            if self.backend_name == "process":
                backend = ProcessBackend(
                    self._reader,
                    self.workers,
                    self.batch_size,
                    self.depth,
                    self.coordinator,
                    self.max_restarts,
                    self.start_method,
                )
            else:
                backend = ThreadBackend(
                    self._reader, self.workers, self.batch_size, self.coordinator
                )
            backend.start()
            if self.autotune and self._tuner is None:
                self._tuner = self._new_tuner()
            self._backend = backend
            self._ring = SlotRing(backend)

    def close(self) -> None:
        """Stop the workers, join them, free the buffers. Idempotent.

        Raises the first worker error that was recorded but never delivered to the consumer
        (for example one that TensorFlow wrapped in its own error type).
        """
        with self._lock:
            backend, self._backend, self._ring = self._backend, None, None
        if backend is None:
            return
        self.coordinator.request_stop()
        backend.close()
        self.coordinator.join(stop_grace_period_secs=1.0, ignore_live_threads=True)

    def record_undelivered_error(self, error: BaseException) -> None:
        """Keep `error` to re-raise at `close()`: it reached a consumer that wrapped it (TF)."""
        self.coordinator.request_stop(error)

    # ---- iteration ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """One epoch. It begins (takes its epoch number, starts workers) at the first next()."""
        return self._run_epoch()

    def _run_epoch(self) -> Iterator[Any]:
        with self._lock:
            epoch, skip = self._next
            self._next = (epoch + 1, 0)
            self._current = [epoch, skip]
            self._active_epochs += 1
        try:
            self._start()
            yield from self._produce(epoch, skip)
        finally:
            with self._lock:
                self._active_epochs -= 1
                owner_left = self._active_epochs == 0 and self._entered == 0
            if owner_left:
                self.close()
                _forget_dummy_thread()

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The source indices of each batch of `epoch` in this shard (derived from seed, epoch).

        Every shard takes every `num_shards`-th sample of the same epoch permutation, so the
        shards are disjoint and together cover the epoch.
        """
        order = epoch_order(len(self.source), shuffle=self.shuffle, seed=self.seed, epoch=epoch)
        order = order[self.shard_index :: self.num_shards]
        size = self.batch_size
        return [order[i : i + size] for i in range(0, len(self) * size, size)]

    def _produce(self, epoch: int, skip: int) -> Iterator[Any]:
        backend, ring = self._backend, self._ring
        assert backend is not None and ring is not None
        todo = deque(self.batch_indices(epoch)[skip:])
        window: deque[tuple[Slot, PendingBatch]] = deque()
        stats = self._stats
        asked = time.perf_counter()

        def top_up() -> None:
            while todo and len(window) < self.depth:
                slot = ring.acquire()
                task = BatchTask(todo.popleft(), epoch, self.seed)
                window.append((slot, backend.submit(task, slot)))

        try:
            top_up()
            while window:
                slot, pending = window.popleft()
                stats.requests += 1
                ready = pending.done() + sum(p.done() for _, p in window)
                stats.ready_sum += ready
                self._wait(backend, pending)
                try:
                    outcome = pending.result()
                except BaseException:
                    ring.release(slot)
                    raise
                top_up()
                if self._current is not None and self._current[0] == epoch:
                    self._current[1] += 1
                stats.producer_busy_s += outcome.busy_s
                self._count_skipped(outcome.skipped)
                if outcome.count == 0:
                    ring.release(slot)
                    continue
                batch = self._deliver(slot, outcome.count)
                ring.deliver(slot)
                stats.batches += 1
                stats.images += outcome.count
                now = time.perf_counter()
                stats.consumer_wait_s += now - asked
                stats.elapsed_s += now - asked
                if self._tuner is not None:
                    self._tune(backend, now - asked, ready, outcome)
                yield batch
                del batch  # our own reference would keep the slot looking in use
                asked = time.perf_counter()
                stats.elapsed_s += asked - now
            stats.epochs += 1
        finally:
            for _, pending in window:
                pending.cancel()
            for slot, pending in window:
                if pending.wait(SLOT_DRAIN_S):
                    ring.release(slot)
                else:  # a worker may still write rows: forget the slot rather than reuse it
                    backend.forget_slot(slot)

    def _new_tuner(self) -> WorkerTuner:
        process = self.backend_name == "process"
        height, width, channels = self.options.shape
        ring_bytes = ring_capacity(self.depth) * self.batch_size * (height * width * channels + 4)
        budget = self.memory_budget or available_memory_bytes() // 4
        return WorkerTuner(
            start=self.workers,
            # A process worker takes whole batches, so more than `depth` of them would idle.
            maximum=self.depth if process else 2 * usable_cores(),
            depth=self.depth,
            worker_bytes=PROCESS_WORKER_BYTES if process else THREAD_WORKER_BYTES,
            budget_bytes=max(budget - ring_bytes, 0),
        )

    def _tune(self, backend: Backend, waited_s: float, ready: int, outcome: Any) -> None:
        assert self._tuner is not None
        count = self._tuner.observe(
            waited_s, ready, outcome.busy_s, outcome.busy_s - outcome.cpu_s - outcome.runnable_s
        )
        if count is not None:
            log.info("prefetch %s", self._tuner.decisions[-1])
            backend.set_workers(count)
            self.workers = count

    def _wait(self, backend: Backend, pending: PendingBatch) -> None:
        """Wait for `pending`; raise ClosedError (or the reported error) if the loader stops.

        A close() from another thread also settles the pending batch (its chunks cancelled, or
        its slot abandoned), so a batch that is done is checked too: its backend must be ours.
        """
        while not pending.wait(POLL_S):
            if self.coordinator.should_stop():
                self._raise_closed()
        if self._backend is not backend:
            self._raise_closed()

    def _raise_closed(self) -> None:
        self.coordinator.raise_requested_exception()
        raise ClosedError("the loader was closed while a batch was being waited for")

    def _count_skipped(self, skipped: list[Any]) -> None:
        for item in skipped:
            log.warning("prefetch skipped %s: %r", item.path, item.error)
            self._stats.skipped += 1
            self._stats.skipped_paths.append(item.path)
            self._skipped_files.add(item.path)
        if self.max_skipped is not None and len(self._skipped_files) > self.max_skipped:
            raise TooManySkippedError(
                f"{len(self._skipped_files)} samples could not be read, more than "
                f"max_skipped={self.max_skipped}; the last was {skipped[-1].path!r}. Fix or "
                "remove the files (see .paths), or raise max_skipped",
                sorted(self._skipped_files),
            ) from skipped[-1].error

    def _deliver(self, slot: Slot, count: int) -> Any:
        images = slot.images[:count]
        raw_labels = slot.labels[:count]
        if self.copy:
            images, raw_labels = images.copy(), raw_labels.copy()
        if self.label_mode is None:
            return images
        if self.label_mode == "int":
            return Batch(images, raw_labels)
        if self.label_mode == "binary":
            return Batch(images, raw_labels.astype(np.float32).reshape(-1, 1))
        return Batch(images, np.eye(len(self.class_names), dtype=np.float32)[raw_labels])

    # ---- resume ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Where the loader is: {"seed", "epoch", "position"}, position in batches delivered.

        Taken mid-epoch, it names the epoch in progress; at an epoch's end, the next epoch at
        position 0. Restore it with `load_state_dict` (in this or a fresh process) and the
        following batches equal those of an uninterrupted run.
        """
        with self._lock:
            current = self._current
            if current is not None and current[1] < len(self):
                epoch, position = current
            else:
                epoch, position = self._next
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
            self.seed = int(state["seed"])
            self._seed_is_random = False
            self._next = (int(state["epoch"]), position)
            self._current = None

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


def _start_method(method: str | None) -> str:
    """The multiprocessing start method for process workers: never fork (unsafe after TF)."""
    if method is None:
        # The default, as set by the program, else the platform's (forkserver from Python 3.14).
        default = multiprocessing.get_start_method(allow_none=True)
        default = default or multiprocessing.get_all_start_methods()[0]
        return default if default in START_METHODS else "spawn"
    if method not in START_METHODS:
        raise ValueError(
            f"start_method must be one of {START_METHODS}, got {method!r}: process workers are "
            "never forked, because forking a process that has started threads (TensorFlow's, "
            "the loader's) can deadlock the child"
        )
    return method


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
