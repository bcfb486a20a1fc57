"""A folder's listing is complete or it is an error (issue 45, item 2).

`os.walk` leaves out a folder it cannot open, and fsspec's generic `find` a folder whose `ls`
fails: one EIO on a flaky mount gave a listing without a class, which was then kept for every
later run and every rank. The faults are injected with `prefetch.testing.flaky_listings`
(`FailingFolders` makes opening a chosen local folder fail, `FailingListings` the `ls` of a
folder of `flaky://`, fsspec's in-memory store listed one `ls` per folder as sftp or smb are);
everything else is real: image files in tmp dirs, the kept listing files, `ImageFolder`.
"""

from __future__ import annotations

import errno
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_kept_listing import CLASSES, kept_files, settle

from prefetch.sources import ImageFolder, index_directory
from prefetch.testing import write_image_folder
from prefetch.testing.flaky_listings import FailingFolders, FailingListings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "data", class_names=CLASSES, per_class=4, size=(8, 8))
    (root / "b" / "deep").mkdir()
    (root / "b" / "deep" / "x.jpg").write_bytes((root / "b" / "b_0000.jpg").read_bytes())
    return settle(root)


def whole(root: Path) -> list[str]:
    """The paths of the listing of `root`, listed with no fault and nothing kept."""
    return ImageFolder(root, keep_listing=False).paths.tolist()


@pytest.mark.parametrize("error", [errno.EIO, errno.EMFILE, errno.ESTALE], ids=errno.errorcode.get)
@pytest.mark.parametrize("folder", ["b", "b/deep"])
def test_a_folder_that_fails_to_open_a_few_times_is_read_again_and_the_listing_is_whole(
    tree: Path, tmp_path: Path, error: int, folder: str
) -> None:
    expected = whole(tree)

    with FailingFolders([tree / folder], error, times=2) as faults:
        listed = ImageFolder(tree, keep_listing=tmp_path / "listings")

    assert faults.tries == {str(tree / folder): 3}
    assert listed.paths.tolist() == expected
    assert str(tree / "b" / "deep" / "x.jpg") in expected
    assert listed.listing.file is not None  # a whole listing is kept
    assert ImageFolder(tree, keep_listing=tmp_path / "listings").listing.read is True


@pytest.mark.parametrize(
    ("error", "times", "tries"),
    [(errno.EIO, None, 5), (errno.EMFILE, None, 5), (errno.EACCES, 1, 1), (errno.ENOENT, 1, 1)],
    ids=["EIO-always", "EMFILE-always", "EACCES-not-retried", "ENOENT-not-retried"],
)
@pytest.mark.parametrize("folder", ["b", "b/deep"])
def test_a_folder_that_cannot_be_opened_raises_naming_it_and_no_listing_is_kept(
    tree: Path, tmp_path: Path, error: int, times: int | None, tries: int, folder: str
) -> None:
    kept = tmp_path / "listings"

    with (
        FailingFolders([tree / folder], error, times=times) as faults,
        pytest.raises(OSError) as raised,
    ):
        ImageFolder(tree, keep_listing=kept)

    assert raised.value.errno == error  # of its kind: a PermissionError stays one
    assert raised.value.filename == str(tree / folder)
    assert "make it readable" in str(raised.value)
    assert faults.tries == {str(tree / folder): tries}  # only transient errors are retried
    assert kept_files(kept) == []
    assert not list(kept.glob(".partial-*"))
    # Once the folder can be read, it is listed whole (nothing short was kept meanwhile).
    again = ImageFolder(tree, keep_listing=kept)
    assert again.listing.read is False and again.paths.tolist() == whole(tree)


def test_the_root_that_fails_to_open_once_is_read_again(tree: Path, tmp_path: Path) -> None:
    with FailingFolders([tree], errno.EIO, times=1) as faults:
        listed = ImageFolder(tree, keep_listing=tmp_path / "listings")

    assert faults.tries == {str(tree): 2}
    assert listed.class_names == list(CLASSES)
    assert listed.paths.tolist() == whole(tree)


def test_a_folder_that_fails_while_listed_without_labels_raises_too(tree: Path) -> None:
    with (
        FailingFolders([tree / "c"], errno.EACCES, times=None),
        pytest.raises(PermissionError, match="cannot list this folder"),
    ):
        index_directory(tree, infer_labels=False, keep_listing=False)


def test_a_link_cycle_followed_is_an_error_naming_the_folder(tree: Path, tmp_path: Path) -> None:
    """os.walk (and so Keras) lists the files again at each level of a followed link cycle
    until the path is too long to resolve, and leaves that last folder out."""
    (tree / "a" / "loop").symlink_to(tree / "a", target_is_directory=True)

    with pytest.raises(OSError, match="cannot list this folder") as raised:
        ImageFolder(tree, follow_links=True, keep_listing=tmp_path / "listings")

    assert raised.value.errno == errno.ELOOP
    assert str(raised.value.filename).startswith(str(tree / "a" / "loop" / "loop"))
    assert kept_files(tmp_path / "listings") == []
    assert len(ImageFolder(tree, keep_listing=False)) == len(whole(tree))  # not followed: fine


# A folder URL: fsspec's generic find, one ls per folder ---------------------------------------


@pytest.fixture
def remote_tree(tree: Path) -> Iterator[str]:
    """The images of `tree` in fsspec's memory store; the `flaky://` URL of their root."""
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    bucket = f"bucket-{uuid.uuid4().hex[:8]}"
    for path in sorted(tree.rglob("*.jpg")):
        memory.pipe(f"memory://{bucket}/train/{path.relative_to(tree)}", path.read_bytes())
    yield f"flaky://{bucket}/train"
    memory.rm(f"memory://{bucket}", recursive=True)


def test_a_folder_url_whose_listing_fails_once_is_listed_again_whole(remote_tree: str) -> None:
    with FailingListings([f"{remote_tree}/b"], ConnectionError, times=1) as faults:
        listed = ImageFolder(remote_tree)

    assert faults.tries == {f"{remote_tree}/b": 2}
    assert len(listed) == 4 * len(CLASSES) + 1
    assert f"{remote_tree}/b/deep/x.jpg" in listed.paths.tolist()
    assert listed.listing.file is None  # a URL's listing is never kept


@pytest.mark.parametrize("folder", ["b", "b/deep"])
def test_a_folder_url_whose_listing_keeps_failing_raises_naming_it(
    remote_tree: str, folder: str
) -> None:
    url = f"{remote_tree}/{folder}"
    with (
        FailingListings([url], PermissionError, times=None),
        pytest.raises(OSError, match=f"the folder '{url}' cannot be listed"),
    ):
        ImageFolder(remote_tree)

    assert len(ImageFolder(remote_tree)) == 4 * len(CLASSES) + 1  # and nothing of it stayed


def test_a_missing_folder_url_still_says_so(remote_tree: str) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolder(remote_tree + "-missing")
