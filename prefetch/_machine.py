"""What this machine gives a loader: the cores this process may use, the memory left.

The bottom layer: the backends (backend="auto") and the runtime (worker counts, the tuner's
memory budget) ask the same functions.
"""

from __future__ import annotations

import os

from prefetch._cgroup import cpu_quota_cores


def available_memory_bytes() -> int:
    """RAM the system can still give: Linux's MemAvailable, else free pages, else 1 GiB."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 2**30


def affinity_cores() -> int:
    """The CPU cores this process may run on (`os.sched_getaffinity`, or `os.cpu_count()`)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def usable_cores() -> int:
    """The cores this process may use: those it may run on (`affinity_cores`), at most its
    cgroup's CPU quota (`prefetch._cgroup.cpu_quota_cores`: `docker --cpus=4`, a Kubernetes
    CPU limit), which the mask does not show."""
    mask = affinity_cores()
    quota = cpu_quota_cores()
    return mask if quota is None else min(mask, quota)


# From this many usable cores on, the default worker count leaves one core to the training
# thread (and the parent's share of the work: receiving every worker's answers).
SPARE_CORE_FROM = 4


def default_workers(cores: int | None = None) -> int:
    """The worker count of `Loader(workers=None)` on `cores` (a rank's share of the host,
    `prefetch._host.host_share`; default: the usable cores): one per core, less one core for
    the training thread from `SPARE_CORE_FROM` cores on (on fewer, every core decodes: the
    training thread's Python is not what a small machine is short of)."""
    cores = usable_cores() if cores is None else cores
    return cores - 1 if cores >= SPARE_CORE_FROM else cores
