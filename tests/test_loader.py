"""Tests for `prefetch.Loader`: order, determinism, shapes, errors, lifetime, memory and stats.

Every test uses real JPEG/PNG files written into tmp_path and real worker threads; the only fakes
are the decoders of `prefetch.testing` and a counting decoder defined here. Images whose pixels
encode their number (a solid gray level per file) let a test tell which file each row came from.
Waits are short and timing bounds generous, so the tests hold on a small, noisy machine; the
leak check in conftest.py verifies that every test ends every worker it starts.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch import (
    Augment,
    Batch,
    DecodeOptions,
    ErrorPolicy,
    FileList,
    ImageFolder,
    Loader,
    TooManySkippedError,
)
from prefetch.testing import FailingDecoder, SlowDecoder, write_bad_files, write_image_folder

# Numbered images are solid gray at LEVEL_STEP * number, so up to 25 distinct images fit a byte.
LEVEL_STEP = 10
# The size of the numbered images on disk, (width, height) in Pillow order.
NUMBERED_SIZE = (20, 12)
# A small target size keeps decoding cheap; not the file size, so every image is resized.
SMALL = (8, 8)
# How long the workers of a dropped iterator may take to go (they poll every 0.1 s). Generous
# on purpose, for a machine busy with other work: the wait ends as soon as they have gone, and
# workers that are never told to go stay for good.
THREADS_GONE_S = 10.0
# Bad kinds that prefetch.testing.write_bad_files writes.
BAD_KINDS = ("corrupt", "truncated", "zero_byte", "text")


# --- helpers (module level, so that decoders and transforms are plain picklable objects) -------


class CustomDecodeError(Exception):
    """An error type that only user code raises: it must reach the consumer unchanged."""


class CountingDecoder:
    """The default decoder after `delay_s`, counting its calls (thread-safe)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        return prefetch.decode_image(path, options)


class ArraySource:
    """A plain indexable dataset: solid uint8 30x50x3 arrays at gray LEVEL_STEP * i, label i % 2."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return np.full((30, 50, 3), LEVEL_STEP * index, np.uint8), index % 2


class PILSource:
    """A plain indexable dataset of solid 50x30 RGB PIL images at gray LEVEL_STEP * i."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        level = LEVEL_STEP * index
        return Image.new("RGB", (50, 30), (level, level, level)), index % 2


def noise_and_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An augmentation that uses its rng: add noise in [-20, 20], then flip half the time."""
    noisy = image.astype(np.int16) + rng.integers(-20, 21, size=image.shape)
    image = np.clip(noisy, 0, 255).astype(np.uint8)
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return image


def drop_first_row(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A broken transform: it changes the image's shape."""
    return image[1:]


def write_numbered_pngs(root: Path, count: int, classes: int = 2) -> dict[int, int]:
    """Write `count` solid gray PNGs at LEVEL_STEP * number into root/class_<k>/.

    Number i goes to class i % classes. Returns {number: label}.
    """
    assert count * LEVEL_STEP <= 255
    for number in range(count):
        folder = root / f"class_{number % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        level = LEVEL_STEP * number
        Image.new("L", NUMBERED_SIZE, level).save(folder / f"img_{number:03d}.png")
    return {number: number % classes for number in range(count)}


def numbers_in(images: np.ndarray) -> list[int]:
    """The numbers of the solid gray images in a batch (checking that each is solid)."""
    levels = images[:, 0, 0, 0].astype(np.int64)
    assert np.all(images == levels[:, None, None, None]), "a numbered image is not solid"
    assert np.all(levels % LEVEL_STEP == 0), f"unexpected gray levels {levels}"
    return [int(level) // LEVEL_STEP for level in levels]


def epoch_numbers(batches: Iterable[Batch]) -> list[int]:
    """The image numbers of an epoch, in delivery order."""
    return [number for batch in batches for number in numbers_in(batch.images)]


def copied(batch: Batch) -> Batch:
    """A private copy of a batch."""
    return Batch(batch.images.copy(), batch.labels.copy())


def run_epochs(loader: Loader, epochs: int) -> list[list[Batch]]:
    """Iterate `epochs` epochs inside `with loader:`, returning copies of every batch."""
    with loader:
        return [[copied(batch) for batch in loader] for _ in range(epochs)]


def assert_same_batches(expected: list[Batch], actual: list[Batch]) -> None:
    """The two lists hold equal images and labels, batch by batch."""
    assert len(actual) == len(expected)
    for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert np.array_equal(want.images, got.images), f"images differ in batch {i}"
        assert np.array_equal(want.labels, got.labels), f"labels differ in batch {i}"


def worker_threads() -> list[threading.Thread]:
    """The live worker threads of every Loader."""
    return [t for t in threading.enumerate() if t.name.startswith("prefetch-worker")]


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.02)
    return True


def all_notes(error: BaseException) -> str:
    """The notes attached to `error`, one per line."""
    return "\n".join(getattr(error, "__notes__", []))


@pytest.fixture
def shapes_root(tmp_path: Path) -> Path:
    """An image folder of 3 classes x 6 JPEGs (48x40), with learnable shapes."""
    return write_image_folder(tmp_path / "shapes", per_class=6)


@pytest.fixture
def numbered_root(tmp_path: Path) -> Path:
    """An image folder of 23 numbered solid gray PNGs in 2 classes."""
    root = tmp_path / "numbered"
    write_numbered_pngs(root, 23)
    return root


# --- determinism --------------------------------------------------------------------------------


