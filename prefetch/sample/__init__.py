"""The per-sample pipeline: read a sample, plan its crop, decode it, write it into a batch's row.

`SampleReader` (`_reader`) is the whole per-batch task, picklable, run by every backend (a
worker thread, or a worker process on a shared-memory slot); `BatchTask`, `Slot`, `Skipped` and
`ChunkOutcome` (`_task`) are the data it reads and writes. The layer sits between decode (and
plan, sources, io) below and the backends above: backends only run these tasks in parallel.
"""

from __future__ import annotations

from prefetch.sample._reader import SampleReader
from prefetch.sample._task import (
    BatchTask,
    ChunkOutcome,
    Skipped,
    Slot,
    Work,
    split_rows,
    thread_clocks,
)

__all__ = [
    "BatchTask",
    "ChunkOutcome",
    "SampleReader",
    "Skipped",
    "Slot",
    "Work",
    "split_rows",
    "thread_clocks",
]
