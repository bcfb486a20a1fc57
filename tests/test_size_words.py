"""Sizes in messages are said in a unit that shows them (issue 45, item 11): a few KiB of
batch slots, or a rank's share of /dev/shm of a few hundred bytes, is never "0 MiB".

Through the public API: a Loader of a real folder on a host whose /dev/shm is shared by a
hundred million ranks (`LOCAL_WORLD_SIZE`), so this rank's share is a few hundred bytes and
its batch slots, a few KiB, do not fit it; `backend_reason` says so.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from prefetch import Loader
from prefetch.errors import TooManyWorkersWarning
from prefetch.testing import write_image_folder


def test_a_share_of_shared_memory_under_a_mib_is_said_in_bytes_not_0_mib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_image_folder(tmp_path / "f", class_names=("a", "b"), per_class=4, size=(16, 16))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10**8))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TooManyWorkersWarning)  # ranks beyond the cores
        loader = Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
        with loader:
            next(iter(loader))
    reason = loader.backend_reason
    if "/dev/shm" not in reason and "shared memory" not in reason:
        pytest.skip(f"no shared-memory folder on this machine: {reason}")
    assert "0 MiB" not in reason
    took = re.search(r"batch slots take (\d+) KiB of shared memory, more than \S+ holds", reason)
    share = re.search(
        r"this rank's share (\d+) bytes: [\d.]+ [GM]i?B among 100000000 ranks", reason
    )
    assert took and share, reason
    assert int(took.group(1)) * 1024 > int(share.group(1)) > 0
    assert reason.startswith("auto: thread")