def test_one_and_four_workers_give_the_same_shuffled_batches_for_two_epochs(
    shapes_root: Path,
) -> None:
    def load(workers: int) -> list[list[Batch]]:
        loader = Loader(
            shapes_root, batch_size=5, image_size=(16, 16), workers=workers, shuffle=True, seed=7
        )
        return run_epochs(loader, 2)

    one, four = load(1), load(4)
    for epoch in range(2):
        assert_same_batches(one[epoch], four[epoch])
    assert not all(
        np.array_equal(a.labels, b.labels) for a, b in zip(one[0], one[1], strict=True)
    ), "the two epochs should be shuffled differently"


def test_a_random_transform_gives_the_same_batches_for_one_and_four_workers(
    shapes_root: Path,
) -> None:
    def load(workers: int, transform: Any) -> list[list[Batch]]:
        loader = Loader(
            shapes_root,
            batch_size=5,
            image_size=(16, 16),
            workers=workers,
            shuffle=True,
            seed=11,
            augment=Augment(transform=transform),
        )
        return run_epochs(loader, 2)

    one, four = load(1, noise_and_flip), load(4, noise_and_flip)
    for epoch in range(2):
        assert_same_batches(one[epoch], four[epoch])
    plain = load(1, None)
    assert not np.array_equal(plain[0][0].images, one[0][0].images), "the transform had no effect"
    for a, b in zip(plain[0], one[0], strict=True):
        assert np.array_equal(a.labels, b.labels), "a transform must not change the order"


# --- every image exactly once -------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_every_image_is_delivered_exactly_once_per_epoch_with_a_short_last_batch(
    tmp_path: Path, shuffle: bool
) -> None:
    labels = write_numbered_pngs(tmp_path, 23)
    loader = Loader(tmp_path, batch_size=5, image_size=SMALL, workers=2, shuffle=shuffle, seed=3)
    assert len(loader) == 5
    with loader:
        for _ in range(2):
            batches = [copied(batch) for batch in loader]
            assert [len(b.images) for b in batches] == [5, 5, 5, 5, 3]
            numbers = epoch_numbers(batches)
            assert sorted(numbers) == list(range(23))
            delivered_labels = np.concatenate([b.labels for b in batches])
            assert delivered_labels.tolist() == [labels[n] for n in numbers]
            if not shuffle:
                assert numbers == sorted(numbers, key=lambda n: (labels[n], n))


def test_the_shuffle_order_differs_between_epochs_and_repeats_with_the_same_seed(
    numbered_root: Path,
) -> None:
    def orders(seed: int) -> list[list[int]]:
        loader = Loader(numbered_root, batch_size=5, image_size=SMALL, workers=2, seed=seed)
        return [epoch_numbers(epoch) for epoch in run_epochs(loader, 2)]

    first = orders(seed=42)
    assert first[0] != first[1]
    assert orders(seed=42) == first
    assert orders(seed=43)[0] != first[0]


def test_every_delivered_image_equals_its_file_decoded_on_its_own(numbered_root: Path) -> None:
    folder = ImageFolder(numbered_root)
    options = DecodeOptions(SMALL)
    loader = Loader(folder, batch_size=4, image_size=SMALL, workers=2, seed=5)
    with loader:
        batches = [copied(batch) for batch in loader]
    images = np.concatenate([b.images for b in batches])
    labels = np.concatenate([b.labels for b in batches])
    # Decode each file once, on its own, and find it again by its gray level.
    by_number: dict[int, tuple[np.ndarray, int]] = {}
    for path, label in zip(folder.paths, folder.labels, strict=True):
        image = prefetch.decode_image(str(path), options)
        by_number[numbers_in(image[None])[0]] = (image, int(label))
    assert len(images) == len(by_number) == 23
    for image, label in zip(images, labels, strict=True):
        expected_image, expected_label = by_number.pop(numbers_in(image[None])[0])
        assert np.array_equal(image, expected_image)
        assert label == expected_label
    assert not by_number


# --- drop_remainder and len ---------------------------------------------------------------------


def test_drop_remainder_drops_the_last_short_batch(numbered_root: Path) -> None:
    loader = Loader(
        numbered_root, batch_size=5, image_size=SMALL, workers=2, drop_remainder=True, seed=1
    )
    assert len(loader) == 4
    with loader:
        batches = [copied(batch) for batch in loader]
    assert len(batches) == len(loader)
    assert all(len(b.images) == 5 and len(b.labels) == 5 for b in batches)
    numbers = epoch_numbers(batches)
    assert len(set(numbers)) == 20


def test_len_counts_the_short_last_batch_without_drop_remainder(numbered_root: Path) -> None:
    loader = Loader(numbered_root, batch_size=5, image_size=SMALL, workers=2)
    assert len(loader) == 5
    assert len(list(loader)) == len(loader)


def test_drop_remainder_with_fewer_samples_than_batch_size_raises(tmp_path: Path) -> None:
    write_numbered_pngs(tmp_path, 3)
    with pytest.raises(ValueError, match="drop_remainder"):
        Loader(tmp_path, batch_size=5, image_size=SMALL, workers=1, drop_remainder=True)


# --- label modes --------------------------------------------------------------------------------


def test_int_labels_are_int32_of_shape_n(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2, label_mode="int")
    batches = [copied(batch) for batch in loader]
    assert all(b.labels.dtype == np.int32 and b.labels.shape == (len(b.images),) for b in batches)
    labels = np.concatenate([b.labels for b in batches])
    assert sorted(labels.tolist()) == [0] * 6 + [1] * 6 + [2] * 6


