"""What a worker does with a batch, and the thread backend that runs it.

`SampleReader.read_into` decodes (or fetches) samples straight into a batch slot; it is the
whole per-batch task and is picklable, so every backend runs the same code. A backend runs
tasks and returns a `PendingBatch` per batch; the Loader only ever talks to this small protocol:

    backend.start(); backend.new_slot() -> Slot; backend.submit(task, slot) -> PendingBatch;
    backend.close()

`ThreadBackend` splits a batch into chunks for its worker threads, which write disjoint rows of
the same slot. Worker threads loop on a short timeout and exit once the Coordinator stops.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from prefetch.coordinator import Coordinator
from prefetch.decode import DecodeOptions, Decoder, to_target_size
from prefetch.errors import add_note

log = logging.getLogger(__name__)

# How often an idle worker thread wakes to check the stop flag.
POLL_S = 0.1
# How long close() waits for worker threads to finish the chunk of samples they are decoding.
JOIN_GRACE_S = 10.0

Transform = Callable[[np.ndarray, np.random.Generator], Any]


@dataclass(eq=False)
class Slot:
    """One preallocated batch: `images` (N, H, W, C) uint8 and `labels` (N,) int32.

    `name` names the shared-memory segment behind a process-backend slot ("" otherwise).
    """

    images: np.ndarray
    labels: np.ndarray
    name: str = ""


@dataclass(frozen=True)
class BatchTask:
    """Decode the samples `indices` (source indices, in batch order) of `epoch`.

    A transform's random generator derives from (seed, epoch, sample index) only.
    """

    indices: np.ndarray
    epoch: int
    seed: int


@dataclass
class Skipped:
    """A sample dropped under on_error="skip"."""

    position: int
    path: str
    error: BaseException


@dataclass
class ChunkOutcome:
    """What decoding rows [start, stop) of a batch produced."""

    skipped: list[Skipped] = field(default_factory=list)
    busy_s: float = 0.0
    cpu_s: float = 0.0
    runnable_s: float = 0.0


@dataclass
class BatchOutcome:
    """A finished batch: the first `count` rows of the slot are valid, in order."""

    count: int
    skipped: list[Skipped]
    busy_s: float
    cpu_s: float = 0.0
    runnable_s: float = 0.0


@dataclass(frozen=True)
class SampleReader:
    """Reads samples of `source` into slots: decode, transform, write. Picklable.

    For file sources (with `paths` and `labels` arrays) it decodes files with `decoder`; for
    any other source it calls `source[index] -> (image, label)` (or just `image` when
    `labelled` is False) and converts the image to the target size.
    """

    source: Any
    decoder: Decoder
    options: DecodeOptions
    transform: Transform | None
    skip_errors: bool
    labelled: bool

    def describe(self, index: int) -> str:
        """The file (or sample) behind `index`, for messages."""
        paths = getattr(self.source, "paths", None)
        return str(paths[index]) if paths is not None else f"{type(self.source).__name__}[{index}]"

    def read_into(
        self, task: BatchTask, slot: Slot, start: int, stop: int, worker: str
    ) -> ChunkOutcome:
        """Fill rows [start, stop) of `slot` with the samples task.indices[start:stop]."""
        began = time.perf_counter()
        began_cpu, began_runnable = thread_clocks()
        outcome = ChunkOutcome()
        for position in range(start, stop):
            index = int(task.indices[position])
            try:
                slot.images[position], label = self._read(index, task)
                slot.labels[position] = label
            except Exception as error:
                what = self.describe(index)
                if not self.skip_errors:
                    add_note(
                        error,
                        f"prefetch: while reading {what!r} (sample {index}, epoch {task.epoch}) "
                        f"in {worker}; pass on_error='skip' to drop unreadable samples",
                    )
                    raise
                outcome.skipped.append(Skipped(position, what, error))
        outcome.busy_s = time.perf_counter() - began
        cpu, runnable = thread_clocks()
        outcome.cpu_s, outcome.runnable_s = cpu - began_cpu, runnable - began_runnable
        return outcome

    def _read(self, index: int, task: BatchTask) -> tuple[np.ndarray, int]:
        paths = getattr(self.source, "paths", None)
        if paths is not None:
            image = self.decoder(str(paths[index]), self.options)
            label = int(self.source.labels[index])
        else:
            item = self.source[index]
            image, label = item if self.labelled else (item, 0)
            image = to_target_size(image, self.options)
        _check_image(image, self.options, "decoder")
        if self.transform is not None:
            rng = np.random.default_rng([task.seed, task.epoch, index])
            image = self.transform(image, rng)
            _check_image(image, self.options, "transform")
        return image, label


def _check_image(image: Any, options: DecodeOptions, made_by: str) -> None:
    """Refuse what would be silently broadcast or wrapped around when written to a slot."""
    if np.shape(image) != options.shape:
        raise ValueError(
            f"{made_by} returned shape {np.shape(image)}, expected {options.shape}: "
            f"a {made_by} must keep the image size (resize with image_size instead)"
        )
    if getattr(image, "dtype", None) != np.uint8:
        raise TypeError(
            f"{made_by} returned dtype {getattr(image, 'dtype', type(image).__name__)}, "
            "expected uint8: clip and cast, e.g. np.clip(x, 0, 255).astype(np.uint8)"
        )


def usable_cores() -> int:
    """The CPU cores this process may run on (`os.sched_getaffinity`, or `os.cpu_count()`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def thread_clocks() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of the calling thread.

    Linux reports both in /proc/thread-self/schedstat; elsewhere the second is 0. Time a worker
    was busy but in neither was spent blocked: waiting for disk, network or a sleep.
    """
    try:
        with open("/proc/thread-self/schedstat", "rb") as schedstat:
            on_cpu, waiting, _ = schedstat.read().split()
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0


def compact(slot: Slot, size: int, skipped: list[Skipped]) -> int:
    """Move the valid rows of the first `size` to the front of the slot; returns their count."""
    if not skipped:
        return size
    bad = {s.position for s in skipped}
    keep = [p for p in range(size) if p not in bad]
    slot.images[: len(keep)] = slot.images[keep]
    slot.labels[: len(keep)] = slot.labels[keep]
    return len(keep)


class PendingBatch(Protocol):
    """A submitted batch. `wait` blocks at most `timeout_s`; `result` raises a worker's error."""

    def wait(self, timeout_s: float) -> bool: ...

    def done(self) -> bool: ...

    def result(self) -> BatchOutcome: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    """Runs batch tasks. One owner (the Loader) calls these from one thread."""

    name: str
    workers: int

    def start(self) -> None: ...

    def new_slot(self) -> Slot: ...

    def submit(self, task: BatchTask, slot: Slot) -> PendingBatch: ...

    def set_workers(self, count: int) -> None: ...

    def forget_slot(self, slot: Slot) -> None: ...

    def close(self) -> None: ...


class ThreadPending:
    """A batch split into chunk futures; it is done when every chunk is."""

    def __init__(self, futures: list[Future[ChunkOutcome]], slot: Slot, size: int) -> None:
        self._futures = futures
        self._slot = slot
        self._size = size

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for future in self._futures:
            try:
                future.exception(timeout=max(deadline - time.monotonic(), 0.0))
            except FutureTimeout:
                return False
            except Exception:  # cancelled: done all the same
                pass
        return True

    def result(self) -> BatchOutcome:
        skipped: list[Skipped] = []
        busy_s = cpu_s = runnable_s = 0.0
        for future in self._futures:
            chunk = future.result()  # raises the first failing chunk's error, in row order
            skipped.extend(chunk.skipped)
            busy_s += chunk.busy_s
            cpu_s += chunk.cpu_s
            runnable_s += chunk.runnable_s
        count = compact(self._slot, self._size, skipped)
        return BatchOutcome(count, skipped, busy_s, cpu_s, runnable_s)

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()


# A queued chunk: its future, the batch task, the slot, and the rows [start, stop) to fill.
_Chunk = tuple[Future[ChunkOutcome], BatchTask, Slot, int, int]


class ThreadBackend:
    """Worker threads sharing one task queue; a batch is split into chunks across them."""

    name = "thread"

    def __init__(
        self,
        reader: SampleReader,
        workers: int,
        batch_size: int,
        coordinator: Coordinator,
    ) -> None:
        self.workers = workers
        self._reader = reader
        self._batch_size = batch_size
        self._coordinator = coordinator
        self._tasks: queue.SimpleQueue[
            tuple[Future[ChunkOutcome], BatchTask, Slot, int, int] | None
        ]
        self._tasks = queue.SimpleQueue()
        self._threads: dict[int, threading.Thread] = {}
        self._chunk = 1

    def start(self) -> None:
        self.set_workers(self.workers)

    def set_workers(self, count: int) -> None:
        """Run `count` worker threads: start missing ones; surplus ones exit after their chunk."""
        self.workers = count
        # About two chunks per worker keeps all workers busy when sample costs vary.
        self._chunk = max(1, -(-self._batch_size // (2 * count)))
        for i in range(count):
            running = self._threads.get(i)
            if running is not None and running.is_alive():
                continue
            thread = threading.Thread(
                target=self._work, args=(i,), name=f"prefetch-worker-{i}", daemon=True
            )
            self._coordinator.register_thread(thread)
            self._threads[i] = thread
            thread.start()

    def new_slot(self) -> Slot:
        height, width, channels = self._reader.options.shape
        return Slot(
            np.empty((self._batch_size, height, width, channels), np.uint8),
            np.empty((self._batch_size,), np.int32),
        )

    def forget_slot(self, slot: Slot) -> None:
        """Nothing to do: a thread slot is plain memory, freed with its last reference."""

    def submit(self, task: BatchTask, slot: Slot) -> ThreadPending:
        size = len(task.indices)
        futures = []
        for start in range(0, size, self._chunk):
            future: Future[ChunkOutcome] = Future()
            self._tasks.put((future, task, slot, start, min(start + self._chunk, size)))
            futures.append(future)
        return ThreadPending(futures, slot, size)

    def _work(self, index: int) -> None:
        name = threading.current_thread().name
        while not self._coordinator.should_stop() and index < self.workers:
            try:
                item = self._tasks.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if item is None:  # a wake-up from close(): check the stop flag now
                continue
            future, task, slot, start, stop = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._reader.read_into(task, slot, start, stop, name))
            except BaseException as error:
                future.set_exception(error)

    def close(self) -> None:
        """Cancel queued chunks and join the worker threads (the Coordinator is stopped)."""
        while True:
            try:
                item = self._tasks.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._tasks.put(None)  # wakes idle workers at once instead of after their poll
        deadline = time.monotonic() + JOIN_GRACE_S
        for thread in self._threads.values():
            thread.join(max(deadline - time.monotonic(), 0.0))
        alive = [t.name for t in self._threads.values() if t.is_alive()]
        if alive:
            log.warning("prefetch worker threads still running after close: %s", alive)
        self._threads = {}
