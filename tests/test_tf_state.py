"""prefetch.tf.dataset's `state_dict()` names the first batch its consumer has not been handed
(issue 45, item 3), for a plain `for batch in ds` loop and for Keras `fit`, however they end:
each rank of a layout takes a few batches and leaves, and loaders on another number of ranks
resume its state; across before and after every sample of the epoch is read once, padding
aside (`check_resumed_ranks`, on real files whose labels are their indices). The batch in the
dataset's own prefetch buffer, which `loader.state_dict()` counts as delivered, is not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_rank_epochs import OPTIONS, check_resumed_ranks, folder, ids  # noqa: F401 (a fixture)

import prefetch
from prefetch.testing import small_cnn

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
import prefetch.tf  # noqa: E402 (after TensorFlow is known to be installed)

pytestmark = pytest.mark.timeout(180)  # Keras fit in each of 2 ranks, on a busy 2-core machine
RANKS, BATCH, TAKEN = 2, 3, 3  # 37 samples: 19 per rank (one padded), 7 batches of 3


class Preempted(Exception):
    """What a preemption handler raises to leave the training loop."""


class LeaveAfter(keras.callbacks.Callback):  # type: ignore[misc]
    """Leaves `fit` after `batches` steps: stops training, or raises `Preempted`."""

    def __init__(self, batches: int, raising: bool) -> None:
        super().__init__()
        self.batches, self.raising = batches, raising

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        if batch + 1 == self.batches:
            if self.raising:
                raise Preempted
            self.model.stop_training = True


def loop_break(ds: Any, loader: prefetch.Loader) -> int:
    for taken, _ in enumerate(ds, 1):
        if taken == TAKEN:
            break
    return TAKEN


def loop_exception(ds: Any, loader: prefetch.Loader) -> int:
    with pytest.raises(Preempted):
        for taken, _ in enumerate(ds, 1):
            if taken == TAKEN:
                raise Preempted
    return TAKEN


def iterator_dropped(ds: Any, loader: prefetch.Loader) -> int:
    epoch = iter(ds)
    for _ in range(TAKEN):
        next(epoch)
    del epoch
    return TAKEN


def fit(ds: Any, raising: bool) -> int:
    model = small_cnn(8, 37)  # built and compiled: fit takes no batch to build it
    leave = LeaveAfter(TAKEN, raising)
    if raising:
        with pytest.raises(Preempted):
            model.fit(ds, epochs=3, shuffle=False, verbose=0, callbacks=[leave])
    else:
        history = model.fit(ds, epochs=3, shuffle=False, verbose=0, callbacks=[leave])
        assert len(history.history["loss"]) == 1
    return TAKEN


WAYS: dict[str, Callable[[Any, prefetch.Loader], int]] = {
    "loop break": loop_break,
    "loop exception": loop_exception,
    "iterator dropped": iterator_dropped,
    "fit stopped by a callback": lambda ds, _: fit(ds, raising=False),
    "fit preempted": lambda ds, _: fit(ds, raising=True),
}


def left_ranks(
    root: Path, way: Callable[[Any, prefetch.Loader], int], **options: Any
) -> tuple[list[dict[str, int]], list[list[list[int]]]]:
    """Each rank's `ds.state_dict()` after `way`, and each rank's batches of epoch 0."""
    states, batches = [], []
    for rank in range(RANKS):
        loader = prefetch.Loader(ids(root), batch_size=BATCH, **OPTIONS)  # type: ignore[arg-type]
        loader.shard(RANKS, rank)
        with loader:
            ds = prefetch.tf.dataset(loader, **options)
            way(ds, loader)
            states.append(ds.state_dict())
        batches.append([b.tolist() for b in loader.batch_indices(0)])
    return states, batches


def handed(batches: list[list[list[int]]], state: dict[str, int]) -> list[list[int]]:
    """The batches every rank read before the batch `state` names (a rank's batches come in
    `batch_indices` order)."""
    return [batch for rank in batches for batch in rank[: state["position"]]]


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_state_taken_after_leaving_resumes_on_other_ranks_reading_each_sample_once(
    folder: Path,  # noqa: F811 (the fixture)
    way: str,
) -> None:
    states, batches = left_ranks(folder, WAYS[way])
    assert states == [states[0]] * RANKS
    assert states[0]["epoch"] == 0 and states[0]["position"] == TAKEN
    check_resumed_ranks(ids(folder), states[0], 3, 2, False, handed(batches, states[0]))


def test_with_a_device_the_state_names_the_first_batch_not_handed_or_the_one_before(
    folder: Path,  # noqa: F811 (the fixture)
) -> None:
    # prefetch_to_device holds one batch out of the dataset's sight: each rank's state names
    # the first batch not handed or the one before it (ranks may differ by it), never a later
    # one, so a resume from rank 0's loses nothing: check_resumed_ranks holds it to the
    # batches before the one it names, which every rank had been handed.
    states, batches = left_ranks(folder, loop_break, device="/cpu:0")
    for state in states:
        assert state["epoch"] == 0 and state["position"] in (TAKEN - 1, TAKEN)
    check_resumed_ranks(ids(folder), states[0], 3, 2, True, handed(batches, states[0]))


def test_the_state_before_any_batch_and_after_a_whole_epoch_is_where_the_next_begins(
    folder: Path,  # noqa: F811 (the fixture)
) -> None:
    loader = prefetch.Loader(ids(folder), batch_size=4, **OPTIONS)  # type: ignore[arg-type]
    with loader:
        ds = prefetch.tf.dataset(loader)
        assert ds.state_dict() == loader.state_dict()  # nothing read yet: epoch 0, position 0
        assert len(list(ds)) == len(loader)
        assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["position"] == 0
        loop_break(ds, loader)
        assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["position"] == TAKEN
        assert len(list(ds)) == len(loader)  # a new iteration forgets what the last was handed
        assert ds.state_dict()["epoch"] == 3 and ds.state_dict()["position"] == 0
