"""One epoch of a Loader: the batches in flight, waiting, delivery.

`iter(loader)` makes a `Stream` of the loader's `Epochs` (prefetch.runtime._epochs), the only
part of the loader it uses. It begins at the first `next()`: it takes its epoch number and
position from the cursor and starts the workers unless `with loader:` owns them. It then
keeps up to `depth` batches in flight, submitted to the backend (more for many thread workers:
`Workers.in_flight`), each into a slot of the ring, and yields them in order as
`Batch(images, labels)`. Once it has submitted its epoch's last batch, the room left in flight
goes to the next epoch's first batches (`Epochs.look_ahead`: only while `with loader:` keeps
the workers running), which the next stream takes over, so the workers do not idle at an
epoch boundary.

A delivered batch is a view of its slot; the ring reuses the slot once the consumer asked for
the next batch and nothing holds the view. When the consumer keeps more than the ring's kept
batches (`KEPT_REFERENCED_SLOTS`), further batches are handed out as copies, so keeping any
number costs memory only (never a slot, a shared-memory segment or its file descriptor).

`close()` (also at exhaustion, on an error, and when the stream is dropped) cancels the batches
still queued and, while the workers go on running, waits for those being decoded within one
deadline (`DRAIN_S`), then returns their slots (`settle`, prefetch.runtime._lookahead): a
worker is never left writing a slot that the ring reuses, and none is killed.
If no `with` block owns the loader, the last stream to end closes it, without that wait: the
workers are stopped (shutdown steps 3 to 5 of `prefetch.backends._lifecycle`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import NamedTuple

import numpy as np

from prefetch.backends import Backend, PendingBatch, SlotRing
from prefetch.coordinator import POLL_S
from prefetch.errors import ClosedError, SampleTimeoutError
from prefetch.runtime._epochs import Epochs
from prefetch.runtime._lookahead import Submitted, settle
from prefetch.sample import BatchTask, Slot


class Batch(NamedTuple):
    """A batch, a named tuple: `images, labels = batch`.

    - `images`: uint8, shape `(N, height, width, channels)`.
    - `labels`: the labels in the loader's `label_mode`: int32 `(N,)` for "int", float32
      `(N, classes)` one-hot for "categorical", float32 `(N, 1)` for "binary", and None for
      `label_mode=None`.
    """

    images: np.ndarray
    labels: np.ndarray | None


class Stream:
    """One epoch of a `Loader`, as an iterator of `Batch`; made by `iter(loader)`.

    `epoch` is the epoch it produces (None until the first `next()`), `position` the batches
    it has delivered, counted from the start of the epoch. `close()` ends it early; it is
    idempotent and also runs when the epoch ends, fails, or the stream is dropped.

    - `epochs`: the loader's epochs, whose next epoch the stream yields (`iter(loader)` passes
      them; a stream is not made by hand).
    """

    def __init__(self, epochs: Epochs) -> None:
        self._epochs = epochs
        self.epoch: int | None = None
        self.position = 0
        self._backend: Backend | None = None
        self._ring: SlotRing | None = None
        self._todo: deque[np.ndarray] = deque()
        self._in_flight: deque[Submitted] = deque()
        self._closed = False
        self._delivered_at: float | None = None  # when the latest batch was handed out

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        try:
            if self.epoch is None:
                begun = self._epochs.begin(self)
                self.epoch, self.position = begun.epoch, begun.position
                self._todo = deque(begun.batches)
                self._in_flight = deque(begun.submitted)
                self._backend, self._ring = begun.backend, begun.ring
            elif self._delivered_at is not None:  # the consumer's time with the last batch
                self._epochs.stats.elapsed_s += time.perf_counter() - self._delivered_at
            batch = self._next_batch()
        except BaseException:
            self.close()
            raise
        if batch is None:
            self._epochs.stats.epochs += 1
            self.close()
            raise StopIteration
        return batch

    def _top_up(self) -> None:
        backend, ring, epochs = self._backend, self._ring, self._epochs
        assert backend is not None and ring is not None and self.epoch is not None
        while self._todo and len(self._in_flight) < epochs.in_flight():
            epochs.ready(self.position + len(self._in_flight))
            slot = ring.acquire()
            task = BatchTask(self._todo.popleft(), self.epoch, epochs.plan.seed)
            self._in_flight.append(Submitted(slot, backend.submit(task, slot), task.indices))
        if not self._todo:  # the epoch's last batch is submitted: the rest of the room
            epochs.look_ahead(epochs.in_flight() - len(self._in_flight))

    def _next_batch(self) -> Batch | None:
        """The next non-empty batch, or None at the epoch's end."""
        epochs, stats = self._epochs, self._epochs.stats
        asked = time.perf_counter()
        self._top_up()
        while self._in_flight:
            slot, pending, indices = self._in_flight.popleft()
            stats.requests += 1
            ready = pending.done() + sum(p.done() for _, p, _ in self._in_flight)
            ready += epochs.ready_ahead()
            stats.ready_sum += ready
            self._wait(slot, pending, indices)
            try:
                outcome = pending.result()
            except BaseException:
                self._ring_of().release(slot)
                raise
            self.position += 1
            epochs.delivered(self.epoch or 0, self.position)
            epochs.count(outcome)
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
            epochs.observe(now - asked, ready, outcome)
            return batch
        return None

    def reads_in_flight(self) -> int:
        """Samples of this epoch's in-flight batches that workers are reading right now."""
        in_flight = list(self._in_flight)  # may be called from another thread
        return sum(
            int(np.count_nonzero(slot.started))
            for slot, _, _ in in_flight
            if slot.started is not None
        )

    def _ring_of(self) -> SlotRing:
        assert self._ring is not None
        return self._ring

    def _deliver(self, slot: Slot, count: int) -> Batch:
        """The batch in `slot`: views, handed to the ring to reuse later, or (when the consumer
        keeps many) a private copy."""
        ring = self._ring_of()
        images, raw = slot.images[:count], slot.labels[:count]
        copied = ring.crowded()
        if copied:
            images, raw = images.copy(), raw.copy()
        batch = Batch(images, self._epochs.labels(raw))
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
        coordinator = self._epochs.coordinator
        limit = self._epochs.options.on_error.sample_timeout_s
        while not pending.wait(POLL_S):
            if coordinator.should_stop():
                self._raise_closed()
            if limit is not None and slot.started is not None:
                self._check_stuck(slot.started, pending, indices, limit)
        if not self._epochs.owns(self._backend):
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
        what = self._epochs.describe(index)
        skip = self._epochs.options.on_error.skip
        # Skip advice only where it is not on already (issue 35.5); with it on, the thread
        # backend cannot stop the read, and only the process backend skips it.
        fix = "(process backend) pass on_error='skip' to drop it"
        if skip:
            fix = "with on_error='skip', use the process backend, which can stop it and skip it"
        error = SampleTimeoutError(
            f"{what!r} (sample {index}) has been read for {now - started[row]:.1f} s, more than "
            f"sample_timeout_s={limit}: a FIFO, a dead network mount or a source that blocks? "
            f"Fix or remove it, raise sample_timeout_s, or {fix}"
        )
        started[row] = 0.0  # handled: a re-sent batch starts the row's clock again
        if not self._backend.time_out(pending, row, error, skip):
            self._epochs.close()  # a stuck thread cannot be stopped: this loader is done
            raise error

    def _raise_closed(self) -> None:
        self._epochs.coordinator.raise_requested_exception()
        raise ClosedError("the loader was closed while a batch was being waited for")

    def close(self) -> None:
        """End the epoch: cancel queued batches, drain the rest within DRAIN_S while the
        workers go on running. Idempotent."""
        if self._closed:
            return
        self._closed = True
        in_flight, self._in_flight = self._in_flight, deque()
        self._todo.clear()
        if self._backend is not None:
            # else nothing writes any more, or the workers are stopped next (by end())
            running = self._epochs.owns(self._backend) and self._epochs.workers_go_on()
            settle(in_flight, self._backend, self._ring_of(), running)
        if self.epoch is not None:
            self._epochs.end()

    def __del__(self) -> None:
        # Dropped unfinished (a `break`, an exception): end the epoch like close(). At
        # interpreter exit the loader's own exit hook has already closed the workers.
        with contextlib.suppress(Exception):  # a finalizer must not raise
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Stream epoch={self.epoch} position={self.position} {state}>"
