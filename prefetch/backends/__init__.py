"""The backends run batch tasks in parallel: worker threads, worker processes on shared memory,
or decode actors on the nodes of a Ray cluster.

What the runtime (`Workers`, `Stream`) uses: `make_backend` builds the backend a loader asked
for (after "auto" has been decided by `choose`, a short measurement); the `Backend` protocol
(`_base`: `submit`, `PendingBatch`, `set_workers`, `time_out`, `close`) and a finished batch
(`BatchOutcome`); the slot ring (`_ring`) and the process backend's shared memory (`_shm`);
`ProcessOptions`, `RayOptions` and the constants of the process and Ray backends (`_options`);
the Ray backend (`_ray`: its actors `_ray_actor`, the cluster `_ray_cluster`, its parts and
where rows were decoded, `DecodePlace`, `_base`; Ray is imported only when it starts); how
worker processes
start and stop, with the shutdown order and its deadlines (`_lifecycle`, used by the shard
writer too) and the open files they need (`_file_limit`). What every backend runs,
`SampleReader`, and the task and slot it is given (`BatchTask`, `Slot`) are the layer below's,
prefetch.sample. The layer imports sample, decode, plan, sources and io below it, never the
runtime.
"""

from __future__ import annotations

from prefetch.backends._base import Backend, BatchOutcome, DecodePlace, PendingBatch
from prefetch.backends._choice import choose_backend
from prefetch.backends._file_limit import (
    EXIT_OUT_OF_FILES,
    FileNeeds,
    OutOfFiles,
    receive_descriptor,
)
from prefetch.backends._lifecycle import (
    DRAIN_S,
    Stop,
    exit_code,
    exit_reason,
    parent_alive,
    start_worker,
    stop_processes,
    worker_context,
)
from prefetch.backends._options import (
    BATCHES_AT_ONCE,
    MAX_REMOTE_READERS_PER_PROCESS,
    RAY_PART_ROWS,
    RAY_PARTS_PER_ACTOR,
    ROWS_AHEAD_PER_READER,
    ProcessOptions,
    RayOptions,
)
from prefetch.backends._processes import ProcessBackend
from prefetch.backends._ray import RayBackend
from prefetch.backends._remote_error import rebuild as rebuild_error
from prefetch.backends._remote_error import with_traceback_text
from prefetch.backends._ring import SlotRing, ring_capacity
from prefetch.backends._shm import ShmRoom, SlotLayout, check_free_space, shm_room, sweep_stale
from prefetch.backends._spawning import main_script_hidden
from prefetch.backends._threads import ThreadBackend
from prefetch.coordinator import Coordinator
from prefetch.sample import SampleReader


def make_backend(
    name: str,
    reader: SampleReader,
    *,
    workers: int,
    batch_size: int,
    depth: int,
    coordinator: Coordinator,
    process: ProcessOptions,
    threads_per_worker: int = 1,
    ray: RayOptions | None = None,
    shard: tuple[int, int] = (1, 0),
    sample_timeout_s: float | None = None,
) -> Backend:
    """A new, not yet started backend: `name` is "thread", "process" (with `threads_per_worker`
    reader threads in each process, as `prefetch.runtime._choice` decided) or "ray" (with
    `ray`'s options, this loader's `shard` (num_shards, shard_index) of the job, whose ranks
    share the cluster's CPUs, and the `sample_timeout_s` its actors are watched for)."""
    if name == "ray":
        options = ray or RayOptions()
        return RayBackend(
            options, reader, workers, batch_size, coordinator, shard, sample_timeout_s
        )
    if name == "process":
        return ProcessBackend(
            reader,
            workers,
            batch_size,
            depth,
            coordinator,
            process.max_restarts,
            process.method,
            threads_per_worker,
        )
    if name == "thread":
        return ThreadBackend(reader, workers, batch_size, coordinator)
    raise ValueError(f"backend must be 'thread', 'process' or 'ray' here, got {name!r}")


__all__ = [
    "BATCHES_AT_ONCE",
    "DRAIN_S",
    "EXIT_OUT_OF_FILES",
    "MAX_REMOTE_READERS_PER_PROCESS",
    "RAY_PARTS_PER_ACTOR",
    "RAY_PART_ROWS",
    "ROWS_AHEAD_PER_READER",
    "Backend",
    "BatchOutcome",
    "Coordinator",
    "DecodePlace",
    "FileNeeds",
    "OutOfFiles",
    "PendingBatch",
    "ProcessBackend",
    "ProcessOptions",
    "RayBackend",
    "RayOptions",
    "ShmRoom",
    "SlotLayout",
    "SlotRing",
    "Stop",
    "ThreadBackend",
    "check_free_space",
    "choose_backend",
    "exit_code",
    "exit_reason",
    "main_script_hidden",
    "make_backend",
    "parent_alive",
    "rebuild_error",
    "receive_descriptor",
    "ring_capacity",
    "shm_room",
    "start_worker",
    "stop_processes",
    "sweep_stale",
    "with_traceback_text",
    "worker_context",
]
