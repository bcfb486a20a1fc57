"""Values from the environment and the host checked at the door (issue 45, items 5, 11): a
launcher's variable that is set but not what the launcher writes is refused naming it, its
value and what is accepted; SLURM's compressed lists are read without expanding them; cgroup
files are read bounded, and a count the host cannot have is not believed; more shards than
samples is refused at `shard()`, not at the first batch.

Launcher variables are passed in as a mapping (or set with monkeypatch for the Loader's own
path), cgroup files through `read(path)`, as in tests/test_ranks.py. Memory is measured with
`tracemalloc` (a count of bytes, not a time).
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from test_ranks import reading

import prefetch
from prefetch.host import cgroup_cores, cpu_quota_cores, host_share, local_ranks
from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(60)

SMALL = (16, 16)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images", class_names=("a", "b"), per_class=3)


# ---- SLURM's lists per node: found by arithmetic, never expanded -----------------------


def test_slurms_compressed_tasks_per_node_are_read_in_memory_that_does_not_grow() -> None:
    task = {"SLURM_LOCALID": "1"}
    tracemalloc.start()
    try:
        million = local_ranks(environ={**task, "SLURM_TASKS_PER_NODE": "2(x1000000)"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert million.count == 2
    assert peak < 100_000, f"{peak} bytes to read '2(x1000000)': the list was expanded"
    # The value: 15 GB and 53 s before; now the node's entry by counting nodes.
    billion = {**task, "SLURM_STEP_TASKS_PER_NODE": "4(x1000000000),3(x2),8"}
    for node, count in [(None, 8), ("0", 4), ("999999999", 4), ("1000000000", 3)]:
        environ = billion if node is None else {**billion, "SLURM_NODEID": node}
        assert local_ranks(environ=environ).count == count, node
    assert local_ranks(environ={**billion, "SLURM_NODEID": "1000000002"}).count == 8
    assert local_ranks(environ={**billion, "SLURM_NODEID": "5000000000"}).count == 8  # beyond


@pytest.mark.parametrize(
    "value", ["", "2,", "2(x3", "2(x0)", "0", "2(x3)1", "-1", "x", "2(x3),,1", "١"]
)
def test_a_slurm_list_that_is_not_one_is_refused_with_the_accepted_form(value: str) -> None:
    environ = {"SLURM_STEP_TASKS_PER_NODE": value, "SLURM_LOCALID": "0"}
    with pytest.raises(ValueError) as raised:
        local_ranks(environ=environ)
    message = str(raised.value)
    assert message.startswith("SLURM_STEP_TASKS_PER_NODE must be SLURM's tasks per node")
    assert f"got {value!r}" in message and "e.g. '2(x3),1'" in message
    assert "fix or unset it, or set PREFETCH_RANKS_PER_HOST" in message


# ---- each launcher variable read is checked ---------------------------------------------


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE must be a whole number >= 1"),
        ({"LOCAL_WORLD_SIZE": ""}, "LOCAL_WORLD_SIZE must be a whole number >= 1"),
        (
            {"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "8"},
            "LOCAL_RANK must be a whole number from 0 to 7",
        ),
        (
            {"LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "-1"},
            "LOCAL_RANK must be a whole number from 0 to 7",
        ),
        (
            {"SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "one"},
            "SLURM_LOCALID must be a whole number from 0 to 3",
        ),
        (
            {"SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "n1"},
            "SLURM_NODEID must be a whole number >= 0",
        ),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4.0"}, "OMPI_COMM_WORLD_LOCAL_SIZE must be a whole"),
        ({"MPI_LOCALNRANKS": "0"}, "MPI_LOCALNRANKS must be a whole number >= 1"),
        ({"MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "2"}, "MPI_LOCALRANKID must be a whole"),
        ({"PREFETCH_RANKS_PER_HOST": "9" * 19}, "PREFETCH_RANKS_PER_HOST must be a whole"),
    ],
)
def test_a_launcher_variable_set_but_not_a_count_is_refused_naming_it(
    environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError) as raised:
        local_ranks(environ=environ)
    message = str(raised.value)
    assert message.startswith(named)
    name = named.split()[0]
    assert f"got {environ[name]!r}: fix or unset it" in message


def test_a_long_value_is_shown_cut_and_a_good_one_still_reads() -> None:
    with pytest.raises(ValueError) as raised:
        local_ranks(environ={"LOCAL_WORLD_SIZE": "8" * 100_000})
    message = str(raised.value)
    assert len(message) < 500 and "(100000 characters)" in message
    ranks = local_ranks(environ={"LOCAL_WORLD_SIZE": " 8 ", "LOCAL_RANK": "7"})
    assert (ranks.count, ranks.rank, ranks.source) == (8, 7, "LOCAL_WORLD_SIZE=8 (torchrun)")


def test_a_loader_under_a_bad_launcher_variable_says_which_at_the_door(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, LOCAL_WORLD_SIZE=abc read as "no launcher variable set": one rank, and every
    rank of the host took all of its cores."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match=r"LOCAL_WORLD_SIZE must be a whole number >= 1 \("):
        prefetch.Loader(folder, image_size=SMALL)
    monkeypatch.setenv("PREFETCH_RANKS_PER_HOST", "1")  # read first: the fix
    loader = prefetch.Loader(folder, image_size=SMALL)
    assert loader.workers >= 1


# ---- cgroup files: bounded reads, and no more CPUs than the host has -------------------


def test_a_cpuset_of_more_cpus_than_the_host_has_is_not_believed() -> None:
    cgroup = {"/proc/self/cgroup": "0::/job\n"}
    huge = {**cgroup, "/sys/fs/cgroup/job/cpuset.cpus.effective": "0-999999999\n"}
    assert cgroup_cores(reading(huge)) is None  # above this host's CPUs (os.cpu_count())
    assert cgroup_cores(reading(huge), cpus=112) is None
    backwards = {**cgroup, "/sys/fs/cgroup/job/cpuset.cpus.effective": "7-3"}
    assert cgroup_cores(reading(backwards), cpus=112) is None
    long = {**cgroup, "/sys/fs/cgroup/job/cpuset.cpus.effective": "0-3" + "\n" * 2**20}
    assert cgroup_cores(reading(long), cpus=112) is None  # 1 MiB: no cpuset of any host
    # so the rank's share is the host's, not "the host's 1000000000"
    share = host_share(environ={"LOCAL_WORLD_SIZE": "8"}, affinity=2, cpus=2, read=reading(huge))
    assert "1000000000" not in share.describe() and share.pool == 2
    assert share.describe().startswith("a quarter of a core: the host's 2 cores among 8 ranks")


def test_a_quota_too_large_for_a_float_or_the_host_narrows_nothing() -> None:
    cgroup = {"/proc/self/cgroup": "0::/\n"}
    overflow = {**cgroup, "/sys/fs/cgroup/cpu.max": "1" + "0" * 400 + " 100000"}
    assert cpu_quota_cores(reading(overflow)) is None  # was an OverflowError out of Loader()
    for limit in ("1" + "0" * 400, "99999999999999999999", "6400000"):
        files = {**cgroup, "/sys/fs/cgroup/cpu.max": f"{limit} 100000\n"}
        assert cpu_quota_cores(reading(files), cpus=64) is None, limit
    files = {**cgroup, "/sys/fs/cgroup/cpu.max": "6300000 100000\n"}
    assert cpu_quota_cores(reading(files), cpus=64) == 63


# ---- more shards than samples: refused at shard(), naming both ---------------------------


def test_more_shards_than_samples_is_refused_at_shard_naming_both(folder: Path) -> None:
    loader = prefetch.Loader(  # 6 samples
        folder, image_size=SMALL, batch_size=2, seed=0, workers=1, backend="thread"
    )
    for shards in (2**62, 7):
        with pytest.raises(ValueError) as raised:
            loader.shard(shards, 0)
        message = str(raised.value)
        assert f"num_shards={shards} is more than this source's samples (6)" in message
        assert "pass num_shards <= 6" in message
    assert loader.options.num_shards == 1  # nothing changed
    loader.shard(6, 5)
    with loader:
        assert [len(batch.labels) for batch in loader] == [1]
