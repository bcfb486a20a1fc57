"""List once (issue 41, item 4): a folder's listing is kept as a file that the other processes
of a host and later runs read (`prefetch.sources._kept_listing` and `_listing_file`,
`ImageFolder(keep_listing=)`).

Processes that list at once are real subprocesses released together; the one that lists is
counted from each one's `ImageFolder.listing`. A lister is made to hang (a fault injected in
its own script) and killed with SIGKILL. Files and folders of another user are made with
`os.chown` (the suite runs as root; those cases are skipped otherwise).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from prefetch.sources import ImageFolder, index_directory
from prefetch.sources import _kept_listing as kept_listing
from prefetch.sources._listing_file import RACY_NS, SUFFIX
from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(60)

NOBODY = 65534
CLASSES = ("a", "b", "c")
# Long enough ago that a listing made now is not "racy" (a change in the stamp's own tick).
SETTLED_S = 3600


def settle(root: Path) -> Path:
    """Set every folder's modification time an hour back (as for any data set not being
    written), so that a listing made now is trusted by callers that begin after it."""
    then = time.time() - SETTLED_S
    for folder in [root, *(path for path in root.rglob("*") if path.is_dir())]:
        os.utime(folder, (then, then))
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "data", class_names=CLASSES, per_class=4, size=(8, 8))
    return settle(root)


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    return tmp_path / "listings"


def listed(root: Path, kept: Path) -> ImageFolder:
    return ImageFolder(root, keep_listing=kept)


def kept_files(kept: Path) -> list[Path]:
    return sorted(kept.glob("*" + SUFFIX))


# What each process of the concurrent tests runs: report ready, wait for "go", list, report.
CHILD = """
import json, sys
from prefetch.sources import ImageFolder
{inject}
print("ready", flush=True)
sys.stdin.readline()
folder = ImageFolder(sys.argv[1], keep_listing=sys.argv[2])
print(json.dumps({{"read": folder.listing.read, "waited_s": folder.listing.waited_s,
                  "paths": folder.paths.tolist(), "labels": folder.labels.tolist()}}),
      flush=True)
"""


def start(root: Path, kept: Path, inject: str = "") -> subprocess.Popen[str]:
    script = CHILD.format(inject=textwrap.dedent(inject))
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(root), str(kept)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    return child


def finish(child: subprocess.Popen[str], go: bool = True) -> dict[str, object]:
    """The child's report, with the lines it printed before it under "said"."""
    out, _ = child.communicate("go\n" if go else "", timeout=50)
    assert child.returncode == 0
    *said, last = out.strip().splitlines()
    result: dict[str, object] = json.loads(last)
    result["said"] = said
    return result


def test_processes_released_at_once_list_the_folder_once_and_read_the_same_files(
    tree: Path, kept: Path
) -> None:
    children = [start(tree, kept) for _ in range(3)]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = [finish(child, go=False) for child in children]

    assert [result["read"] for result in results].count(False) == 1  # one listed
    fresh = ImageFolder(tree, keep_listing=False)
    for result in results:
        assert result["paths"] == fresh.paths.tolist()
        assert result["labels"] == fresh.labels.tolist()
    assert len(kept_files(kept)) == 1


def lock_open_by(pid: int, kept: Path) -> bool:
    return any(Path(f.path).suffix == ".lock" for f in psutil.Process(pid).open_files())


# The lister waits for a file before it walks the first class folder: it holds the lock.
HANG_UNTIL = """
import os, time
import prefetch.sources._listing as listing
walk = listing._walk_images
def slow_walk(*args, **kwargs):
    print("listing", flush=True)
    while not os.path.exists({go!r}):
        time.sleep(0.02)
    return walk(*args, **kwargs)
listing._walk_images = slow_walk
"""


# Each read of a kept listing says whether the lock was free meanwhile (another open file
# description of this process cannot take a lock this process holds).
SAY_LOCK = """
import fcntl, glob, os
import prefetch.sources._kept_listing as kept_listing
read = kept_listing.read_listing
def read_saying(folder, name, key):
    with open(glob.glob(os.path.join(sys.argv[2], "*.lock"))[0], "rb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("lock free", flush=True)
        except BlockingIOError:
            print("lock held", flush=True)
    return read(folder, name, key)
kept_listing.read_listing = read_saying
"""


