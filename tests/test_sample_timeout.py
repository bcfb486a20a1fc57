"""sample_timeout_s: a sample that never returns (a FIFO named .jpg, a source that blocks).

Without a limit such a sample hangs training forever, on both backends and also under
on_error="skip". With one, the process backend kills the stuck worker (no restart spent) and
raises `SampleTimeoutError` naming the file and worker, or skips the sample under "skip"; the
thread backend, which cannot stop a thread, raises naming the file and closes the loader. The
FIFOs are opened for writing at the end of each test, so a stuck thread ends and leaks nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from prefetch import Augment, ErrorPolicy, FileList, Loader, RandomResizedCrop, SampleTimeoutError
from prefetch.testing import PlainReadDecoder, write_image_folder

pytestmark = pytest.mark.timeout(120)

# Generous on purpose: a busy machine must not read a slow but healthy sample as stuck.
LIMIT_S = 2.0


@pytest.fixture
def files_with_a_fifo(tmp_path: Path) -> Iterator[tuple[FileList, str]]:
    """Six good images and, fourth in order, a FIFO named like a JPEG; unblocked at the end."""
    root = write_image_folder(tmp_path / "good", class_names=("a", "b"), per_class=3)
    good = sorted(str(p) for p in root.rglob("*.jpg"))
    fifo = str(tmp_path / "stuck.jpg")
    os.mkfifo(fifo)
    paths = [*good[:3], fifo, *good[3:]]
    yield FileList(paths, labels=[0, 0, 0, 1, 1, 1, 1]), fifo
    # A reader blocked in open() gets end-of-file once a writer comes and goes; a decoder may
    # retry with another library (and block again), so keep coming for a few seconds.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):  # ENXIO: nobody is reading it right now
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        time.sleep(0.02)


def loader_for(files: FileList, **options: object) -> Loader:
    # prefetch's own decoders refuse a FIFO at once; a plain read blocks on it, as a read from
    # a dead network mount would (crops are decoded by prefetch's own window decoder).
    crop = options.pop("crop", None)
    on_error = ErrorPolicy(str(options.pop("on_error", "raise")), sample_timeout_s=LIMIT_S)
    options = {
        "batch_size": 7,
        "image_size": (16, 16),
        "shuffle": False,
        "decoder": "auto" if crop else PlainReadDecoder(),
        "augment": Augment(crop),  # type: ignore[arg-type]
        **options,
    }
    return Loader(files, on_error=on_error, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_thread_loader_raises_naming_the_stuck_file_and_closes(
    files_with_a_fifo: tuple[FileList, str], on_error: str
) -> None:
    files, _ = files_with_a_fifo
    loader = loader_for(files, backend="thread", workers=2, on_error=on_error)
    with pytest.raises(SampleTimeoutError, match=r"stuck\.jpg") as raised:
        list(loader)
    assert isinstance(raised.value, TimeoutError)
    assert "sample_timeout_s=2.0" in str(raised.value)
    # skip advice only where skipping is not on already (issue 35.5)
    assert ("pass on_error='skip'" in str(raised.value)) == (on_error == "raise")
    assert loader._epochs.workers.backend is None  # closed


def test_a_process_loader_kills_the_stuck_worker_and_raises_naming_file_and_worker(
    files_with_a_fifo: tuple[FileList, str],
) -> None:
    files, _ = files_with_a_fifo
    loader = loader_for(files, backend="process", workers=1)
    with loader:
        with pytest.raises(SampleTimeoutError, match=r"stuck\.jpg") as raised:
            list(loader)
        notes = "\n".join(getattr(raised.value, "__notes__", []))
        assert "killed prefetch-process-0" in notes
        backend = loader._epochs.workers.backend
        assert backend is not None and backend.restarts == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("crop", [None, RandomResizedCrop()], ids=["whole", "crop"])
def test_a_process_loader_skips_the_stuck_sample_under_on_error_skip(
    files_with_a_fifo: tuple[FileList, str], crop: RandomResizedCrop | None
) -> None:
    files, fifo = files_with_a_fifo
    loader = loader_for(files, backend="process", workers=2, on_error="skip", crop=crop)
    with loader:
        (batch,) = list(loader)
        backend = loader._epochs.workers.backend
        assert backend is not None and backend.restarts == 0  # type: ignore[attr-defined]
    assert len(batch.images) == 6 and batch.labels is not None
    assert list(batch.labels) == [0, 0, 0, 1, 1, 1]
    stats = loader.stats()
    assert stats.skipped == 1 and stats.skipped_paths == (fifo,)


class BlockingSource:
    """A user source whose sample `stuck` blocks (a dead network mount) until released."""

    def __init__(self, size: int, stuck: int) -> None:
        self.size, self.stuck = size, stuck
        self.released = threading.Event()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if index == self.stuck:
            self.released.wait(60)
        return np.zeros((16, 16, 3), np.uint8), 0


def test_a_blocking_getitem_times_out_naming_the_sample() -> None:
    source = BlockingSource(8, stuck=5)
    loader = Loader(
        source,
        batch_size=4,
        image_size=(16, 16),
        workers=2,
        backend="thread",
        on_error=ErrorPolicy(sample_timeout_s=LIMIT_S),
        shuffle=False,
    )
    try:
        with pytest.raises(SampleTimeoutError, match=r"BlockingSource\[5\]"):
            list(loader)
    finally:
        source.released.set()


def test_without_a_limit_nothing_is_timed_out_and_the_limit_is_checked(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "good", class_names=("a",), per_class=4)
    assert Loader(root, image_size=(8, 8)).options.on_error.sample_timeout_s is None
    assert (
        len(list(Loader(root, image_size=(8, 8), on_error=ErrorPolicy(sample_timeout_s=30)))) == 1
    )
    for bad in (0, -1, True, "5"):
        with pytest.raises(ValueError, match="sample_timeout_s"):
            Loader(root, image_size=(8, 8), on_error=ErrorPolicy(sample_timeout_s=bad))  # type: ignore[arg-type]
