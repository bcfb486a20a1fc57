"""The one folder lister (`prefetch.sources._folders.index_directory`) and `PathArray`, the paths
it holds.

The lister is compared with Keras's own `index_directory` (keras.src.utils.dataset_utils) on a
tree of real files that exercises each rule: sorted class folders (code-point order, hidden
ones skipped), the walk sorted by folder path, extensions in any case, hidden files and folders
inside classes, symlinked classes and subfolders (with and without follow_links), a symlink to
a file and a broken one (both listed: Keras keeps what is not a folder), a folder named like an
image, a name that is not UTF-8, and the path string for the directory argument as given
(relative, trailing or doubled slash, "..", pathlib.Path).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.sources._folders import PathArray, index_directory

pytestmark = pytest.mark.timeout(60)

FORMATS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
# The directory argument, relative to tmp_path (the working directory of these tests).
DIRECTORY_FORMS = ["data", "data/", "./data", "data//", "sub/../data", "ABSOLUTE", "PATH"]


def _image(path: Path, seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    image_format = {".png": "PNG", ".gif": "GIF", ".bmp": "BMP"}.get(path.suffix.lower(), "JPEG")
    Image.fromarray(pixels).save(path, image_format)


def _tree(base: Path, odd: bool) -> Path:
    """base/data with every listing rule in it (see the module docstring); returns base/data."""
    root = base / "data"
    names = [
        "B/1.jpg",
        "a/img10.jpg",
        "a/img2.JPG",
        "a/U.JpEg",
        "a/.h.png",
        "a/.hidden/h.jpg",
        "a/sub/x.png",
        "a/sub/deeper/z.gif",
        "a/sub-1/y.BMP",
        "a b/s.jpg",
        "é/e.jpg",
        "e/plain.jpg",
        ".git/x.jpg",
        "top.JPG",
    ]
    for seed, name in enumerate(names):
        _image(root / name, seed)
    (root / "a" / "notes.txt").write_text("not an image\n")
    (root / "a" / "img.jpg.bak").write_text("not an image\n")
    (root / "a" / "dir.jpg").mkdir()
    (root / "empty").mkdir()
    _image(base / "outside" / "o.jpg")
    _image(base / "outside" / "inner" / "i.png")
    (root / "linked").symlink_to(base / "outside", target_is_directory=True)
    (root / "a" / "ln").symlink_to(base / "outside", target_is_directory=True)
    (root / "a" / "file_link.jpg").symlink_to(root / "B" / "1.jpg")
    (base / "sub").mkdir()
    if odd:
        (root / "a" / "broken.jpg").symlink_to(base / "nowhere.jpg")
        with open(os.path.join(os.fsencode(root / "a"), b"\xff-not-utf8.jpg"), "wb") as file:
            file.write((root / "B" / "1.jpg").read_bytes())
    return root


def _directory(form: str, root: Path) -> Any:
    if form == "ABSOLUTE":
        return str(root)
    if form == "PATH":
        return Path("data")
    return form


@pytest.fixture
def odd_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return _tree(tmp_path, odd=True)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return _tree(tmp_path, odd=False)


# Keras's own lister -------------------------------------------------------------------------


@pytest.mark.parametrize("follow_links", [False, True], ids=["no_links", "follow_links"])
@pytest.mark.parametrize("labels", ["inferred", None], ids=["inferred", "no_labels"])
@pytest.mark.parametrize("form", DIRECTORY_FORMS)
def test_the_lister_gives_keras_files_labels_and_path_strings(
    odd_tree: Path, form: str, labels: str | None, follow_links: bool
) -> None:
    dataset_utils = pytest.importorskip("keras.src.utils.dataset_utils")
    directory = _directory(form, odd_tree)
    expected_paths, expected_labels, expected_names = dataset_utils.index_directory(
        directory, labels, FORMATS, shuffle=False, follow_links=follow_links, verbose=False
    )

    paths, got_labels, names = index_directory(
        directory, infer_labels=labels is not None, follow_links=follow_links
    )

    assert paths.tolist() == expected_paths
    if labels is not None:
        assert names == expected_names
        assert got_labels.tolist() == expected_labels.tolist()


@pytest.mark.parametrize(
    "class_names", [["é", "a"], ["linked", "B", "a b"], ["e", "a", "e"]], ids=str
)
def test_given_class_names_list_like_keras_even_repeated(
    odd_tree: Path, class_names: list[str]
) -> None:
    dataset_utils = pytest.importorskip("keras.src.utils.dataset_utils")
    expected_paths, expected_labels, _ = dataset_utils.index_directory(
        "data", "inferred", FORMATS, class_names=class_names, shuffle=False, verbose=False
    )

    paths, labels, names = index_directory("data", class_names=class_names)

    assert names == class_names
    assert paths.tolist() == expected_paths
    assert labels.tolist() == expected_labels.tolist()


@pytest.mark.tf
@pytest.mark.parametrize("form", ["data/", "./data", "sub/../data", "PATH"])
def test_the_drop_in_file_paths_equal_keras_for_the_directory_as_given(
    tree: Path, form: str
) -> None:
    keras = pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    import prefetch.tf

    options: dict[str, Any] = {"image_size": (6, 6), "seed": 3, "verbose": False}
    expected = keras.utils.image_dataset_from_directory(_directory(form, tree), **options)
    got = prefetch.tf.image_dataset_from_directory(_directory(form, tree), **options)

    assert got.file_paths == expected.file_paths
    assert got.class_names == expected.class_names
    assert isinstance(got.file_paths, list)


def test_image_folder_paths_are_the_listers_for_the_root_as_given(tree: Path) -> None:
    folder = prefetch.ImageFolder("data/")

    paths, labels, names = index_directory("data/")
    assert folder.paths.tolist() == paths.tolist()
    assert folder.paths[0].startswith("data/")
    assert folder.labels.tolist() == labels.tolist()
    assert folder.class_names == names


def test_a_missing_directory_raises_the_os_error_keras_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        index_directory(tmp_path / "missing")

    assert info.value.filename == str(tmp_path / "missing")
    assert len(index_directory(tmp_path / "missing", infer_labels=False)[0]) == 0


def test_a_name_that_is_not_utf8_round_trips_to_the_file(odd_tree: Path) -> None:
    paths, _, _ = index_directory("data")

    odd = [path for path in paths if "not-utf8" in path]
    assert len(odd) == 1
    with open(odd[0], "rb") as file:
        assert file.read(2) == b"\xff\xd8"  # the JPEG behind the undecodable name


# PathArray ------------------------------------------------------------------------------------

NAMES = ["a/x.jpg", "", "é/ü.png", "b/\udcff.jpg", "c" * 300, "d/y.JPG"]


def test_a_path_array_reads_like_a_numpy_array_of_str() -> None:
    paths = PathArray(NAMES)

    assert len(paths) == len(NAMES)
    assert [paths[i] for i in range(len(NAMES))] == NAMES
    assert paths[-1] == paths[np.int64(5)] == "d/y.JPG"
    assert list(paths) == paths.tolist() == NAMES
    assert np.asarray(paths).tolist() == NAMES
    assert all(type(path) is str for path in paths)


@pytest.mark.parametrize(
    "index",
    [
        slice(1, 4),
        slice(None, None, -1),
        slice(4, 1, -2),
        slice(-2, None),
        slice(3, 1),
        slice(None, -0),
        [4, 0, 0, 2],
        np.array([5, -1, 1], dtype=np.int32),
        np.array([], dtype=np.int64),
        [],
        np.array([True, False, True, False, False, True]),
    ],
    ids=repr,
)
def test_a_path_array_takes_numpy_indexing(index: Any) -> None:
    expected = np.array(NAMES, dtype=object)[index].tolist()

    got = PathArray(NAMES)[index]

    assert isinstance(got, PathArray)
    assert got.tolist() == expected
    assert [got[i] for i in range(len(got))] == expected
    assert got[1:].tolist() == expected[1:]


@pytest.mark.parametrize("index", [6, -7, [0, 6], np.array([[0, 1]]), np.array([0.5])], ids=repr)
def test_a_path_array_refuses_indices_out_of_bounds_or_of_the_wrong_kind(index: Any) -> None:
    with pytest.raises(IndexError):
        PathArray(NAMES)[index]


def test_a_path_array_refuses_a_nul_character() -> None:
    with pytest.raises(ValueError, match="NUL"):
        PathArray(["ok.jpg", "bad\0.jpg"])


def test_a_path_array_pickles_as_its_two_buffers() -> None:
    paths = PathArray(NAMES * 1000)[::2]

    data = pickle.dumps(paths, protocol=pickle.HIGHEST_PROTOCOL)

    assert pickle.loads(data).tolist() == (NAMES * 1000)[::2]
    assert len(data) < paths.nbytes + 1000


def test_a_path_array_holds_utf8_bytes_plus_nine_per_path() -> None:
    names = [
        f"/data/imagenet/train/n{c:08d}/n{c:08d}_{i}.JPEG" for c in range(50) for i in range(200)
    ]
    paths = PathArray(names)

    utf8 = sum(len(name.encode()) for name in names)
    assert paths.nbytes == utf8 + 9 * len(names) + 8
    assert paths.nbytes * 3 < np.array(names).nbytes


def test_a_file_list_keeps_a_path_array_as_is_and_subsets_stay_path_arrays() -> None:
    paths = PathArray(["a.jpg", "b.jpg", "c.jpg"])

    files = prefetch.FileList(paths, [0, 1, 0])

    assert files.paths is paths
    assert isinstance(files.subset([2, 0]).paths, PathArray)
    assert files.subset([2, 0]).paths.tolist() == ["c.jpg", "a.jpg"]
