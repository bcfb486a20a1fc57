"""A loader's one window of batches in flight (prefetch.runtime._window), as users meet it.

What a user relies on: two epochs iterated at once on one loader (two streams, interleaved)
each get their own batches in order and neither waits forever on the other; the window never
keeps more batches submitted than the loader's in-flight bound, whatever the streams do; a
stream given up mid-epoch hands its room to the next one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_lookahead import BACKENDS, folder, make

from prefetch.testing import RecordingDecoder, assert_same_batches

pytestmark = pytest.mark.timeout(120)

__all__ = ["folder"]  # the module's image folder fixture, shared with test_lookahead


def copies(batches: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.copy(), labels.copy()) for images, labels in batches]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_epochs_iterated_at_once_each_get_their_batches_in_order(
    folder: Path, backend: str
) -> None:
    alone = make(folder, backend="thread")
    expected = [copies(list(alone)) for _ in range(2)]
    loader = make(folder, backend=backend)
    with loader:
        first, second = iter(loader), iter(loader)
        got: list[list[Any]] = [[], []]
        got[0].append(next(first))  # epoch 0 begins
        for _ in range(len(loader) - 1):  # then both, turn by turn
            got[1].extend(copies([next(second)]))
            got[0].extend(copies([next(first)]))
        got[1].extend(copies(list(second)))
        assert list(first) == []
    assert_same_batches(copies(got[0][:1]) + got[0][1:], expected[0])
    assert_same_batches(got[1], expected[1])


@pytest.fixture
def recorder(tmp_path: Path) -> RecordingDecoder:
    """A decoder that records each sample it starts."""
    return RecordingDecoder(tmp_path / "starts.log")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_window_never_keeps_more_batches_submitted_than_the_bound(
    folder: Path, recorder: RecordingDecoder, backend: str
) -> None:
    loader = make(folder, backend=backend, decoder=recorder, shuffle=False)
    delivered = 0
    with loader:
        bound = loader.stats().in_flight
        for _ in range(3):
            for _batch in loader:
                delivered += 1
                # every sample started so far belongs to a batch delivered or in flight
                assert len(recorder.starts()) <= (delivered + bound) * 4
    assert delivered == 3 * len(loader)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stream_dropped_mid_epoch_leaves_the_next_one_whole(folder: Path, backend: str) -> None:
    alone = make(folder, backend="thread")
    expected = [copies(list(alone)) for _ in range(2)]
    loader = make(folder, backend=backend)
    with loader:
        stream = iter(loader)
        next(stream)
        stream.close()  # epoch 0 given up after one batch: its batches in flight drained
        assert_same_batches(copies(list(loader)), expected[1])