def test_categorical_labels_are_float32_one_hot_rows(shapes_root: Path) -> None:
    def load(label_mode: str) -> list[Batch]:
        loader = Loader(
            shapes_root,
            batch_size=4,
            image_size=SMALL,
            workers=2,
            seed=2,
            label_mode=label_mode,
        )
        return [copied(batch) for batch in loader]

    ints, one_hot = load("int"), load("categorical")
    for int_batch, hot_batch in zip(ints, one_hot, strict=True):
        assert hot_batch.labels.dtype == np.float32
        assert hot_batch.labels.shape == (len(hot_batch.images), 3)
        assert np.array_equal(hot_batch.labels, np.eye(3, dtype=np.float32)[int_batch.labels])


def test_binary_labels_are_float32_column_with_two_classes(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("cat", "dog"), per_class=5)
    loader = Loader(root, batch_size=4, image_size=SMALL, workers=2, label_mode="binary")
    batches = [copied(batch) for batch in loader]
    for batch in batches:
        assert batch.labels.dtype == np.float32
        assert batch.labels.shape == (len(batch.images), 1)
    values = np.concatenate([b.labels for b in batches]).ravel()
    assert sorted(values.tolist()) == [0.0] * 5 + [1.0] * 5


def test_binary_labels_with_three_classes_raise(shapes_root: Path) -> None:
    with pytest.raises(ValueError, match="exactly 2 classes"):
        Loader(shapes_root, batch_size=4, image_size=SMALL, workers=1, label_mode="binary")


def test_no_label_mode_yields_batches_whose_labels_are_none(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2, label_mode=None)
    items = [batch for batch in loader]
    assert len(items) == len(loader)
    for images, labels in items:
        assert labels is None
        assert type(images) is np.ndarray
        assert images.dtype == np.uint8 and images.shape[1:] == (*SMALL, 3)
    assert sum(len(batch.images) for batch in items) == 18


# --- colour modes and sizes ---------------------------------------------------------------------


def test_grayscale_gives_one_channel(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2, color_mode="grayscale")
    batch = next(iter(loader))
    assert batch.images.shape == (4, *SMALL, 1)
    assert batch.images.dtype == np.uint8
    del batch


