"""The ranks on this host and each one's share of its cores.

A GPU host runs one training process (a *rank*) per GPU, each with its own Loader; the host's
cores and its shared-memory folder are shared among them. `local_ranks` reads how many ranks
this host runs (and this process's place among them) from what the launcher set, or from what
the user gave; `host_share` turns that into this rank's cores (its part of `/dev/shm` is
`prefetch.backends.ShmRoom`'s, from the same count of ranks). The bottom layer: the runtime
sizes its defaults with these, and the listing kept per host and the guide cite them. Pure
reads of the environment and of `/proc`, `/sys`: nothing is cached, nothing blocks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from prefetch._cgroup import cgroup_cores, cpu_quota_cores
from prefetch._machine import affinity_cores

# The variable a user sets to say how many ranks share this host, above any launcher's.
RANKS_VARIABLE = "PREFETCH_RANKS_PER_HOST"

# The launchers' variables, in the order they are read: (count, local rank, launcher). The
# first count that is set (and a whole number >= 1) wins. SLURM's are read only inside a task
# that srun started (SLURM_LOCALID is set): a batch script's own process is one process, not
# its job's tasks. A SLURM count may be a list per node ("2(x3),1"): the entry of this node
# (SLURM_NODEID) is taken, or the largest when the node is not known.
LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "torchrun"),
    ("SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("SLURM_NTASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("SLURM_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
    ("MPI_LOCALNRANKS", "MPI_LOCALRANKID", "MPICH / Intel MPI"),
)


@dataclass(frozen=True)
class LocalRanks:
    """How many ranks run on this host (`count`), this process's local rank among them (`rank`,
    None when nothing says), and where the count came from (`source`, for messages:
    "LOCAL_WORLD_SIZE=8 (torchrun)", "ranks_per_host=4", "no launcher variable set")."""

    count: int
    rank: int | None
    source: str

    @property
    def known(self) -> bool:
        """Whether anything gave the count (a launcher's variable, or the user)."""
        return self.source != UNKNOWN


UNKNOWN = "no launcher variable set"


def local_ranks(
    ranks_per_host: int | None = None, environ: Mapping[str, str] | None = None
) -> LocalRanks:
    """The ranks on this host, read in this order (the first one set wins):

    1. `ranks_per_host`, given by the caller (the Loader's `ranks_per_host=`);
    2. `PREFETCH_RANKS_PER_HOST` (a whole number >= 1, else ValueError);
    3. `LOCAL_WORLD_SIZE` (torchrun; local rank `LOCAL_RANK`);
    4. inside an srun task (`SLURM_LOCALID` set, the local rank): `SLURM_STEP_TASKS_PER_NODE`,
       then `SLURM_NTASKS_PER_NODE`, then `SLURM_TASKS_PER_NODE` (a list per node such as
       "2(x3),1": this node's entry by `SLURM_NODEID`, else the largest);
    5. `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI; `OMPI_COMM_WORLD_LOCAL_RANK`);
    6. `MPI_LOCALNRANKS` (MPICH's Hydra, Intel MPI; `MPI_LOCALRANKID`);
    7. else one rank ("no launcher variable set").

    A launcher's variable that is not a whole number >= 1 is passed over (the next is read):
    a stray variable must not stop training. `environ` defaults to `os.environ`.
    """
    env = os.environ if environ is None else environ
    if ranks_per_host is not None:
        count = _whole(str(ranks_per_host)) if not isinstance(ranks_per_host, bool) else None
        if count is None:
            raise ValueError(f"ranks_per_host must be an int >= 1, got {ranks_per_host!r}")
        return LocalRanks(count, None, f"ranks_per_host={count}")
    given = env.get(RANKS_VARIABLE)
    if given is not None:
        count = _whole(given)
        if count is None:
            raise ValueError(
                f"{RANKS_VARIABLE} must be a whole number >= 1 (the training processes on this "
                f"host), got {given!r}: fix or unset it"
            )
        return LocalRanks(count, None, f"{RANKS_VARIABLE}={count}")
    for count_name, rank_name, launcher in LAUNCHERS:
        value = env.get(count_name)
        if value is None or (launcher == "SLURM" and rank_name not in env):
            continue
        slurm = launcher == "SLURM"
        count = _slurm_count(value, env.get("SLURM_NODEID")) if slurm else _whole(value)
        if count is None:
            continue
        rank = _whole(env.get(rank_name, ""), least=0)
        return LocalRanks(count, rank, f"{count_name}={value} ({launcher})")
    return LocalRanks(1, None, UNKNOWN)


@dataclass(frozen=True)
class HostShare:
    """This rank's share of the host: `cores` it may use by default, out of `pool` (the cores
    the host, container or job gives all its ranks), with `affinity` cores in its own mask;
    `bound` is whether that mask is the rank's own (a launcher bound each rank to its cores);
    `quota` is the cgroup's CPU quota in cores when it narrowed the share (else None): then
    `pool` is the quota, shared by all the ranks. `ranks` is `local_ranks()`."""

    ranks: LocalRanks
    cores: int
    pool: int
    affinity: int
    bound: bool
    quota: int | None = None

    def describe(self) -> str:
        """The cores and where they came from, e.g. "14 cores: the host's 112 among 8 ranks
        (LOCAL_WORLD_SIZE=8 (torchrun))", "1 core: the 4 of this cgroup's CPU quota among 8
        ranks (...)"."""
        ranks = self.ranks
        noun = "core" if self.cores == 1 else "cores"
        if self.quota is not None:
            quota = f"the {self.quota} of this cgroup's CPU quota (docker --cpus, a CPU limit)"
            if ranks.count == 1:
                why = ranks.source if ranks.known else f"one rank: {ranks.source}"
                return f"{self.cores} usable {noun} ({why}; {quota})"
            mask = f", within the {self.affinity} the launcher bound it to" if self.bound else ""
            return f"{self.cores} {noun}: {quota} among {ranks.count} ranks{mask} ({ranks.source})"
        if self.bound:
            among = f"; {ranks.count} ranks ({ranks.source})" if ranks.known else ""
            return (
                f"{self.cores} {noun}: this process's affinity mask, which the launcher bound "
                f"to {self.affinity} of the host's {self.pool}{among}"
            )
        if ranks.count == 1:
            why = ranks.source if ranks.known else f"one rank: {ranks.source}"
            return f"{self.cores} usable {noun} ({why})"
        mask = "" if self.affinity == self.pool else f"this process's {self.affinity} of "
        return (
            f"{self.cores} {noun}: {mask}the host's {self.pool} among {ranks.count} ranks "
            f"({ranks.source})"
        )


def host_share(
    ranks_per_host: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    affinity: int | None = None,
    pool: int | None = None,
    quota: int | None = None,
) -> HostShare:
    """This rank's cores, from the ranks on this host (`local_ranks(ranks_per_host, environ)`),
    the cores in this process's affinity mask (`affinity`: `affinity_cores()` unless given) and
    the host's pool (`pool`: the cores of this process's cpuset cgroup, `cgroup_cores()`: a
    container's or a SLURM job's; else `os.cpu_count()`):

    - when the mask is narrower than the pool and the ranks' masks could be disjoint
      (ranks x mask <= pool), a launcher bound each rank to its cores (srun --cpu-bind, mpirun
      --bind-to, taskset per rank): the mask is this rank's share, not divided again;
    - else the ranks share the mask: its cores divided among them (at least 1);
    - and at most its part of the cgroup's CPU quota (`quota`: `cpu_quota_cores()` unless
      `pool` is given), which all the ranks of a container or job share: quota / ranks.

    So 8 ranks of torchrun on a 112-core host get 14 cores each, 8 ranks that srun bound to
    14 cores each get those 14, and 8 ranks in a container given `--cpus=16` get 2 each.
    `affinity`, `pool` and `quota` are for tests of hosts this is not.
    """
    ranks = local_ranks(ranks_per_host, environ)
    if quota is None and pool is None:
        quota = cpu_quota_cores()
    mask = affinity_cores() if affinity is None else affinity
    host = pool if pool is not None else (cgroup_cores() or os.cpu_count() or mask)
    host = max(host, mask)
    bound = mask < host and ranks.count * mask <= host
    cores = mask if bound else max(1, mask // ranks.count)
    if quota is None or quota // ranks.count >= cores:
        return HostShare(ranks, cores, host, mask, bound)
    return HostShare(ranks, max(1, quota // ranks.count), quota, mask, bound, quota)


def _whole(text: str, least: int = 1) -> int | None:
    """`text` as a whole number >= `least`, or None."""
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= least else None


def _slurm_count(text: str, node: str | None) -> int | None:
    """A SLURM tasks-per-node value ("8", "2(x3),1") for this node: its entry by `node` (the
    SLURM_NODEID), the one value when all nodes run alike, else the largest; None when it is
    not such a list."""
    counts: list[int] = []
    for part in text.split(","):
        value, _, repeat = part.partition("(x")
        count, times = _whole(value), _whole(repeat.rstrip(")")) if repeat else 1
        if count is None or times is None:
            return None
        counts.extend([count] * times)
    if not counts:
        return None
    index = _whole(node or "", least=0)
    if index is not None and index < len(counts):
        return counts[index]
    return max(counts)
