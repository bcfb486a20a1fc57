"""Backends run batch tasks in parallel: worker threads, or worker processes on shared memory.

- `base`: the protocol a stream talks to (`Backend`, `PendingBatch`) and the data crossing it;
- `reader`: `SampleReader`, the per-batch work every backend runs;
- `ring`: the slot ring and its capacity; `shm`: the process backend's shared-memory segments;
- `threads`, `processes`: the two backends; `choose`: backend="auto", a short measurement.

`make_backend` builds the backend a loader asked for (after "auto" has been decided).
"""

from __future__ import annotations

from prefetch.backends._base import Backend
from prefetch.backends._options import MAX_REMOTE_READERS_PER_PROCESS, ProcessOptions
from prefetch.backends._processes import ProcessBackend
from prefetch.backends._reader import SampleReader
from prefetch.backends._threads import ThreadBackend
from prefetch.coordinator import Coordinator
from prefetch.io._storage import reads_over_network


def make_backend(
    name: str,
    reader: SampleReader,
    *,
    workers: int,
    batch_size: int,
    depth: int,
    coordinator: Coordinator,
    process: ProcessOptions,
) -> Backend:
    """A new, not yet started backend: `name` is "thread" or "process"."""
    if name == "process":
        return ProcessBackend(
            reader,
            workers,
            batch_size,
            depth,
            coordinator,
            process.max_restarts,
            process.method,
            reader_threads(process, reader, batch_size),
        )
    if name == "thread":
        return ThreadBackend(reader, workers, batch_size, coordinator)
    raise ValueError(f"backend must be 'thread' or 'process' here, got {name!r}")


def reader_threads(process: ProcessOptions, reader: SampleReader, batch_size: int) -> int:
    """The reader threads per worker process: as asked; else, on remote URLs, one per row of
    the batch (at most `MAX_REMOTE_READERS_PER_PROCESS`); else 1."""
    if process.threads_per_worker is not None:
        return process.threads_per_worker
    if reads_over_network(reader.source):
        return min(batch_size, MAX_REMOTE_READERS_PER_PROCESS)
    return 1
