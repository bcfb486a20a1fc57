"""One epoch of a Loader, as a thin iterator over the loader's window: take, wait, deliver.

`iter(loader)` makes a `Stream` of the loader's `Epochs` (prefetch.runtime._epochs), the only
part of the loader it uses. At the first `next()` it begins its epoch (`Epochs.begin`: the
cursor's epoch and position, the workers started unless `with loader:` owns them) and claims
that epoch's run of batches in the loader's one `Window` (prefetch.runtime._window), which
keeps the batches in flight, across epochs while `with loader:` keeps the workers. Each
`next()` tops the window up, takes the run's oldest batch, waits for it and hands it out as
`Batch(images, labels)`.

A delivered batch is a view of its slot; the ring reuses the slot once the consumer asked for
the next batch and nothing holds the view. When the consumer keeps more than the ring's kept
batches (`KEPT_REFERENCED_SLOTS`), further batches are handed out as copies, so keeping any
number costs memory only (never a slot, a shared-memory segment or its file descriptor).

`close()` (also at exhaustion, on an error, and when the stream is dropped) ends the run: its
batches still queued are cancelled and, while the workers go on running, those being decoded
are waited for within one deadline (`DRAIN_S`), then their slots returned (`Window.end`): a
worker is never left writing a slot that the ring reuses, and none is killed.
If no `with` block owns the loader, the last stream to end closes it, without that wait: the
workers are stopped (shutdown steps 3 to 5 of `prefetch.backends._lifecycle`).
"""

from __future__ import annotations

import contextlib
import time
from typing import NamedTuple

import numpy as np

from prefetch.coordinator import POLL_S
from prefetch.errors import ClosedError, SampleTimeoutError
from prefetch.runtime._epochs import Epochs
from prefetch.runtime._window import InFlight, Run, Window
from prefetch.sample import Slot


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
        self._window: Window | None = None
        self._run: Run | None = None
        self._closed = False
        self._delivered_at: float | None = None  # when the latest batch was handed out

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise StopIteration
        try:
            if self._run is None:
                self._window, self._run = self._epochs.begin()
                self.epoch, self.position = self._run.epoch, self._run.start
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

    def _next_batch(self) -> Batch | None:
        """The next non-empty batch, or None at the epoch's end."""
        epochs, stats, window, run = self._epochs, self._epochs.stats, self._window, self._run
        assert window is not None and run is not None
        asked = time.perf_counter()
        if not epochs.runs(window):  # closed meanwhile: its batches were given up
            self._raise_closed()
        window.top_up()
        while (item := window.take(run)) is not None:
            stats.requests += 1
            ready = item.pending.done() + window.ready()
            stats.ready_sum += ready
            self._wait(item)
            try:
                outcome = item.pending.result()
            except BaseException:
                window.ring.release(item.slot)
                raise
            self.position += 1
            epochs.delivered(run.epoch, self.position)
            epochs.count(outcome)
            if outcome.count == 0:
                window.ring.release(item.slot)
                window.top_up()
                continue
            batch = self._deliver(item.slot, outcome.count)
            window.top_up()
            stats.batches += 1
            stats.images += outcome.count
            now = self._delivered_at = time.perf_counter()
            stats.consumer_wait_s += now - asked
            stats.elapsed_s += now - asked
            epochs.workers.observe(now - asked, ready, outcome)
            return batch
        return None

    def _deliver(self, slot: Slot, count: int) -> Batch:
        """The batch in `slot`: views, handed to the ring to reuse later, or (when the consumer
        keeps many) a private copy."""
        assert self._window is not None
        ring = self._window.ring
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

    def _wait(self, item: InFlight) -> None:
        """Wait for `item`; raise ClosedError (or the reported error) if the loader stops.

        A close() from another thread also settles the pending batch (its chunks cancelled, or
        its slot abandoned), so a batch that is done is checked too: its window must be the
        loader's. With `sample_timeout_s`, a sample read for longer is handed to the backend to
        time out.
        """
        workers, window = self._epochs.workers, self._window
        limit = self._epochs.options.on_error.sample_timeout_s
        while not item.pending.wait(POLL_S):
            if workers.coordinator.should_stop():
                self._raise_closed()
            if limit is not None and item.slot.started is not None:
                self._check_stuck(item, limit)
        if not self._epochs.runs(window):
            self._raise_closed()

    def _check_stuck(self, item: InFlight, limit: float) -> None:
        """Time out a row of `item` whose sample has been read for more than `limit` s."""
        started, window = item.slot.started, self._window
        assert started is not None and window is not None
        now = time.monotonic()
        stuck = np.flatnonzero((started > 0) & (now - started > limit))
        if not len(stuck):
            return
        row = int(stuck[0])
        index = int(item.indices[row])
        what = self._epochs.workers.reader.describe(index)
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
        if not window.backend.time_out(item.pending, row, error, skip):
            self._epochs.close()  # a stuck thread cannot be stopped: this loader is done
            raise error

    def _raise_closed(self) -> None:
        self._epochs.workers.coordinator.raise_requested_exception()
        raise ClosedError("the loader was closed while a batch was being waited for")

    def close(self) -> None:
        """End the epoch: cancel queued batches, drain the rest within DRAIN_S while the
        workers go on running. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._run is not None and self._window is not None:
            self._epochs.end(self._window, self._run)

    def __del__(self) -> None:
        # Dropped unfinished (a `break`, an exception): end the epoch like close(). At
        # interpreter exit the loader's own exit hook has already closed the workers.
        with contextlib.suppress(Exception):  # a finalizer must not raise
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Stream epoch={self.epoch} position={self.position} {state}>"
