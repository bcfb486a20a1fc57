"""Ranks (issue 41, items 2 and 3): every rank the same number of batches, and a state that
resumes exactly on any number of ranks and with any batch size.

The properties run on the plan (`prefetch.plan`, pure, so many layouts are cheap); the
Loaders below run them end to end on real files, through both worker backends, with a worker
process killed on the way. Each sample's label is its index (`ids`), so the batches say which
samples were read.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.plan import EpochPlan, LoaderState, StreamingPlan, loader_state, resume
from prefetch.testing import CrashingDecoder, write_image_folder

pytestmark = pytest.mark.timeout(120)

SIZES = (1, 2, 3, 5, 7, 10, 17, 31, 64, 101, 1020)
RANKS = (1, 2, 3, 4, 7, 8, 16)
BATCHES = (1, 2, 3, 5, 8, 32)
SAMPLES = 37  # prime: no layout below divides it
OPTIONS = dict(image_size=(8, 8), workers=1, seed=5, backend="thread")


def plans(size: int, ranks: int, batch: int, **options: object) -> list[EpochPlan]:
    """The plan of every rank of a layout."""
    return [
        EpochPlan(
            size=size, batch_size=batch, seed=3, num_shards=ranks, shard_index=rank, **options
        )  # type: ignore[arg-type]
        for rank in range(ranks)
    ]


def padding(plan: EpochPlan, epoch: int, begin: int, ranks: int) -> list[int]:
    """The samples a run of `epoch` from sample `begin` on `ranks` ranks reads twice."""
    return np.resize(plan.sequence(epoch), -(plan.size - begin) % ranks).tolist()


# ---- item 2: the same number of batches on every rank ----------------------------------------


@pytest.mark.parametrize("shuffle", [True, False, "batches"])
def test_every_rank_has_the_same_batches_and_together_they_read_the_epoch_once_padded(
    shuffle: bool | str,
) -> None:
    for size, ranks, batch, drop in itertools.product(SIZES, RANKS, BATCHES, (False, True)):
        layout = plans(size, ranks, batch, shuffle=shuffle, drop_remainder=drop)
        per_rank = -(-size // ranks)
        expected = per_rank // batch if drop else -(-per_rank // batch)
        for epoch in (0, 1):
            batches = [plan.batches(epoch) for plan in layout]
            assert [len(b) for b in batches] == [expected] * ranks, (size, ranks, batch, drop)
            assert all(len(plan) == expected for plan in layout)
            read = Counter(int(i) for rank in batches for b in rank for i in b)
            # Every sample once, and the epoch's first -size % ranks samples once more (in
            # turn, when there are fewer samples than ranks) ...
            whole = Counter([*range(size), *padding(layout[0], epoch, 0, ranks)])
            if not drop:
                assert read == whole
                continue
            # ... less, with drop_remainder, each rank's short last batch.
            assert all(len(b) == batch for rank in batches for b in rank)
            assert sum(read.values()) == expected * batch * ranks and not read - whole


def test_the_padding_is_the_epochs_first_samples_a_different_few_each_epoch() -> None:
    layout = plans(1020, 7, 5)
    pads = [padding(layout[0], epoch, 0, 7) for epoch in range(3)]
    assert [len(pad) for pad in pads] == [2, 2, 2]  # 1020 samples padded to 7 x 146 = 1022
    assert len({tuple(pad) for pad in pads}) == 3
    for epoch, pad in enumerate(pads):
        assert pad == [int(i) for i in layout[0].sequence(epoch)[:2]]


def test_the_issues_case_gives_every_rank_30_batches(tmp_path: Path) -> None:
    # Issue 41: 1,020 samples on 7 ranks in batches of 5 gave 30, 30, 30, 30, 30, 29, 29.
    image = write_image_folder(tmp_path, class_names=("circle",), per_class=1, size=(8, 8))
    files = prefetch.FileList([next(image.rglob("*.jpg"))] * 1020, np.arange(1020))
    counts = []
    for rank in range(7):
        loader = prefetch.Loader(files, batch_size=5, **OPTIONS)  # type: ignore[arg-type]
        loader.shard(7, rank)
        counts.append(len(loader))
        assert len(loader.batch_indices(0)) == len(loader.batch_indices(1)) == 30
    assert counts == [30] * 7


# ---- item 3: the state, and resuming it on another layout --------------------------------------


def test_each_ranks_state_names_the_same_global_position() -> None:
    layout = plans(SAMPLES, 4, 3)
    states = [loader_state(plan, 1, 2) for plan in layout]
    assert states == [states[0]] * 4
    assert states[0] == {
        "version": 2, "seed": 3, "epoch": 1, "position": 2, "samples": 24,
        "size": SAMPLES, "num_shards": 4, "batch_size": 3,
    }  # fmt: skip
    assert LoaderState.of(json.loads(json.dumps(states[0]))).samples == 24


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_state_resumes_exactly_on_any_ranks_and_batch_size(shuffle: bool) -> None:
    layouts = [(1, 4), (2, 3), (3, 5), (4, 8), (8, 1)]
    for (r1, b1), (r2, b2), (r3, b3) in itertools.product(layouts, repeat=3):
        for drop in (False, True):
            first = plans(SAMPLES, r1, b1, shuffle=shuffle, drop_remainder=drop)
            for taken in range(len(first[0])):
                check_a_resume_chain(first, taken, (r2, b2), (r3, b3))


def check_a_resume_chain(
    first: list[EpochPlan], taken: int, second: tuple[int, int], third: tuple[int, int]
) -> None:
    """Read `taken` batches of epoch 1 on `first`, resume on `second`, read one batch, resume
    on `third` and finish: every sample of the epoch read once, besides the padding of the
    layout that ends the epoch; every rank of a layout the same number of batches."""
    epoch, drop = 1, first[0].drop_remainder
    read = [int(i) for plan in first for b in plan.batches(epoch)[:taken] for i in b]
    state = loader_state(first[0], epoch, taken)
    pads: list[int] = []
    for number, (ranks, batch) in enumerate((second, third)):
        base = plans(SAMPLES, ranks, batch, shuffle=first[0].shuffle, drop_remainder=drop)
        resumed = [resume(plan.replace(seed=0), LoaderState.of(state)) for plan in base]
        plan, position = resumed[0]
        runs = [p.batches(epoch, position) for p, _ in resumed]
        assert {pos for _, pos in resumed} == {position}
        assert [len(run) for run in runs] == [len(plan) - position] * ranks
        if number == 0 and (ranks, batch) == (first[0].num_shards, first[0].batch_size):
            assert [b.tolist() for b in runs[0]] == [
                b.tolist() for b in first[0].batches(epoch)[taken:]
            ]
        steps = 1 if number == 0 and len(runs[0]) > 1 else len(runs[0])
        read += [int(i) for run in runs for b in run[:steps] for i in b]
        if steps == len(runs[0]):  # the run read to its end, its padding too
            pads = padding(plan, epoch, state["samples"], ranks)
            break
        state = loader_state(plan, epoch, position + steps)
    counts = Counter(read)
    if drop:  # each layout's short last batch is left out: each sample at most once + padding
        assert all(counts[i] <= 1 + pads.count(i) for i in counts)
    else:
        assert counts == Counter([*range(SAMPLES), *pads])


def test_batches_shuffle_and_streamed_shards_resume_mid_epoch_only_on_their_own_layout() -> None:
    fixed = plans(SAMPLES, 4, 3, shuffle="batches")
    state = LoaderState.of(loader_state(fixed[0], 0, 2))
    plan, position = resume(fixed[1], state)  # the same layout: exact
    assert position == 2 and plan.batches(0, 2)[0].tolist() == fixed[1].batches(0)[2].tolist()
    other = plans(SAMPLES, 2, 3, shuffle="batches")[0]
    with pytest.raises(
        ValueError, match=r"on 4 ranks with batch_size 3.*: shuffle='batches' fixes"
    ):
        resume(other, state)
    at_the_end = LoaderState.of(loader_state(fixed[0], 1, 0))
    assert resume(other, at_the_end)[1] == 0  # a state taken between epochs resumes anywhere
    starts = np.array([0, 10, 20, 30, SAMPLES])
    streamed = [StreamingPlan.of(plan, starts, buffer=4) for plan in plans(SAMPLES, 2, 3)]
    state = LoaderState.of(loader_state(streamed[0], 0, 1))
    assert resume(streamed[1], state)[1] == 1
    with pytest.raises(ValueError, match="a streamed shard source gives each rank whole"):
        resume(streamed[0].replace(num_shards=1, shard_index=0), state)


def test_bad_and_foreign_states_are_refused_and_a_version_1_state_still_loads(
    folder: Path,
) -> None:
    loader = prefetch.Loader(ids(folder), batch_size=4, **OPTIONS)  # type: ignore[arg-type]
    state = loader.state_dict()
    with pytest.raises(ValueError, match="version 3; this prefetch reads versions 1 and 2"):
        loader.load_state_dict({**state, "version": 3})
    with pytest.raises(ValueError, match=r"lacks \['samples'\]"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "samples"})
    with pytest.raises(ValueError, match="'epoch' must be an int >= 0, got -1"):
        loader.load_state_dict({**state, "epoch": -1})
    with pytest.raises(ValueError, match="a dataset of 40 samples"):
        loader.load_state_dict({**state, "size": 40, "samples": 8})
    loader.shard(2, 1)
    loader.load_state_dict({"seed": 5, "epoch": 2, "position": 3})  # version 1: this layout
    assert loader.state_dict().items() >= {"epoch": 2, "position": 3, "samples": 24}.items()
    with loader:
        rest = [b for b in loader]
    assert len(rest) == len(loader) - 3


@pytest.mark.parametrize("shuffle", [True, False, "batches"])
def test_a_state_at_an_epochs_last_position_saves_as_the_epochs_end_and_loads_anywhere(
    folder: Path, shuffle: bool | str
) -> None:
    # A cursor restored at position len(loader) (a version-1 state there; or a resumed epoch
    # with drop_remainder and less than a batch left) has nothing left of its epoch: its state
    # is the epoch's end, `size` samples read, which any layout loads with nothing left.
    loader = prefetch.Loader(ids(folder), batch_size=4, **{**OPTIONS, "shuffle": shuffle})  # type: ignore[arg-type]
    loader.load_state_dict({"seed": 5, "epoch": 2, "position": len(loader)})
    state = loader.state_dict()
    assert state.items() >= {"epoch": 2, "position": len(loader), "samples": SAMPLES}.items()
    for ranks, batch in ((1, 4), (3, 2)):
        other = prefetch.Loader(ids(folder), batch_size=batch, **{**OPTIONS, "shuffle": shuffle})  # type: ignore[arg-type]
        other.shard(ranks, 1 % ranks)
        other.load_state_dict(state)
        assert other.state_dict()["position"] == len(other), (ranks, batch)
        with other:
            assert read(other) == []  # epoch 2 has nothing left
            assert len(read(other)) == len(other)  # then epoch 3, whole
    plan = plans(SAMPLES, 4, 5, drop_remainder=True)[0]
    resumed, position = resume(plan, LoaderState.of(loader_state(plans(SAMPLES, 1, 1)[0], 0, 35)))
    assert position == len(resumed)  # 2 samples left: no full batch of 4 ranks x 5
    assert loader_state(resumed, 0, position)["samples"] == SAMPLES


# ---- end to end: Loaders on real files ---------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    return write_image_folder(root, class_names=("circle",), per_class=SAMPLES, size=(10, 10))


def ids(folder: Path, paths: list[str] | None = None) -> prefetch.FileList:
    """The folder's files, each labelled with its own index."""
    paths = paths or [str(path) for path in prefetch.ImageFolder(folder).paths]
    return prefetch.FileList(paths, np.arange(len(paths)), [str(i) for i in range(len(paths))])


