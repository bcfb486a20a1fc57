"""prefetch.tf.image_dataset_from_directory raises Keras's errors: same type, Keras's text first.

Each case calls Keras's `image_dataset_from_directory` and the drop-in with the same bad
arguments on a tiny folder of real JPEGs (3 classes x 2), and checks that the drop-in raises
the same exception type with a message that starts with Keras's (ours may add the fix after it).
"""

from __future__ import annotations

import multiprocessing.pool
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import write_image_folder

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

pytestmark = pytest.mark.timeout(60)

# (arguments, what Keras refuses); "{root}" and "{file}" are replaced by the tiny folder's
# root and one of its files. Labels are lists built afresh for each call (Keras shuffles a
# given list in place).
CASES: list[tuple[dict[str, Any], str]] = [
    ({"labels": "other"}, "labels neither inferred, None nor a list"),
    ({"labels": 5}, "labels an int"),
    ({"labels": np.array([0, 1, 0, 1, 0, 1])}, "labels a numpy array"),
    ({"labels": [0, 1], "class_names": ["a"]}, "class_names with a list of labels"),
    ({"labels": [0, 1], "class_names": []}, "empty class_names with a list of labels"),
    ({"labels": None, "class_names": ["a"]}, "class_names without labels"),
    ({"label_mode": None, "class_names": ["a"]}, "class_names without label_mode"),
    ({"label_mode": "other"}, "unknown label_mode"),
    ({"label_mode": ["int"]}, "unhashable label_mode"),
    ({"color_mode": "other"}, "unknown color_mode"),
    ({"image_size": (1, 2, 3)}, "image_size of three"),
    ({"image_size": "ab"}, "image_size a string"),
    ({"interpolation": "Cubic"}, "unknown interpolation"),
    ({"interpolation": 3}, "interpolation not a string"),
    ({"format": "numpy"}, "unknown format"),
    ({"validation_split": 2}, "validation_split above 1"),
    ({"validation_split": 0.2}, "validation_split without subset"),
    ({"subset": "training"}, "subset without validation_split"),
    ({"validation_split": 0.2, "subset": "test", "seed": 1}, "unknown subset"),
    ({"validation_split": 0.2, "subset": "training"}, "validation_split without seed"),
    ({"class_names": ["a", "zz"]}, "class_names not subfolders"),
    ({"class_names": [["a"]]}, "unhashable class_names"),
    ({"labels": [0, 1, 0]}, "fewer labels than files"),
    ({"label_mode": "binary"}, "binary with three classes"),
    ({"labels": [0, 1, 2, 3, 4, 5], "label_mode": "binary"}, "binary with six labels"),
    ({"data_format": "chw"}, "unknown data_format"),
    ({"crop_to_aspect_ratio": True, "pad_to_aspect_ratio": True}, "crop and pad"),
    ({"seed": -1}, "negative seed"),
    ({"seed": 1.5}, "float seed"),
    ({"seed": "x"}, "string seed"),
    ({"batch_size": 0}, "zero batch_size"),
    ({"batch_size": 0, "shuffle": False}, "zero batch_size unshuffled"),
    ({"batch_size": "x"}, "string batch_size"),
    ({"validation_split": 0.01, "subset": "training", "seed": 1}, "empty training subset"),
    ({"validation_split": 0.01, "subset": "both", "seed": 1}, "empty training of both"),
    ({"directory": "{root}/missing"}, "missing directory"),
    ({"directory": "{root}/missing", "labels": None}, "missing directory without labels"),
    ({"directory": "{file}"}, "a file as directory"),
    ({"directory": "{root}/empty"}, "a folder without images"),
    ({"directory": "{root}/empty", "labels": None}, "a folder without images, no labels"),
    ({"unknown_argument": 1}, "an unknown keyword"),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/{a,b,c}/*.jpg (2 real JPEGs each) and an empty folder root/empty/x/."""
    base = tmp_path_factory.mktemp("tiny")
    root = write_image_folder(base / "data", class_names=("a", "b", "c"), per_class=2)
    (base / "empty" / "x").mkdir(parents=True)
    return root


def _arguments(case: dict[str, Any], root: Path) -> dict[str, Any]:
    arguments: dict[str, Any] = {"directory": str(root), "image_size": (8, 8), "verbose": False}
    for name, value in case.items():
        if isinstance(value, str):
            value = value.format(root=root.parent, file=next(root.glob("a/*.jpg")))
        elif isinstance(value, list):
            value = list(value)  # Keras shuffles a list of labels in place
        arguments[name] = value
    return arguments


def _raised(function: Any, arguments: dict[str, Any]) -> BaseException:
    with pytest.raises(Exception) as info:
        function(**arguments)
    _close_pools(info.value)
    return info.value


def _close_pools(error: BaseException) -> None:
    """Stop the thread pool that Keras's index_directory leaves running when it raises."""
    traceback = error.__traceback__
    while traceback is not None:
        for value in list(traceback.tb_frame.f_locals.values()):
            if isinstance(value, multiprocessing.pool.Pool):
                value.terminate()
                value.join()
        traceback = traceback.tb_next


@pytest.mark.parametrize(("case", "why"), CASES, ids=[why for _, why in CASES])
def test_the_drop_in_raises_keras_type_with_keras_message_first(
    tiny: Path, case: dict[str, Any], why: str
) -> None:
    expected = _raised(keras.utils.image_dataset_from_directory, _arguments(case, tiny))
    got = _raised(prefetch.tf.image_dataset_from_directory, _arguments(case, tiny))

    assert type(got) is type(expected), f"{why}: Keras raised {expected!r}, we raised {got!r}"
    assert str(got).startswith(str(expected)), (
        f"{why}: our message should start with Keras's\n keras: {expected}\n   ours: {got}"
    )


def test_errors_that_keras_leaves_to_the_os_carry_our_fix_as_a_note(tiny: Path) -> None:
    missing = tiny.parent / "missing"

    with pytest.raises(FileNotFoundError) as info:
        prefetch.tf.image_dataset_from_directory(missing, image_size=(8, 8), verbose=False)

    assert info.value.filename == str(missing)
    assert any("subfolder per class" in note for note in info.value.__notes__)


def test_our_own_refusals_start_with_keras_wording_where_keras_checks_later(tiny: Path) -> None:
    """Keras accepts a zero image size at the call (and fails while iterating); we refuse it
    at once, worded as Keras's own image_size message."""
    with pytest.raises(ValueError, match=r"^Invalid `image_size` value\. .* >= 1"):
        prefetch.tf.image_dataset_from_directory(tiny, image_size=(0, 8), verbose=False)


def test_format_grain_is_refused_with_the_keras_alternative(tiny: Path) -> None:
    with pytest.raises(ValueError, match=r"keras\.utils\.image_dataset_from_directory"):
        prefetch.tf.image_dataset_from_directory(tiny, format="grain", verbose=False)


def test_keras_s_data_format_spelling_in_any_case_is_accepted(tiny: Path) -> None:
    ds = prefetch.tf.image_dataset_from_directory(
        tiny, image_size=(8, 8), data_format="CHANNELS_FIRST", verbose=False
    )

    assert ds.element_spec[0].shape[1:] == (3, 8, 8)
    assert os.fspath(tiny) in ds.file_paths[0]
