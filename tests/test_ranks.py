"""A host shared by its ranks (issue 41.1): each rank's defaults take its share, not the host.

The detection (`prefetch.host`) is read from the variables a launcher sets, passed in as a
mapping; the cores of hosts this machine is not (16, 112) are passed in as counts; the real
path runs in a subprocess under torchrun's variables and a narrowed affinity mask.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch._messages import counted
from prefetch.backends import ShmRoom
from prefetch.host import (
    UNKNOWN,
    cgroup_cores,
    cpu_list_size,
    cpu_quota_cores,
    host_share,
    local_ranks,
)
from prefetch.runtime import LoaderOptions
from prefetch.runtime import _choice as choice
from prefetch.runtime._autoscale import tuner_for
from prefetch.sample import SampleReader
from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(60)

SMALL = (16, 16)
TORCHRUN_8 = {"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "3", "RANK": "11", "WORLD_SIZE": "16"}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(
        tmp_path / "images", class_names=("a", "b"), per_class=4, size=(24, 24)
    )


# ---- which variables say how many ranks share the host, in which order ----------------


def test_without_a_launcher_one_rank_is_assumed_and_said() -> None:
    ranks = local_ranks(environ={"RANK": "3", "WORLD_SIZE": "8"})  # global ranks say nothing
    assert (ranks.count, ranks.rank, ranks.source) == (1, None, UNKNOWN) and not ranks.known


def test_each_launchers_count_and_local_rank_are_read() -> None:
    cases = {
        "torchrun": ({"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "5"}, 8, 5),
        "SLURM": ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "2"}, 4, 2),
        "Open MPI": ({"OMPI_COMM_WORLD_LOCAL_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 6, 1),
        "MPICH / Intel MPI": ({"MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}, 2, 0),
    }
    for launcher, (environ, count, rank) in cases.items():
        ranks = local_ranks(environ=environ)
        assert (ranks.count, ranks.rank) == (count, rank), launcher
        assert ranks.source.endswith(f"({launcher})") and ranks.known


def test_the_first_variable_set_wins_in_the_documented_order() -> None:
    environ = {
        "PREFETCH_RANKS_PER_HOST": "3",
        "LOCAL_WORLD_SIZE": "8",
        "SLURM_STEP_TASKS_PER_NODE": "4",
        "SLURM_TASKS_PER_NODE": "7",
        "SLURM_LOCALID": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "6",
        "MPI_LOCALNRANKS": "2",
    }
    assert local_ranks(5, environ).source == "ranks_per_host=5"  # the caller's count first
    order = ["PREFETCH_RANKS_PER_HOST=3", "LOCAL_WORLD_SIZE=8 (torchrun)"]
    order += ["SLURM_STEP_TASKS_PER_NODE=4 (SLURM)", "SLURM_TASKS_PER_NODE=7 (SLURM)"]
    order += ["OMPI_COMM_WORLD_LOCAL_SIZE=6 (Open MPI)", "MPI_LOCALNRANKS=2 (MPICH / Intel MPI)"]
    for source in order:
        assert local_ranks(environ=environ).source == source
        del environ[source.split("=")[0]]
    assert local_ranks(environ=environ).source == UNKNOWN


def test_slurm_counts_only_inside_an_srun_task_and_per_node() -> None:
    job = {"SLURM_TASKS_PER_NODE": "8", "SLURM_NTASKS_PER_NODE": "8", "SLURM_JOB_ID": "7"}
    assert local_ranks(environ=job).count == 1  # a batch script's own process: one process
    task = {**job, "SLURM_LOCALID": "3"}
    assert (local_ranks(environ=task).count, local_ranks(environ=task).rank) == (8, 3)
    uneven = {"SLURM_STEP_TASKS_PER_NODE": "4(x3),2", "SLURM_LOCALID": "0"}
    assert local_ranks(environ={**uneven, "SLURM_NODEID": "3"}).count == 2  # this node's entry
    assert local_ranks(environ={**uneven, "SLURM_NODEID": "1"}).count == 4
    assert local_ranks(environ=uneven).count == 4  # node unknown: the largest


def test_a_malformed_count_is_refused_naming_the_variable_ours_or_a_launchers(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher's count that is set but not a count was passed over (and "eight" fell through
    # to the next launcher): now each is refused with its name and value (tests/test_rank_env.py).
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be a whole number >= 1"):
        local_ranks(environ={"LOCAL_WORLD_SIZE": "eight", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    with pytest.raises(ValueError, match="got '0'"):
        local_ranks(environ={"LOCAL_WORLD_SIZE": "0"})
    with pytest.raises(ValueError, match="PREFETCH_RANKS_PER_HOST must be a whole number"):
        local_ranks(environ={"PREFETCH_RANKS_PER_HOST": "many"})
    with pytest.raises(ValueError, match="ranks_per_host must be an int >= 1, got 0"):
        local_ranks(0, {})
    monkeypatch.setenv("PREFETCH_RANKS_PER_HOST", "0")
    with pytest.raises(ValueError, match="PREFETCH_RANKS_PER_HOST must be a whole number >= 1"):
        prefetch.Loader(folder)


def test_the_ranks_on_a_host_are_the_environments_not_a_loader_keyword(folder: Path) -> None:
    """The ranks on a host are a fact of the host, which every loader of the process reads
    where launchers put it; the keyword that said it per loader is gone (issue 46)."""
    with pytest.raises(TypeError) as raised:
        prefetch.Loader(folder, ranks_per_host=2)
    assert "no longer takes ranks_per_host=: pass" in str(raised.value)
    assert "PREFETCH_RANKS_PER_HOST=N" in str(raised.value)


# ---- each rank's cores, on hosts this machine is not -----------------------------------


def test_eight_torchrun_ranks_on_a_112_core_host_take_14_cores_and_13_workers_each() -> None:
    share = host_share(environ=TORCHRUN_8, affinity=112, pool=112)
    assert (share.cores, share.bound) == (14, False)
    assert prefetch.runtime.default_workers(share.cores) == 13  # one core for the training loop
    assert share.describe() == (
        "14 cores: the host's 112 cores among 8 ranks (LOCAL_WORLD_SIZE=8 (torchrun))"
    )


def test_a_mask_the_launcher_bound_is_the_ranks_share_and_is_not_divided_again() -> None:
    bound = host_share(environ=TORCHRUN_8, affinity=14, pool=112)  # srun --cpu-bind, per rank
    assert (bound.cores, bound.bound) == (14, True)
    assert "affinity mask, which the launcher bound to 14 of the host's 112" in bound.describe()
    shared = host_share(environ=TORCHRUN_8, affinity=16, pool=112)  # `taskset -c 0-15 torchrun`
    assert (shared.cores, shared.bound) == (2, False)  # 8 x 16 > 112: one mask for all ranks
    container = host_share(environ={"LOCAL_WORLD_SIZE": "4"}, affinity=16, pool=16)
    assert container.cores == 4  # a container's 16 cores (its cpuset) among 4 ranks
    alone = host_share(environ={}, affinity=6, pool=16)  # `taskset -c 0-5 python train.py`
    assert (alone.cores, alone.bound) == (6, True)


def test_eight_ranks_on_a_16_core_host_take_at_most_two_cores_each() -> None:
    for affinity in (16, 2):  # all cores, or bound two by two
        share = host_share(environ=TORCHRUN_8, affinity=affinity, pool=16)
        assert share.cores == 2
        assert prefetch.runtime.default_workers(share.cores) == 2
    assert host_share(environ={"LOCAL_WORLD_SIZE": "32"}, affinity=16, pool=16).cores == 1


def reading(files: dict[str, str]) -> Callable[[str], str]:
    """A `read(path)` of these files only (others: FileNotFoundError, as on a host)."""

    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        return files[path]

    return read


def test_the_cpuset_cgroup_is_the_hosts_pool_for_cgroup_v2_and_v1() -> None:
    v2 = {
        "/proc/self/cgroup": "0::/job_7/step_0\n",
        "/sys/fs/cgroup/job_7/step_0/cpuset.cpus.effective": "0-13,56-69\n",
    }
    assert cgroup_cores(reading(v2), cpus=112) == 28
    v1 = {
        "/proc/self/cgroup": "4:memory:/x\n3:cpuset,cpu:/docker/abc\n0::/\n",
        "/sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus": "0-3",
    }
    assert cgroup_cores(reading(v1), cpus=112) == 4
    own_root = {  # a container that sees the host's path but has its own cgroup mounted
        "/proc/self/cgroup": "0::/docker/abc\n",
        "/sys/fs/cgroup/cpuset.cpus.effective": "0-7",
    }
    assert cgroup_cores(reading(own_root), cpus=112) == 8
    assert cgroup_cores(reading({})) is None
    assert cgroup_cores(reading({"/proc/self/cgroup": "0::/\n"})) is None
    assert cpu_list_size("0-3,8-11,16\n") == 9


def test_a_cgroup_cpu_quota_is_read_from_v2_and_v1_the_least_over_the_folders_above() -> None:
    docker_v2 = {"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "400000 100000\n"}
    assert cpu_quota_cores(reading(docker_v2), cpus=64) == 4  # docker run --cpus=4
    nested = {  # a pod's limit above a container's own (none): the least applies
        "/proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000",
        "/sys/fs/cgroup/kubepods/pod1/cpu.max": "250000 100000",
        "/sys/fs/cgroup/kubepods/cpu.max": "max 100000",
    }
    assert cpu_quota_cores(reading(nested), cpus=64) == 3  # 2.5 cores' time: rounded up
    v1 = {
        "/proc/self/cgroup": "5:memory:/x\n4:cpu,cpuacct:/docker/abc\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "800000",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
    }
    assert cpu_quota_cores(reading(v1), cpus=64) == 8
    tiny = {"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "10000 100000"}
    assert cpu_quota_cores(reading(tiny), cpus=64) == 1  # a tenth of a core is still one worker
    unlimited = {"/proc/self/cgroup": "0::/a\n", "/sys/fs/cgroup/a/cpu.max": "max 100000"}
    assert cpu_quota_cores(reading(unlimited)) is None
    assert cpu_quota_cores(reading({"/proc/self/cgroup": "1:cpu:/\n"})) is None
    assert (
        cpu_quota_cores(reading({"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "x"}))
        is None
    )
    assert cpu_quota_cores(reading({})) is None


def test_a_cpu_quota_is_shared_by_the_ranks_of_a_container_not_a_mask_of_each() -> None:
    # `docker run --cpus=16` on a 64-core host: every rank's mask shows 64 cores
    quota = host_share(environ=TORCHRUN_8, affinity=64, pool=64, quota=16)
    assert (quota.cores, quota.pool, quota.bound) == (2, 16, False)
    assert quota.describe() == (
        "2 cores: the 16 of this cgroup's CPU quota (docker --cpus, a CPU limit) among 8 ranks "
        "(LOCAL_WORLD_SIZE=8 (torchrun))"
    )
    alone = host_share(environ={}, affinity=64, pool=64, quota=4)
    assert alone.cores == 4 and "4 usable cores (one rank: " in alone.describe()
    assert "CPU quota" in alone.describe()
    # srun bound each rank to 4 cores inside a job whose quota holds all 8 ranks' cores
    bound = host_share(environ=TORCHRUN_8, affinity=4, pool=64, quota=32)
    assert (bound.cores, bound.bound, bound.quota) == (4, True, None)
    # ... or to 8 cores each, under a quota of 16 for all 8: 2 cores' time each
    narrow = host_share(environ=TORCHRUN_8, affinity=8, pool=64, quota=16)
    assert (narrow.cores, narrow.bound, narrow.quota) == (2, True, 16)
    assert narrow.describe().startswith(
        "2 cores: the 16 of this cgroup's CPU quota (docker --cpus, a CPU limit) among 8 ranks, "
        "within the 8 the launcher bound it to"
    )
    # a quota above the pool narrows nothing and is not named
    wide = host_share(environ=TORCHRUN_8, affinity=16, pool=16, quota=64)
    assert (wide.cores, wide.quota) == (2, None) and "quota" not in wide.describe()


# ---- what 8 ranks on a 112-core host start, in one decision ----------------------------


NO_BATCH = np.zeros(0, np.int64)  # what backend="auto" measures: nothing, for files


def reader_of(folder: Path, batch_size: int) -> tuple[LoaderOptions, SampleReader]:
    """A loader's options and its reader (made, never started)."""
    loader = prefetch.Loader(folder, batch_size=batch_size, image_size=SMALL, seed=0)
    return loader.options, loader._epochs.workers.reader


