"""This rank's share of the host's cores: the one core count of the package.

The host's cores are shared among its ranks (`local_ranks`, prefetch.host._launchers), within
this process's affinity mask and its cgroup's cpuset and CPU quota (prefetch.host._cgroup).
`host_share` turns them into this rank's cores; `usable_cores` is the same count for one rank
(what a tool that runs once per host, or a report of the machine, uses); `default_workers` is
what a Loader starts on a share. Pure reads of `/proc` and `/sys`: nothing is cached, nothing
blocks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from prefetch._messages import counted
from prefetch.host._cgroup import cgroup_cores, cpu_quota_cores
from prefetch.host._launchers import LocalRanks, local_ranks
from prefetch.host._machine import affinity_cores


@dataclass(frozen=True)
class HostShare:
    """This rank's share of the host: `cores` it may use by default (a whole number, at least
    1), out of `pool` (the cores the host, container or job gives all its ranks), with
    `affinity` cores in its own mask; `bound` is whether that mask is the rank's own (a
    launcher bound each rank to its cores); `quota` is the cgroup's CPU quota in cores when it
    narrowed the share (else None): then `pool` is the quota, shared by all the ranks. `ranks`
    is `local_ranks()`. `exact` is the share before rounding: below one core when the ranks
    outnumber the cores they share (`crowded`)."""

    ranks: LocalRanks
    cores: int
    pool: int
    affinity: int
    bound: bool
    quota: int | None = None

    @property
    def exact(self) -> Fraction:
        """This rank's cores, unrounded: the quota or the mask among the ranks (the mask alone
        when the launcher bound it): `Fraction(2, 8)` for 8 ranks on 2 cores."""
        if self.quota is not None:
            return Fraction(self.quota, self.ranks.count)
        return Fraction(self.affinity, 1 if self.bound else self.ranks.count)

    @property
    def crowded(self) -> bool:
        """Whether the ranks outnumber the cores they share: each rank gets less than a core,
        yet runs at least one worker beside its training loop."""
        return self.exact < 1

    def describe(self) -> str:
        """The cores and where they came from, e.g. "14 cores: the host's 112 cores among 8
        ranks (LOCAL_WORLD_SIZE=8 (torchrun))", "half a core: the 4 of this cgroup's CPU
        quota (docker --cpus, a CPU limit) among 8 ranks (...)"."""
        ranks, amount = self.ranks, cores_text(self.exact)
        why = ranks.source if ranks.known else f"one rank: {ranks.source}"
        if self.quota is not None:
            quota = f"the {self.quota} of this cgroup's CPU quota (docker --cpus, a CPU limit)"
            if ranks.count == 1:
                return f"{counted(self.cores, 'usable core')} ({why}; {quota})"
            mask = f", within the {self.affinity} the launcher bound it to" if self.bound else ""
            return f"{amount}: {quota} among {ranks.count} ranks{mask} ({ranks.source})"
        if self.bound:
            among = f"; {counted(ranks.count, 'rank')} ({ranks.source})" if ranks.known else ""
            return (
                f"{amount}: this process's affinity mask, which the launcher bound to "
                f"{self.affinity} of the host's {self.pool}{among}"
            )
        if ranks.count == 1:
            return f"{counted(self.cores, 'usable core')} ({why})"
        mask = "" if self.affinity == self.pool else f"this process's {self.affinity} of "
        return (
            f"{amount}: {mask}the host's {counted(self.pool, 'core')} among {ranks.count} "
            f"ranks ({ranks.source})"
        )


# Shares of a core said in words; others as "2/7 of a core".
_PARTS = {2: "half a core", 3: "a third of a core", 4: "a quarter of a core"}


def cores_text(cores: Fraction) -> str:
    """A share of cores in words: "14 cores", "1 core" (whole cores, rounded down from 1 on),
    "half a core", "a quarter of a core", "2/7 of a core"."""
    if cores >= 1:
        return counted(int(cores), "core")
    if cores.numerator == 1 and cores.denominator in _PARTS:
        return _PARTS[cores.denominator]
    return f"{cores.numerator}/{cores.denominator} of a core"


def host_share(
    ranks_per_host: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    affinity: int | None = None,
    pool: int | None = None,
    quota: int | None = None,
    cpus: int | None = None,
    read: Callable[[str], str] | None = None,
) -> HostShare:
    """This rank's cores, from the ranks on this host (`local_ranks(ranks_per_host, environ)`),
    the cores in this process's affinity mask (`affinity`: `affinity_cores()` unless given) and
    the host's pool (`pool`: the cores of this process's cpuset cgroup, `cgroup_cores()`: a
    container's or a SLURM job's; else `os.cpu_count()`):

    - when the mask is narrower than the pool and the ranks' masks could be disjoint
      (ranks x mask <= pool), a launcher bound each rank to its cores (srun --cpu-bind, mpirun
      --bind-to, taskset per rank): the mask is this rank's share, not divided again;
    - else the ranks share the mask: its cores divided among them (at least 1; `exact` keeps
      the fraction, below 1 when the ranks outnumber the cores);
    - and at most its part of the cgroup's CPU quota (`quota`: `cpu_quota_cores()` unless
      `pool` is given), which all the ranks of a container or job share: quota / ranks.

    So 8 ranks of torchrun on a 112-core host get 14 cores each, 8 ranks that srun bound to
    14 cores each get those 14, and 8 ranks in a container given `--cpus=16` get 2 each.
    `affinity`, `pool` and `quota` are for tests of hosts this is not; so are `cpus` (the
    host's CPUs, `os.cpu_count()` unless given) and `read(path) -> text`, which reads the
    cgroup files (`prefetch.host._cgroup`, bounded by `cpus`) of containers this is not.
    """
    ranks = local_ranks(ranks_per_host, environ)
    if quota is None and pool is None:
        quota = cpu_quota_cores(read, cpus)
    mask = affinity_cores() if affinity is None else affinity
    if pool is None:
        pool = cgroup_cores(read, cpus) or cpus or os.cpu_count() or mask
    host = max(pool, mask)
    bound = mask < host and ranks.count * mask <= host
    share = HostShare(ranks, mask if bound else max(1, mask // ranks.count), host, mask, bound)
    if quota is None or Fraction(quota, ranks.count) >= share.exact:
        return share
    return HostShare(ranks, max(1, quota // ranks.count), quota, mask, bound, quota)


def usable_cores() -> int:
    """The cores this process may use, as one rank (`host_share(1).cores`): its affinity mask,
    at most its cgroup's CPU quota (`docker --cpus=4`, a Kubernetes CPU limit), which the mask
    does not show. What a tool that runs once per host (the shard writer, `prefetch bench`)
    sizes itself by."""
    return host_share(1).cores


# From this many cores on, the default worker count leaves one core to the training thread
# (and the parent's share of the work: receiving every worker's answers).
SPARE_CORE_FROM = 4


def default_workers(cores: int | None = None) -> int:
    """The worker count of `Loader(workers=None)` on `cores` (a rank's share of the host,
    `host_share().cores`; default: `usable_cores()`): one per core, less one core for the
    training thread from `SPARE_CORE_FROM` cores on (on fewer, every core decodes: the
    training thread's Python is not what a small machine is short of)."""
    cores = usable_cores() if cores is None else cores
    return cores - 1 if cores >= SPARE_CORE_FROM else cores
