"""The backend protocol, and what a finished batch comes to.

A backend runs batch tasks and returns a `PendingBatch` per batch; the stream (one epoch) only
ever talks to this small protocol, from one thread:

    backend.start(); backend.new_slot() -> Slot; backend.submit(task, slot) -> PendingBatch;
    backend.set_workers(n); backend.forget_slot(slot); backend.close()

Every backend runs the same per-batch code, `SampleReader.read_into` (the layer below,
prefetch.sample), which writes decoded samples straight into a `Slot`; the task, the slot and
what reading rows produced (`BatchTask`, `Slot`, `ChunkOutcome`, `Skipped`) are defined there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

from prefetch.sample import BatchTask, ChunkOutcome, Skipped, Slot


@dataclass
class BatchOutcome(ChunkOutcome):
    """A finished batch: the first `count` rows of the slot are valid, in order; the rest are
    its chunks' outcome, merged (`skipped` in row order)."""

    count: int = 0

    @classmethod
    def of(cls, chunk: ChunkOutcome, count: int, skipped: list[Skipped]) -> BatchOutcome:
        """A finished batch of `count` valid rows from its (merged) chunk outcome."""
        shared = {field.name: getattr(chunk, field.name) for field in fields(chunk)}
        return cls(**{**shared, "skipped": skipped, "count": count})


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

    def starting(self) -> int:
        """Workers started but not ready yet (a spawned process that has not answered a batch:
        it is still importing), which the tuner must not judge a worker count by."""
        ...

    def forget_slot(self, slot: Slot) -> None: ...

    def time_out(self, pending: Any, row: int, error: BaseException, skip: bool) -> bool:
        """Row `row` of `pending` has been read for too long (`error` says so).

        Returns False when the backend cannot stop the stuck work: the consumer then raises
        `error` and closes the loader. Otherwise the pending batch settles by itself: re-sent
        with the row skipped when `skip`, else failing with `error`.
        """
        ...

    def close(self) -> None: ...
