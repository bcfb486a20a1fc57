"""Behaviour both worker backends share, each test parametrized over backend="thread"/"process".

tests/test_loader.py covers these for threads in depth; here each behaviour runs through both
backends: order, determinism, errors at the right batch with their own type, skipping, copies,
kept batches, stats, sources without files, broken-off epochs and rapid open/close cycles.
Samples are told apart by label: a `FileList` gives every file its own label, its position.
Classes defined here are sent to spawned workers, which import this module to unpickle them.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

import prefetch
from prefetch import (
    Augment,
    Batch,
    DecodeOptions,
    ErrorPolicy,
    FileList,
    Loader,
    TooManySkippedError,
)
from prefetch.backends._shm import PREFIX, SHM_DIR
from prefetch.decode._choice import get_decoder
from prefetch.testing import (
    FailingDecoder,
    SlowDecoder,
    assert_same_batches,
    random_flip_and_noise,
    worker_processes,
    write_bad_files,
    write_image_folder,
)

pytestmark = pytest.mark.timeout(60)

BACKENDS = ("thread", "process")
SMALL = (16, 16)
WORKER_NAMES = {"thread": "prefetch-worker-", "process": "prefetch-process-"}


class CustomDecodeError(Exception):
    """An error type only user code raises: it must reach the consumer unchanged."""


class ArraySource:
    """A source without files: solid 20x30 RGB arrays at gray level 10 * i, label i."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.class_names = [str(i) for i in range(count)]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return np.full((20, 30, 3), 10 * index, np.uint8), index


def drop_first_row(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A broken transform: it changes the image's shape."""
    return image[1:]


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """22 JPEGs of shapes in 2 classes (24x20), in ImageFolder order."""
    root = write_image_folder(
        tmp_path_factory.mktemp("shared"), class_names=("a", "b"), per_class=11, size=(24, 20)
    )
    return [Path(p) for p in prefetch.ImageFolder(root).paths]


def labelled(paths: list[Path]) -> FileList:
    """The files with label i for paths[i]: a delivered label names its file."""
    return FileList(paths, list(range(len(paths))))


def copied(batch: Batch) -> Batch:
    return Batch(batch.images.copy(), batch.labels.copy())


def copies(loader: Loader) -> list[Batch]:
    """One epoch, every batch copied."""
    return [copied(batch) for batch in loader]


def all_notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


def our_segments() -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if n.startswith(f"{PREFIX}{os.getpid()}_")]


