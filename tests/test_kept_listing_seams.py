"""A kept listing never crashes its reader, its environment is checked at the door, and kept
listings are pruned (issue 45, item 4).

The kept files are real (written by `ImageFolder`), damaged or truncated by hand as a cleanup
tool, a full disk or a user would; a truncation while a process uses its listing runs in a
subprocess (before, the process died of SIGBUS). Files nobody used for 30 days are made by
setting their times back (`os.utime`), never by waiting; a key "in use" is one whose lock file
another open file holds (`flock`), as a listing process holds it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from test_kept_listing import (
    CLASSES,
    HANG_UNTIL,
    finish,
    kept_files,
    lock_open_by,
    settle,
    start,
)

from prefetch.sources import ImageFolder
from prefetch.sources import _kept_listing as kept_listing
from prefetch.sources._listing_file import CHECKSUM_BYTES, SUFFIX
from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(60)

DAY_S = 24 * 3600


def make_tree(folder: Path, classes: tuple[str, ...] = CLASSES) -> Path:
    return settle(write_image_folder(folder, class_names=classes, per_class=4, size=(8, 8)))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "data")


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    return tmp_path / "listings"


def fresh(root: Path) -> ImageFolder:
    return ImageFolder(root, keep_listing=False)


# A reader survives the file it read ------------------------------------------------------------

# Reads the kept listing, truncates the file, then uses the listing (paths, and a Loader's
# epoch): a process that mapped the file died of SIGBUS here.
TRUNCATE_THEN_USE = """
import os, sys
import prefetch
root, kept, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
prefetch.ImageFolder(root, keep_listing=kept)
folder = prefetch.ImageFolder(root, keep_listing=kept)
assert folder.listing.read, folder.listing
os.truncate(folder.listing.file, size)
paths = folder.paths.tolist()
loader = prefetch.Loader(folder, batch_size=5, image_size=(8, 8), workers=1, backend="thread")
with loader:
    images = sum(len(labels) for _, labels in loader)
