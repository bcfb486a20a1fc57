"""The parent's handles in the process backend: a batch sent to a worker, and a worker.

`ProcessPending` is settled through its backend's `pump` (it holds only the backend's `pump`
and `cancel`); `WorkerHandle` is what the backend keeps per worker process: its pipe, the
batches it holds (`InFlight`) and whether it is leaving.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from multiprocessing.connection import Connection
from typing import Any, Protocol

from prefetch.backends._base import BatchOutcome, BatchTask, Slot


class Pump(Protocol):
    """What a pending batch needs from its backend."""

    def pump(self, timeout_s: float) -> None: ...

    def cancel(self, batch_id: int) -> None: ...


class ProcessPending:
    """A batch sent to one worker; its result arrives through the backend's pump."""

    def __init__(self, backend: Pump, batch_id: int) -> None:
        self._backend = backend
        self.batch_id = batch_id
        self.outcome: BatchOutcome | None = None
        self.error: BaseException | None = None
        self.cancelled = False  # the consumer no longer wants it
        self.abandoned = False  # no worker will write into its slot any more

    def done(self) -> bool:
        """Settled: its worker answered, or can no longer write into the slot."""
        return self.outcome is not None or self.error is not None or self.abandoned

    def wait(self, timeout_s: float) -> bool:
        """Wait until this batch is settled or `timeout_s` passed; returns whether it is."""
        deadline = time.monotonic() + timeout_s
        while not self.done():  # pumps at least once, so answers already sent count
            self._backend.pump(max(deadline - time.monotonic(), 0.0))
            if time.monotonic() >= deadline:
                break
        return self.done()

    def result(self) -> BatchOutcome:
        if self.error is not None:
            raise self.error
        assert self.outcome is not None, "result() before the batch was done"
        return self.outcome

    def cancel(self) -> None:
        """Stop wanting the batch; its worker skips it if it has not begun it. It is done only
        once its worker answered (or is gone), so the slot is not reused while a worker may
        still write into it."""
        if not self.cancelled:
            self.cancelled = True
            self._backend.cancel(self.batch_id)


# What a worker holds for a batch: its task, slot and size.
InFlight = tuple[BatchTask, Slot, int]


class WorkerHandle:
    """The parent's view of one worker process: its pipe and the batches it holds."""

    def __init__(self, index: int, process: Any, conn: Connection) -> None:
        self.index = index
        self.process = process
        self.conn = conn
        self.in_flight: OrderedDict[int, InFlight] = OrderedDict()
        self.answered = 0
        self.retiring = False  # sent a stop by set_workers: it leaves after its batches
        self.timed_out = False  # killed by time_out: its replacement costs no restart