# --- order and determinism ----------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_follow_the_epoch_order_and_hold_each_file_once(
    paths: list[Path], backend: str, shuffle: bool
) -> None:
    loader = Loader(
        labelled(paths),
        batch_size=5,
        image_size=SMALL,
        workers=2,
        shuffle=shuffle,
        seed=3,
        backend=backend,
    )
    options = DecodeOptions(SMALL)
    with loader:
        epochs = [copies(loader) for _ in range(2)]
    for epoch, batches in enumerate(epochs):
        order = loader.batch_indices(epoch)
        assert [batch.labels.tolist() for batch in batches] == [b.tolist() for b in order]
        for batch in batches:
            for image, label in zip(batch.images, batch.labels, strict=True):
                np.testing.assert_array_equal(
                    image, get_decoder("auto")(str(paths[label]), options)
                )
    labels = [np.concatenate([b.labels for b in batches]).tolist() for batches in epochs]
    assert sorted(labels[0]) == sorted(labels[1]) == list(range(len(paths)))
    assert (labels[0] != labels[1]) == shuffle, "only shuffled epochs differ in order"


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_random_transform_gives_the_same_batches_for_any_backend_and_worker_count(
    paths: list[Path], backend: str, workers: int
) -> None:
    options: dict[str, Any] = dict(
        batch_size=4,
        image_size=SMALL,
        seed=21,
        augment=prefetch.Augment(transform=random_flip_and_noise),
    )
    with Loader(labelled(paths), workers=2, **options) as reference:
        expected = [copies(reference) for _ in range(2)]
    with Loader(labelled(paths), workers=workers, backend=backend, **options) as loader:
        got = [copies(loader) for _ in range(2)]
    for epoch in range(2):
        assert_same_batches(got[epoch], expected[epoch])


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_decoder_error_arrives_at_its_batch_with_its_type_traceback_and_a_note(
    paths: list[Path], backend: str
) -> None:
    failing = paths[13]  # batch 3 of batches of 4, in order
    loader = Loader(
        labelled(paths),
        batch_size=4,
        image_size=SMALL,
        workers=2,
        shuffle=False,
        backend=backend,
        decoder=FailingDecoder(failing.name, CustomDecodeError),
    )
    delivered = []
    with pytest.raises(CustomDecodeError, match="injected failure") as raised, loader:
        for _, labels in loader:
            delivered.append(labels.tolist())
    assert type(raised.value) is CustomDecodeError
    assert delivered == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    notes = all_notes(raised.value)
    assert str(failing) in notes and WORKER_NAMES[backend] in notes
    text = "".join(traceback.format_exception(raised.value))
    decoder_file = os.path.join("prefetch", "testing", "_fakes.py")  # where FailingDecoder lives
    assert decoder_file in text and "in __call__" in text, "the worker's traceback is kept"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transform_that_changes_the_shape_is_refused(paths: list[Path], backend: str) -> None:
    loader = Loader(
        labelled(paths),
        batch_size=4,
        image_size=SMALL,
        workers=2,
        backend=backend,
        augment=Augment(transform=drop_first_row),
    )
    with pytest.raises(ValueError, match="transform returned shape"), loader:
        for _ in loader:
            pass


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_skipped_raises_too_many_skipped_with_the_paths_and_the_last_error(
    paths: list[Path], tmp_path: Path, backend: str
) -> None:
    bad = write_bad_files(tmp_path, kinds=("corrupt", "zero_byte"))
    files = [*paths[:3], bad["corrupt"], *paths[3:6], bad["zero_byte"], *paths[6:9]]
    loader = Loader(
        labelled(files),
        batch_size=2,
        image_size=SMALL,
        workers=2,
        shuffle=False,
        on_error=ErrorPolicy("skip", max_skipped=1),
        backend=backend,
    )
    delivered = []
    with pytest.raises(TooManySkippedError) as raised, loader:
        for _, labels in loader:
            delivered.append(labels.tolist())
    assert sorted(raised.value.paths) == sorted(str(p) for p in bad.values())
    assert isinstance(raised.value.__cause__, OSError), "the last decode error is the cause"
    assert delivered == [[0, 1], [2], [4, 5]], "raised at the batch that passed the cap"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wholly_skipped_batch_is_passed_over_and_counts_as_delivered(
    paths: list[Path], tmp_path: Path, backend: str
) -> None:
    bad = write_bad_files(tmp_path, kinds=("zero_byte", "text"))
    files = [*paths[:2], bad["zero_byte"], bad["text"], *paths[2:4]]
    loader = Loader(
        labelled(files),
        batch_size=2,
        image_size=SMALL,
        workers=1,
        shuffle=False,
        on_error="skip",
        backend=backend,
    )
    assert [labels.tolist() for _, labels in copies(loader)] == [[0, 1], [4, 5]]
    assert (
        loader.state_dict().items()
        >= {"seed": loader.options.seed, "epoch": 1, "position": 0}.items()
    )
    assert loader.stats().skipped == 2


# --- batch memory -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_kept_keep_their_own_content(paths: list[Path], backend: str) -> None:
    options: dict[str, Any] = dict(batch_size=4, image_size=SMALL, workers=2, seed=8)
    with Loader(labelled(paths), **options) as reference:
        expected = copies(reference) + copies(reference)
    with Loader(labelled(paths), backend=backend, **options) as loader:
        kept = list(loader) + list(loader)  # views into slots, kept across two epochs
    assert_same_batches(kept, expected)
    for i, a in enumerate(kept):
        for b in kept[i + 1 :]:
            assert not np.shares_memory(a.images, b.images)


# --- stats and sources ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats_count_images_batches_and_epochs_and_name_the_backend(
    paths: list[Path], backend: str
) -> None:
    loader = Loader(
        labelled(paths), batch_size=4, image_size=SMALL, workers=2, depth=3, backend=backend
    )
    with loader:
        for _ in range(2):
            for _ in loader:
                pass
    stats = loader.stats()
    assert (stats.backend, stats.workers, stats.depth) == (backend, 2, 3)
    assert (stats.epochs, stats.batches, stats.images) == (2, 2 * len(loader), 2 * len(paths))
    assert stats.producer_busy_s > 0 and stats.images_per_s > 0
    assert 0 <= stats.consumer_wait_fraction <= 1 and 0 <= stats.mean_ready_batches <= 3
    assert stats.skipped == 0 and stats.skipped_paths == ()


