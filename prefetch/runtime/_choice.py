"""The one place where a loader's workers are sized and `backend="auto"` is settled.

Every default here is this rank's share of the host, not the host (`prefetch.host.host_share`:
the ranks on the host from the launcher or `PREFETCH_RANKS_PER_HOST`, and the cores that leaves
this one); so 8 ranks of torchrun on a 112-core host take 13 worker processes each, not 111.

- `planned_workers`, when the Loader is made: `workers=N` as given (said once with a
  `TooManyWorkersWarning` when N is above the rank's cores, unless the files are remote URLs,
  whose workers wait on the network), else one per core of the share, less one from
  `SPARE_CORE_FROM` cores on (`prefetch.host.default_workers`). Ranks that outnumber the
  cores they share (a share below one core: 8 ranks on 2 cores, or under `--cpus=4`) still
  run a worker each: said with a `TooManyWorkersWarning` once per process and text, whatever
  `workers` is (`too_many_ranks`).
- `decide`, when the workers first start: the backend (`choose_backend` for "auto"; threads when
  the process backend's batch slots do not fit this rank's share of /dev/shm), the worker count
  (tuned remote URLs start above one per core: `remote_start`) and the slots' memory (`ring_bytes`
  of `in_flight` batches), with the reason written once: what `stats().backend_reason` says.

Pure functions of the options, the reader and the share, apart from `choose_backend`'s short
measurement and the reading of /dev/shm's size.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass

import numpy as np

from prefetch._messages import counted, sized
from prefetch.backends import (
    MAX_REMOTE_READERS_PER_PROCESS,
    RAY_PART_ROWS,
    RAY_PARTS_PER_ACTOR,
    ROWS_AHEAD_PER_READER,
    SlotLayout,
    check_free_space,
    choose_backend,
    ring_capacity,
    shm_room,
)
from prefetch.errors import TooManyWorkersWarning
from prefetch.host import RANKS_VARIABLE, SPARE_CORE_FROM, HostShare, default_workers
from prefetch.runtime._autoscale import connection_cap
from prefetch.runtime._options import (
    REMOTE_PROCESSES_PER_CORE,
    REMOTE_READER_THREADS,
    Autotune,
    LoaderOptions,
)
from prefetch.sample import SampleReader
from prefetch.sources import reads_over_network

# What workers=16 on 2 cores cost against the default, measured (docs/tuning.md, "Workers and
# cores": benchmarks/oversubscribed.py, and issue 41's 22.9 s against 2.3 s); the warning
# quotes it.
MEASURED = (
    "on 2 cores, workers=16 took 4x to 10x as long as the default to the first batch and "
    "decoded no faster after it"
)


@dataclass(frozen=True)
class Decision:
    """What `decide` settled: the backend, the worker count to start with, the bytes of batch
    slots they may own (`ring_bytes`) and why (`reason`, `stats().backend_reason`)."""

    backend: str
    workers: int
    ring_bytes: int
    reason: str


# The texts of the crowded-ranks warnings this process has said (each is said once).
_SAID: set[str] = set()
_SAID_LOCK = threading.Lock()


def planned_workers(options: LoaderOptions, share: HostShare, remote: bool) -> int:
    """The worker count a loader is made with (see the module docstring); warns once about a
    fixed count above the share of the cores, and once per process about ranks that
    outnumber their cores."""
    workers = options.workers
    asked = None if workers is None or isinstance(workers, Autotune) else int(workers)
    if share.crowded:
        _say_once(too_many_ranks(share, asked))
    elif asked is not None and asked > share.cores and not remote:
        warnings.warn(too_many_workers(asked, share), TooManyWorkersWarning, _user_level())
    return default_workers(share.cores) if asked is None else asked


def too_many_ranks(share: HostShare, asked: int | None) -> str:
    """The warning for ranks that outnumber the cores they share (`share.crowded`): the
    ranks, the cores, this rank's fraction of one, and the fix, which is fewer ranks or more
    cores (no worker count can be below one); with `workers=asked` above one, what that adds."""
    ranks = share.ranks.count
    cores = share.quota if share.quota is not None else share.affinity
    on = f"{counted(cores, 'core')}{' (the CPU quota)' if share.quota is not None else ''}"
    crowd = f"{counted(ranks, 'worker')} and {ranks} training loops"
    what = f"each rank's share of the cores is {share.describe()}"
    if asked is not None and asked > 1:
        what = (
            f"workers={asked} on each of {ranks} ranks is {asked * ranks} workers for {on}; "
            f"{what}. Fewer workers cannot fix it: with workers=1, the least, {crowd} still "
            f"take turns on {on}"
        )
    else:
        what += f", yet each rank runs a worker: {crowd} take turns on {on}"
    return (
        f"prefetch: {what}. Run at most {counted(cores, 'rank')} on these "
        "cores, or give them more (more CPUs for the job or container, a larger docker --cpus "
        f"or CPU limit); if fewer ranks share this host, set {RANKS_VARIABLE}"
    )


def _say_once(message: str) -> None:
    """Warn `message` (a TooManyWorkersWarning naming the user's line) unless this process
    has said it: it is about the process's ranks, not about one Loader."""
    with _SAID_LOCK:
        if message in _SAID:
            return
        _SAID.add(message)
    warnings.warn(message, TooManyWorkersWarning, _user_level())


def too_many_workers(asked: int, share: HostShare) -> str:
    """The warning for `workers=asked` above the share: the counts, where they came from, the
    measured cost and the fix."""
    ranks = share.ranks
    if ranks.count > 1:
        what = (
            f"workers={asked} on each of {ranks.count} ranks ({ranks.source}) is "
            f"{asked * ranks.count} workers for this host's {counted(share.pool, 'core')}; "
            f"this rank's share is {share.describe()}"
        )
    else:
        what = f"workers={asked} on {share.describe()}"
    return (
        f"prefetch: {what}. Workers beyond the cores only take turns on them ({MEASURED}; "
        f"docs/tuning.md). Leave workers unset (here {default_workers(share.cores)}: one per "
        f"core of the share) or pass at most workers={share.cores}; workers='auto' tunes within "
        "the cores"
    )


def decide(
    options: LoaderOptions,
    reader: SampleReader,
    first_batch: np.ndarray,
    share: HostShare,
    planned: int,
    *,
    tuned: bool,
    remote: bool,
) -> Decision:
    """Backend, worker count and slot memory of a loader starting its workers for the first
    time, and the reason, once. `planned` is `planned_workers`; `first_batch` (sample indices)
    is what backend="auto" measures for a source that is not a file source."""
    auto = options.backend == "auto"
    if auto:
        choice = choose_backend(reader, first_batch, tuned=tuned)
        name, why = choice.name, choice.reason
    else:
        name, why = options.backend, asked_for(options)
    room = shm_room(share.ranks.count)

    def start_count(backend: str) -> int:
        if tuned and remote:
            return max(planned, remote_start(backend == "process", share.cores))
        return planned

    if name == "process" and room is not None:
        needed = ring_bytes(options, reader, "process", start_count("process"))
        if not auto:  # asked for: the slots must fit what is free (MemoryError saying how)
            slots = ring_capacity(in_flight(options, reader, name, start_count(name)))
            check_free_space(needed, slots, options.batch_size)
        elif needed > room.share:
            name = "thread"
            why += (
                f"; but the process backend's batch slots take {sized(needed)} of shared memory, "
                f"more than {room.folder} holds for it ({room.describe()}; docs/processes.md: "
                "/dev/shm)"
            )
    count = start_count(name)
    ring = ring_bytes(options, reader, name, count)
    where = "in RAM"  # a thread backend's slots, or a process backend's without /dev/shm
    if name == "process" and room is not None:
        where = f"of {room.folder} ({room.describe()})"
    backend = f"auto: {name} ({why})" if auto else why
    workers = _workers_text(options, share, count, tuned, remote)
    reason = f"{backend}; {workers}; batch slots {sized(ring)} {where}"
    return Decision(name, count, ring, reason)


def reader_threads(options: LoaderOptions, reader: SampleReader) -> int:
    """The reader threads in each worker process: `ProcessOptions.threads_per_worker` as
    asked; else, on remote URLs, one per row of the batch (at most
    `MAX_REMOTE_READERS_PER_PROCESS`), whose reads mostly wait; else 1."""
    if options.process.threads_per_worker is not None:
        return options.process.threads_per_worker
    if reads_over_network(reader.source):
        return min(options.batch_size, MAX_REMOTE_READERS_PER_PROCESS)
    return 1


def asked_for(options: LoaderOptions) -> str:
    """The reason of a backend the user named ("backend='thread' was asked for"), "" for auto."""
    return "" if options.backend == "auto" else f"backend={options.backend!r} was asked for"


def in_flight(options: LoaderOptions, reader: SampleReader, backend: str, workers: int) -> int:
    """Batches an epoch keeps submitted: `depth`, and more when the workers need more rows
    than that to all be busy: `ROWS_AHEAD_PER_READER` rows for every reader (a worker
    thread, or each reader thread of a worker process), so that dozens of workers, or
    workers waiting on remote storage, each have a sample to read while the oldest batch's
    last rows finish. Both backends share every batch's rows among their workers.

    For the Ray backend (`workers`: its decode actors ready now) the window is deeper: every
    actor holds `RAY_PARTS_PER_ACTOR` parts of up to `RAY_PART_ROWS` rows (one decoding, the
    next on its way over the network), and one more waits for it in this process, so that an
    actor ahead of the oldest batch's never idles until that batch is delivered. This window
    is the only bound on the parts, and on the rows in Ray's object store."""
    if backend == "ray":
        part = min(options.batch_size, RAY_PART_ROWS)
        rows = (RAY_PARTS_PER_ACTOR + 1) * part * workers
        return max(options.depth, -(-rows // options.batch_size))
    readers = workers
    if backend == "process":
        readers *= reader_threads(options, reader)
    return max(options.depth, -(-ROWS_AHEAD_PER_READER * readers // options.batch_size))


def ring_bytes(options: LoaderOptions, reader: SampleReader, backend: str, workers: int) -> int:
    """The bytes of batch slots the ring may own at once: the loader's memory bound for decoded
    batches (`ring_capacity(in_flight(...))` slots of `batch_size` rows)."""
    layout = SlotLayout(options.batch_size, reader.options.shape)
    return ring_capacity(in_flight(options, reader, backend, workers)) * layout.nbytes


def remote_start(process: bool, cores: int) -> int:
    """The worker count a tuned loader of remote URLs starts at on `cores` (the rank's share):
    `REMOTE_READER_THREADS` threads per core (within `connection_cap`), or
    `REMOTE_PROCESSES_PER_CORE` processes per core (each reads a batch per reader thread):
    reads wait, so one per core is too few, and processes started later cost a spawn each while
    the tuner waits for them."""
    if process:
        return REMOTE_PROCESSES_PER_CORE * cores
    return min(REMOTE_READER_THREADS * cores, connection_cap())


def _workers_text(
    options: LoaderOptions, share: HostShare, count: int, tuned: bool, remote: bool
) -> str:
    """The worker count and where it came from, e.g. "13 workers, one per core of 14 cores: the
    host's 112 among 8 ranks (LOCAL_WORLD_SIZE=8 (torchrun)), less one for the training
    thread"."""
    cores, workers = share.describe(), counted(count, "worker")
    if options.workers is not None and not isinstance(options.workers, Autotune):
        return f"{workers} (workers={options.workers}) on {cores}"
    if tuned and remote:
        return f"{workers} to start, tuned (remote URLs: reads wait) on {cores}"
    first = f"{workers}{' to start, tuned' if tuned else ''}"
    if share.crowded:
        return f"{first}, the least, on {cores}"
    spare = ", less one for the training thread" if share.cores >= SPARE_CORE_FROM else ""
    return f"{first}, one per core of {cores}{spare}"


def _user_level() -> int:
    """The `stacklevel` of the first frame outside prefetch: the user's line that made the
    Loader (or called the prefetch function that did), which a warning then names."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
