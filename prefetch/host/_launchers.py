"""How many training processes (ranks) run on this host, read from the launcher or the user.

A GPU host runs one training process (a *rank*) per GPU, each with its own Loader: torchrun,
SLURM's srun, Open MPI and MPICH say how many in their variables. `local_ranks` reads them (or
what the user gave) and this process's place among them. Every variable read is checked here,
at the door, in memory that does not grow with its numbers (SLURM's "4(x1000000000)" is never
expanded): a value that is not what the launcher writes is a ValueError naming the variable,
the value and what is accepted. Pure reads of the environment: nothing is cached.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from prefetch._checks import positive

# The variable a user sets to say how many ranks share this host, above any launcher's.
RANKS_VARIABLE = "PREFETCH_RANKS_PER_HOST"

# The launchers' variables, in the order they are read: (count, local rank, launcher). The
# first count that is set wins. SLURM's are read only inside a task that srun started
# (SLURM_LOCALID is set): a batch script's own process is one process, not its job's tasks. A
# SLURM count may be a list per node ("2(x3),1"): the entry of this node (SLURM_NODEID) is
# taken, or the largest when the node is not known.
LAUNCHERS: tuple[tuple[str, str, str], ...] = (
    ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "torchrun"),
    ("SLURM_STEP_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("SLURM_NTASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("SLURM_TASKS_PER_NODE", "SLURM_LOCALID", "SLURM"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
    ("MPI_LOCALNRANKS", "MPI_LOCALRANKID", "MPICH / Intel MPI"),
)

# A whole number as a launcher writes it: ASCII digits, at most 18 (below 2**63; SLURM's own
# counts are 32-bit), spaces around allowed. Longer text is refused before any int() of it.
_WHOLE = re.compile(r"\s*([0-9]{1,18})\s*")
# One entry of a SLURM list per node: N tasks on one node, or on each of M nodes: "N(xM)".
_SLURM_ENTRY = re.compile(r"\s*([0-9]{1,18})(?:\(x([0-9]{1,18})\))?\s*")
# What a message shows of a value (a variable may hold 128 KiB).
_SHOWN_CHARS = 60


@dataclass(frozen=True)
class LocalRanks:
    """How many ranks run on this host (`count`), this process's local rank among them (`rank`,
    None when nothing says), and where the count came from (`source`, for messages:
    "LOCAL_WORLD_SIZE=8 (torchrun)", "PREFETCH_RANKS_PER_HOST=4", "no launcher variable set")."""

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

    1. `ranks_per_host`, given by the caller (`host_share(1)`: this process as one rank);
    2. `PREFETCH_RANKS_PER_HOST`;
    3. `LOCAL_WORLD_SIZE` (torchrun; local rank `LOCAL_RANK`);
    4. inside an srun task (`SLURM_LOCALID` set, the local rank): `SLURM_STEP_TASKS_PER_NODE`,
       then `SLURM_NTASKS_PER_NODE`, then `SLURM_TASKS_PER_NODE` (a list per node such as
       "2(x3),1": this node's entry by `SLURM_NODEID`, found by arithmetic, never expanded;
       the largest when `SLURM_NODEID` is unset or beyond the list);
    5. `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI; `OMPI_COMM_WORLD_LOCAL_RANK`);
    6. `MPI_LOCALNRANKS` (MPICH's Hydra, Intel MPI; `MPI_LOCALRANKID`);
    7. else one rank ("no launcher variable set").

    Every variable read is checked: a count that is not a whole number >= 1 (for SLURM, not
    its list of them), a local rank that is not one of 0 .. count - 1, a `SLURM_NODEID` that is
    not a whole number, is a ValueError naming the variable, its value and what is accepted (a
    wrong count would size every rank's workers wrongly, silently). Variables not read (those
    after the one that wins) are not checked. `environ` defaults to `os.environ`.
    """
    env = os.environ if environ is None else environ
    if ranks_per_host is not None:
        count = positive("ranks_per_host", ranks_per_host)
        return LocalRanks(count, None, f"ranks_per_host={count}")
    given = env.get(RANKS_VARIABLE)
    if given is not None:
        count = _count(RANKS_VARIABLE, given, "the training processes on this host")
        return LocalRanks(count, None, f"{RANKS_VARIABLE}={count}")
    for count_name, rank_name, launcher in LAUNCHERS:
        value = env.get(count_name)
        if value is None or (launcher == "SLURM" and rank_name not in env):
            continue
        if launcher == "SLURM":
            count = slurm_count(count_name, value, env.get("SLURM_NODEID"))
            shown = _shown(value, quote=False)  # the list, as SLURM wrote it
        else:
            count = _count(count_name, value, f"{launcher}'s count of the processes on this host")
            shown = str(count)
        rank = env.get(rank_name)
        place = None
        if rank is not None:
            among = f"this process's place among the {count} of {count_name}"
            place = _count(rank_name, rank, among, least=0, below=count)
        return LocalRanks(count, place, f"{count_name}={shown} ({launcher})")
    return LocalRanks(1, None, UNKNOWN)


def slurm_count(name: str, text: str, node: str | None) -> int:
    """This node's entry of SLURM's tasks per node (`text`, the value of the variable `name`):
    a comma-separated list of "N" (N tasks on one node) and "N(xM)" (N on each of M nodes),
    N and M >= 1. The entry of node `node` (SLURM_NODEID: 0, 1, ...) is found by counting the
    nodes each entry covers, never by expanding the list; when `node` is None or beyond the
    list, the largest entry (the most ranks this node can run). ValueError naming the
    variable when `text` is not such a list or `node` not a whole number."""
    index = None if node is None else _count("SLURM_NODEID", node, "this node's index", least=0)
    largest, first_node, found = 0, 0, None
    for part in text.split(","):
        entry = _SLURM_ENTRY.fullmatch(part)
        tasks, nodes = (int(entry[1]), int(entry[2] or 1)) if entry else (0, 0)
        if tasks < 1 or nodes < 1:
            raise ValueError(
                f"{name} must be SLURM's tasks per node: whole numbers >= 1 separated by "
                f"commas, each maybe repeated over nodes as N(xM), e.g. '2(x3),1'; got "
                f"{_shown(text)}: fix or unset it, or set {RANKS_VARIABLE} "
                "(read before any launcher's variable)"
            )
        if found is None and index is not None and index < first_node + nodes:
            found = tasks
        largest, first_node = max(largest, tasks), first_node + nodes
    return largest if found is None else found


def _count(
    name: str,
    text: str,
    meaning: str,
    *,
    least: int = 1,
    below: int | None = None,
) -> int:
    """`text` (the value of `name`) as a whole number >= `least` (and < `below`), or ValueError
    naming the variable, the value and what is accepted."""
    match = _WHOLE.fullmatch(text)
    value = int(match[1]) if match else -1
    if value < least or (below is not None and value >= below):
        accepted = f">= {least}" if below is None else f"from {least} to {below - 1}"
        fix = f", or set {RANKS_VARIABLE} (read before any launcher's variable)"
        if name == RANKS_VARIABLE:
            fix = ""
        raise ValueError(
            f"{name} must be a whole number {accepted} ({meaning}), got {_shown(text)}: fix "
            f"or unset it{fix}"
        )
    return value


def _shown(text: str, quote: bool = True) -> str:
    """`text` for a message: its repr (or itself), cut to `_SHOWN_CHARS` characters."""
    cut = text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}..."
    shown = repr(cut) if quote else cut
    return shown if cut is text else f"{shown} ({len(text)} characters)"
