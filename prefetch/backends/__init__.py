"""Backends run batch tasks in parallel: worker threads, or worker processes on shared memory.

- `base`: the protocol a stream talks to (`Backend`, `PendingBatch`) and the data crossing it;
- `reader`: `SampleReader`, the per-batch work every backend runs;
- `ring`: the slot ring and its capacity; `shm`: the process backend's shared-memory segments;
- `threads`, `processes`: the two backends; `choose`: backend="auto", a short measurement.

`make_backend` builds the backend a loader asked for (after "auto" has been decided).
"""

from __future__ import annotations

from prefetch.backends.base import Backend
from prefetch.backends.processes import ProcessBackend
from prefetch.backends.reader import SampleReader
from prefetch.backends.threads import ThreadBackend
from prefetch.coordinator import Coordinator
from prefetch.options import REMOTE_READER_THREADS, ProcessOptions
from prefetch.storage import source_scheme


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
            _reader_threads(process, reader),
        )
    if name == "thread":
        return ThreadBackend(reader, workers, batch_size, coordinator)
    raise ValueError(f"backend must be 'thread' or 'process' here, got {name!r}")


def _reader_threads(process: ProcessOptions, reader: SampleReader) -> int:
    """The reader threads per worker process: as asked, else more for URL sources."""
    if process.threads_per_worker is not None:
        return process.threads_per_worker
    return REMOTE_READER_THREADS if source_scheme(reader.source) else 1
