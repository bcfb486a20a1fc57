"""The thread backend: worker threads share one task queue and write disjoint rows of a slot.

`ThreadBackend` splits a batch into chunks (about two per worker) for its threads. Worker threads
loop on a short timeout and exit once the Coordinator stops; `close()` wakes idle ones at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from prefetch.backends._base import BatchOutcome, OnThisHost, compact
from prefetch.backends._lifecycle import STUCK_THREAD_JOIN_S, THREAD_JOIN_S
from prefetch.coordinator import POLL_S, Coordinator, Deadline
from prefetch.sample import BatchTask, ChunkOutcome, SampleReader, Slot, split_rows

log = logging.getLogger("prefetch.backends")

# Chunks a batch is cut into per worker thread: about two keep every thread busy when sample
# costs vary, and take the GIL once per chunk, not per sample.
CHUNKS_PER_THREAD = 2


class ThreadPending:
    """A batch split into chunk futures; it is done when every chunk is."""

    def __init__(self, futures: list[Future[ChunkOutcome]], slot: Slot, size: int) -> None:
        self._futures = futures
        self._slot = slot
        self._size = size

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self, timeout_s: float) -> bool:
        deadline = Deadline(timeout_s)
        for future in self._futures:
            try:
                future.exception(timeout=deadline.remaining())
            except FutureTimeout:
                return False
            except Exception:  # cancelled: done all the same
                pass
        return True

    def result(self) -> BatchOutcome:
        # result() raises the first failing chunk's error, in row order
        merged = ChunkOutcome.merged([future.result() for future in self._futures])
        count = compact(self._slot, self._size, merged.skipped)
        return BatchOutcome.of(merged, count, merged.skipped)

    def cancel(self) -> None:
        for future in self._futures:
            future.cancel()


# A queued chunk: its future, the batch task, the slot, and the rows [start, stop) to fill.
_Chunk = tuple[Future[ChunkOutcome], BatchTask, Slot, int, int]


class ThreadBackend(OnThisHost):
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
        self._stuck = False

    def start(self) -> None:
        self.set_workers(self.workers)

    def set_workers(self, count: int) -> None:
        """Run `count` worker threads: start missing ones; surplus ones exit after their chunk."""
        self.workers = count
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

    def starting(self) -> int:
        """Threads are ready at once."""
        return 0

    def new_slot(self) -> Slot:
        height, width, channels = self._reader.options.shape
        return Slot(
            np.empty((self._batch_size, height, width, channels), np.uint8),
            np.empty((self._batch_size,), np.int32),
            started=np.zeros((self._batch_size,), np.float64),
        )

    def forget_slot(self, slot: Slot) -> None:
        """Nothing to do: a thread slot is plain memory, freed with its last reference."""

    def time_out(self, pending: object, row: int, error: BaseException, skip: bool) -> bool:
        """A thread cannot be stopped from outside: the consumer raises `error` (and closes,
        which then waits only `STUCK_THREAD_JOIN_S` for the threads; the stuck one is a daemon)."""
        self._stuck = True
        return False

    def submit(self, task: BatchTask, slot: Slot) -> ThreadPending:
        size = len(task.indices)
        futures = []
        for start, stop in split_rows(size, CHUNKS_PER_THREAD * self.workers):
            future: Future[ChunkOutcome] = Future()
            self._tasks.put((future, task, slot, start, stop))
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
        # Shutdown steps 4 and 5 (`_lifecycle`'s note): wake every thread, one deadline for all.
        for _ in self._threads:
            self._tasks.put(None)  # wakes idle workers at once instead of after their poll
        deadline = Deadline(STUCK_THREAD_JOIN_S if self._stuck else THREAD_JOIN_S)
        for thread in self._threads.values():
            thread.join(deadline.remaining())
        alive = [t.name for t in self._threads.values() if t.is_alive()]
        if alive:
            log.warning("prefetch worker threads still running after close: %s", alive)
        self._threads = {}