def _write_rgba_pngs(folder: Path, count: int) -> list[np.ndarray]:
    """Write RGBA PNGs (24 wide, 16 high) with an alpha gradient; returns their pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    pixels = []
    for i in range(count):
        rgba = np.zeros((16, 24, 4), np.uint8)
        rgba[..., 0] = 40 + 10 * i
        rgba[..., 1] = 120
        rgba[..., 2] = 200 - 10 * i
        rgba[..., 3] = np.linspace(0, 255, 24, dtype=np.uint8)[None, :]
        Image.fromarray(rgba, "RGBA").save(folder / f"rgba_{i:02d}.png")
        pixels.append(rgba)
    return pixels


def test_rgba_keeps_the_alpha_of_an_rgba_png(tmp_path: Path) -> None:
    pixels = _write_rgba_pngs(tmp_path / "only", 3)
    loader = Loader(
        tmp_path, batch_size=3, image_size=(16, 24), workers=2, shuffle=False, color_mode="rgba"
    )
    batch = next(iter(loader))
    assert batch.images.shape == (3, 16, 24, 4)
    assert np.array_equal(batch.images, np.stack(pixels))
    del batch


def test_rgb_from_an_rgba_png_gives_three_channels(tmp_path: Path) -> None:
    pixels = _write_rgba_pngs(tmp_path / "only", 3)
    loader = Loader(tmp_path, batch_size=3, image_size=(16, 24), workers=2, shuffle=False)
    batch = next(iter(loader))
    assert batch.images.shape == (3, 16, 24, 3)
    assert np.array_equal(batch.images, np.stack(pixels)[..., :3])
    del batch


def test_rgb_from_a_grayscale_jpeg_gives_three_equal_channels(tmp_path: Path) -> None:
    folder = tmp_path / "gray"
    folder.mkdir()
    for i in range(4):
        gradient = np.tile(np.linspace(0, 255, 32, dtype=np.uint8), (24, 1))
        Image.fromarray(gradient, "L").save(folder / f"gray_{i}.jpg", "JPEG")
    loader = Loader(tmp_path, batch_size=4, image_size=(12, 16), workers=2)
    batch = next(iter(loader))
    assert batch.images.shape == (4, 12, 16, 3)
    assert np.array_equal(batch.images[..., 0], batch.images[..., 1])
    assert np.array_equal(batch.images[..., 0], batch.images[..., 2])
    del batch


@pytest.mark.parametrize(("color_mode", "channels"), [("grayscale", 1), ("rgb", 3), ("rgba", 4)])
def test_a_non_square_image_size_gives_height_by_width_batches(
    shapes_root: Path, color_mode: str, channels: int
) -> None:
    loader = Loader(
        shapes_root, batch_size=4, image_size=(12, 20), workers=2, color_mode=color_mode
    )
    assert loader.image_shape == (12, 20, channels)
    shapes = {batch.images.shape[1:] for batch in loader}
    assert shapes == {(12, 20, channels)}


def test_crop_to_aspect_ratio_keeps_the_centre_of_a_wide_image(tmp_path: Path) -> None:
    folder = tmp_path / "flags"
    folder.mkdir()
    flag = np.zeros((100, 300, 3), np.uint8)
    flag[:, :100] = (255, 0, 0)
    flag[:, 100:200] = (0, 255, 0)
    flag[:, 200:] = (0, 0, 255)
    Image.fromarray(flag).save(folder / "flag.png")

    def load(crop: bool) -> np.ndarray:
        loader = Loader(
            tmp_path, batch_size=1, image_size=(32, 32), workers=1, crop_to_aspect_ratio=crop
        )
        return next(iter(loader)).images[0].astype(np.int16).copy()

    cropped = load(True)
    green = (cropped[..., 1] > 200) & (cropped[..., 0] < 60) & (cropped[..., 2] < 60)
    assert green.mean() > 0.9
    squashed = load(False)
    assert squashed[:, 0, 0].min() > 200, "without cropping the red left third stays in view"
    assert squashed[:, -1, 2].min() > 200, "without cropping the blue right third stays in view"


# --- bad files ----------------------------------------------------------------------------------


def _folder_with_one_bad_file(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """4 good JPEGs (animals_*) followed, in file order, by one bad file of `kind`."""
    root = write_image_folder(tmp_path / "tree", class_names=("animals",), per_class=4)
    bad = write_bad_files(tmp_path / "bad")[kind]
    target = root / "animals" / bad.name
    shutil.copy(bad, target)
    return root, target


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_on_error_raise_stops_at_the_bad_file_with_a_note_naming_it(
    tmp_path: Path, kind: str
) -> None:
    root, bad = _folder_with_one_bad_file(tmp_path, kind)
    with pytest.raises(OSError) as direct:  # what Pillow itself raises for this file
        prefetch.decode_image(str(bad), DecodeOptions(SMALL))
    loader = Loader(root, batch_size=2, image_size=SMALL, workers=2, shuffle=False)
    delivered = 0
    with pytest.raises(OSError) as info:
        for _ in loader:
            delivered += 1
    assert delivered == 2, "the good batches before the bad file are delivered"
    assert type(info.value) is type(direct.value), "the error keeps its original type"
    assert str(bad) in all_notes(info.value)


def test_on_error_skip_delivers_every_good_image_once_and_counts_the_bad_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="prefetch")
    labels = write_numbered_pngs(tmp_path, 14)
    bad = write_bad_files(tmp_path / "class_0")
    loader = Loader(tmp_path, batch_size=4, image_size=SMALL, workers=2, seed=9, on_error="skip")
    batches = [copied(batch) for batch in loader]
    numbers = epoch_numbers(batches)
    assert sorted(numbers) == list(range(14))
    assert np.concatenate([b.labels for b in batches]).tolist() == [labels[n] for n in numbers]
    stats = loader.stats()
    assert stats.skipped == len(BAD_KINDS)
    assert sorted(stats.skipped_paths) == sorted(str(path) for path in bad.values())
    assert stats.images == 14
    logged = caplog.text
    assert all(str(path) in logged for path in bad.values()), "each skipped file is logged"


def test_max_skipped_raises_too_many_skipped_once_passed(tmp_path: Path) -> None:
    write_numbered_pngs(tmp_path, 6)
    bad = write_bad_files(tmp_path / "class_1")
    for kind in ("truncated", "text"):
        bad[kind].unlink()
    loader = Loader(
        tmp_path,
        batch_size=2,
        image_size=SMALL,
        workers=2,
        shuffle=False,
        on_error=ErrorPolicy("skip", max_skipped=1),
    )
    with pytest.raises(TooManySkippedError) as info:
        for _ in loader:
            pass
    assert sorted(info.value.paths) == sorted(str(bad[k]) for k in ("corrupt", "zero_byte"))
    assert isinstance(info.value.__cause__, OSError), "the last decode error is the cause"


def test_state_dict_after_an_epoch_with_a_wholly_skipped_batch_names_the_next_epoch(
    tmp_path: Path,
) -> None:
    bad = write_bad_files(tmp_path / "bad")
    goods = []
    for number in (0, 1, 4, 5):
        path = tmp_path / f"good_{number}.png"
        Image.new("L", NUMBERED_SIZE, LEVEL_STEP * number).save(path)
        goods.append(path)
    # Batches of 2 in file order: [good 0, good 1], [zero-byte, text], [good 4, good 5].
    paths = [*goods[:2], bad["zero_byte"], bad["text"], *goods[2:]]
    loader = Loader(
        FileList(paths, [0] * 6),
        batch_size=2,
        image_size=SMALL,
        workers=1,
        shuffle=False,
        on_error="skip",
    )
    numbers = epoch_numbers(copied(batch) for batch in loader)
    assert numbers == [0, 1, 4, 5]
    assert loader.state_dict()["epoch"] == 1
    assert loader.state_dict()["position"] == 0


def test_a_custom_decoder_error_reaches_the_consumer_with_its_own_type(shapes_root: Path) -> None:
    failing = str(shapes_root / "square" / "square_0002.jpg")
    loader = Loader(
        shapes_root,
        batch_size=4,
        image_size=SMALL,
        workers=2,
        decoder=FailingDecoder("square_0002", CustomDecodeError),
        backend="thread",  # the note names a worker thread (processes: test_process_faults)
    )
    with pytest.raises(CustomDecodeError, match="injected failure") as info:
        for _ in loader:
            pass
    assert type(info.value) is CustomDecodeError
    assert failing in all_notes(info.value)
    assert "prefetch-worker-" in all_notes(info.value), "the note names the worker"
    frames = traceback.extract_tb(info.value.__traceback__)
    assert any(frame.name == "__call__" and "testing" in frame.filename for frame in frames), (
        "the worker's traceback, down to the decoder, is kept"
    )


def test_a_transform_that_changes_the_shape_raises(shapes_root: Path) -> None:
    loader = Loader(
        shapes_root,
        batch_size=4,
        image_size=SMALL,
        workers=2,
        augment=Augment(transform=drop_first_row),
    )
    with pytest.raises(ValueError, match="transform returned shape"):
        for _ in loader:
            pass


def float_output(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return image.astype(np.float32) / 255


class WrongSizeDecoder:
    """Returns one row too few, which numpy would otherwise broadcast silently."""

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        _, width, channels = options.shape
        return np.zeros((1, width, channels), np.uint8)


def test_a_transform_that_returns_floats_is_refused_rather_than_wrapped_around(
    shapes_root: Path,
) -> None:
    loader = Loader(
        shapes_root, batch_size=4, image_size=SMALL, augment=Augment(transform=float_output)
    )
    with pytest.raises(TypeError, match=r"transform returned dtype float32, expected uint8"):
        for _ in loader:
            pass


def test_a_decoder_that_returns_the_wrong_size_is_refused(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, decoder=WrongSizeDecoder())
    with pytest.raises(ValueError, match="decoder returned shape"):
        for _ in loader:
            pass


# --- sources ------------------------------------------------------------------------------------


def test_a_plain_indexable_source_of_arrays_is_used_as_is_and_resized() -> None:
    source = ArraySource(10)
    loader = Loader(source, batch_size=4, image_size=(16, 12), workers=2, shuffle=False)
    assert loader.source is source
    batches = [copied(batch) for batch in loader]
    assert [b.images.shape for b in batches] == [(4, 16, 12, 3), (4, 16, 12, 3), (2, 16, 12, 3)]
    assert epoch_numbers(batches) == list(range(10))
    assert np.concatenate([b.labels for b in batches]).tolist() == [i % 2 for i in range(10)]


def test_a_plain_indexable_source_of_pil_images_works() -> None:
    loader = Loader(PILSource(7), batch_size=3, image_size=SMALL, workers=2, seed=4)
    batches = [copied(batch) for batch in loader]
    assert all(b.images.shape[1:] == (*SMALL, 3) for b in batches)
    numbers = epoch_numbers(batches)
    assert sorted(numbers) == list(range(7))
    assert np.concatenate([b.labels for b in batches]).tolist() == [n % 2 for n in numbers]


def test_a_folder_path_string_works_like_an_image_folder(shapes_root: Path) -> None:
    def load(source: Any) -> tuple[list[str], list[Batch]]:
        loader = Loader(source, batch_size=4, image_size=SMALL, workers=2, seed=8)
        return loader.class_names, [copied(batch) for batch in loader]

    names_from_str, from_str = load(str(shapes_root))
    names_from_folder, from_folder = load(ImageFolder(shapes_root))
    assert names_from_str == names_from_folder == ["circle", "square", "triangle"]
    assert_same_batches(from_folder, from_str)


# --- lifetime -----------------------------------------------------------------------------------


def test_with_keeps_the_same_worker_threads_across_epochs_and_ends_them(
    shapes_root: Path,
) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=3, backend="thread")
    with loader:
        for _ in loader:
            pass
        first = set(worker_threads())
        for _ in loader:
            pass
        second = set(worker_threads())
        assert len(first) == 3
        assert first == second, "the same thread objects serve every epoch inside `with`"
    assert not worker_threads()


def test_an_epoch_without_with_ends_its_workers_when_it_ends(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2, backend="thread")
    seen = []
    for _ in loader:
        seen.append(len(worker_threads()))
    assert seen[0] == 2
    assert not worker_threads()
    for _ in loader:  # a second epoch starts workers afresh, and ends them too
        pass
    assert not worker_threads()


def test_breaking_out_of_a_loop_ends_the_workers(shapes_root: Path) -> None:
    loader = Loader(
        shapes_root,
        batch_size=2,
        image_size=SMALL,
        workers=2,
        decoder=SlowDecoder(0.01),
        backend="thread",
    )
    for _ in loader:
        assert worker_threads()
        break
    assert wait_until(lambda: not worker_threads(), THREADS_GONE_S)


def test_deleting_a_started_iterator_ends_the_workers(shapes_root: Path) -> None:
    loader = Loader(
        shapes_root,
        batch_size=2,
        image_size=SMALL,
        workers=2,
        decoder=SlowDecoder(0.01),
        backend="thread",
    )
    iterator = iter(loader)
    first = next(iterator)
    assert first.images.shape == (2, *SMALL, 3)
    assert worker_threads()
    del iterator
    assert wait_until(lambda: not worker_threads(), THREADS_GONE_S)


def test_an_iterator_dropped_before_its_first_batch_does_not_keep_later_workers_alive(
    shapes_root: Path,
) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2)
    unused = iter(loader)  # e.g. zip(range(0), loader) makes one and never advances it
    del unused
    for _ in loader:
        pass
    left = [t.name for t in worker_threads()]
    loader.close()  # end them anyway, so that the leak check only reports real leaks
    assert not left, f"workers still running after the epoch ended: {left}"


def test_an_epoch_broken_off_inside_with_leaves_the_next_epoch_complete(
    numbered_root: Path,
) -> None:
    loader = Loader(numbered_root, batch_size=4, image_size=SMALL, workers=2, seed=6)
    with loader:
        for _ in loader:
            break
        numbers = epoch_numbers(copied(batch) for batch in loader)
    assert sorted(numbers) == list(range(23))


def test_close_can_be_called_again_and_again(shapes_root: Path) -> None:
    never_started = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2)
    for _ in range(3):
        never_started.close()
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2)
    with loader:
        for _ in loader:
            pass
        for _ in range(3):
            loader.close()
        assert not worker_threads()
    for _ in range(3):
        loader.close()
    assert not worker_threads()


# --- memory: kept batches and the bounded window ------------------------------------------------


def test_batches_kept_in_a_list_keep_their_own_content(tmp_path: Path) -> None:
    write_numbered_pngs(tmp_path, 25)

    def load() -> Loader:
        return Loader(tmp_path, batch_size=4, image_size=SMALL, workers=2, depth=2, seed=12)

    kept = list(load())
    private = [Batch(images.copy(), labels.copy()) for images, labels in load()]
    assert len(kept) == 7
    assert_same_batches(private, kept)
    assert sorted(epoch_numbers(kept)) == list(range(25))
    for i, a in enumerate(kept):
        for b in kept[i + 1 :]:
            assert not np.shares_memory(a.images, b.images)


def test_batches_kept_across_two_epochs_inside_with_stay_distinct(tmp_path: Path) -> None:
    write_numbered_pngs(tmp_path, 20)
    loader = Loader(tmp_path, batch_size=4, image_size=SMALL, workers=2, depth=2, seed=13)
    with loader:
        first, second = list(loader), list(loader)
    assert sorted(epoch_numbers(first)) == sorted(epoch_numbers(second)) == list(range(20))
    assert epoch_numbers(first) != epoch_numbers(second)
    kept = first + second
    for i, a in enumerate(kept):
        for b in kept[i + 1 :]:
            assert not np.shares_memory(a.images, b.images)


def test_a_stalled_consumer_bounds_the_decoded_samples_by_the_window(tmp_path: Path) -> None:
    write_numbered_pngs(tmp_path, 24)
    decoder = CountingDecoder(0.02)
    depth, batch_size = 2, 3
    loader = Loader(
        tmp_path,
        batch_size=batch_size,
        image_size=SMALL,
        workers=2,
        depth=depth,
        decoder=decoder,
        backend="thread",  # backend="auto" would decode a few samples to choose
    )
    window = (depth + 1) * batch_size  # the batch the consumer holds and `depth` behind it
    iterator = iter(loader)
    try:
        first = next(iterator)
        assert len(first.images) == batch_size
        # A stalled consumer: the workers fill the window, however slowly (30 s: generous on
        # purpose, for a busy machine), and then must stop; in 0.5 s more, two workers that did
        # not stop would decode up to 50 more samples.
        filled = wait_until(lambda: decoder.calls >= window, timeout_s=30.0)
        assert filled, f"{decoder.calls} samples decoded, fewer than the window's {window}"
        time.sleep(0.5)
        decoded = decoder.calls
    finally:
        iterator.close()
    assert decoded == window


# --- stats --------------------------------------------------------------------------------------


def test_stats_after_an_epoch_count_images_batches_and_time(shapes_root: Path) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=SMALL, workers=2)
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats.images == 18
    assert stats.batches == len(loader) == 5
    assert stats.epochs == 1
    assert stats.images_per_s > 0
    assert 0.0 <= stats.consumer_wait_fraction <= 1.0
    assert stats.producer_busy_s > 0
    assert stats.skipped == 0 and stats.skipped_paths == ()


def test_a_slow_consumer_waits_little_for_fast_decoding(shapes_root: Path) -> None:
    # threads: the overlap, not a worker process's start-up (about a second on 2 busy cores)
    loader = Loader(
        shapes_root, batch_size=3, image_size=SMALL, workers=2, depth=2, backend="thread"
    )
    for _ in loader:
        # Generous on purpose: 0.2 s a step is about a hundred times what decoding a batch of
        # three small JPEGs takes, so even the first batch's wait on a busy machine stays short.
        time.sleep(0.2)
    assert loader.stats().consumer_wait_fraction < 0.5


def test_an_instant_consumer_waits_most_of_the_time_for_slow_decoding(shapes_root: Path) -> None:
    # Generous on purpose: each batch takes its workers 0.1 s of sleep, far more than a busy
    # machine adds to the consumer's own empty loop between batches.
    loader = Loader(
        shapes_root, batch_size=4, image_size=SMALL, workers=2, decoder=SlowDecoder(0.05)
    )
    for _ in loader:
        pass
    assert loader.stats().consumer_wait_fraction > 0.5


# --- argument validation ------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["batch_size", "workers", "depth"])
def test_a_count_below_one_is_refused_with_the_bad_value(shapes_root: Path, option: str) -> None:
    message = f"{option} must be an int >= 1, got 0"
    with pytest.raises(ValueError, match=re.escape(message)):
        Loader(shapes_root, image_size=SMALL, **{option: 0})


@pytest.mark.parametrize(
    ("option", "allowed"),
    [
        ("label_mode", ("int", "categorical", "binary")),
        ("on_error", ("raise", "skip")),
        ("color_mode", ("grayscale", "rgb", "rgba")),
        ("interpolation", ("nearest", "bilinear", "bicubic", "area", "lanczos3")),
    ],
)
def test_an_unknown_choice_is_refused_naming_the_allowed_values(
    shapes_root: Path, option: str, allowed: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match=option) as info:
        Loader(shapes_root, image_size=SMALL, workers=1, **{option: "bogus"})
    message = str(info.value)
    assert "bogus" in message
    for value in allowed:
        assert repr(value) in message


def test_an_empty_file_list_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        Loader(FileList([]), image_size=SMALL, workers=1)


# --- image_size as one int (issue 19, item 5) ---------------------------------------------------


@pytest.mark.parametrize("size", [8, np.int64(8)], ids=["int", "numpy int"])
def test_an_int_image_size_is_a_square(shapes_root: Path, size: Any) -> None:
    loader = Loader(shapes_root, batch_size=4, image_size=size, workers=1)
    assert loader.options.image_size == (8, 8)
    assert loader.image_shape == (8, 8, 3)
    assert next(iter(loader)).images.shape == (4, 8, 8, 3)
    assert DecodeOptions(size) == DecodeOptions((8, 8))
    assert DecodeOptions([6, 8]).image_size == (6, 8)  # a list, as Keras accepts


@pytest.mark.parametrize("bad", [0, -1, (8, 8, 8), 8.0, (8, 0), (8.0, 8), True, "8", None])
def test_a_bad_image_size_names_image_size_and_the_accepted_forms(
    shapes_root: Path, bad: Any
) -> None:
    for make in (lambda: Loader(shapes_root, image_size=bad), lambda: DecodeOptions(bad)):
        with pytest.raises(ValueError) as info:
            make()
        message = str(info.value)
        assert message.startswith("image_size must be an int >= 1 (a square"), message
        assert "(height, width)" in message and repr(bad) in message


# --- what is a file source (issue 19, item 8) ---------------------------------------------------


class NamedArraySource(ArraySource):
    """A source of its own that happens to have `paths` (names, not files) and no `labels`."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.paths = [f"sample-{index}" for index in range(count)]


