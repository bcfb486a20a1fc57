"""prefetch.tf.image_dataset_from_directory, side by side with Keras's own function."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.decode import _resize as resize
from prefetch.testing import draw_shape, small_cnn, write_bad_files, write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
from keras.src.utils import dataset_utils  # noqa: E402 - Keras's own listing, as the oracle

# Per-image mean absolute difference allowed against Keras's pixels, in 0..255 units.
PIXEL_TOLERANCE = 3.0


@pytest.fixture(scope="module", autouse=True)
def tensorflow_threads_started() -> None:
    """Run one tf.data pipeline first: TensorFlow's own threads then predate every test."""
    for _ in tf.data.Dataset.range(2).map(lambda x: x + 1):
        pass


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of JPEGs plus nested folders, PNG/BMP/GIF/upper-case files, a hidden
    folder, a non-image file, a top-level image and a symlinked folder inside a class."""
    root = write_image_folder(tmp_path_factory.mktemp("mixed") / "data", per_class=5, size=(40, 30))
    rng = np.random.default_rng(3)
    extras = {
        "circle/nested/deeper/deep.png": "PNG",
        "circle/nested/b.bmp": "BMP",
        "square/nested/s.gif": "GIF",
        "square/UPPER.JPEG": "JPEG",
        "triangle/a_first.png": "PNG",
        ".hidden/h.jpg": "JPEG",
        "top.jpg": "JPEG",
    }
    for name, image_format in extras.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        draw_shape("ring", (40, 30), rng).save(path, image_format)
    (root / "circle" / "notes.txt").write_text("not an image\n")
    linked = write_image_folder(root.parent / "outside", class_names=("cross",), per_class=2)
    os.symlink(linked / "cross", root / "triangle" / "linked")
    return root


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small JPEG and PNG folders (2 classes x 3, 40x30); the PNGs are RGBA with varied alpha."""
    base = tmp_path_factory.mktemp("photos")
    jpeg = write_image_folder(
        base / "jpeg", class_names=("circle", "cross"), per_class=3, size=(40, 30)
    )
    png = base / "png"
    rng = np.random.default_rng(5)
    for name in ("circle", "cross"):
        (png / name).mkdir(parents=True)
        for i in range(3):
            image = draw_shape(name, (40, 30), rng)
            image.putalpha(Image.fromarray(rng.integers(0, 256, (30, 40), dtype=np.uint8)))
            image.save(png / name / f"{name}_{i}.png")
    return {"jpeg": jpeg, "png": png}


def _both(directory: Path, **options: Any) -> tuple[Any, Any]:
    """Keras's dataset and ours for the same arguments (ours with 2 worker threads)."""
    expected = keras.utils.image_dataset_from_directory(directory, **options)
    got = prefetch.tf.image_dataset_from_directory(directory, workers=2, **options)
    return expected, got


def _epoch(ds: Any) -> list[Any]:
    return [
        tuple(np.asarray(part) for part in item) if isinstance(item, tuple) else np.asarray(item)
        for item in ds.as_numpy_iterator()
    ]


def _keras_labels(directory: Path, labels: Any = "inferred", **options: Any) -> Any:
    """Keras's own (shuffled) listing: (paths, labels, class_names)."""
    return dataset_utils.index_directory(
        str(directory),
        labels,
        formats=(".bmp", ".gif", ".jpeg", ".jpg", ".png"),
        verbose=False,
        **options,
    )


# ---- listing, classes and splits ----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"seed": 7},
        {"seed": 123},
        {"shuffle": False},
        {"seed": 7, "validation_split": 0.25, "subset": "training"},
        {"seed": 7, "validation_split": 0.25, "subset": "validation"},
        {"seed": 7, "labels": None},
        {"seed": 7, "label_mode": None},
        {"seed": 7, "class_names": ["triangle", "circle"]},
        {"seed": 7, "class_names": ("square", "circle")},
        {"seed": 7, "follow_links": True},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_classes_file_paths_and_split_equal_keras_for_the_same_seed(
    mixed: Path, options: dict[str, Any]
) -> None:
    expected, got = _both(mixed, image_size=(8, 8), verbose=False, **options)
    assert got.class_names == expected.class_names
    assert got.file_paths == expected.file_paths
    assert len(got.file_paths) > 0
    if got.class_names is not None:  # each file keeps the label of its class folder
        labels = got.loader.source.labels
        for path, label in zip(got.file_paths, labels, strict=True):
            relative = os.path.relpath(path, mixed)
            assert relative.split(os.sep)[0] == got.class_names[label]


def test_subset_both_gives_keras_training_and_validation_files(mixed: Path) -> None:
    expected, got = _both(
        mixed, image_size=(8, 8), seed=11, validation_split=0.3, subset="both", verbose=False
    )
    assert len(got) == 2
    assert [ds.file_paths for ds in got] == [ds.file_paths for ds in expected]
    assert [ds.class_names for ds in got] == [ds.class_names for ds in expected]
    assert not set(got[0].file_paths) & set(got[1].file_paths)
    # The labels of each subset are Keras's, file by file.
    paths, labels, _ = _keras_labels(mixed, seed=11)
    keras_label = dict(zip(paths, labels, strict=True))
    for ds in got:
        assert [keras_label[p] for p in ds.file_paths] == list(ds.loader.source.labels)