def read(loader: prefetch.Loader, batches: int | None = None) -> list[list[int]]:
    """The labels of the next `batches` batches of the loader's epoch (all, with None)."""
    out = []
    for _, labels in itertools.islice(loader, batches):
        assert labels is not None
        out.append([int(i) for i in labels])
    return out


@pytest.mark.parametrize(
    "before, after, shard_first",
    [((4, 4), (2, 4), True), ((4, 4), (2, 6), False), ((2, 3), (3, 3), False),
     ((2, 3), (3, 2), True), ((8, 2), (1, 2), True), ((8, 2), (1, 5), False)],
)  # fmt: skip
def test_loaders_resumed_on_other_ranks_read_the_rest_of_the_epoch_once(
    folder: Path, before: tuple[int, int], after: tuple[int, int], shard_first: bool
) -> None:
    (r1, b1), (r2, b2) = before, after
    taken, epoch_read, states = 2 if r1 < 8 else 1, [], []
    for rank in range(r1):
        loader = prefetch.Loader(ids(folder), batch_size=b1, **OPTIONS)  # type: ignore[arg-type]
        loader.shard(r1, rank)
        with loader:
            epoch_read += read(loader, taken)
            states.append(loader.state_dict())
    assert states == [states[0]] * r1  # any rank's state is the whole state
    state = json.loads(json.dumps(states[0]))
    assert state["samples"] == taken * b1 * r1
    check_resumed_ranks(ids(folder), state, r2, b2, shard_first, epoch_read)


