"""The process and Ray backends' options and the constants the backends share with the runtime.

`ProcessOptions` and `RayOptions` are frozen and keyword-only: `Loader(backend=ProcessOptions(...))`
selects the process backend with it, `Loader(backend=RayOptions(...))` the Ray backend. A bad
value raises ValueError naming the option, the value and the fix.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

import numpy as np

from prefetch._checks import positive
from prefetch._messages import suggest_keywords

# Reader threads of a worker process on remote URLs: one per row of its batch, at most this many.
MAX_REMOTE_READERS_PER_PROCESS = 32
# Rows a worker process with reader threads reads at once, per reader thread: the next part's
# reads wait on storage while the current one's rows are decoded.
BATCHES_AT_ONCE = 2
# Rows kept submitted for every reader (a worker thread, or a reader thread of a worker process):
# what `Workers.in_flight` sizes the batches in flight by, so that every worker has rows to read.
ROWS_AHEAD_PER_READER = 2
START_METHODS = ("spawn", "forkserver")


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class ProcessOptions:
    """Options of the process backend; `Loader(backend=ProcessOptions(...))` selects it.

    - `max_restarts`: how many times a crashed worker (killed, segfaulted) is restarted and its
      batches re-sent before `WorkerCrashedError`; 0 makes the first crash fatal.
    - `start_method`: "spawn" or "forkserver"; None takes the program's default when it is one
      of those, else "spawn". Workers are never forked: forking a process that runs threads
      (TensorFlow's, the loader's) can deadlock the child.
    - `threads_per_worker`: reader threads in each worker process, which split its batch
      between them. 1 suits local disks; more let a process overlap reads that wait on
      storage (a network mount, an object store) instead of the CPU. None (the default): on
      remote URLs, one per row of the batch (at most `MAX_REMOTE_READERS_PER_PROCESS`), so a
      process reads its whole batch at once; else 1.
    """

    max_restarts: int = 3
    start_method: str | None = None
    threads_per_worker: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(
            self.max_restarts, (int, np.integer)
        ):
            raise ValueError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.threads_per_worker is not None:
            positive("threads_per_worker", self.threads_per_worker)
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(
                f"start_method must be one of {START_METHODS}, got {self.start_method!r}: "
                "process workers are never forked, because forking a process that has started "
                "threads (TensorFlow's, the loader's) can deadlock the child"
            )

    @property
    def method(self) -> str:
        """The start method workers use: `start_method`, or the default as described."""
        if self.start_method is not None:
            return self.start_method
        # The default, as set by the program, else the platform's (forkserver from Python 3.14).
        default = multiprocessing.get_start_method(allow_none=True)
        default = default or multiprocessing.get_all_start_methods()[0]
        return default if default in START_METHODS else "spawn"


# A Ray backend's batch is cut into parts of at most this many rows (`split_rows`), each run by
# one decode actor. Each part is one call and one object in Ray's store, which cost about 3 ms
# of CPU (driver, actor and raylet together, measured on the 2-core VM) whatever its size: 16
# rows a part took 1.24 ms of CPU per 224 x 224 training crop against the process backend's
# 0.78, 64 rows 0.89 (the setup of benchmarks/ray_decode.py's "overhead" rows, all rows then
# through the object store; docs/beyond-the-host.md, "What it costs").
RAY_PART_ROWS = 64
# Parts each decode actor holds at once: one being decoded, the next already on its way, so an
# actor never waits for the network between two parts. With `RAY_PART_ROWS`, this sizes the
# window of batches in flight for remote decode (`prefetch.runtime._choice.in_flight`).
RAY_PARTS_PER_ACTOR = 2


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Decode on the CPUs of a Ray cluster too; `Loader(backend=RayOptions(...))` selects it.

    The training process plans every batch (order, crop boxes, flips) and assembles it; decode
    actors on the cluster's nodes run the same per-sample path as the other backends on parts
    of each batch and return rows through Ray's object store (docs/beyond-the-host.md). The
    Loader's `workers` are the actors on this process's own node ("local workers", sized as
    any backend's workers: by default one per core of this rank's share of the host; they
    reserve no Ray CPU; `workers=0` for none); the actors below run on the other nodes.

    - `address`: the cluster's address ("10.0.0.1:6379", what `ray start --head` printed);
      None for the cluster `ray.init` already joined in this process, else `RAY_ADDRESS`, else
      a cluster started on this machine with `ray start`.
    - `cpus`: decode actors on the other nodes, one CPU each (Ray reserves it); None for this
      rank's share of those nodes' CPUs: each node's CPUs divided among the loaders that
      `Loader.shard` splits the job into, so 8 ranks of one job share them instead of each
      reserving all of them.
    - `resource`: a custom resource that the decode nodes declare
      (`ray start --resources='{"prefetch": 1}'`, any amount): only nodes that have it get
      actors; None for every other node with CPUs.
    - `max_retries`: how many times a part is run again after the actor running it died (its
      node left, or it crashed) before `WorkerCrashedError` names its samples.
    - `connect_timeout_s`: how long reaching the cluster at `address` may take before an error
      that names the address.
    - `lost_timeout_s`: how long the loader waits for a decode actor when it has none (no local
      workers, and every decode node gone or none started) before the batches fail with an
      error that says so.
    """

    address: str | None = None
    cpus: int | None = None
    resource: str | None = None
    max_retries: int = 3
    connect_timeout_s: float = 10.0
    lost_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.address is not None and (not isinstance(self.address, str) or not self.address):
            raise ValueError(
                f"address must be a Ray cluster's address such as '10.0.0.1:6379', or None for "
                f"the cluster ray.init joined, got {self.address!r}"
            )
        cpus = self.cpus
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 0):
            raise ValueError(
                f"cpus must be an int >= 0 (decode actors on the other nodes; 0 for none), or "
                f"None for this rank's share of the cluster's, got {cpus!r}"
            )
        if self.resource is not None and (not isinstance(self.resource, str) or not self.resource):
            raise ValueError(
                "resource must be the name of a custom resource the decode nodes declare "
                f"(ray start --resources='{{\"prefetch\": 1}}'), or None, got {self.resource!r}"
            )
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("connect_timeout_s", "lost_timeout_s"):
            seconds = getattr(self, name)
            number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            if not number or not seconds > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, got {seconds!r}")
