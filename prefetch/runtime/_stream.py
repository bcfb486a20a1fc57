"""One epoch of a Loader: the window of in-flight batches, waiting, delivery, the skip cap, stats.

`iter(loader)` makes a `Stream`. It begins at the first `next()`: it takes its epoch number and
position from the loader's cursor and starts the loader's workers unless `with loader:` owns
them. It then keeps up to `depth` batches submitted to the backend (more for many thread
workers: `Session.in_flight`), each into a slot of the ring, and yields them in order as
`Batch(images, labels)`.

A delivered batch is a view of its slot; the ring reuses the slot once the consumer asked for
the next batch and nothing holds the view. When the consumer keeps more than the ring's kept
batches (`KEPT_REFERENCED_SLOTS`), further batches are handed out as copies, so keeping any
number costs memory only (never a slot, a shared-memory segment or its file descriptor).

`close()` (also at exhaustion, on an error, and when the stream is dropped) cancels the batches
still queued and waits for those being decoded within one deadline (`DRAIN_S`), then returns
their slots: a worker is never left writing a slot that the ring reuses, and none is killed.
If no `with` block owns the loader, the last stream to end closes it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from prefetch.backends._base import Backend, BatchTask, PendingBatch, Skipped, Slot
from prefetch.backends._ring import SlotRing
from prefetch.coordinator import POLL_S
from prefetch.errors import ClosedError, SampleTimeoutError, TooManySkippedError
from prefetch.sources._labels import encode_labels

if TYPE_CHECKING:
    from prefetch.runtime._loader import Loader

# skipped files are reported on the logger users already filter on
log = logging.getLogger("prefetch.loader")

# How long an ended epoch waits, in all, for the batches its workers are still decoding.
DRAIN_S = 5.0


class Batch(NamedTuple):
    """A batch, a named tuple: `images, labels = batch`.

    - `images`: uint8, shape `(N, height, width, channels)`.
    - `labels`: the labels in the loader's `label_mode`: int32 `(N,)` for "int", float32
      `(N, classes)` one-hot for "categorical", float32 `(N, 1)` for "binary", and None for
      `label_mode=None`.
    """

    images: np.ndarray
    labels: np.ndarray | None


class SkipCounter:
    """Counts the samples skipped under on_error="skip" across a loader's life; enforces the cap.

    `max_skipped` caps the number of distinct files skipped (None: no cap); passing it raises
    `TooManySkippedError` listing them all.
    """

    def __init__(self, max_skipped: int | None) -> None:
        self.max_skipped = max_skipped
        self.files: set[str] = set()

    def count(self, skipped: list[Skipped], stats: Any) -> None:
        for item in skipped:
            log.warning("prefetch skipped %s: %r", item.path, item.error)
            stats.skipped += 1
            stats.skipped_paths.append(item.path)
            self.files.add(item.path)
        if self.max_skipped is not None and len(self.files) > self.max_skipped:
            raise TooManySkippedError(
                f"{len(self.files)} samples could not be read, more than "
                f"max_skipped={self.max_skipped}; the last was {skipped[-1].path!r}. Fix or "
                "remove the files (see .paths), or raise max_skipped",
                sorted(self.files),
            ) from skipped[-1].error


class Stream:
    """One epoch of a `Loader`, as an iterator of `Batch`; made by `iter(loader)`.

    `epoch` is the epoch it produces (None until the first `next()`), `position` the batches
    it has delivered, counted from the start of the epoch. `close()` ends it early; it is
    idempotent and also runs when the epoch ends, fails, or the stream is dropped.

    - `loader`: the `Loader` whose next epoch the stream yields (made by `iter(loader)`, not
      by hand).
    """

    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self.epoch: int | None = None
        self.position = 0
        self._backend: Backend | None = None
        self._ring: SlotRing | None = None
        self._todo: deque[np.ndarray] = deque()
        self._window: deque[tuple[Slot, PendingBatch, np.ndarray]] = deque()
        self._closed = False
        self._delivered_at: float | None = None  # when the latest batch was handed out

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        try:
            if self.epoch is None:
                self._begin()
            elif self._delivered_at is not None:  # the consumer's time with the last batch
                self._loader._stats.elapsed_s += time.perf_counter() - self._delivered_at
            batch = self._next_batch()
        except BaseException:
            self.close()
            raise
        if batch is None:
            self._loader._stats.epochs += 1
            self.close()
            raise StopIteration
        return batch

    def _begin(self) -> None:
        loader = self._loader
        self.epoch, self.position = loader._begin_stream(self)
        batches = loader._plan.batches(self.epoch, self.position)
        self._todo = deque(batches)
        self._backend, self._ring = loader._start(self.epoch, self.position, batches)

    def _top_up(self) -> None:
        backend, ring, loader = self._backend, self._ring, self._loader
        assert backend is not None and ring is not None and self.epoch is not None
        while self._todo and len(self._window) < loader._session.in_flight():
            if loader._spool is not None:
                loader._spool.ready(self.position + len(self._window))
            slot = ring.acquire()
            task = BatchTask(self._todo.popleft(), self.epoch, loader.seed)
            self._window.append((slot, backend.submit(task, slot), task.indices))

    def _next_batch(self) -> Batch | None:
        """The next non-empty batch, or None at the epoch's end."""
        loader, stats = self._loader, self._loader._stats
        asked = time.perf_counter()
        self._top_up()
        while self._window:
            slot, pending, indices = self._window.popleft()
            stats.requests += 1
            ready = pending.done() + sum(p.done() for _, p, _ in self._window)
            stats.ready_sum += ready
            self._wait(slot, pending, indices)
            try:
                outcome = pending.result()
            except BaseException:
                self._ring_of().release(slot)
                raise
            self.position += 1
            loader._cursor.advance(self.epoch or 0)
            if loader._spool is not None:
                loader._spool.release(self.position)
            stats.producer_busy_s += outcome.busy_s
            stats.read_s.extend(outcome.read_s)
            stats.cache_hits += outcome.cache_hits
            stats.cache_misses += outcome.cache_misses
            loader._skips.count(outcome.skipped, stats)
            if outcome.count == 0:
                self._ring_of().release(slot)
                self._top_up()
                continue
            batch = self._deliver(slot, outcome.count)
            self._top_up()
            stats.batches += 1
            stats.images += outcome.count
            now = self._delivered_at = time.perf_counter()
            stats.consumer_wait_s += now - asked
            stats.elapsed_s += now - asked
            loader._session.observe(now - asked, ready, outcome)
            return batch
        return None

    def reads_in_flight(self) -> int:
        """Samples of this epoch's in-flight batches that workers are reading right now."""
        window = list(self._window)  # may be called from another thread
        return sum(
            int(np.count_nonzero(slot.started)) for slot, _, _ in window if slot.started is not None
        )

    def _ring_of(self) -> SlotRing:
        assert self._ring is not None
        return self._ring

    def _deliver(self, slot: Slot, count: int) -> Batch:
        """The batch in `slot`: views, handed to the ring to reuse later, or a private copy."""
        loader, ring = self._loader, self._ring_of()
        images, raw = slot.images[:count], slot.labels[:count]
        copied = loader.copy or ring.crowded()
        if copied:
            images, raw = images.copy(), raw.copy()
        batch = Batch(images, encode_labels(raw, loader.label_mode, len(loader.class_names)))
        if copied:
            ring.release(slot)
        else:
            ring.deliver(slot)
        return batch

    def _wait(self, slot: Slot, pending: PendingBatch, indices: np.ndarray) -> None:
        """Wait for `pending`; raise ClosedError (or the reported error) if the loader stops.

        A close() from another thread also settles the pending batch (its chunks cancelled, or
        its slot abandoned), so a batch that is done is checked too: its backend must be ours.
        With `sample_timeout_s`, a sample read for longer is handed to the backend to time out.
        """
        coordinator = self._loader.coordinator
        limit = self._loader.sample_timeout_s
        while not pending.wait(POLL_S):
            if coordinator.should_stop():
                self._raise_closed()
            if limit is not None and slot.started is not None:
                self._check_stuck(slot.started, pending, indices, limit)
        if not self._loader._session.owns(self._backend):
            self._raise_closed()

    def _check_stuck(
        self, started: np.ndarray, pending: PendingBatch, indices: np.ndarray, limit: float
    ) -> None:
        """Time out a row of `pending` whose sample has been read for more than `limit` s."""
        now = time.monotonic()
        stuck = np.flatnonzero((started > 0) & (now - started > limit))
        if not len(stuck) or self._backend is None:
            return
        row = int(stuck[0])
        index = int(indices[row])
        what = self._loader._session.reader.describe(index)
        error = SampleTimeoutError(
            f"{what!r} (sample {index}) has been read for {now - started[row]:.1f} s, more than "
            f"sample_timeout_s={limit}: a FIFO, a dead network mount or a source that blocks? "
            "Fix or remove it, raise sample_timeout_s, or (process backend) pass "
            "on_error='skip' to drop it"
        )
        started[row] = 0.0  # handled: a re-sent batch starts the row's clock again
        skip = self._loader.on_error == "skip"
        if not self._backend.time_out(pending, row, error, skip):
            self._loader.close()  # a stuck thread cannot be stopped: this loader is done
            raise error

    def _raise_closed(self) -> None:
        self._loader.coordinator.raise_requested_exception()
        raise ClosedError("the loader was closed while a batch was being waited for")

    def close(self) -> None:
        """End the epoch: cancel queued batches, drain the rest within DRAIN_S. Idempotent."""
        if self._closed:
            return
        self._closed = True
        window, self._window = self._window, deque()
        self._todo.clear()
        if self._backend is not None:
            for _, pending, _ in window:
                pending.cancel()
            running = self._loader._session.owns(self._backend)  # else nothing writes any more
            deadline = time.monotonic() + (DRAIN_S if running else 0.0)
            for slot, pending, _ in window:
                if pending.wait(max(deadline - time.monotonic(), 0.0)):
                    self._ring_of().release(slot)
                else:  # a worker may still write rows: forget the slot rather than reuse it
                    self._backend.forget_slot(slot)
        if self.epoch is not None:
            if self._loader._spool is not None:
                self._loader._spool.end()  # stop fetching this epoch's shards
            self._loader._end_stream()

    def __del__(self) -> None:
        # Dropped unfinished (a `break`, an exception): end the epoch like close(). At
        # interpreter exit the loader's own exit hook has already closed the workers.
        with contextlib.suppress(Exception):  # a finalizer must not raise
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Stream epoch={self.epoch} position={self.position} {state}>"