def order_of(source: prefetch.FileList, epoch: int) -> list[int]:
    """The samples of `epoch` in the order the ranks read them together."""
    loader = prefetch.Loader(source, batch_size=1, **OPTIONS)  # type: ignore[arg-type]
    return [int(b[0]) for b in loader.batch_indices(epoch)]


def check_resumed_ranks(
    source: prefetch.FileList,
    state: dict[str, int],
    ranks: int,
    batch: int,
    shard_first: bool,
    epoch_read: list[list[int]],
    **options: object,
) -> None:
    """Resume `state` on `ranks` loaders of `batch`; check the epoch (read before:
    `epoch_read`) is read once besides the padding, and the next epoch is a whole one."""
    counts, after, next_epoch = [], [], []
    for rank in range(ranks):
        loader = prefetch.Loader(source, batch_size=batch, **{**OPTIONS, **options})  # type: ignore[arg-type]
        if shard_first:
            loader.shard(ranks, rank)
        loader.load_state_dict(state)
        if not shard_first:
            loader.shard(ranks, rank)
        left = len(loader) - loader.state_dict()["position"]
        with loader:
            run = read(loader)
            next_epoch.append(read(loader))
        assert len(run) == left
        counts.append(len(run))
        after += run
        assert next_epoch[-1] == [b.tolist() for b in loader.batch_indices(state["epoch"] + 1)]
    assert counts == [counts[0]] * ranks
    pad = np.resize(order_of(source, state["epoch"]), -(SAMPLES - state["samples"]) % ranks)
    read_once = Counter(i for b in epoch_read + after for i in b)
    assert read_once == Counter([*range(SAMPLES), *pad.tolist()])
    whole = Counter(i for rank in next_epoch for b in rank for i in b)
    pad = np.resize(order_of(source, state["epoch"] + 1), -SAMPLES % ranks)
    assert whole == Counter([*range(SAMPLES), *pad.tolist()])