def test_eight_ranks_on_112_cores_start_13_processes_and_231_mb_of_slots_each(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model in docs/tuning.md: batch 256 at 224x224, depth 2, 8 torchrun ranks on a
    112-core host with a 504 GiB /dev/shm: each rank 13 worker processes, in flight
    max(2, 2 rows x 13 / 256) = 2 batches, a ring of 2 + 4 kept = 6 slots of 256 rows of
    224 x 224 x 3 + 4 (label) + 8 (start time) bytes = 231,229,440 bytes."""
    _, small = reader_of(folder, batch_size=256)
    options = LoaderOptions(batch_size=256, image_size=(224, 224))
    reader = replace(small, options=options.decode)
    share = host_share(environ=TORCHRUN_8, affinity=112, pool=112)
    room = ShmRoom(504 * 2**30, 500 * 2**30, 8, "/dev/shm")
    monkeypatch.setattr(choice, "shm_room", lambda ranks: room if ranks == 8 else None)

    planned = choice.planned_workers(options, share, remote=False)
    decision = choice.decide(options, reader, NO_BATCH, share, planned, tuned=False, remote=False)

    assert (decision.backend, decision.workers) == ("process", 13)
    assert decision.ring_bytes == 6 * 256 * (224 * 224 * 3 + 4 + 8) == 231_229_440
    assert "13 workers, one per core of 14 cores: the host's 112 cores among 8 ranks" in (
        decision.reason
    )
    assert "(LOCAL_WORLD_SIZE=8 (torchrun)), less one for the training thread" in decision.reason
    assert "batch slots 221 MiB of " in decision.reason
    assert "this rank's share 63.0 GiB: 504.0 GiB among 8 ranks" in decision.reason
    assert decision.reason.endswith(
        "(LOCAL_WORLD_SIZE=8 (torchrun)), less one for the training thread; batch slots 221 MiB "
        "of /dev/shm (this rank's share 63.0 GiB: 504.0 GiB among 8 ranks, 500.0 GiB free)"
    )  # docs/tuning.md quotes this text
    # 8 x 13 = 104 worker processes and 8 training loops: the host's 112 cores, not 8 x 111.
    assert 8 * (decision.workers + 1) == 112
    # At batch 32, the ring before (111 workers: 7 batches in flight) and now (13: 2 in flight).
    options = LoaderOptions(batch_size=32, image_size=(224, 224))
    reader = replace(small, options=options.decode)
    slot = 32 * (224 * 224 * 3 + 4 + 8)
    assert choice.ring_bytes(options, reader, "process", 111) == 11 * slot == 52_990_080
    assert choice.ring_bytes(options, reader, "process", 13) == 6 * slot == 28_903_680


def test_slots_that_fit_the_folder_but_not_this_ranks_share_of_it_go_to_threads(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options, reader = reader_of(folder, batch_size=8)
    share = host_share(environ=TORCHRUN_8, affinity=16, pool=16)
    need = choice.ring_bytes(options, reader, "process", 2)
    total = 8 * need - 8  # the whole folder holds the slots; an eighth of it does not
    monkeypatch.setattr(choice, "shm_room", lambda ranks: ShmRoom(total, total, ranks))

    decision = choice.decide(options, reader, NO_BATCH, share, 2, tuned=False, remote=False)

    assert decision.backend == "thread"
    assert decision.reason.startswith("auto: thread (files are decoded in worker processes")
    assert "but the process backend's batch slots take" in decision.reason
    assert "among 8 ranks" in decision.reason and decision.reason.endswith("in RAM")
    alone = host_share(environ={}, affinity=16, pool=16)
    kept = choice.decide(options, reader, NO_BATCH, alone, 2, tuned=False, remote=False)
    assert kept.backend == "process"


def test_the_tuner_grows_within_the_ranks_cores_and_its_part_of_the_memory() -> None:
    processes = tuner_for(
        process=True, workers=2, depth=2, ring_bytes=0, memory_budget=2**40, cores=14
    )
    threads = tuner_for(
        process=False, workers=2, depth=2, ring_bytes=0, memory_budget=2**40, cores=14
    )
    assert (processes.maximum, threads.maximum) == (14, 28)


# ---- a worker count above the cores is said once ----------------------------------------


def test_workers_above_the_cores_warn_once_with_the_counts_and_the_fix(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = prefetch.runtime.usable_cores()
    monkeypatch.setenv("PREFETCH_RANKS_PER_HOST", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            prefetch.Loader(folder, image_size=SMALL, workers=cores + 1)
        prefetch.Loader(folder, image_size=SMALL, workers=cores)
    assert len(caught) == 1, [str(w.message) for w in caught]
    warning = caught[0]
    assert issubclass(warning.category, prefetch.TooManyWorkersWarning)
    assert warning.filename == __file__  # the user's line, not prefetch's
    message = str(warning.message)
    assert f"workers={cores + 1} on {cores} usable cores (PREFETCH_RANKS_PER_HOST=1)" in message
    assert f"pass at most workers={cores}" in message and "Leave workers unset" in message


@pytest.mark.skipif(prefetch.runtime.usable_cores() < 2, reason="needs a core for each rank")
def test_ranks_times_workers_above_the_hosts_cores_warns_with_both_counts(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = prefetch.runtime.usable_cores()  # 2 ranks: each its share, cores // 2
    monkeypatch.setenv("PREFETCH_RANKS_PER_HOST", "2")
    with pytest.warns(prefetch.TooManyWorkersWarning) as caught:
        prefetch.Loader(folder, image_size=SMALL, workers=cores)
    message = str(caught[0].message)
    assert f"workers={cores} on each of 2 ranks (PREFETCH_RANKS_PER_HOST=2)" in message
    assert f"is {2 * cores} workers for this host's {cores} cores" in message
    assert f"pass at most workers={cores // 2}" in message


def test_remote_workers_wait_on_the_network_and_are_not_warned_about() -> None:
    share = host_share(environ={}, affinity=2, pool=2)
    options = LoaderOptions(workers=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choice.planned_workers(options, share, remote=True) == 64
    with pytest.warns(prefetch.TooManyWorkersWarning):
        choice.planned_workers(options, share, remote=False)


# ---- ranks beyond the cores: a fraction of a core each, said ------------------------------


def test_ranks_beyond_the_cores_get_a_fraction_of_a_core_said_in_words() -> None:
    cases = [  # (ranks, affinity, pool): what each rank's share says
        (8, 2, 2, "a quarter of a core: the host's 2 cores among 8 ranks"),
        (4, 2, 2, "half a core: the host's 2 cores among 4 ranks"),
        (3, 1, 1, "a third of a core: the host's 1 core among 3 ranks"),
        (7, 2, 2, "2/7 of a core: the host's 2 cores among 7 ranks"),
        (16, 2, 16, "1/8 of a core: this process's 2 of the host's 16 cores among 16 ranks"),
        (2, 2, 2, "1 core: the host's 2 cores among 2 ranks"),
    ]
    for ranks, affinity, pool, said in cases:
        share = host_share(ranks, affinity=affinity, pool=pool)
        assert share.describe() == f"{said} (ranks_per_host={ranks})"
        assert share.cores == 1 and share.crowded == (ranks > affinity)
        assert share.exact == Fraction(affinity, ranks)


def test_a_container_with_a_cpu_quota_of_4_running_8_ranks_gives_each_half_a_core(
    folder: Path,
) -> None:
    """`docker run --cpus=4` on a 64-core host, 8 torchrun ranks in it: each rank's mask shows
    64 cores, its share is half a core's time."""
    said = (
        "half a core: the 4 of this cgroup's CPU quota (docker --cpus, a CPU limit) among 8 "
        "ranks (LOCAL_WORLD_SIZE=8 (torchrun))"
    )
    given = host_share(environ=TORCHRUN_8, affinity=64, pool=64, quota=4)
    assert (given.cores, given.pool, given.quota, given.describe()) == (1, 4, 4, said)
    v2 = {"/proc/self/cgroup": "0::/docker/abc\n", "/sys/fs/cgroup/docker/abc/cpu.max": "400000"}
    v1 = {
        "/proc/self/cgroup": "3:cpu,cpuacct:/docker/abc\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "400000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    }
    options, reader = reader_of(folder, batch_size=4)
    for files in (v2, v1):  # the quota files of each cgroup version, as the kernel shows them
        share = host_share(environ=TORCHRUN_8, affinity=64, cpus=64, read=reading(files))
        assert (share.cores, share.quota, share.exact) == (1, 4, Fraction(1, 2))
        assert share.describe() == said and share.crowded
        decision = choice.decide(options, reader, NO_BATCH, share, 1, tuned=False, remote=False)
        assert f"; 1 worker, the least, on {said};" in decision.reason
        warning = choice.too_many_ranks(share, None)
        assert f"each rank's share of the cores is {said}, yet each rank runs a worker" in warning
        assert "8 workers and 8 training loops take turns on 4 cores (the CPU quota)" in warning
        assert "Run at most 4 ranks on these cores, or give them more" in warning


def test_the_reason_of_a_crowded_rank_says_one_worker_on_its_fraction(folder: Path) -> None:
    options, reader = reader_of(folder, batch_size=4)
    share = host_share(environ=TORCHRUN_8, affinity=2, pool=2)
    decision = choice.decide(options, reader, NO_BATCH, share, 1, tuned=False, remote=False)
    assert (
        "; 1 worker, the least, on a quarter of a core: the host's 2 cores among 8 ranks "
        "(LOCAL_WORLD_SIZE=8 (torchrun)); "
    ) in decision.reason
    one = replace(options, workers=1)
    decision = choice.decide(one, reader, NO_BATCH, share, 1, tuned=False, remote=False)
    assert "; 1 worker (workers=1) on a quarter of a core: the host's 2 cores" in decision.reason


CROWDED = """
import json, sys, warnings
import prefetch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")  # every call shown: what is said once is prefetch's doing
    prefetch.Loader(sys.argv[1], image_size=16)
    prefetch.Loader(sys.argv[1], image_size=16, workers=1)  # the same as the default
    for _ in range(2):
        prefetch.Loader(sys.argv[1], image_size=16, workers="auto")
    prefetch.Loader(sys.argv[1], image_size=16, workers=4)
print(json.dumps([[w.category.__name__, w.filename, str(w.message)] for w in caught]))
"""


@pytest.mark.timeout(120)  # two interpreters on 2 busy cores
def test_each_rank_beyond_the_cores_warns_once_whatever_workers_says(folder: Path) -> None:
    """Real rank processes under torchrun's variables, twice as many as the cores: each
    warns once for all its loaders (default, workers=1, "auto"), and once more for
    workers=4, whose advice is the truth: no worker count helps, fewer ranks or more cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = 2 * (cores or 1)
    environ = {"LOCAL_WORLD_SIZE": str(ranks)}
    share = host_share(environ=environ)  # what each rank computes: half a core
    assert share.describe().startswith("half a core: ")
    clean = {k: v for k, v in os.environ.items() if k not in TORCHRUN_8}
    for rank in (0, 1):
        done = subprocess.run(
            [sys.executable, "-c", CROWDED, str(folder)],
            env={**clean, **environ, "LOCAL_RANK": str(rank)},
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        said = json.loads(done.stdout.strip().splitlines()[-1])
        assert len(said) == 2, said
        assert [category for category, _, _ in said] == ["TooManyWorkersWarning"] * 2
        assert all(filename == "<string>" for _, filename, _ in said)  # the user's lines
        default, four = (message for _, _, message in said)
        assert default.startswith(f"prefetch: each rank's share of the cores is {share.describe()}")
        assert f"{ranks} workers and {ranks} training loops take turns on {cores} " in default
        assert four.startswith(f"prefetch: workers=4 on each of {ranks} ranks is {4 * ranks} ")
        assert f"each rank's share of the cores is {share.describe()}" in four
        assert "Fewer workers cannot fix it: with workers=1, the least" in four
        assert f"Run at most {counted(cores or 1, 'rank')} on these cores, or give" in four
        assert "at most workers=" not in four


# ---- the real path: torchrun's variables and a narrowed mask, in a subprocess -----------

RANK = """
import json, os, sys, warnings
import prefetch
if len(sys.argv) > 2:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: int(sys.argv[2])]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = prefetch.Loader(sys.argv[1], batch_size=4, image_size=16, seed=0)
planned = loader.workers
with loader:
    images = sum(len(batch.images) for batch in loader)
