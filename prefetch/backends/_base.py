"""The backend protocol and the data that crosses it.

A backend runs batch tasks and returns a `PendingBatch` per batch; the stream (one epoch) only
ever talks to this small protocol, from one thread:

    backend.start(); backend.new_slot() -> Slot; backend.submit(task, slot) -> PendingBatch;
    backend.set_workers(n); backend.forget_slot(slot); backend.close()

Every backend runs the same per-batch code, `SampleReader.read_into` (prefetch.backends._reader),
which writes decoded samples straight into a `Slot`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np


@dataclass(eq=False)
class Slot:
    """One preallocated batch: `images` (N, H, W, C) uint8 and `labels` (N,) int32.

    `name` names the shared-memory segment behind a process-backend slot ("" otherwise).
    `started` (float64 (N,)) holds, for each row, the `time.monotonic()` at which a worker began
    reading its sample, and 0 once it is written: how the consumer sees a sample that never
    returns (`sample_timeout_s`). The clock is system-wide, so worker processes share it.
    """

    images: np.ndarray
    labels: np.ndarray
    name: str = ""
    started: np.ndarray | None = None


@dataclass(frozen=True)
class BatchTask:
    """Decode the samples `indices` (source indices, in batch order) of `epoch`.

    A transform's random generator derives from (seed, epoch, sample index) only. The rows
    in `timed_out` are not read but skipped: an earlier worker never returned from them.
    """

    indices: np.ndarray
    epoch: int
    seed: int
    timed_out: tuple[int, ...] = ()


@dataclass
class Skipped:
    """A sample dropped under on_error="skip"."""

    position: int
    path: str
    error: BaseException


@dataclass
class ChunkOutcome:
    """What decoding rows [start, stop) of a batch produced; `read_s`: seconds per sample;
    `cache_hits`, `cache_misses`: samples read from a kept local copy, or copied first;
    `cache_fetched_bytes`, `cache_evictions`, `cache_evicted_bytes`: what the worker's cache
    read from storage and evicted meanwhile (`ObjectCache.take_counts`)."""

    skipped: list[Skipped] = field(default_factory=list)
    busy_s: float = 0.0
    cpu_s: float = 0.0
    runnable_s: float = 0.0
    read_s: list[float] = field(default_factory=list)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_fetched_bytes: int = 0
    cache_evictions: int = 0
    cache_evicted_bytes: int = 0

    @classmethod
    def merged(cls, chunks: list[ChunkOutcome]) -> ChunkOutcome:
        """The chunks of one batch as one outcome (in row order)."""
        sums = {
            name: sum(getattr(chunk, name) for chunk in chunks)
            for name in (
                "busy_s",
                "cpu_s",
                "runnable_s",
                "cache_hits",
                "cache_misses",
                "cache_fetched_bytes",
                "cache_evictions",
                "cache_evicted_bytes",
            )
        }
        return cls(
            skipped=[item for chunk in chunks for item in chunk.skipped],
            read_s=[seconds for chunk in chunks for seconds in chunk.read_s],
            **sums,
        )


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