class CheckedFileList(FileList):
    """A FileList subclass: a file source, whose `__getitem__` the loader must never call."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        raise AssertionError("a file source's __getitem__ was called")


@pytest.mark.parametrize("backend", ["thread", "process", "auto"])
def test_a_source_of_its_own_with_a_paths_attribute_is_read_through_getitem(
    backend: str,
) -> None:
    source = NamedArraySource(6)
    assert not prefetch.sources._folders.is_file_source(source)
    loader = Loader(
        source, batch_size=3, image_size=SMALL, workers=1, shuffle=False, backend=backend
    )
    batches = [copied(batch) for batch in loader]
    assert epoch_numbers(batches) == list(range(6))
    assert np.concatenate([b.labels for b in batches]).tolist() == [i % 2 for i in range(6)]


def test_a_file_list_and_its_subclasses_are_file_sources_decoded_by_the_loader(
    numbered_root: Path,
) -> None:
    folder = ImageFolder(numbered_root)
    files = CheckedFileList(folder.paths, folder.labels, folder.class_names)
    assert all(prefetch.sources._folders.is_file_source(s) for s in (folder, files))
    loader = Loader(files, batch_size=8, image_size=SMALL, workers=2, shuffle=False)
    in_folder_order = [int(Path(path).stem.split("_")[1]) for path in folder.paths]
    assert epoch_numbers(copied(batch) for batch in loader) == in_folder_order


def test_a_source_of_its_own_is_named_by_class_and_index_in_messages() -> None:
    reader = Loader(NamedArraySource(3), image_size=SMALL, workers=1)._epochs.workers.reader
    assert reader.describe(2) == "NamedArraySource[2]"


# --- error notes name what failed (issue 19, item 9) --------------------------------------------


def raise_key_error(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A transform with a bug: it raises."""
    raise KeyError("no such key")