stats = loader.stats()
print(json.dumps({"planned": planned, "workers": stats.workers, "images": images,
                  "warnings": [str(w.message) for w in caught],
                  "backend": stats.backend, "reason": stats.backend_reason}))
"""


def run_rank(
    folder: Path, environ: dict[str, str], *mask: int, first: str = ""
) -> dict[str, object]:
    """RANK in a new interpreter under `environ` (narrowed to `mask` cores), after the code
    `first`; what it printed."""
    clean = {k: v for k, v in os.environ.items() if k not in TORCHRUN_8}
    done = subprocess.run(
        [sys.executable, "-c", first + RANK, str(folder), *map(str, mask)],
        env={**clean, **environ},
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(120)  # two interpreters, each spawning a worker process on 2 busy cores
@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux's affinity calls and two cores to narrow to one",
)
def test_a_default_loader_under_torchrun_takes_at_most_its_share(folder: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    # 8 ranks on this host: each its share, at least 1 core (here 2 // 8 -> 1).
    crowded = run_rank(folder, TORCHRUN_8)
    assert crowded["planned"] == crowded["workers"] == max(1, cores // 8)
    assert crowded["images"] == 8 and crowded["backend"] == "process"
    assert f"the host's {cores} cores among 8 ranks (LOCAL_WORLD_SIZE=8 (torchrun))" in str(
        crowded["reason"]
    )
    # A mask the launcher narrowed to one core: that core is the rank's share, not divided.
    bound = run_rank(folder, {"LOCAL_WORLD_SIZE": str(cores), "LOCAL_RANK": "0"}, 1)
    assert bound["planned"] == bound["workers"] == 1
    assert "affinity mask, which the launcher bound to 1 of the host's" in str(bound["reason"])


@contextlib.contextmanager
def cpu_quota_cgroup(cores: float) -> Iterator[Path]:
    """A new cgroup (v1's cpu controller, or v2 with it enabled) whose processes get `cores`
    cores' worth of time; skips the test where this process may not make one (not root, a
    read-only or unfamiliar cgroup mount). Removed afterwards (its processes have exited)."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists():
        root, files = v1, {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(cores * 1e5))}
    elif "cpu" in (v2 / "cgroup.subtree_control").read_text(errors="replace").split():
        root, files = v2, {"cpu.max": f"{int(cores * 1e5)} 100000"}
    else:
        pytest.skip("no cgroup cpu controller to make a quota with")
    group = root / f"prefetch-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        group.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a cgroup here ({error})")
    try:
        for name, value in files.items():
            (group / name).write_text(value)
        yield group
    finally:
        left = empty_cgroup(group)
        group.rmdir()
    assert not left, f"processes outlived the rank in its cgroup: {left}"