@pytest.mark.parametrize("label_mode", ["int", "categorical"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_source_without_files_is_read_by_index_and_resized(backend: str, label_mode: str) -> None:
    loader = Loader(
        ArraySource(10),
        batch_size=4,
        image_size=(8, 12),
        workers=2,
        shuffle=False,
        label_mode=label_mode,
        backend=backend,
    )
    with loader:
        batches = copies(loader)
    images = np.concatenate([batch.images for batch in batches])
    assert images.shape == (10, 8, 12, 3)
    assert images.reshape(10, -1).min(axis=1).tolist() == [10 * i for i in range(10)]
    assert images.reshape(10, -1).max(axis=1).tolist() == [10 * i for i in range(10)]
    labels = np.concatenate([batch.labels for batch in batches])
    want = np.arange(10, dtype=np.int32)
    np.testing.assert_array_equal(
        labels, want if label_mode == "int" else np.eye(10, dtype=np.float32)
    )


# --- lifetime -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_epoch_broken_off_inside_with_leaves_the_next_epoch_intact(
    paths: list[Path], tmp_path: Path, backend: str
) -> None:
    files = paths[:8]
    # Batches of 2: file 3, the second row of batch 1, takes 1 s to decode the first time, so
    # that batch is still being decoded when the consumer leaves epoch 0 after batch 0.
    decoder = SlowDecoder(1.0, marker=files[3].name, once_flag=str(tmp_path / "slow-once"))
    loader = Loader(
        labelled(files),
        batch_size=2,
        image_size=SMALL,
        workers=2,
        depth=1,
        shuffle=False,
        decoder=decoder,
        backend=backend,
    )
    options = DecodeOptions(SMALL)
    expected = [get_decoder("auto")(str(path), options) for path in files]
    with loader:
        for _batch in loader:
            break
        del _batch
        got = []
        for images, labels in loader:
            if not got:
                time.sleep(1.5)  # hold the first batch past the slow decode of epoch 0
            got.append((images.copy(), labels.copy()))
    assert np.concatenate([labels for _, labels in got]).tolist() == list(range(8))
    for images, labels in got:
        for image, label in zip(images, labels, strict=True):
            np.testing.assert_array_equal(image, expected[label], f"row of file {label}")


CYCLES = 100


# 100 loaders, each spawning a worker process: 32 s on a quiet 2-core machine, 50 s with four
# busy loops beside it, 233 s with six and a second test run beside it.
@pytest.mark.timeout(420)
@pytest.mark.parametrize("backend", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_a_hundred_rapid_open_close_cycles_leak_nothing(paths: list[Path], backend: str) -> None:
    """Each way of ending a loader in turn, 100 times; then no thread, process, segment or fd."""
    files = labelled(paths[:6])

    def cycle(number: int) -> None:
        loader = Loader(
            files, batch_size=2, image_size=(8, 8), workers=1, seed=number, backend=backend
        )
        way = number % 4
        if way == 0:  # one batch inside with
            with loader:
                next(iter(loader))
        elif way == 1:  # break out of an epoch without with
            for _ in loader:
                break
        elif way == 2:  # break out mid-epoch inside with
            with loader:
                for taken, _ in enumerate(loader):
                    if taken == 1:
                        break
        else:  # a whole epoch
            with loader:
                for _ in loader:
                    pass

    cycle(0)  # starts multiprocessing's resource tracker once, which holds a descriptor
    # Objects of earlier tests that hold a descriptor until collected (an ObjectCache's folder)
    # are collected now, not in the middle of the count.
    gc.collect()
    me = psutil.Process()
    threads, descriptors = set(threading.enumerate()), me.num_fds()
    started = time.monotonic()
    for number in range(1, CYCLES):
        cycle(number)
    per_cycle = (time.monotonic() - started) / (CYCLES - 1)
    assert not [t.name for t in set(threading.enumerate()) - threads if t.is_alive()]
    assert not worker_processes()
    assert not our_segments()
    gc.collect()
    # A leak is growth; fewer is something of an earlier test being closed meanwhile.
    assert me.num_fds() <= descriptors, f"file descriptors leaked ({per_cycle:.2f} s per cycle)"
