"""The data a batch task is made of, and what reading its rows produces.

`BatchTask` (which samples of which epoch), `Slot` (the preallocated batch its rows are written
into: RAM, or a shared-memory segment of the process backend), `Skipped` (a sample dropped under
`on_error="skip"`) and `ChunkOutcome` (what reading rows [start, stop) came to). Plain values,
picklable: a worker process receives the task and answers with the outcome. `split_rows` shares
a batch's rows among workers; `thread_clocks` times the reading thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from prefetch.io import CacheCounts, Tally


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


def split_rows(size: int, parts: int, first: int = 0) -> list[tuple[int, int]]:
    """Rows [first, first + size) in `parts` contiguous ranges (at most `size`, at least one)
    whose lengths differ by at most 1: how every backend shares a batch's rows among its
    workers (thread chunks, one part per worker process, a process's reader threads, a
    remote part)."""
    parts = max(1, min(parts, size))
    step, extra = divmod(size, parts)
    bounds, start = [], first
    for k in range(parts):
        stop = start + step + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@dataclass
class Skipped:
    """A sample dropped under on_error="skip"."""

    position: int
    path: str
    error: BaseException


@dataclass
class Work(Tally):
    """What reading rows cost, as counters that add up (`Tally`): `busy_s` the reading
    thread's seconds on the rows, of which `cpu_s` on a CPU and `runnable_s` waiting for one
    (the rest blocked: disk, network); `cache` what the worker's object cache did meanwhile
    (`CacheCounts`: hits, misses, bytes fetched, evictions). A new counter is a field here (or
    of `CacheCounts`): it travels to `Loader.stats()` with the rest."""

    busy_s: float = 0.0
    cpu_s: float = 0.0
    runnable_s: float = 0.0
    cache: CacheCounts = field(default_factory=CacheCounts)


@dataclass
class ChunkOutcome:
    """What decoding rows [start, stop) of a batch produced: the samples `skipped`, `read_s`
    (seconds per sample) and the `work`'s counters."""

    skipped: list[Skipped] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    work: Work = field(default_factory=Work)

    @classmethod
    def merged(cls, chunks: list[ChunkOutcome]) -> ChunkOutcome:
        """The chunks of one batch as one outcome (in row order)."""
        return cls(
            skipped=[item for chunk in chunks for item in chunk.skipped],
            read_s=[seconds for chunk in chunks for seconds in chunk.read_s],
            work=sum((chunk.work for chunk in chunks), Work()),
        )


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