def empty_cgroup(group: Path, wait_s: float = 60.0) -> list[str]:
    """Wait until no process is left in `group`: a rank's helpers (multiprocessing's resource
    tracker) exit only after the rank, when their pipe closes. Those still there after `wait_s`
    are killed and named (their command lines): a leak."""
    deadline = time.monotonic() + wait_s
    while (procs := (group / "cgroup.procs").read_text().split()) and time.monotonic() < deadline:
        time.sleep(0.05)
    named = []
    for pid in procs:
        with contextlib.suppress(OSError):
            named.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            os.kill(int(pid), signal.SIGKILL)
    while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline + 10:
        time.sleep(0.05)  # a killed process leaves at once
    return named


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform != "linux", reason="cgroups are Linux's")
def test_a_default_loader_in_a_cgroup_with_a_cpu_quota_takes_the_quotas_cores(
    folder: Path,
) -> None:
    cores = len(os.sched_getaffinity(0))
    with cpu_quota_cgroup(0.5) as group:  # half a core's time: one worker, not one per core
        joined = f"import os; open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        rank = run_rank(folder, {}, first=joined)
    assert rank["planned"] == rank["workers"] == 1 and rank["images"] == 8
    assert "this cgroup's CPU quota" in str(rank["reason"])
    assert prefetch.runtime.usable_cores() == cores  # this process, outside the cgroup


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform != "linux", reason="cgroups are Linux's")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a quota of 1 core narrows only 2 or more")
def test_four_ranks_in_a_cgroup_with_a_quota_of_one_core_take_a_quarter_each_and_say_so(
    folder: Path,
) -> None:
    """A container's quota, for real: a cgroup with one core's time, a rank of 4 in it."""
    said = (
        "a quarter of a core: the 1 of this cgroup's CPU quota (docker --cpus, a CPU limit) "
        "among 4 ranks (LOCAL_WORLD_SIZE=4 (torchrun))"
    )
    with cpu_quota_cgroup(1.0) as group:
        joined = f"import os; open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n"
        rank = run_rank(folder, {"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "2"}, first=joined)
    assert rank["planned"] == rank["workers"] == 1 and rank["images"] == 8
    assert f"; 1 worker, the least, on {said};" in str(rank["reason"])
    warned = rank["warnings"]
    assert isinstance(warned, list) and len(warned) == 1, warned
    assert warned[0].startswith(f"prefetch: each rank's share of the cores is {said}, yet ")
    assert "4 workers and 4 training loops take turns on 1 core (the CPU quota)" in warned[0]
    assert "Run at most 1 rank on these cores, or give them more" in warned[0]
