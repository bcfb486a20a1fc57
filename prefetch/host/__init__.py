"""The host a loader runs on: its ranks, its cores and its memory, counted one way.

A GPU host runs one training process (a *rank*) per GPU, each with its own Loader; the host's
cores and its shared-memory folder are shared among them. What the launcher says
(`local_ranks`, `_launchers`), what the cgroup allows (`_cgroup`: a cpuset, a CPU quota) and
what this process's affinity mask holds (`_machine`) come together in one count,
`host_share(ranks_per_host)`: this rank's cores, which every default is sized by;
`usable_cores()` is that count for one rank. The bottom layer: pure reads of the environment,
`/proc` and `/sys`, checked at the door; nothing is cached, nothing blocks.
"""

from __future__ import annotations

from prefetch.host._cgroup import cgroup_cores, cpu_list_size, cpu_quota_cores
from prefetch.host._launchers import (
    LAUNCHERS,
    RANKS_VARIABLE,
    UNKNOWN,
    LocalRanks,
    local_ranks,
    slurm_count,
)
from prefetch.host._machine import affinity_cores, available_memory_bytes
from prefetch.host._share import (
    SPARE_CORE_FROM,
    HostShare,
    cores_text,
    default_workers,
    host_share,
    usable_cores,
)

__all__ = [
    "LAUNCHERS",
    "RANKS_VARIABLE",
    "SPARE_CORE_FROM",
    "UNKNOWN",
    "HostShare",
    "LocalRanks",
    "affinity_cores",
    "available_memory_bytes",
    "cgroup_cores",
    "cores_text",
    "cpu_list_size",
    "cpu_quota_cores",
    "default_workers",
    "host_share",
    "local_ranks",
    "slurm_count",
    "usable_cores",
]