class RaisingSource(ArraySource):
    """A source whose `__getitem__` has a bug at index 3."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if index == 3:
            raise ZeroDivisionError("a bug in __getitem__")
        return super().__getitem__(index)


class TextLabelSource(ArraySource):
    """A source that returns a class name where the label (a class index) belongs."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, Any]:
        image, _ = super().__getitem__(index)
        return image, "cat"


def first_error(loader: Loader) -> BaseException:
    """The error that iterating one epoch of `loader` raises."""
    with pytest.raises(Exception) as info:
        for _ in loader:
            pass
    return info.value


SKIP_ADVICE = "on_error='skip'"


def test_a_transform_that_changes_the_shape_gets_a_note_naming_it_not_skip_advice(
    shapes_root: Path,
) -> None:
    error = first_error(
        Loader(
            shapes_root,
            batch_size=4,
            image_size=SMALL,
            workers=1,
            augment=Augment(transform=drop_first_row),
            backend="thread",
        )
    )
    assert isinstance(error, ValueError)
    notes = all_notes(error)
    assert "transform drop_first_row returned an image the loader cannot use" in notes
    assert "fix drop_first_row" in notes and "(8, 8, 3)" in notes
    assert str(shapes_root) in notes and "prefetch-worker-0" in notes
    assert SKIP_ADVICE not in notes


