"""Tests for `prefetch.ImageFolder`, `prefetch.FileList` and `prefetch.plan._epochs.epoch_order`.

Image trees are real files written with Pillow into tmp_path. The listing rules are checked
against Keras `image_dataset_from_directory` itself (skipped when Keras is not installed).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.plan._epochs import epoch_order
from prefetch.sources._folders import IMAGE_EXTENSIONS, PathArray
from prefetch.testing import write_image_folder

# A bound for every test here; only the Keras parity test comes near it (TensorFlow's import).
pytestmark = pytest.mark.timeout(60)

# Pillow format for each extension used in the trees below (compared lower-cased).
PILLOW_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".gif": "GIF"}


def _write_image(path: Path, seed: int = 0) -> Path:
    """Write a tiny (8x8) real image at `path`, in the format its extension names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, PILLOW_FORMATS[path.suffix.lower()])
    return path


def _write_text(path: Path, text: str = "not an image\n") -> Path:
    """Write a small non-image file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _write_keras_tree(root: Path, outside: Path) -> Path:
    """A tree that exercises each of Keras's listing rules; returns `root`.

    Classes "Zebra" (upper case sorts first), "cat", "dog", "empty" (no images) and "linked"
    (a symlink to a folder elsewhere). Inside them: nested subfolders, "sub" vs "sub-x" vs
    "sub/deeper" (the walk is sorted by full path), a hidden subfolder (kept: only hidden class
    folders are skipped), mixed-case extensions, names whose string order is not their natural
    order, non-image files, and a symlinked subfolder (followed only with follow_links=True).
    Ignored: the hidden class ".hidden", and the files at the root.
    """
    images = [
        "Zebra/img10.jpg",
        "Zebra/img2.jpg",
        "Zebra/Img1.JPG",
        "Zebra/a.Png",
        "cat/img10.jpeg",
        "cat/img2.jpg",
        "cat/B.bmp",
        "cat/c.gif",
        "cat/.thumbs/t.jpg",
        "cat/sub/d.JPEG",
        "cat/sub/deeper/e.png",
        "cat/sub-x/f.GIF",
        "cat/zz_last.BMP",
        "dog/nested/h.jpg",
        "dog/nested/H.jpg",
        "dog/x.jpg",
        ".hidden/hidden.jpg",
        "root_image.jpg",
    ]
    for seed, name in enumerate(images):
        _write_image(root / name, seed)
    for name in ["readme.txt", "cat/notes.txt", "cat/meta.json", "Zebra/img3.jpg.txt"]:
        _write_text(root / name)
    _write_text(root / "empty" / "labels.json", "{}")
    (root / "dog" / "folder.jpg").mkdir()  # a directory with an image name: not a file
    for seed, name in enumerate(["o1.jpg", "o2.png", "inner/o3.gif"]):
        _write_image(outside / name, 100 + seed)
    (root / "cat" / "linked_subfolder").symlink_to(outside, target_is_directory=True)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    return root


def _keras_listing(
    root: Path, class_names: list[str] | None, follow_links: bool
) -> tuple[list[str], np.ndarray, list[str]]:
    """(file paths, labels, class names) as Keras `image_dataset_from_directory` lists them."""
    keras = pytest.importorskip("keras")
    dataset = keras.utils.image_dataset_from_directory(
        str(root),
        class_names=class_names,
        shuffle=False,
        batch_size=4,
        image_size=(8, 8),
        follow_links=follow_links,
        verbose=False,
    )
    labels = np.concatenate([np.asarray(batch_labels) for _, batch_labels in dataset])
    return list(dataset.file_paths), labels, list(dataset.class_names)


def _normalised(paths: list[str] | np.ndarray) -> list[str]:
    return [os.path.normpath(str(path)) for path in paths]


# Keras parity ---------------------------------------------------------------------------------


@pytest.mark.tf
@pytest.mark.parametrize(
    ("class_names", "follow_links"),
    [(None, False), (None, True), (["dog", "Zebra", "cat"], False)],
    ids=["inferred", "follow_links", "given_class_names"],
)
def test_listing_matches_keras_image_dataset_from_directory(
    tmp_path: Path, class_names: list[str] | None, follow_links: bool
) -> None:
    root = _write_keras_tree(tmp_path / "data", tmp_path / "outside")
    keras_paths, keras_labels, keras_class_names = _keras_listing(root, class_names, follow_links)

    folder = prefetch.ImageFolder(root, class_names=class_names, follow_links=follow_links)

    assert folder.class_names == keras_class_names
    assert _normalised(folder.paths) == _normalised(keras_paths)
    assert folder.labels.tolist() == keras_labels.tolist()


def test_the_keras_tree_lists_what_the_keras_rules_say(tmp_path: Path) -> None:
    """The same rules spelled out, so a failure says which rule broke even without Keras."""
    root = _write_keras_tree(tmp_path / "data", tmp_path / "outside")

    folder = prefetch.ImageFolder(root)

    assert folder.class_names == ["Zebra", "cat", "dog", "empty", "linked"]
    relative = [os.path.relpath(path, root) for path in folder.paths]
    assert relative == [
        "Zebra/Img1.JPG",
        "Zebra/a.Png",
        "Zebra/img10.jpg",
        "Zebra/img2.jpg",
        "cat/B.bmp",
        "cat/c.gif",
        "cat/img10.jpeg",
        "cat/img2.jpg",
        "cat/zz_last.BMP",
        "cat/.thumbs/t.jpg",
        "cat/sub/d.JPEG",
        "cat/sub-x/f.GIF",
        "cat/sub/deeper/e.png",
        "dog/x.jpg",
        "dog/nested/H.jpg",
        "dog/nested/h.jpg",
        "linked/o1.jpg",
        "linked/o2.png",
        "linked/inner/o3.gif",
    ]
    assert folder.labels.tolist() == [0] * 4 + [1] * 9 + [2] * 3 + [4] * 3


def test_hidden_class_folders_are_skipped(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", ".hidden", "b"), per_class=2)

    folder = prefetch.ImageFolder(root)

    assert folder.class_names == ["a", "b"]
    assert not any(".hidden" in path for path in folder.paths)


def test_files_at_the_root_are_ignored(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", "b"), per_class=2)
    _write_image(root / "stray.jpg")

    folder = prefetch.ImageFolder(root)

    assert len(folder) == 4
    assert str(root / "stray.jpg") not in folder.paths.tolist()


# Class names ----------------------------------------------------------------------------------


def test_class_names_select_and_order_the_classes(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("circle", "square", "triangle"), per_class=3)

    folder = prefetch.ImageFolder(root, class_names=["square", "circle"])

    assert folder.class_names == ["square", "circle"]
    assert len(folder) == 6
    for path, label in zip(folder.paths, folder.labels, strict=True):
        assert Path(path).parent.name == folder.class_names[label]
    assert folder.labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_a_class_name_without_a_folder_is_rejected_by_name(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("circle", "square"), per_class=1)

    with pytest.raises(ValueError, match="ghost") as info:
        prefetch.ImageFolder(root, class_names=["circle", "ghost"])

    assert "square" in str(info.value), "the message should list the subfolders that do exist"


# Errors name the path and the fix -------------------------------------------------------------


def test_a_missing_root_raises_file_not_found_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_folder"

    with pytest.raises(FileNotFoundError, match="no_such_folder") as info:
        prefetch.ImageFolder(missing)

    assert str(missing) in str(info.value)
    assert "subfolder" in str(info.value), "the message should say what to pass instead"


def test_a_file_as_root_raises_file_not_found_naming_the_path(tmp_path: Path) -> None:
    not_a_folder = _write_image(tmp_path / "picture.jpg")

    with pytest.raises(FileNotFoundError) as info:
        prefetch.ImageFolder(not_a_folder)

    assert str(not_a_folder) in str(info.value)


def test_a_root_without_class_folders_asks_for_one_subfolder_per_class(tmp_path: Path) -> None:
    _write_image(tmp_path / "loose.jpg")
    _write_image(tmp_path / ".hidden" / "x.jpg")

    with pytest.raises(ValueError, match="subfolder") as info:
        prefetch.ImageFolder(tmp_path)

    assert str(tmp_path) in str(info.value)


def test_class_folders_without_images_name_the_allowed_extensions(tmp_path: Path) -> None:
    _write_text(tmp_path / "a" / "notes.txt")
    _write_text(tmp_path / "b" / "picture.tiff")
    (tmp_path / "c").mkdir()

    with pytest.raises(ValueError, match="no images") as info:
        prefetch.ImageFolder(tmp_path)

    message = str(info.value)
    assert str(tmp_path) in message
    for extension in (".bmp", ".gif", ".jpeg", ".jpg", ".png"):
        assert extension in message


def test_the_allowed_extensions_are_those_of_keras() -> None:
    assert sorted(IMAGE_EXTENSIONS) == [".bmp", ".gif", ".jpeg", ".jpg", ".png"]


# Arrays, not lists ----------------------------------------------------------------------------


def test_paths_are_a_path_array_and_labels_an_int32_array(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", "b", "c"), per_class=4)

    folder = prefetch.ImageFolder(root)

    assert isinstance(folder.paths, PathArray)
    assert all(isinstance(part, np.ndarray) for part in (folder.paths._data, folder.paths._starts))
    assert isinstance(folder.labels, np.ndarray)
    assert folder.labels.dtype == np.int32
    assert len(folder) == len(folder.paths) == len(folder.labels) == 12
    assert folder.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_an_image_folder_accepts_a_string_root(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", "b"), per_class=2)

    assert (
        prefetch.ImageFolder(str(root)).paths.tolist() == prefetch.ImageFolder(root).paths.tolist()
    )


def test_indexing_an_image_folder_decodes_the_image_and_gives_its_label(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", "b"), per_class=2, size=(12, 10))

    image, label = prefetch.ImageFolder(root)[3]

    assert image.shape == (10, 12, 3)
    assert image.dtype == np.uint8
    assert label == 1


# Symlinks -------------------------------------------------------------------------------------


def test_a_symlinked_folder_inside_a_class_is_followed_only_with_follow_links(
    tmp_path: Path,
) -> None:
    root = write_image_folder(tmp_path / "data", class_names=("a", "b"), per_class=2)
    linked = _write_image(tmp_path / "elsewhere" / "extra.png")
    (root / "a" / "more").symlink_to(linked.parent, target_is_directory=True)

    plain = prefetch.ImageFolder(root)
    followed = prefetch.ImageFolder(root, follow_links=True)

    through_link = str(root / "a" / "more" / "extra.png")
    assert through_link not in plain.paths.tolist()
    assert len(plain) == 4
    assert through_link in followed.paths.tolist()
    assert len(followed) == 5
    assert followed.labels[followed.paths.tolist().index(through_link)] == 0


# FileList -------------------------------------------------------------------------------------


def test_a_file_list_keeps_paths_and_labels_as_arrays(tmp_path: Path) -> None:
    paths = [tmp_path / "x.jpg", str(tmp_path / "y.jpg"), tmp_path / "z.jpg"]

    files = prefetch.FileList(paths, [1, 0, 1])

    assert isinstance(files.paths, PathArray)
    assert files.paths.tolist() == [str(path) for path in paths]
    assert isinstance(files.labels, np.ndarray)
    assert files.labels.dtype == np.int32
    assert files.labels.tolist() == [1, 0, 1]
    assert files.has_labels
    assert files.class_names == ["0", "1"]
    assert len(files) == 3


def test_a_file_list_keeps_the_given_class_names() -> None:
    files = prefetch.FileList(["a.jpg", "b.jpg"], [0, 0], class_names=["cat", "dog"])

    assert files.class_names == ["cat", "dog"]


def test_a_file_list_rejects_a_label_count_that_differs_from_the_path_count() -> None:
    with pytest.raises(ValueError, match="2 labels for 3 paths"):
        prefetch.FileList(["a.jpg", "b.jpg", "c.jpg"], [0, 1])


def test_a_file_list_rejects_negative_labels() -> None:
    with pytest.raises(ValueError, match="got -1"):
        prefetch.FileList(["a.jpg", "b.jpg"], [0, -1])


def test_a_file_list_rejects_labels_beyond_its_class_names() -> None:
    with pytest.raises(ValueError, match="label 2 is out of range for 2 class names"):
        prefetch.FileList(["a.jpg", "b.jpg"], [0, 2], class_names=["cat", "dog"])


def test_a_file_list_without_labels_says_so() -> None:
    files = prefetch.FileList(["a.jpg", "b.jpg"])

    assert not files.has_labels
    assert len(files) == 2
    assert files.class_names == []
    assert files.labels.dtype == np.int32


def test_a_subset_keeps_the_class_names_and_picks_paths_and_labels() -> None:
    files = prefetch.FileList(
        ["a.jpg", "b.jpg", "c.jpg", "d.jpg"], [0, 1, 2, 0], class_names=["x", "y", "z", "unused"]
    )

    part = files.subset([3, 1])

    assert isinstance(part, prefetch.FileList)
    assert part.paths.tolist() == ["d.jpg", "b.jpg"]
    assert part.labels.tolist() == [0, 1]
    assert part.class_names == ["x", "y", "z", "unused"]
    assert part.has_labels


def test_a_subset_of_an_image_folder_keeps_its_class_names(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path, class_names=("a", "b", "c"), per_class=2)
    folder = prefetch.ImageFolder(root)

    part = folder.subset(np.array([0, 1]))

    assert part.class_names == ["a", "b", "c"]
    assert part.labels.tolist() == [0, 0]
    assert part.paths.tolist() == folder.paths[:2].tolist()


def test_a_subset_of_an_unlabelled_file_list_stays_unlabelled() -> None:
    part = prefetch.FileList(["a.jpg", "b.jpg", "c.jpg"]).subset([2])

    assert not part.has_labels
    assert part.paths.tolist() == ["c.jpg"]


# Epoch order ----------------------------------------------------------------------------------


def test_epoch_order_without_shuffle_is_the_identity() -> None:
    order = epoch_order(10, shuffle=False, seed=123, epoch=4)

    assert order.tolist() == list(range(10))


def test_the_same_seed_and_epoch_give_the_same_permutation() -> None:
    first = epoch_order(100, shuffle=True, seed=7, epoch=3)
    again = epoch_order(100, shuffle=True, seed=7, epoch=3)

    assert first.tolist() == again.tolist()


def test_different_epochs_give_different_permutations() -> None:
    orders = {tuple(epoch_order(100, shuffle=True, seed=7, epoch=e).tolist()) for e in range(5)}

    assert len(orders) == 5


def test_different_seeds_give_different_permutations() -> None:
    first = epoch_order(100, shuffle=True, seed=1, epoch=0)
    other = epoch_order(100, shuffle=True, seed=2, epoch=0)

    assert first.tolist() != other.tolist()


@pytest.mark.parametrize("size", [0, 1, 2, 37, 1000])
def test_a_shuffled_epoch_order_is_a_permutation(size: int) -> None:
    order = epoch_order(size, shuffle=True, seed=0, epoch=1)

    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(size))


# ---- Keras's split, the one the Loader and the drop-in share ----------------------------------


def test_keras_split_without_a_seed_keeps_the_listing_order() -> None:
    from prefetch.sources._folders import keras_split

    assert keras_split(10, validation_split=0.3, subset="training", seed=None).tolist() == list(
        range(7)
    )
    assert keras_split(10, validation_split=0.3, subset="validation", seed=None).tolist() == [
        7,
        8,
        9,
    ]
    assert keras_split(4, validation_split=None, subset=None, seed=None).tolist() == [0, 1, 2, 3]


def test_keras_split_shuffles_with_numpys_random_state_as_keras_does() -> None:
    from prefetch.sources._folders import keras_split

    order = np.arange(20)
    np.random.RandomState(42).shuffle(order)
    training = keras_split(20, validation_split=0.25, subset="training", seed=42)
    validation = keras_split(20, validation_split=0.25, subset="validation", seed=42)
    assert training.tolist() == order[:15].tolist()
    assert validation.tolist() == order[15:].tolist()
