"""The parent's handles in the process backend: a batch split into parts, and a worker.

A batch's rows are shared among the workers: `submit` splits them in contiguous parts (`Part`),
one per worker it sends a part to, so N workers decode N samples of one batch at once whatever
the number of batches in flight. `ProcessPending` is the batch: it is settled through its
backend's `pump` (it holds only the backend's `pump` and `cancel`) once every part is, so no
worker can still write into its slot. `WorkerHandle` is what the backend keeps per worker
process: its pipe, the parts it holds (`InFlight`) and whether it is leaving.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Protocol

from prefetch._messages import counted
from prefetch.backends._answers import AnswerReader
from prefetch.backends._base import BatchOutcome, compact
from prefetch.coordinator import Deadline
from prefetch.errors import WorkerCrashedError
from prefetch.sample import BatchTask, ChunkOutcome, Skipped, Slot


class Pump(Protocol):
    """What a pending batch needs from its backend."""

    def pump(self, timeout_s: float) -> None: ...

    def cancel(self, batch_id: int) -> None: ...


@dataclass(frozen=True)
class Part:
    """Rows [start, stop) of the batch `task` in `slot`: what one worker is sent at a time."""

    task: BatchTask
    slot: Slot
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


class ProcessPending:
    """A batch whose parts were sent to workers; its parts' answers arrive through the pump."""

    def __init__(self, backend: Pump, batch_id: int, slot: Slot, size: int, parts: int) -> None:
        self._backend = backend
        self.batch_id = batch_id
        self.slot = slot
        self.size = size
        self.outcome: BatchOutcome | None = None
        self.error: BaseException | None = None
        self.cancelled = False  # the consumer no longer wants it
        self.abandoned = False  # no worker will write into its slot any more
        # What each part (in row order) came to: a ChunkOutcome, an error, or None (not yet).
        self._answers: list[ChunkOutcome | BaseException | None] = [None] * parts
        self._dropped = False  # a part was cancelled before it began: nothing to deliver

    def settle_part(self, part: int, answer: ChunkOutcome | BaseException | None) -> None:
        """Part `part` answered (`None`: it was dropped before it began). Once every part has,
        the batch is settled: abandoned, failed with the first part's error in row order, or
        done with the rows of its parts compacted."""
        if answer is None:
            self._dropped = True
            answer = ChunkOutcome()
        self._answers[part] = answer
        if any(a is None for a in self._answers):
            return
        if self._dropped or self.cancelled:
            self.abandoned = True
            return
        errors = [a for a in self._answers if isinstance(a, BaseException)]
        if errors:
            self.error = errors[0]
            return
        merged = ChunkOutcome.merged([a for a in self._answers if isinstance(a, ChunkOutcome)])
        skipped: list[Skipped] = merged.skipped
        self.outcome = BatchOutcome.of(merged, compact(self.slot, self.size, skipped), skipped)

    def fail(self, error: BaseException) -> None:
        """Settle the whole batch with `error` at once (no worker writes into it any more)."""
        self.error = error

    def done(self) -> bool:
        """Settled: every part answered, or none can write into the slot any more."""
        return self.outcome is not None or self.error is not None or self.abandoned

    def wait(self, timeout_s: float) -> bool:
        """Wait until this batch is settled or `timeout_s` passed; returns whether it is."""
        deadline = Deadline(timeout_s)
        while not self.done():  # pumps at least once, so answers already sent count
            self._backend.pump(deadline.remaining())
            if deadline.expired():
                break
        return self.done()

    def result(self) -> BatchOutcome:
        if self.error is not None:
            raise self.error
        assert self.outcome is not None, "result() before the batch was done"
        return self.outcome

    def cancel(self) -> None:
        """Stop wanting the batch; workers skip its parts they have not begun. It is done only
        once every part's worker answered (or is gone), so the slot is not reused while a
        worker may still write into it."""
        if not self.cancelled:
            self.cancelled = True
            self._backend.cancel(self.batch_id)


# What a worker holds for a part it was sent: the batch's id, the part's number and the part.
InFlight = tuple[int, int, Part]


_NEVER_BEGAN = (
    ". It died before it began any sample, so its start-up may have failed: see its traceback "
    "on stderr (a script that starts process workers needs `if __name__ == '__main__':` around "
    "its main code)"
)


class WorkerHandle:
    """The parent's view of one worker process: its pipe and the parts it holds, by part id."""

    def __init__(self, index: int, process: Any, conn: Connection) -> None:
        self.index = index
        self.process = process
        self.conn = conn
        self.answers = AnswerReader(conn.fileno())
        self.in_flight: OrderedDict[int, InFlight] = OrderedDict()
        self.answered = 0
        self.retiring = False  # sent a stop by set_workers: it leaves after its parts
        self.timed_out = False  # killed by time_out: its replacement costs no restart

    def rows(self) -> int:
        """Rows of the parts it holds: how busy it is."""
        return sum(part.rows for _, _, part in self.in_flight.values())

    def begun(self, describe: Callable[[int], str]) -> list[str]:
        """The samples it began and did not finish (their rows' clocks run), named by
        `describe(index)`: once it died, the sample that killed it, if one did."""
        found = []
        for _, _, part in self.in_flight.values():
            if part.slot.started is not None:
                rows = part.slot.started[part.start : part.stop].nonzero()[0] + part.start
                found += [describe(int(part.task.indices[row])) for row in rows]
        return found

    def sent_files(self, describe: Callable[[int], str]) -> list[str]:
        """The samples of the parts it holds, named by `describe(index)`."""
        return [
            describe(int(index))
            for _, _, part in self.in_flight.values()
            for index in part.task.indices[part.start : part.stop]
        ]

    def crashed(
        self, reason: str, restarts: int, max_restarts: int, files: list[str], began: bool
    ) -> WorkerCrashedError:
        """The error for this worker's death past `max_restarts`: `reason` names its exit code
        or signal and the sample it was reading (`began`: it had begun one, `begun`); `files`
        what it held. Only a worker that never answered and began no sample may have failed
        to start."""
        return WorkerCrashedError(
            f"worker process {self.process.name} (pid {self.process.pid}) died with "
            f"{reason}, after {counted(restarts, 'restart')} (max_restarts="
            f"{max_restarts}); its part of the batch held {counted(len(files), 'file')}: "
            f"{files[:8]}"
            + (" ..." if len(files) > 8 else "")
            + (_NEVER_BEGAN if self.answered == 0 and not began else "")
        )