def test_a_transform_that_raises_gets_a_note_naming_it(shapes_root: Path) -> None:
    error = first_error(
        Loader(
            shapes_root,
            batch_size=4,
            image_size=SMALL,
            workers=1,
            augment=Augment(transform=raise_key_error),
            backend="thread",
        )
    )
    assert type(error) is KeyError
    notes = all_notes(error)
    assert "transform raise_key_error raised" in notes and "fix raise_key_error" in notes
    assert SKIP_ADVICE not in notes


def test_a_getitem_that_raises_gets_a_note_naming_the_method_and_index() -> None:
    error = first_error(
        Loader(RaisingSource(6), batch_size=6, image_size=SMALL, shuffle=False, backend="thread")
    )
    assert type(error) is ZeroDivisionError
    notes = all_notes(error)
    assert "RaisingSource.__getitem__(3) raised" in notes
    assert "fix RaisingSource.__getitem__" in notes
    assert SKIP_ADVICE not in notes


def test_a_getitem_that_returns_a_bad_label_gets_a_note_saying_what_to_return() -> None:
    error = first_error(
        Loader(TextLabelSource(4), batch_size=4, image_size=SMALL, workers=1, backend="thread")
    )
    assert isinstance(error, ValueError)
    notes = all_notes(error)
    assert (
        "TextLabelSource.__getitem__(" in notes and "returned what the loader cannot use" in notes
    )
    assert "the label an int class index" in notes
    assert SKIP_ADVICE not in notes