def test_a_process_that_finds_the_folder_being_listed_waits_and_reads_the_kept_listing(
    tree: Path, kept: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    lister = start(tree, kept, HANG_UNTIL.format(go=str(go)))
    assert lister.stdin is not None and lister.stdout is not None
    lister.stdin.write("go\n")
    lister.stdin.flush()
    assert lister.stdout.readline().strip() == "listing"
    reader = start(tree, kept, SAY_LOCK)
    assert reader.stdin is not None
    reader.stdin.write("go\n")
    reader.stdin.flush()
    deadline = time.monotonic() + 30
    while not lock_open_by(reader.pid, kept):  # the reader is at the lock, waiting
        assert reader.poll() is None, "the reader did not wait for the lister"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    go.touch()

    made, read = finish(lister, go=False), finish(reader, go=False)

    assert made["read"] is False and read["read"] is True
    assert isinstance(read["waited_s"], float) and read["waited_s"] > 0
    assert read["paths"] == made["paths"] and read["labels"] == made["labels"]
    # Read first while the lister held the lock, then with the lock let go: the waiters of a
    # host read at once, not one after another.
    assert read["said"] == ["lock held", "lock free"]


# The lister hangs while writing the kept file (after its partial file is made).
HANG_WRITING = """
import os, time
def hang(fd):
    print("writing", flush=True)
    time.sleep(60)
os.fsync = hang
"""


@pytest.mark.parametrize("when", ["listing", "writing"])
def test_a_lister_killed_holding_the_lock_does_not_block_the_next(
    tree: Path, kept: Path, tmp_path: Path, when: str
) -> None:
    inject = HANG_WRITING if when == "writing" else HANG_UNTIL.format(go=str(tmp_path / "never"))
    lister = start(tree, kept, inject)
    assert lister.stdin is not None and lister.stdout is not None
    lister.stdin.write("go\n")
    lister.stdin.flush()
    assert lister.stdout.readline().strip() == when
    os.kill(lister.pid, signal.SIGKILL)
    lister.wait(timeout=20)

    folder = listed(tree, kept)

    assert folder.listing.read is False and len(folder) == 4 * len(CLASSES)
    assert not list(kept.glob(".partial-*")), "the killed lister's partial file is left"
    assert listed(tree, kept).listing.read is True


def test_a_lister_that_holds_the_lock_too_long_is_said_then_listed_without(
    tree: Path, kept: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A holder stopped (Ctrl-Z) with the lock: the waiter names it after LOCK_SAY_S, and after
    LOCK_WAIT_S lists for itself without keeping (shortened here)."""
    monkeypatch.setattr(kept_listing, "LOCK_SAY_S", 0.05)
    monkeypatch.setattr(kept_listing, "LOCK_WAIT_S", 0.2)
    listed(tree, kept)  # the lock file is made
    (lock,) = kept.glob("*.lock")
    os.utime(tree / "a")  # the kept listing no longer serves: the lock is needed
    holder = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        os.pwrite(holder, b"4242\n", 0)
        with caplog.at_level(logging.INFO, "prefetch.loader"):
            folder = listed(tree, kept)
    finally:
        os.close(holder)

    assert folder.listing.read is False and folder.listing.file is None
    said = [record.getMessage() for record in caplog.records]
    assert any("waiting for process 4242 to list" in line for line in said), said
    assert any("for process 4242 listing into" in line for line in said), said


def add_file(tree: Path) -> None:
    (tree / "b" / "new.jpg").write_bytes((tree / "b" / "b_0000.jpg").read_bytes())


def remove_file(tree: Path) -> None:
    (tree / "a" / "a_0001.jpg").unlink()


def rename_file(tree: Path) -> None:
    (tree / "c" / "c_0002.jpg").rename(tree / "c" / "z.jpg")


def add_in_subfolder(tree: Path) -> None:
    (tree / "a" / "deep").mkdir()
    settle(tree)
    listed(tree, tree.parent / "listings")  # the sub-folder is in the kept listing
    (tree / "a" / "deep" / "x.png").write_bytes((tree / "a" / "a_0000.jpg").read_bytes())


def add_class(tree: Path) -> None:
    write_image_folder(tree, class_names=("d",), per_class=1, size=(8, 8))


@pytest.mark.parametrize(
    "change", [add_file, remove_file, rename_file, add_in_subfolder, add_class], ids=str
)
def test_a_listing_whose_folder_changed_is_listed_again(
    tree: Path, kept: Path, change: object
) -> None:
    assert listed(tree, kept).listing.read is False
    assert listed(tree, kept).listing.read is True
    assert callable(change)
    change(tree)

    again = listed(tree, kept)

    assert again.listing.read is False
    fresh = ImageFolder(tree, keep_listing=False)
    assert again.paths.tolist() == fresh.paths.tolist()
    assert again.class_names == fresh.class_names
    assert len(kept_files(kept)) == 1  # replaced, not added


def test_a_listing_made_just_after_a_change_is_trusted_only_by_callers_that_began_before_it(
    tree: Path, kept: Path
) -> None:
    future = time.time() + 60  # a folder changed "now" as far as the stamps can tell
    os.utime(tree / "a", (future, future))
    assert listed(tree, kept).listing.read is False

    assert listed(tree, kept).listing.read is False  # began after it: listed again
    assert RACY_NS >= 1_000_000_000


def test_the_kept_listing_gives_the_listers_paths_labels_and_classes(
    tree: Path, kept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = os.path.join(os.fsencode(tree / "b"), b"\xff-not-utf8.jpg")
    with open(odd, "wb") as file:
        file.write((tree / "b" / "b_0000.jpg").read_bytes())
    settle(tree)
    monkeypatch.chdir(tmp_path)
    for options in ({}, {"class_names": ["c", "a"]}, {"infer_labels": False}):
        made = index_directory("data", keep_listing=kept, **options)  # type: ignore[arg-type]
        read = index_directory("data", keep_listing=kept, **options)  # type: ignore[arg-type]
        fresh = index_directory("data", keep_listing=False, **options)  # type: ignore[arg-type]
        for got in (made, read):
            assert got[0].tolist() == fresh[0].tolist()
            assert got[1].tolist() == fresh[1].tolist() and got[2] == fresh[2]
    assert len(kept_files(kept)) == 3  # one per set of options


def test_a_damaged_or_linked_kept_file_is_not_read_and_is_replaced(
    tree: Path, kept: Path, tmp_path: Path
) -> None:
    listed(tree, kept)
    (path,) = kept_files(kept)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert listed(tree, kept).listing.read is False

    target = tmp_path / "elsewhere"
    target.write_bytes(b"not yours to write")
    path.unlink()
    path.symlink_to(target)
    assert listed(tree, kept).listing.read is False
    assert target.read_bytes() == b"not yours to write"
    assert not path.is_symlink() and listed(tree, kept).listing.read is True


def test_a_kept_file_that_others_may_write_is_not_read(tree: Path, kept: Path) -> None:
    listed(tree, kept)
    (path,) = kept_files(kept)
    path.chmod(0o666)

    assert listed(tree, kept).listing.read is False
    assert path.stat().st_mode & 0o777 == 0o600  # replaced by a private one


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_a_kept_file_of_another_user_is_not_read(tree: Path, kept: Path) -> None:
    listed(tree, kept)
    (path,) = kept_files(kept)
    os.chown(path, NOBODY, NOBODY)

    assert listed(tree, kept).listing.read is False
    assert path.stat().st_uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root")
def test_a_named_folder_that_another_user_owns_or_others_may_write_is_refused(
    tree: Path, kept: Path
) -> None:
    kept.mkdir(mode=0o700)
    kept.chmod(0o777)
    with pytest.raises(ValueError, match=r"keep_listing .* is writable by others .*chmod 700"):
        listed(tree, kept)
    kept.chmod(0o700)
    os.chown(kept, NOBODY, NOBODY)
    with pytest.raises(ValueError, match="belongs to user 65534, not to you"):
        listed(tree, kept)


def test_the_default_folder_when_refused_is_said_once_and_the_folder_still_listed(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared-cache"
    (shared / "listings").mkdir(parents=True)
    (shared / "listings").chmod(0o777)
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(shared))

    with caplog.at_level(logging.WARNING, "prefetch.loader"):
        folders = [ImageFolder(tree), ImageFolder(tree)]

    assert [folder.listing.file for folder in folders] == [None, None]
    assert len(folders[0]) == 4 * len(CLASSES)
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "folder listings are not kept" in caplog.records[0].getMessage()


def test_keeping_is_off_with_false_or_the_environment_and_the_default_is_the_cache_folder(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(cache))
    assert ImageFolder(tree, keep_listing=False).listing.file is None
    monkeypatch.setenv("PREFETCH_KEEP_LISTING", "0")
    assert ImageFolder(tree).listing.file is None
    assert not cache.exists()
    monkeypatch.delenv("PREFETCH_KEEP_LISTING")
    made = ImageFolder(tree).listing
    assert made.file is not None and Path(made.file).parent == cache / "listings"
    assert (cache / "listings").stat().st_mode & 0o777 == 0o700
    assert ImageFolder(tree).listing.read is True
    with pytest.raises(TypeError, match="keep_listing must be True"):
        ImageFolder(tree, keep_listing=1)  # type: ignore[arg-type]