def test_a_list_of_labels_follows_the_sorted_file_order_like_keras(mixed: Path) -> None:
    count = len(_keras_labels(mixed, labels=None, shuffle=False)[0])
    given = [i % 4 for i in range(count)]
    expected, got = _both(mixed, labels=given, image_size=(8, 8), seed=5, verbose=False)
    assert got.class_names == expected.class_names == ["0", "1", "2", "3"]
    assert got.file_paths == expected.file_paths
    _, keras_labels, _ = _keras_labels(mixed, labels=given, seed=5)
    assert list(got.loader.source.labels) == list(keras_labels)


def test_verbose_messages_are_keras_messages(
    mixed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = dict(image_size=(8, 8), seed=1, validation_split=0.2, subset="training")
    keras.utils.image_dataset_from_directory(mixed, **options)
    expected = capsys.readouterr().out
    prefetch.tf.image_dataset_from_directory(mixed, **options)
    got = capsys.readouterr().out
    assert got == expected
    assert "Found 20 files belonging to 3 classes." in got
    assert "Using 16 files for training." in got


@pytest.mark.parametrize(
    "options",
    [
        {"label_mode": "int"},
        {"label_mode": "categorical"},
        {"label_mode": None},
        {"label_mode": "categorical", "batch_size": None},
        {"interpolation": "nearest", "data_format": "channels_first"},
        {"color_mode": "grayscale", "interpolation": "bicubic"},
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
def test_element_spec_and_length_equal_keras(mixed: Path, options: dict[str, Any]) -> None:
    expected, got = _both(mixed, image_size=(12, 10), seed=2, verbose=False, **options)
    assert got.element_spec == expected.element_spec
    assert got.cardinality().numpy() == expected.cardinality().numpy()
    assert len(_epoch(got)) == got.cardinality().numpy()


def test_binary_labels_are_float_columns_like_keras(photos: dict[str, Path]) -> None:
    expected, got = _both(
        photos["jpeg"], image_size=(8, 8), label_mode="binary", shuffle=False, verbose=False
    )
    assert got.element_spec == expected.element_spec
    ((_, got_labels),) = _epoch(got)
    ((_, expected_labels),) = _epoch(expected)
    np.testing.assert_array_equal(got_labels, expected_labels)


# ---- pixels ----------------------------------------------------------------------------


def _assert_pixels_match(expected: Any, got: Any) -> None:
    ((expected_images, expected_labels),) = _epoch(expected)
    ((got_images, got_labels),) = _epoch(got)
    np.testing.assert_array_equal(got_labels, expected_labels)
    assert got_images.dtype == expected_images.dtype
    assert got_images.shape == expected_images.shape
    for index, (mine, theirs) in enumerate(zip(got_images, expected_images, strict=True)):
        difference = np.abs(mine.astype(np.float64) - theirs.astype(np.float64)).mean()
        assert difference <= PIXEL_TOLERANCE, (
            f"image {index} ({got.file_paths[index]}) differs from Keras's by {difference:.2f}"
        )


@pytest.mark.parametrize("fit", ["stretch", "crop", "pad"])
@pytest.mark.parametrize(
    ("folder", "color_mode", "interpolation"),
    [
        ("jpeg", "rgb", "bilinear"),
        ("jpeg", "grayscale", "bilinear"),
        ("png", "rgb", "bilinear"),
        ("png", "grayscale", "bilinear"),
        ("png", "rgba", "bilinear"),
        ("jpeg", "rgb", "nearest"),
        ("png", "grayscale", "nearest"),
        ("png", "rgba", "nearest"),
    ],
)
def test_pixels_equal_keras_within_resize_tolerance(
    photos: dict[str, Path], folder: str, color_mode: str, fit: str, interpolation: str
) -> None:
    expected, got = _both(
        photos[folder],
        image_size=(16, 24),  # another aspect ratio than the 30x40 files
        color_mode=color_mode,
        interpolation=interpolation,
        crop_to_aspect_ratio=fit == "crop",
        pad_to_aspect_ratio=fit == "pad",
        shuffle=False,
        verbose=False,
    )
    _assert_pixels_match(expected, got)


@pytest.mark.parametrize("interpolation", resize.METHODS)
def test_every_keras_interpolation_matches_keras_pixels(
    photos: dict[str, Path], interpolation: str
) -> None:
    expected, got = _both(
        photos["jpeg"],
        image_size=(20, 52),
        interpolation=interpolation,
        shuffle=False,
        verbose=False,
    )
    _assert_pixels_match(expected, got)


@pytest.mark.parametrize("method", resize.METHODS)
@pytest.mark.parametrize(("source", "target"), [((37, 50), (16, 24)), ((9, 13), (20, 17))])
def test_numpy_resize_equals_tf_image_resize_up_to_rounding(
    method: str, source: tuple[int, int], target: tuple[int, int]
) -> None:
    image = np.random.default_rng(0).integers(0, 256, (*source, 3), dtype=np.uint8)
    expected = np.clip(np.rint(tf.image.resize(image, target, method=method).numpy()), 0, 255)
    got = resize.resize(image, target, method)
    assert got.dtype == np.uint8 and got.shape == (*target, 3)
    assert np.abs(got.astype(np.float64) - expected).max() <= 1  # a rounding tie at most


def test_the_keras_parity_options_refuse_what_they_cannot_match() -> None:
    with pytest.raises(ValueError, match="antialias=False"):
        prefetch.DecodeOptions((8, 8), interpolation="hamming", antialias=False)
    with pytest.raises(ValueError, match="at most one"):
        prefetch.DecodeOptions((8, 8), crop_to_aspect_ratio=True, pad_to_aspect_ratio=True)


# ---- epochs, errors, lifetime -------------------------------------------------------------


def _image_keys(ds: Any) -> list[bytes]:
    return [image.tobytes() for batch in _epoch(ds) for image in batch]


def test_each_iteration_is_an_epoch_reshuffled_only_when_shuffle(mixed: Path) -> None:
    shuffled = prefetch.tf.image_dataset_from_directory(
        mixed, image_size=(8, 8), label_mode=None, batch_size=4, seed=3, verbose=False
    )
    first, second = _image_keys(shuffled), _image_keys(shuffled)
    assert len(first) == len(shuffled.file_paths)
    assert sorted(first) == sorted(second) and first != second
    ordered = prefetch.tf.image_dataset_from_directory(
        mixed, image_size=(8, 8), label_mode=None, batch_size=4, shuffle=False, verbose=False
    )
    assert _image_keys(ordered) == _image_keys(ordered)


def test_the_validation_set_of_subset_both_is_not_shuffled(mixed: Path) -> None:
    _, validation = prefetch.tf.image_dataset_from_directory(
        mixed,
        image_size=(8, 8),
        label_mode=None,
        seed=3,
        validation_split=0.5,
        subset="both",
        verbose=False,
    )
    assert _image_keys(validation) == _image_keys(validation)


def test_the_process_backend_gives_the_thread_backend_pixels(photos: dict[str, Path]) -> None:
    options: dict[str, Any] = dict(image_size=(16, 24), shuffle=False, verbose=False, workers=1)
    threads = prefetch.tf.image_dataset_from_directory(photos["jpeg"], **options)
    processes = prefetch.tf.image_dataset_from_directory(
        photos["jpeg"], backend="process", **options
    )
    ((expected, _),) = _epoch(threads)
    ((got, _),) = _epoch(processes)
    np.testing.assert_array_equal(got, expected)


@pytest.fixture
def with_a_bad_file(tmp_path: Path) -> Iterator[Path]:
    root = write_image_folder(tmp_path / "data", per_class=3, size=(20, 20))
    bad = write_bad_files(tmp_path / "bad")
    os.replace(bad["corrupt"], root / "circle" / "bad_corrupt.jpg")
    yield root


def test_a_worker_error_surfaces_through_tensorflow_naming_the_original_and_the_file(
    with_a_bad_file: Path,
) -> None:
    ds = prefetch.tf.image_dataset_from_directory(
        with_a_bad_file, image_size=(8, 8), shuffle=False, verbose=False
    )
    with pytest.raises(tf.errors.OpError, match="UnidentifiedImageError") as raised:
        _epoch(ds)
    assert "bad_corrupt.jpg" in str(raised.value)


def test_the_loader_block_re_raises_a_worker_error_as_the_original(
    with_a_bad_file: Path,
) -> None:
    ds = prefetch.tf.image_dataset_from_directory(
        with_a_bad_file, image_size=(8, 8), seed=0, verbose=False
    )
    with pytest.raises(Image.UnidentifiedImageError) as raised, ds.loader:
        _epoch(ds)
    assert "bad_corrupt.jpg" in "\n".join(getattr(raised.value, "__notes__", []))


def test_a_partly_read_dataset_stops_its_workers(mixed: Path) -> None:
    ds = prefetch.tf.image_dataset_from_directory(
        mixed, image_size=(8, 8), batch_size=2, seed=0, verbose=False
    )
    for _ in ds.take(1):
        pass
    iterator = iter(ds)
    next(iterator)
    del iterator
    # The leak check of conftest fails the test if a worker thread is still running.


def test_keras_fit_with_training_and_validation_sets(mixed: Path) -> None:
    train, validation = prefetch.tf.image_dataset_from_directory(
        mixed,
        image_size=(16, 16),
        batch_size=8,
        seed=0,
        validation_split=0.25,
        subset="both",
        verbose=False,
    )
    model = small_cnn(16, len(train.class_names))
    history = model.fit(train, validation_data=validation, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == len(history.history["val_loss"]) == 2
    assert np.isfinite(history.history["val_loss"]).all()
    assert train.loader.stats().images == 2 * len(train.file_paths)


# Argument errors (Keras's types and messages) are in tests/test_keras_errors.py.
