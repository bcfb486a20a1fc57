"""An open loader's lookahead: the next epoch's first batches are decoded while the current
epoch's last ones are consumed, so the workers do not idle at an epoch boundary.

What a user relies on: the lookahead happens (with real workers, threads and processes); it
changes no batch, no resume state, no error and no stat; `close()` cancels it without leaking;
`shard()` and `load_state_dict()` between epochs discard it; and memory stays within the ring.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.backends import ring_capacity
from prefetch.backends._shm import PREFIX, SHM_DIR
from prefetch.testing import (
    FailingDecoder,
    RecordingDecoder,
    SlowDecoder,
    assert_same_batches,
    random_flip_and_noise,
    write_image_folder,
)

pytestmark = pytest.mark.timeout(120)

BACKENDS = ["thread", "process"]
IMAGES = 24  # 2 classes x 12
Epoch = list[tuple[np.ndarray, np.ndarray]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(
        tmp_path_factory.mktemp("lookahead"), class_names=("a", "b"), per_class=12, size=(12, 12)
    )


def make(folder: Path, **options: Any) -> prefetch.Loader:
    settings: dict[str, Any] = dict(batch_size=4, image_size=(8, 8), seed=5, depth=2, workers=2)
    settings.update(options)
    return prefetch.Loader(folder, **settings)


def taken(stream: Any, count: int | None = None, pause_s: float = 0.0) -> Epoch:
    """Copies of `count` batches of `stream` (all when None), sleeping `pause_s` after each."""
    batches = []
    for images, labels in stream:
        batches.append((images.copy(), labels.copy()))
        time.sleep(pause_s)
        if count is not None and len(batches) == count:
            break
    return batches


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Return once `condition()` holds; fail (after `limit_s`, a bound, not a measurement) if it
    never does."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_next_epochs_first_samples_start_before_the_last_batch_is_taken(
    folder: Path, tmp_path: Path, backend: str
) -> None:
    recorder = RecordingDecoder(tmp_path / "starts.log")
    loader = make(folder, shuffle=False, decoder=recorder, backend=backend)
    first_of_next = {loader.source.location(int(i)) for i in loader.batch_indices(1)[0]}
    with loader:
        stream = iter(loader)
        taken(stream, len(loader) - 1, pause_s=0.01)  # all but the last batch of epoch 0
        # Every sample of epoch 0 has started; the next to start are epoch 1's, ahead.
        wait_for(lambda: len(recorder.starts()) > IMAGES, "a sample of epoch 1 started")
        ahead = recorder.starts()[IMAGES:]
        assert set(ahead) <= first_of_next  # one batch ahead: all the room there is
        last = taken(stream)
        assert len(last) == 1  # epoch 0's last batch is taken only now
        assert loader.state_dict().items() >= {"seed": 5, "epoch": 1, "position": 0}.items()
        assert len(taken(loader)) == len(loader)  # epoch 1, whole
    # Nothing was decoded twice for the lookahead: each sample once an epoch.
    counts = {path: recorder.starts().count(path) for path in recorder.starts()}
    assert max(counts.values()) <= 3  # epoch 0, epoch 1, and at most one epoch-2 lookahead


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_batches_are_those_without_lookahead_at_any_consumer_speed(
    folder: Path, backend: str, workers: int
) -> None:
    options = dict(augment=prefetch.Augment(transform=random_flip_and_noise), workers=workers)
    unentered = make(folder, backend="thread", **options)  # no lookahead: each epoch alone
    expected = [taken(unentered) for _ in range(3)]
    for pause_s in (0.0, 0.005):
        loader = make(folder, backend=backend, **options)
        with loader:
            got = [taken(loader, pause_s=pause_s) for _ in range(3)]
        for epoch in range(3):
            assert_same_batches(got[epoch], expected[epoch])


@pytest.mark.parametrize("backend", BACKENDS)
def test_resuming_at_and_around_the_boundary_gives_the_following_batches(
    folder: Path, backend: str
) -> None:
    unentered = make(folder)
    expected = [taken(unentered) for _ in range(2)]
    loader = make(folder, backend=backend)
    with loader:
        stream = iter(loader)
        taken(stream, len(loader) - 1)  # the lookahead has begun
        around = loader.state_dict()
        assert around.items() >= {"seed": 5, "epoch": 0, "position": len(loader) - 1}.items()
        taken(stream)
        at = loader.state_dict()  # the looked-ahead batches are not delivered ones
        assert at.items() >= {"seed": 5, "epoch": 1, "position": 0}.items()
        # Restored on the same open loader, between epochs: the same next epoch.
        loader.load_state_dict(at)
        assert_same_batches(taken(loader), expected[1])
        # Back to the last batch of epoch 0, with epoch 1 looked ahead meanwhile.
        loader.load_state_dict(around)
        assert_same_batches(taken(loader), expected[0][-1:])
        assert_same_batches(taken(loader), expected[1])
    for state, following in ((around, expected[0][-1:] + expected[1]), (at, expected[1])):
        fresh = make(folder, backend=backend, seed=None)
        fresh.load_state_dict(state)
        with fresh:
            got = taken(fresh) + (taken(fresh) if state is around else [])
        assert_same_batches(got, following)


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_and_shard_between_epochs_discard_the_lookahead(
    folder: Path, backend: str
) -> None:
    other_seed = make(folder, seed=9)
    other_seed.load_state_dict({"seed": 9, "epoch": 3, "position": 0})
    expected_seed = taken(other_seed)
    half = make(folder)
    half.load_state_dict({"seed": 5, "epoch": 1, "position": 0})
    half.shard(2, 1)
    expected_shard = taken(half)
    loader = make(folder, backend=backend)
    with loader:
        taken(loader)  # epoch 0; epoch 1 is looked ahead now
        loader.load_state_dict({"seed": 9, "epoch": 3, "position": 0})
        assert_same_batches(taken(loader), expected_seed)
        taken(loader)  # epoch 4 of seed 9; its epoch 5 is looked ahead
        loader.load_state_dict({"seed": 5, "epoch": 1, "position": 0})
        loader.shard(2, 1)
        assert len(loader) == 3
        assert_same_batches(taken(loader), expected_shard)


@pytest.mark.parametrize("backend", BACKENDS)
def test_closing_with_a_lookahead_in_flight_cancels_it_and_leaks_nothing(
    folder: Path, tmp_path: Path, backend: str
) -> None:
    recorder = RecordingDecoder(tmp_path / "starts.log")
    loader = make(folder, decoder=recorder, backend=backend)
    with loader:
        taken(loader)  # one epoch only: the lookahead costs at most what is in flight
        in_flight = loader.stats().in_flight
        wait_for(lambda: len(recorder.starts()) > IMAGES, "the lookahead started")
    assert len(recorder.starts()) <= IMAGES + in_flight * 4
    assert loader.state_dict().items() >= {"seed": 5, "epoch": 1, "position": 0}.items()
    # Closed explicitly with the lookahead being decoded (the no_leaks fixture checks the rest)
    again = make(folder, decoder=SlowDecoder(0.05), backend=backend)
    again.__enter__()
    taken(again)
    again.close()
    assert again.stats().batches == len(again)


def test_an_unentered_loader_looks_nothing_ahead(folder: Path, tmp_path: Path) -> None:
    recorder = RecordingDecoder(tmp_path / "starts.log")
    loader = make(folder, decoder=recorder, backend="thread")  # "auto" would measure a batch
    taken(loader)
    assert len(recorder.starts()) == IMAGES


def our_segments() -> int:
    return sum(name.startswith(f"{PREFIX}{os.getpid()}_") for name in os.listdir(SHM_DIR))


def test_the_lookahead_takes_no_slot_beyond_the_ring(folder: Path) -> None:
    loader = make(folder, backend="process", depth=2)
    most = 0
    with loader:
        for _ in range(3):
            for _batch in loader:
                most = max(most, our_segments())
    assert 0 < most <= ring_capacity(2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_in_the_next_epochs_first_batch_is_raised_at_that_batch(
    folder: Path, backend: str
) -> None:
    loader = make(folder, shuffle=False, backend=backend)
    bad = loader.source.location(int(loader.batch_indices(0)[0][1]))  # in batch 0 of each epoch
    loader = make(folder, shuffle=False, backend=backend, decoder=FailingDecoder(bad))
    loader.load_state_dict({"seed": 5, "epoch": 0, "position": 1})  # epoch 0 leaves batch 0 out
    with loader:
        rest = taken(loader)  # ends normally although epoch 1's failing batch is decoded ahead
        assert len(rest) == len(loader) - 1
        wait_for(lambda: loader._epochs.ready_ahead() >= 1, "epoch 1's first batch decoded")
        stream = iter(loader)
        with pytest.raises(ValueError, match="injected failure") as raised:
            next(stream)
        assert bad in "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
        assert loader.state_dict().items() >= {"seed": 5, "epoch": 1, "position": 0}.items()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_skipped_sample_decoded_ahead_is_counted_once_in_its_own_epoch(
    folder: Path, backend: str
) -> None:
    plain = make(folder, shuffle=False)
    bad = plain.source.location(int(plain.batch_indices(0)[0][1]))
    loader = make(
        folder,
        shuffle=False,
        backend=backend,
        decoder=FailingDecoder(bad),
        on_error="skip",
    )
    loader.load_state_dict({"seed": 5, "epoch": 0, "position": 1})
    with loader:
        taken(loader)
        wait_for(lambda: loader._epochs.ready_ahead() >= 1, "epoch 1's first batch decoded")
        stats = loader.stats()
        assert (stats.skipped, stats.batches, stats.images) == (0, len(loader) - 1, IMAGES - 4)
        loader.reset_stats()
        epoch = taken(loader)
        stats = loader.stats()
    assert [len(images) for images, _ in epoch] == [3] + [4] * (len(loader) - 1)
    assert (stats.skipped, stats.skipped_paths) == (1, (bad,))
    assert (stats.epochs, stats.batches, stats.images) == (1, len(loader), IMAGES - 1)
    assert 0.0 <= stats.consumer_wait_fraction <= 1.0
