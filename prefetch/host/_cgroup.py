"""What this process's cgroup lets it run: the cores of its cpuset, and its CPU quota.

A container (`docker run --cpus=4`, a Kubernetes CPU limit) or a SLURM job may give a process
fewer cores than its affinity mask shows: a cpuset (which CPUs) or a quota (how much CPU time
per period, over any CPUs: `--cpus=4` on a 64-core host still shows 64 cores in the mask, and
64 busy workers are throttled to 4 cores' time). The bottom layer: `prefetch.host._share` caps
each rank's cores with the quota. Pure reads of
`/proc/self/cgroup` and `/sys/fs/cgroup`, cgroup v2 and v1; nothing is cached. What is read is
bounded: at most `MAX_FILE_CHARS` of a file, and no count above the host's CPUs (a cpuset of
"0-999999999" or a quota of a billion cores is not this host's): a file that is not what the
kernel writes is passed over, as one that cannot be read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator

CGROUP_MOUNT = "/sys/fs/cgroup"
# The most characters read of a cgroup file: a CPU list of every other CPU of 8,192 (Linux's
# largest NR_CPUS) is about 20,000; longer text is not a cgroup file of ours.
MAX_FILE_CHARS = 1 << 16


def cgroup_cores(read: Callable[[str], str] | None = None, cpus: int | None = None) -> int | None:
    """The cores of this process's cpuset cgroup (a container's `--cpuset-cpus`, a SLURM job's
    cores), from cgroup v2's `cpuset.cpus.effective` or v1's `cpuset.effective_cpus`: in the
    cgroup's folder under the mount, else at the mount's root (a container that sees its own
    cgroup there); None when none can be read, or when it names more CPUs than the host has
    (`cpus`, default `os.cpu_count()`). `read(path) -> text` and `cpus` are for tests."""
    reader, most = _bounded(read), cpus or os.cpu_count() or 1
    for version, controllers, path in _cgroups(reader):
        if version == 2:
            mounts, name = [CGROUP_MOUNT], "cpuset.cpus.effective"
        elif "cpuset" in controllers:
            mounts, name = [f"{CGROUP_MOUNT}/cpuset"], "cpuset.effective_cpus"
        else:
            continue
        for folder in _folders(mounts, path, ancestors=False):
            try:
                count = cpu_list_size(reader(f"{folder}/{name}"))
            except (OSError, ValueError):
                continue
            if 0 < count <= most:
                return count
    return None


def cpu_quota_cores(
    read: Callable[[str], str] | None = None, cpus: int | None = None
) -> int | None:
    """The cores' worth of CPU time this process's cgroup may use (its quota over its period,
    rounded up: 2.5 is 3), the least over its folder, the folders above it and the mount's
    root, from cgroup v2's `cpu.max` ("400000 100000"; "max": none) or v1's
    `cpu.cfs_quota_us` (-1: none) and `cpu.cfs_period_us`; None when no quota is set, none can
    be read, or the least is not below the host's CPUs (`cpus`, default `os.cpu_count()`: such
    a quota narrows nothing). `read(path) -> text` and `cpus` are for tests."""
    reader, most = _bounded(read), cpus or os.cpu_count() or 1
    least: float | None = None
    for version, controllers, path in _cgroups(reader):
        if version == 2:
            mounts = [CGROUP_MOUNT]
        elif "cpu" in controllers:
            mounts = list(
                dict.fromkeys([f"{CGROUP_MOUNT}/{','.join(controllers)}", f"{CGROUP_MOUNT}/cpu"])
            )
        else:
            continue
        for folder in _folders(mounts, path, ancestors=True):
            try:
                cores = _quota(reader, folder, version)
            except (OSError, ValueError, ArithmeticError):  # ZeroDivision, Overflow
                continue
            if cores is not None and cores > 0 and (least is None or cores < least):
                least = cores
    if least is None or least >= most:
        return None
    return max(1, math.ceil(least - 1e-9))


def cpu_list_size(text: str) -> int:
    """The CPUs in a kernel CPU list ("0-3,8-11,16" is 9), counted range by range (never
    expanded); ValueError when it is not one (a range that runs backwards, a sign, a
    non-number)."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        if not (first.isdigit() and (last or first).isdigit()) or int(last or first) < int(first):
            raise ValueError(f"not a kernel CPU list: {text[:60]!r}")
        count += int(last or first) - int(first) + 1
    return count


def _cgroups(reader: Callable[[str], str]) -> Iterator[tuple[int, list[str], str]]:
    """This process's cgroups, from /proc/self/cgroup: (2, [], path) for the v2 hierarchy,
    (1, controllers, path) for each v1 one."""
    try:
        lines = reader("/proc/self/cgroup").splitlines()
    except (OSError, ValueError):
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            _, controllers, path = parts
            yield (2, [], path) if controllers == "" else (1, controllers.split(","), path)


def _folders(mounts: list[str], path: str, *, ancestors: bool) -> Iterator[str]:
    """The folders of the cgroup `path` under each mount (and of the cgroups above it when
    `ancestors`), then each mount's root, each once."""
    seen: set[str] = set()
    for mount in mounts:
        parts = [part for part in path.split("/") if part]
        while True:
            folder = "/".join([mount, *parts])
            if folder not in seen:
                seen.add(folder)
                yield folder
            if not parts:
                break
            parts = parts[:-1] if ancestors else []


def _quota(reader: Callable[[str], str], folder: str, version: int) -> float | None:
    """The quota over the period in `folder` (cores), None when unlimited."""
    if version == 2:
        limit, _, period = reader(f"{folder}/cpu.max").strip().partition(" ")
        return None if limit == "max" else int(limit) / int(period or "100000")
    quota = int(reader(f"{folder}/cpu.cfs_quota_us"))
    return None if quota < 0 else quota / int(reader(f"{folder}/cpu.cfs_period_us"))


def _bounded(read: Callable[[str], str] | None) -> Callable[[str], str]:
    """`read` (default: the file's text), refusing more than `MAX_FILE_CHARS` with ValueError."""

    def bounded(path: str) -> str:
        if read is None:
            with open(path, encoding="ascii") as file:
                text = file.read(MAX_FILE_CHARS + 1)
        else:
            text = read(path)
        if len(text) > MAX_FILE_CHARS:
            raise ValueError(f"{path}: more than {MAX_FILE_CHARS} characters")
        return text

    return bounded