print(len(paths), images, prefetch.ImageFolder(root, keep_listing=kept).listing.read, flush=True)
"""


@pytest.mark.parametrize("size", [0, 100], ids=["emptied", "cut"])
def test_a_kept_listing_truncated_while_in_use_does_not_crash_its_reader(
    tree: Path, kept: Path, size: int
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", TRUNCATE_THEN_USE, str(tree), str(kept), str(size)],
        capture_output=True,
        text=True,
        timeout=50,
    )

    assert run.returncode == 0, run.stderr[-2000:]
    count = 4 * len(CLASSES)
    # Every path and image, then the truncated file is refused and listed again.
    assert run.stdout.split() == [str(count), str(count), "False"]


def rewrite(path: Path, old: bytes, new: bytes) -> None:
    """Replace the bytes `old` in the kept listing `path` by `new` (as long) and set its
    checksum to match, as a file damaged before it was checksummed would be."""
    data = path.read_bytes()
    assert data.count(old) >= 1 and len(old) == len(new)
    body = data[:-CHECKSUM_BYTES].replace(old, new)
    path.write_bytes(body + zlib.crc32(body).to_bytes(CHECKSUM_BYTES, "little"))


@pytest.mark.parametrize(
    ("old", "new"),
    [(b"b_0001.jpg", b"\xff_0001.jpg"), (b"c\x00", b"\xfe\x00"), (b"a_0002", b"a\xc3(002")],
    ids=["in-a-path", "in-a-class-name", "a-broken-sequence"],
)
def test_a_kept_listing_with_names_that_are_not_utf8_is_listed_again(
    tree: Path, kept: Path, old: bytes, new: bytes
) -> None:
    ImageFolder(tree, keep_listing=kept)
    (path,) = kept_files(kept)
    rewrite(path, old, new)

    again = ImageFolder(tree, keep_listing=kept)

    assert again.listing.read is False  # refused, then listed
    assert again.paths.tolist() == fresh(tree).paths.tolist()
    assert again.class_names == list(CLASSES)
    assert ImageFolder(tree, keep_listing=kept).listing.read is True  # replaced


def test_names_that_os_fsdecode_made_of_odd_bytes_are_kept_and_read(tree: Path, kept: Path) -> None:
    odd = os.path.join(os.fsencode(tree / "b"), b"\xff-not-utf8.jpg")
    with open(odd, "wb") as file:
        file.write((tree / "b" / "b_0000.jpg").read_bytes())
    settle(tree)
    ImageFolder(tree, keep_listing=kept)

    read = ImageFolder(tree, keep_listing=kept)

    assert read.listing.read is True
    assert os.fsdecode(odd) in read.paths.tolist()


# The environment, checked at the door ----------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "False", "OFF", " no ", "off"])
def test_keep_listing_off_in_any_usual_spelling_keeps_nothing(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREFETCH_KEEP_LISTING", value)

    assert ImageFolder(tree).listing.file is None
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["", "1", "true", "YES", "on"])
def test_keep_listing_on_or_unset_keeps_in_the_cache_folder(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREFETCH_KEEP_LISTING", value)

    made = ImageFolder(tree).listing

    assert made.file is not None and Path(made.file).parent == tmp_path / "cache" / "listings"


@pytest.mark.parametrize("value", ["nope", "2", "disabled"])
def test_keep_listing_not_understood_is_an_error_naming_the_variable_and_its_values(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PREFETCH_KEEP_LISTING", value)

    with pytest.raises(ValueError, match=f"PREFETCH_KEEP_LISTING='{value}' is not understood"):
        ImageFolder(tree)
    with pytest.raises(ValueError, match=r"0/false/no/off .* 1/true/yes/on"):
        ImageFolder(tree)
    assert ImageFolder(tree, keep_listing=False).listing.file is None  # not consulted
    assert not (tmp_path / "cache").exists()


def test_a_relative_xdg_cache_home_is_ignored_as_the_spec_says(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.delenv("PREFETCH_CACHE_DIR")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-cache")
    monkeypatch.chdir(work)

    made = ImageFolder(tree).listing

    assert made.file is not None
    assert Path(made.file).parent == home / ".cache" / "prefetch" / "listings"
    assert list(work.iterdir()) == []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # an absolute one is used
    assert Path(str(ImageFolder(tree).listing.file)).parent == tmp_path / "xdg/prefetch/listings"


def test_a_relative_prefetch_cache_dir_is_refused_naming_it_and_the_fix(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFETCH_CACHE_DIR", "cache")
    monkeypatch.chdir(tmp_path)

    with pytest.raises(ValueError, match=r"PREFETCH_CACHE_DIR='cache' is a relative path.*abs"):
        ImageFolder(tree)
    assert not (tmp_path / "cache").exists()


# Pruning ---------------------------------------------------------------------------------------


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY_S
    os.utime(path, (then, then))


def key_files(listing: str) -> list[Path]:
    """The kept listing `listing` and its lock file."""
    return [Path(listing), Path(listing[: -len(SUFFIX)] + ".lock")]


def test_writing_a_listing_removes_those_unused_for_30_days_but_none_in_use(
    tmp_path: Path, kept: Path
) -> None:
    roots = [make_tree(tmp_path / f"data{i}") for i in range(5)]
    files = [key_files(str(ImageFolder(root, keep_listing=kept).listing.file)) for root in roots]
    for paths in files[:4]:
        for path in paths:
            age(path, 31)
    age(files[3][0], 29)  # used 29 days ago
    assert ImageFolder(roots[2], keep_listing=kept).listing.read  # used now (31 days back)
    orphans = [kept / (".partial-" + "e" * 32 + "-0123456789abcdef"), kept / ("f" * 32 + ".lock")]
    for orphan in orphans:
        orphan.write_bytes(b"")
        age(orphan, 40)
    holder = os.open(files[1][1], os.O_RDWR)  # another process lists the second folder
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        os.utime(roots[4] / "a")  # its listing no longer serves: written again
        assert ImageFolder(roots[4], keep_listing=kept).listing.read is False
    finally:
        os.close(holder)

    assert not any(path.exists() for path in files[0]), "unused for 31 days: removed"
    assert all(path.exists() for path in files[1]), "locked by another process: kept"
    for used in (files[2], files[3], files[4]):
        assert all(path.exists() for path in used), "used within 30 days: kept"
    assert not any(orphan.exists() for orphan in orphans)
    assert ImageFolder(roots[0], keep_listing=kept).listing.read is False  # listed again


def test_a_write_prunes_at_most_a_bounded_number_of_keys(kept: Path, tree: Path) -> None:
    ImageFolder(tree, keep_listing=kept)
    unused = [kept / f"{index:032x}.lock" for index in range(kept_listing.PRUNE_KEYS + 8)]
    for path in unused:
        path.write_bytes(b"")
        age(path, 31)

    for left in (8, 0):
        os.utime(tree / "a")  # the listing is written again
        assert ImageFolder(tree, keep_listing=kept).listing.read is False
        assert sum(path.exists() for path in unused) == left


# The lister pauses between opening the lock file and locking it, until RESUME exists.
PAUSE_BEFORE_LOCK = """
import os, time
import prefetch.sources._kept_listing as kept_listing
wait_for = kept_listing._wait_for
def paused(handle, place):
    print("opened", flush=True)
    while not os.path.exists({resume!r}):
        time.sleep(0.02)
    return wait_for(handle, place)
kept_listing._wait_for = paused
"""


def test_a_lock_file_removed_before_it_is_locked_is_never_held_by_two(
    tree: Path, kept: Path, tmp_path: Path
) -> None:
    """A process that locked a lock file no longer named (removed between its open and its
    lock, as pruning may) locks the file named now, so a later process waits for it rather
    than listing beside it."""
    ImageFolder(tree, keep_listing=kept)
    (lock,) = kept.glob("*.lock")
    age(tree / "a", 0.5)  # the kept listing no longer serves (and a new one would, to all)
    go, resume = tmp_path / "go", tmp_path / "resume"
    inject = PAUSE_BEFORE_LOCK.format(resume=str(resume)) + HANG_UNTIL.format(go=str(go))
    first = start(tree, kept, inject)
    assert first.stdin is not None and first.stdout is not None
    first.stdin.write("go\n")
    first.stdin.flush()
    assert first.stdout.readline().strip() == "opened"
    lock.unlink()
    resume.touch()
    while (line := first.stdout.readline().strip()) != "listing":  # it holds a lock, and lists
        assert line == "opened", line
    second = start(tree, kept)
    assert second.stdin is not None
    second.stdin.write("go\n")
    second.stdin.flush()
    deadline = time.monotonic() + 30
    while not lock_open_by(second.pid, kept) and second.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    go.touch()

    made, read = finish(first, go=False), finish(second, go=False)

    assert (made["read"], read["read"]) == (False, True)  # one listed, the other waited
    assert read["paths"] == made["paths"] == fresh(tree).paths.tolist()
    assert read["labels"] == fresh(tree).labels.tolist()
