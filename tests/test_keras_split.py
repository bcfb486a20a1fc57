"""`Loader(validation_split=..., subset=..., seed=...)` holds Keras's files on each side.

The oracle is Keras itself: `keras.utils.image_dataset_from_directory(...).file_paths` for the
same folder, split and seed, and the drop-in `prefetch.tf.image_dataset_from_directory`, which
shares the loader's split (`prefetch.sources._folders.keras_split`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import draw_shape, write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of 7 JPEGs, plus nested and upper-case files (Keras's listing order)."""
    root = write_image_folder(tmp_path_factory.mktemp("split") / "data", per_class=7, size=(24, 20))
    rng = np.random.default_rng(0)
    for name in ("circle/nested/deep.png", "square/UPPER.JPEG", "triangle/a_first.png"):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        draw_shape("ring", (24, 20), rng).save(path, "PNG" if name.endswith("png") else "JPEG")
    return root


def keras_files(folder: Path, **options: Any) -> list[str]:
    ds = keras.utils.image_dataset_from_directory(
        folder, image_size=(8, 8), verbose=False, **options
    )
    return list(ds.file_paths)


@pytest.mark.parametrize("subset", ["training", "validation"])
@pytest.mark.parametrize(("split", "seed"), [(0.2, 0), (0.25, 7), (0.5, 123), (0.1, 2024)])
def test_each_side_holds_kerass_files_in_kerass_order(
    folder: Path, subset: str, split: float, seed: int
) -> None:
    options = {"validation_split": split, "subset": subset, "seed": seed}
    expected = keras_files(folder, **options)
    loader = prefetch.Loader(folder, image_size=8, workers=1, **options)  # type: ignore[arg-type]
    assert loader.source.paths.tolist() == expected  # type: ignore[attr-defined]
    assert prefetch.tf.dataset(loader).file_paths == expected
    drop_in = prefetch.tf.image_dataset_from_directory(
        folder, image_size=8, verbose=False, **options
    )
    assert drop_in.file_paths == expected


def test_the_labels_of_each_side_are_their_class_folders(folder: Path) -> None:
    for subset in ("training", "validation"):
        loader = prefetch.Loader(
            folder, image_size=8, seed=5, validation_split=0.3, subset=subset, workers=1
        )
        source: Any = loader.source
        for path, label in zip(source.paths, source.labels, strict=True):
            class_folder = os.path.relpath(path, folder).split(os.sep)[0]
            assert class_folder == loader.class_names[label]


def test_a_validation_loader_that_does_not_shuffle_keeps_kerass_files(folder: Path) -> None:
    options = {"validation_split": 0.3, "subset": "validation", "seed": 9}
    loader = prefetch.Loader(folder, image_size=8, shuffle=False, **options)  # type: ignore[arg-type]
    assert loader.source.paths.tolist() == keras_files(folder, **options)  # type: ignore[attr-defined]
    both = keras.utils.image_dataset_from_directory(
        folder, image_size=(8, 8), verbose=False, validation_split=0.3, subset="both", seed=9
    )
    assert loader.source.paths.tolist() == list(both[1].file_paths)  # type: ignore[attr-defined]


def test_the_drop_in_takes_an_int_image_size_and_refuses_a_bad_one_in_kerass_words(
    folder: Path,
) -> None:
    ds = prefetch.tf.image_dataset_from_directory(folder, image_size=8, verbose=False, seed=1)
    assert ds.element_spec[0].shape.as_list() == [None, 8, 8, 3]
    with pytest.raises(ValueError, match=r"^Invalid `image_size` value\..*one int for a square"):
        prefetch.tf.image_dataset_from_directory(folder, image_size=8.0, verbose=False)
