"""Loader(url, remote=RemoteOptions(cache_dir=...)): each remote object is read once, then
from a private local copy.

Real objects: JPEGs and PNGs in fsspec's memory filesystem (thread workers; it lives in one
process) and behind the loopback HTTP server (worker processes). The proof that a later epoch
reads the copies is that the store is gone by then: the objects deleted, the server stopped.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import stat
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import prefetch.io._cache
from prefetch import ImageFolder, Loader, LoaderStats, RemoteOptions
from prefetch.io import read_location
from prefetch.io._cache import ObjectCache
from prefetch.testing import serve_folder, write_image_folder

pytestmark = pytest.mark.usefixtures("fsspec_io_thread")

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")

SIZE = (16, 16)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    root = write_image_folder(tmp_path / "train", class_names=("a", "b"), per_class=5)
    write_image_folder(tmp_path / "train", class_names=("b",), per_class=2, image_format="PNG")
    return root


@pytest.fixture
def memory_root(local_root: Path) -> Iterator[str]:
    url = f"memory://cache-{uuid.uuid4().hex[:8]}/train"
    fs = fsspec.filesystem("memory")
    for path in local_root.rglob("*.*"):
        fs.pipe_file(f"{url}/{path.relative_to(local_root).as_posix()}", path.read_bytes())
    yield url
    if fs.exists(url):
        fs.rm(url, recursive=True)


def epochs(
    loader: Loader, count: int, between: object = None
) -> tuple[list[np.ndarray], list[LoaderStats]]:
    """`count` epochs' images (each concatenated) and statistics; `between()` runs after the
    first epoch. Each epoch on its own (no `with loader:`): an open loader reads the next
    epoch's first batches ahead, during this one, which would blur what each epoch read from
    storage and from the copies."""
    images, stats = [], []
    for number in range(count):
        images.append(np.concatenate([batch.images.copy() for batch in loader]))
        stats.append(loader.stats())
        loader.reset_stats()
        if number == 0 and callable(between):
            between()
    return images, stats


def kept_copies(folder: str | os.PathLike[str]) -> list[Path]:
    """The copies in a cache folder (not its bookkeeping: `.ledger`, `.users`, `.lock-*`,
    `.partial-*`)."""
    return sorted(path for path in Path(folder).iterdir() if not path.name.startswith("."))


def hits_and_misses(stats: list[LoaderStats]) -> list[tuple[int, int]]:
    return [(epoch.cache_hits, epoch.cache_misses) for epoch in stats]


def reference(local_root: Path, count: int) -> list[np.ndarray]:
    return epochs(Loader(local_root, batch_size=4, image_size=SIZE, seed=3, workers=2), count)[0]


def test_a_thread_loader_reads_each_object_once_then_from_its_private_copy(
    local_root: Path, memory_root: str, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    loader = Loader(
        memory_root,
        batch_size=4,
        image_size=SIZE,
        seed=3,
        workers=2,
        remote=RemoteOptions(cache_dir=cache_dir),
    )
    fs = fsspec.filesystem("memory")
    (first, second), stats = epochs(loader, 2, lambda: fs.rm(memory_root, recursive=True))

    expected = reference(local_root, 2)
    np.testing.assert_array_equal(first, expected[0])
    np.testing.assert_array_equal(second, expected[1])  # the store was empty by then
    assert hits_and_misses(stats) == [(0, 12), (12, 0)]
    assert loader.options.cache_dir == cache_dir
    copies = kept_copies(cache_dir)
    assert len(copies) == len(loader.source) == 12
    assert {copy.suffix for copy in copies} == {".jpg", ".png"}
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    assert {stat.S_IMODE(item.stat().st_mode) for item in cache_dir.iterdir()} == {0o600}
    bookkeeping = {item.name for item in cache_dir.iterdir()} - {c.name for c in copies}
    assert bookkeeping == {".ledger", ".users"}


@pytest.mark.timeout(120)  # spawns worker processes, twice
def test_worker_processes_share_the_copies_and_a_later_loader_needs_no_server(
    local_root: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    with serve_folder(local_root.parent) as base:
        source = ImageFolder(base + "train/")
        options = dict(
            batch_size=4,
            image_size=SIZE,
            seed=3,
            workers=2,
            remote=RemoteOptions(cache_dir=cache_dir),
        )
        first, stats = epochs(Loader(source, backend="process", **options), 1)  # type: ignore[arg-type]
    assert len(kept_copies(cache_dir)) == len(source)
    assert hits_and_misses(stats) == [(0, len(source))]
    # The server is gone: a new loader over the same listing reads every object from its copy.
    again, stats = epochs(Loader(source, backend="process", **options), 2)  # type: ignore[arg-type]
    assert hits_and_misses(stats) == [(len(source), 0)] * 2
    assert f"cache: {len(source)} of {len(source)} read from local copies" in str(stats[1])

    expected = reference(local_root, 2)
    np.testing.assert_array_equal(first[0], expected[0])
    np.testing.assert_array_equal(again[1], expected[1])


def test_a_bad_cache_dir_is_refused_naming_the_folder_and_the_fix(
    local_root: Path, memory_root: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"reads no URLs .* leave cache_dir out"):
        Loader(local_root, image_size=SIZE, remote=RemoteOptions(cache_dir=tmp_path / "cache"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # like /tmp without the sticky bit: a neighbour could swap copies
    with pytest.raises(ValueError, match=f"'{shared}' is writable by others .*chmod 700"):
        Loader(memory_root, image_size=SIZE, remote=RemoteOptions(cache_dir=shared))
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="is not a folder"):
        Loader(memory_root, image_size=SIZE, remote=RemoteOptions(cache_dir=a_file))
    if os.geteuid() == 0:  # root can hand a folder to another user, as a neighbour's would be
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(ValueError, match="belongs to user 65534, not to you"):
            Loader(memory_root, image_size=SIZE, remote=RemoteOptions(cache_dir=theirs))


def test_a_process_that_locks_the_folder_itself_does_not_keep_a_cache_from_its_recount(
    tmp_path: Path,
) -> None:
    """Another user may open a cache_dir that others may read (0755, mkdir's default) and
    flock it: the lock its users hold is that of its `.users` file (0600), never the folder's,
    so such a lock neither delays a process nor keeps the lone one from recounting."""
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o755)
    cache = ObjectCache.open(folder)
    del cache
    gc.collect()  # its descriptors closed: no process uses the folder
    ledger = folder / ".ledger"  # a killed process's reservation: 1000 bytes no file holds
    ledger.write_bytes(struct.pack("<8sqqq", b"pfcache1", 1000, 0, 0))
    neighbour = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(neighbour, fcntl.LOCK_SH | fcntl.LOCK_NB)
        assert ObjectCache.open(folder).used_bytes() == 0  # alone: counted from the files
    finally:
        os.close(neighbour)


def test_copies_are_named_by_url_and_a_failed_read_leaves_nothing(
    memory_root: str, tmp_path: Path
) -> None:
    cache = ObjectCache.open(tmp_path / "cache")
    url = f"{memory_root}/a/a_0000.jpg"
    assert cache.path_for(url) == cache.path_for(url) != cache.path_for(url + "x")
    assert cache.path_for(url).endswith(".jpg")
    assert cache.local_copy(url) == (cache.path_for(url), False)  # read, then copied
    assert cache.local_copy(url) == (cache.path_for(url), True)
    with pytest.raises(FileNotFoundError, match=r"missing\.jpg"):
        cache.local_copy(f"{memory_root}/a/missing.jpg")
    assert [copy.name for copy in kept_copies(cache.folder)] == [
        os.path.basename(cache.path_for(url))
    ]
    copy = os.path.basename(cache.path_for(url))
    assert sorted(os.listdir(cache.folder)) == [".ledger", ".users", copy]
    # a worker killed mid-write leaves a partial copy: an old one is removed at the next open
    old, recent = Path(cache.folder, ".partial-old"), Path(cache.folder, ".partial-recent")
    old.write_bytes(b"half a jpeg")
    recent.write_bytes(b"being written now")
    os.utime(old, (0, 0))
    ObjectCache.open(cache.folder)
    assert not old.exists() and recent.exists()


def test_a_copy_that_cannot_be_written_is_decoded_from_the_bytes_fetched_not_fetched_again(
    local_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(handle: int, name: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", name)

    monkeypatch.setattr(prefetch.io._cache, "_write", full_disk)  # the fault: a full disk
    cache = ObjectCache.open(tmp_path / "cache")
    requests: list[str] = []
    with serve_folder(local_root, requests=requests) as base:
        data, kept = cache.decoded(base + "a/a_0000.jpg", read_location)  # a path or the URL
    assert data == (local_root / "a" / "a_0000.jpg").read_bytes() and not kept
    assert requests == ["/a/a_0000.jpg"]  # once: the bytes read were decoded
    assert sorted(os.listdir(cache.folder)) == [".ledger", ".users"] and cache.used_bytes() == 0


# Run in a child: RLIMIT_FSIZE (with SIGXFSZ ignored) makes every write past 100 bytes fail with
# EFBIG, as a full disk makes them fail with ENOSPC.
CANNOT_WRITE = """
import logging, resource, signal, sys
import fsspec, numpy as np
from prefetch import Loader, RemoteOptions
logging.basicConfig(level=logging.WARNING, format="%(message)s")
local, url, cache_dir = sys.argv[1:]
fs = fsspec.filesystem("memory")
import pathlib
for path in pathlib.Path(local).rglob("*.*"):
    fs.pipe_file(url + "/" + path.relative_to(local).as_posix(), path.read_bytes())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
def epoch(source, **options):
    # threads: a file size limit of 100 bytes leaves no room for shared-memory batch slots
    with Loader(source, batch_size=4, image_size=(16, 16), seed=3, workers=2, backend="thread",
                **options) as l:
        return np.concatenate([batch.images.copy() for batch in l])
remote = RemoteOptions(cache_dir=cache_dir)
np.testing.assert_array_equal(epoch(url, remote=remote), epoch(local))
print("same pixels")
"""


@pytest.mark.timeout(120)  # a child process that imports prefetch
def test_a_cache_that_cannot_be_written_reads_from_storage_and_says_so_once(
    local_root: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    url = f"memory://full-{uuid.uuid4().hex[:8]}/train"
    run = subprocess.run(
        [sys.executable, "-c", CANNOT_WRITE, str(local_root), url, str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    assert "same pixels" in run.stdout
    assert run.stderr.count("cannot write to cache_dir") == 1
    assert "reading from storage instead" in run.stderr
    assert sorted(os.listdir(cache_dir)) == [".ledger", ".users"]  # no partial copies left
