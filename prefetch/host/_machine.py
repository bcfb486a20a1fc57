"""What this machine gives a process: the cores of its affinity mask, the memory left."""

from __future__ import annotations

import os


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