def test_a_decoder_of_ones_own_that_returns_the_wrong_size_gets_a_note_naming_it(
    shapes_root: Path,
) -> None:
    error = first_error(
        Loader(shapes_root, batch_size=4, image_size=SMALL, workers=1, decoder=WrongSizeDecoder())
    )
    notes = all_notes(error)
    assert "decoder WrongSizeDecoder returned an image the loader cannot use" in notes
    assert SKIP_ADVICE not in notes


def test_a_decoder_of_ones_own_that_raises_gets_both_fixes(shapes_root: Path) -> None:
    decoder = FailingDecoder("square_0002", CustomDecodeError)
    error = first_error(Loader(shapes_root, batch_size=4, image_size=SMALL, decoder=decoder))
    notes = all_notes(error)
    assert "decoder FailingDecoder raised while reading" in notes
    assert SKIP_ADVICE in notes and "the error is in FailingDecoder" in notes


def test_a_file_the_decoder_cannot_read_still_gets_the_skip_advice(tmp_path: Path) -> None:
    bad = write_bad_files(tmp_path / "bad", kinds=["corrupt"])["corrupt"]
    error = first_error(Loader(FileList([bad]), image_size=SMALL, label_mode=None))
    notes = all_notes(error)
    assert f"while reading {str(bad)!r}" in notes
    assert "pass on_error='skip' to drop unreadable samples" in notes


def test_the_note_of_a_transform_error_comes_back_from_a_worker_process(
    shapes_root: Path,
) -> None:
    loader = Loader(
        shapes_root,
        batch_size=4,
        image_size=SMALL,
        workers=1,
        augment=Augment(transform=raise_key_error),
        backend="process",
    )
    error = first_error(loader)
    notes = all_notes(error)
    assert "transform raise_key_error raised" in notes and "prefetch-process-0" in notes
    assert SKIP_ADVICE not in notes


# --- validation_split and subset (issue 19, item 6; Keras's files: test_keras_split.py) --------


def split_files(root: Path, **options: Any) -> list[str]:
    loader = Loader(root, image_size=SMALL, workers=1, validation_split=0.25, **options)
    return loader.source.paths.tolist()  # type: ignore[attr-defined, no-any-return]


def test_the_two_subsets_are_disjoint_and_together_every_file(numbered_root: Path) -> None:
    every = ImageFolder(numbered_root).paths.tolist()
    training = split_files(numbered_root, subset="training", seed=3)
    validation = split_files(numbered_root, subset="validation", seed=3)
    assert len(validation) == int(0.25 * len(every)) == 5
    assert not set(training) & set(validation)
    assert sorted(training + validation) == sorted(every)
    assert split_files(numbered_root, subset="validation", seed=3, shuffle=False) == validation
    assert split_files(numbered_root, subset="validation", seed=4) != validation


def test_a_split_loader_delivers_exactly_its_subsets_files(numbered_root: Path) -> None:
    loader = Loader(
        numbered_root,
        batch_size=4,
        image_size=SMALL,
        workers=2,
        seed=1,
        validation_split=0.25,
        subset="validation",
    )
    expected = sorted(int(Path(p).stem.split("_")[1]) for p in loader.source.paths)  # type: ignore[attr-defined]
    assert sorted(epoch_numbers(copied(batch) for batch in loader)) == expected
    assert loader.options.validation_split == 0.25 and loader.options.subset == "validation"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"validation_split": 0.2, "seed": 1}, "validation_split and subset go together"),
        ({"subset": "training", "seed": 1}, "validation_split and subset go together"),
        ({"validation_split": 0.2, "subset": "both", "seed": 1}, "make two Loaders"),
        ({"validation_split": 0.2, "subset": "train", "seed": 1}, "subset must be one of"),
        ({"validation_split": 0.2, "subset": "training"}, "validation_split needs a seed"),
        ({"validation_split": 1.5, "subset": "training", "seed": 1}, "between 0 and 1"),
        ({"validation_split": 0, "subset": "training", "seed": 1}, "between 0 and 1"),
        ({"validation_split": True, "subset": "training", "seed": 1}, "between 0 and 1"),
        ({"validation_split": 0.01, "subset": "training", "seed": 1}, "holds out 0 files"),
    ],
)
def test_a_split_loader_refuses_what_it_cannot_split_by_with_the_fix(
    numbered_root: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Loader(numbered_root, image_size=SMALL, **options)


def test_a_split_needs_a_file_source() -> None:
    with pytest.raises(ValueError, match=r"validation_split splits a list of files.*ArraySource"):
        Loader(ArraySource(10), image_size=SMALL, validation_split=0.2, subset="training", seed=1)