@pytest.mark.timeout(180)  # two spawned worker processes, one of them killed and restarted
def test_a_resume_with_a_worker_process_killed_on_the_way_still_reads_the_epoch_once(
    folder: Path, tmp_path: Path
) -> None:
    # 4 ranks read 2 batches of 4; 2 ranks go on with batches of 5 in worker processes. The
    # first sample rank 0 reads after the resume kills its worker (once); the batch is decoded
    # again by the restarted worker.
    epoch_read, states = [], []
    for rank in range(4):
        loader = prefetch.Loader(ids(folder), batch_size=4, **OPTIONS)  # type: ignore[arg-type]
        loader.shard(4, rank)
        with loader:
            epoch_read += read(loader, 2)
            states.append(loader.state_dict())
    probe = prefetch.Loader(ids(folder), batch_size=5, **OPTIONS)  # type: ignore[arg-type]
    probe.shard(2, 0)
    probe.load_state_dict(states[0])
    victim = int(probe.batch_indices(states[0]["epoch"])[0][0])
    paths = [str(path) for path in prefetch.ImageFolder(folder).paths]
    crash_copy = tmp_path / "crash-once.jpg"
    shutil.copyfile(paths[victim], crash_copy)
    crashed = tmp_path / "crashed"
    decoder = CrashingDecoder("crash-once", once_flag=str(crashed))
    paths[victim] = str(crash_copy)
    source = ids(folder, paths)
    check_resumed_ranks(
        source, states[0], 2, 5, True, epoch_read, backend="process", decoder=decoder
    )
    assert crashed.exists(), "the worker was not killed"
