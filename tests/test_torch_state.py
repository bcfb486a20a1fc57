"""prefetch.torch.DeviceLoader's state_dict names the first batch its loop has not been handed,
however the loop ends (issue 45, item 3): each rank of a layout takes a few batches and leaves
its loop in one of the ways a training script does, and loaders on another number of ranks
resume its state; across before and after every sample of the epoch is read once, padding
aside (`check_resumed_ranks`, on real files whose labels are their indices)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_rank_epochs import OPTIONS, check_resumed_ranks, folder, ids  # noqa: F401 (a fixture)

import prefetch

torch = pytest.importorskip("torch")
import prefetch.torch  # noqa: E402 (after torch is known to be installed)

pytestmark = pytest.mark.timeout(120)


class Preempted(Exception):
    """What a preemption handler raises to leave the training loop."""


def leave_by_break(batches: Any, taken: int, seen: list[list[int]]) -> None:
    for _, labels in batches:
        seen.append(labels.tolist())
        if len(seen) == taken:
            break


def leave_by_exception(batches: Any, taken: int, seen: list[list[int]]) -> None:
    with pytest.raises(Preempted):
        for _, labels in batches:
            seen.append(labels.tolist())
            if len(seen) == taken:
                raise Preempted


def leave_by_close(batches: Any, taken: int, seen: list[list[int]]) -> None:
    epoch: Iterator[Any] = iter(batches)
    seen += [next(epoch)[1].tolist() for _ in range(taken)]
    epoch.close()  # type: ignore[attr-defined]


def leave_by_dropping(batches: Any, taken: int, seen: list[list[int]]) -> None:
    epoch = iter(batches)
    seen += [next(epoch)[1].tolist() for _ in range(taken)]
    del epoch  # the generator is collected
    gc.collect()


WAYS: dict[str, Callable[[Any, int, list[list[int]]], None]] = {
    "break": leave_by_break,
    "exception": leave_by_exception,
    "close": leave_by_close,
    "collected": leave_by_dropping,
}


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_state_taken_after_the_loop_is_left_resumes_on_other_ranks_reading_each_sample_once(
    folder: Path,  # noqa: F811 (the fixture)
    way: str,
) -> None:
    # 4 ranks of batch 2 take 3 batches each (one more is read ahead, never handed out), then
    # 2 ranks of batch 3 resume: the issue's case lost the 4 read-ahead batches' 8 samples.
    ranks, taken, epoch_read, states = 4, 3, [], []
    for rank in range(ranks):
        loader = prefetch.Loader(ids(folder), batch_size=2, **OPTIONS)  # type: ignore[arg-type]
        loader.shard(ranks, rank)
        batches = prefetch.torch.DeviceLoader(loader, dtype=torch.uint8, distributed=False)
        seen: list[list[int]] = []
        with loader:
            WAYS[way](batches, taken, seen)
            states.append(batches.state_dict())
        assert len(seen) == taken
        epoch_read += seen
    assert states == [states[0]] * ranks
    assert states[0]["epoch"] == 0 and states[0]["position"] == taken
    check_resumed_ranks(ids(folder), states[0], 2, 3, True, epoch_read)


def test_the_state_after_a_whole_epoch_is_the_next_epoch_and_a_new_loop_forgets_the_last(
    folder: Path,  # noqa: F811 (the fixture)
) -> None:
    loader = prefetch.Loader(ids(folder), batch_size=4, **OPTIONS)  # type: ignore[arg-type]
    batches = prefetch.torch.DeviceLoader(loader, dtype=torch.uint8)
    with loader:
        assert len(list(batches)) == len(loader)
        assert batches.state_dict()["epoch"] == 1 and batches.state_dict()["position"] == 0
        leave_by_break(batches, 2, [])
        assert batches.state_dict()["epoch"] == 1 and batches.state_dict()["position"] == 2
        assert len(list(batches)) == len(loader)  # epoch 2, whole
    assert batches.state_dict()["epoch"] == 3 and batches.state_dict()["position"] == 0
    # A state loaded through the DeviceLoader replaces what its last loop was handed.
    batches.load_state_dict({**batches.state_dict(), "epoch": 5})
    assert batches.state_dict()["epoch"] == 5 and batches.state_dict()["position"] == 0
