"""The object cache under its defaults, at its seams (issue 45): an open loader of many worker
processes, a process killed mid-download, odd entries in the folder, a damaged ledger, and a
cache_limit too small for what a streamed epoch holds at once.

Real images behind the loopback server (`prefetch.testing.serve_folder`, which logs every GET),
real worker processes, a real SIGKILL. A test that needs the folder shared holds it open in
this process, as another rank of the host would: the next loader is then not alone with it,
and cannot recount it from its files.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from test_cache_limit import kill_when_ready, ledger_count, loader_for, write_set

import prefetch.io._cache
from prefetch import Loader, RemoteOptions, TarSource
from prefetch.io import spooled_name
from prefetch.io._cache import ObjectCache
from prefetch.testing import serve_folder, write_image_folder
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.usefixtures("fsspec_io_thread")

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")

SIZE = (8, 8)
_HEADER = struct.Struct("<8sqqqq")  # the ledger's header: magic, bytes, queue head, length, oldest


def copies(folder: Path) -> list[Path]:
    """The copies in a cache folder (not its bookkeeping files, all named with a dot)."""
    return sorted(path for path in folder.iterdir() if not path.name.startswith("."))


def copies_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in copies(folder) if path.is_file())


def epochs_of(loader: Loader, count: int) -> tuple[list[np.ndarray], list[dict[str, int]]]:
    """`count` epochs of `loader`: each one's images and statistics."""
    images, stats = [], []
    for _ in range(count):
        images.append(np.concatenate([batch.images.copy() for batch in loader]))
        stats.append(loader.stats().as_dict())
        loader.reset_stats()
    return images, stats


@pytest.mark.timeout(240)  # worker processes spawned, grown by the tuner, three epochs
def test_an_open_loader_of_many_worker_processes_keeps_every_copy_under_keep(
    tmp_path: Path,
) -> None:
    # The defaults: process workers for URLs, tuned (they grow while the first epoch is read),
    # `with loader:` (the next epoch's first batches read while this one ends), "keep".
    train = write_image_folder(
        tmp_path / "train", class_names=("a", "b", "c"), per_class=100, size=(20, 16)
    )
    limit = sum(path.stat().st_size for path in train.rglob("*.*")) // 2
    cache_dir = tmp_path / "cache"
    options = {"batch_size": 16, "image_size": SIZE, "seed": 5}
    with serve_folder(tmp_path, latency_s=0.02) as base:
        loader = Loader(
            base + "train/",
            remote=RemoteOptions(cache_dir=cache_dir, cache_limit=limit),
            **options,  # type: ignore[arg-type]
        )
        with loader:
            got, stats = epochs_of(loader, 3)
        assert loader.backend_reason.startswith("auto: process")
    want, _ = epochs_of(Loader(train, **options), 3)  # type: ignore[arg-type]
    for images, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(images, expected)

    kept = len(copies(cache_dir))
    assert 0 < kept < 300 and copies_bytes(cache_dir) <= limit
    assert [epoch["cache_evictions"] for epoch in stats] == [0, 0, 0]
    # every copy the first epoch kept is read in each later one, the rest from the store
    assert [(epoch["cache_hits"], epoch["cache_misses"]) for epoch in stats[1:]] == [
        (kept, 300 - kept)
    ] * 2
    assert ledger_count(cache_dir) == copies_bytes(cache_dir)


def held(mark: Path) -> bool:
    """Whether a process holds the epoch mark `mark` (a shared flock: it reads that epoch)."""
    fd = os.open(mark, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_loader_marks_the_epochs_it_reads_and_lets_go_of_them_when_gone(tmp_path: Path) -> None:
    write_set(tmp_path)
    cache_dir = tmp_path / "cache"
    with serve_folder(tmp_path) as base:
        loader = loader_for(base + "train/", cache_dir, 10**6)
        epochs_of(loader, 2)
        marks = sorted(cache_dir.glob(".epoch-*"))
        assert [mark.name for mark in marks] == [".epoch-0", ".epoch-1"]
        assert [held(mark) for mark in marks] == [False, True]  # it may read on in epoch 1
        del loader
        gc.collect()
    assert not any(held(mark) for mark in marks)  # its descriptors went with its cache


def read_shards(url: str, cache_dir: Path, limit: int) -> None:
    """A spawned loader of the shards at `url` through the cache, killed while it fetches."""
    source = TarSource(url, shuffle_buffer=4)
    for _ in loader_for(source, cache_dir, limit):
        pass


def kill_mid_download(url: str, cache_dir: Path, limit: int) -> int:
    """Start `read_shards` and SIGKILL it once a shard is partly written; the partial copies'
    bytes it had then."""

    def partly_written() -> bool:
        return any(p.stat().st_size > 0 for p in cache_dir.glob(".partial-*"))

    kill_when_ready(read_shards, (url, cache_dir, limit), partly_written)
    return sum(path.stat().st_size for path in cache_dir.glob(".partial-*"))


@pytest.mark.timeout(240)  # three spawned processes, killed, and a loader after them
def test_a_loader_killed_mid_download_leaves_nothing_counted_for_the_next(
    tmp_path: Path, private_cache: Path
) -> None:
    train = tmp_path / "train"
    write_image_folder(train, class_names=("a", "b"), per_class=12, size=(96, 96), seed=3)
    write_shards(train, tmp_path / "shards", format="tar", shard_size=4, shuffle=False)
    shard_sizes = [path.stat().st_size for path in sorted((tmp_path / "shards").glob("*.tar"))]
    # room for every shard, and little more: a few leaked reservations would not fit beside
    limit = sum(shard_sizes) + 4096
    cache_dir = tmp_path / "cache"
    neighbour = ObjectCache.open(cache_dir, limit)  # another rank: no loader is alone
    with serve_folder(tmp_path, bandwidth_bytes_per_s=20_000) as base:
        url = base + "shards/shard-*.tar"
        TarSource(url, shuffle_buffer=4)  # indexed once, here, before the kills
        partly = [kill_mid_download(url, cache_dir, limit) for _ in range(3)]
    assert all(0 < size < sum(shard_sizes) for size in partly)

    with serve_folder(tmp_path) as base:
        source = TarSource(base + "shards/shard-*.tar", shuffle_buffer=4)
        with loader_for(source, cache_dir, limit) as cached:
            got, stats = epochs_of(cached, 2)
        with loader_for(source) as plain:
            want, _ = epochs_of(plain, 2)
    for images, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(images, expected)
    assert stats[1]["cache_fetched_bytes"] == 0  # every shard kept in the first epoch
    # the reservations of the killed loaders were returned: the ledger counts the copies, but
    # for a known window: a kill between `Ledger.settle`'s two steps (the record truncated in
    # the object's lock file, then its bytes counted out of the ledger) leaves one record's
    # bytes counted (seen once in three suite runs beside busy loops; CHANGELOG, issue 45).
    assert not list(cache_dir.glob(".partial-*")) and not list(cache_dir.glob(".lock-*"))
    assert copies_bytes(cache_dir) == sum(shard_sizes)
    record = prefetch.io._cache_ledger._RESERVATION.size
    leftover = ledger_count(cache_dir) - sum(shard_sizes)
    assert leftover in [kills * record for kills in range(len(partly) + 1)], leftover
    assert neighbour.used_bytes() == ledger_count(cache_dir)


def test_odd_entries_at_copies_names_are_read_around_never_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch.io._cache, "_warned", set())  # each warning is once per process
    train = write_set(tmp_path)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_bytes(b"the user's own file")
    with serve_folder(tmp_path) as base:
        loader = loader_for(base + "train/", cache_dir, 10**6)
        urls = list(loader.source.paths)
        names = [ObjectCache(str(cache_dir), 0, 0).name_for(url) for url in urls[:3]]
        (cache_dir / names[0]).mkdir()  # a folder
        (cache_dir / names[1]).symlink_to(tmp_path / "elsewhere")  # a symbolic link
        odd = 2
        if os.geteuid() == 0:  # only root can put another user's file there
            (cache_dir / names[2]).write_bytes(b"not yours")
            os.chown(cache_dir / names[2], 65534, 65534)
            odd = 3
        with caplog.at_level(logging.WARNING, "prefetch.cache"):
            got, stats = epochs_of(loader, 2)
    want, _ = epochs_of(loader_for(train), 2)
    for images, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(images, expected)
    # read from the store each epoch, counted as misses; every other object kept
    assert [(epoch["cache_hits"], epoch["cache_misses"]) for epoch in stats] == [
        (0, 30),
        (30 - odd, odd),
    ]
    assert (cache_dir / names[0]).is_dir() and not any((cache_dir / names[0]).iterdir())
    assert os.readlink(cache_dir / names[1]) == str(tmp_path / "elsewhere")
    assert (tmp_path / "elsewhere").read_bytes() == b"the user's own file"
    if odd == 3:
        assert (cache_dir / names[2]).read_bytes() == b"not yours"
        assert (cache_dir / names[2]).stat().st_uid == 65534
    warnings = [r.getMessage() for r in caplog.records if "not a copy" in r.getMessage()]
    assert len(warnings) == 1 and str(cache_dir) in warnings[0]  # said once, naming it
    kept = [path for path in copies(cache_dir) if path.name not in names]
    assert len(kept) == 30 - odd
    assert ledger_count(cache_dir) == sum(path.stat().st_size for path in kept)


@pytest.mark.parametrize(
    "field, value",
    [
        ((2, 3), (2**60, 2**60 + 1)),  # a queue head far past the file
        ((1,), (2**62 + 5,)),  # more bytes than any folder holds
        ((3,), (2**63 - 1,)),  # an oldest time past any
    ],
    ids=["queue-head", "bytes", "oldest"],
)
def test_a_damaged_ledger_is_counted_from_the_files(
    tmp_path: Path, field: tuple[int, ...], value: tuple[int, ...]
) -> None:
    train = write_set(tmp_path)
    sizes = sorted(path.stat().st_size for path in train.rglob("*.*"))
    cache_dir = tmp_path / "cache"
    with serve_folder(tmp_path) as base:
        loader = loader_for(base + "train/", cache_dir, sum(sizes) + 4096)
        first, _ = epochs_of(loader, 1)
        assert len(copies(cache_dir)) == 30
        for copy in copies(cache_dir)[:3]:  # three copies gone: read again, and kept again
            copy.unlink()
        header = list(_HEADER.unpack((cache_dir / ".ledger").read_bytes()[: _HEADER.size]))
        for index, number in zip(field, value, strict=True):
            header[index] = number
        with open(cache_dir / ".ledger", "r+b") as ledger:
            ledger.write(_HEADER.pack(*header))
        later, stats = epochs_of(loader, 2)
    want, _ = epochs_of(loader_for(train), 3)
    for images, expected in zip(first + later, want, strict=True):
        np.testing.assert_array_equal(images, expected)
    assert [(epoch["cache_hits"], epoch["cache_misses"]) for epoch in stats] == [(27, 3), (30, 0)]
    assert sum(epoch["cache_evictions"] for epoch in stats) == 0
    assert ledger_count(cache_dir) == copies_bytes(cache_dir) == sum(sizes)


@pytest.mark.timeout(120)
def test_a_limit_too_small_for_a_shuffle_buffer_over_every_shard_says_what_it_needs(
    tmp_path: Path, private_cache: Path
) -> None:
    train = write_set(tmp_path)
    write_shards(train, tmp_path / "shards", format="tar", shard_size=3, shuffle=False)
    shard_sizes = [path.stat().st_size for path in sorted((tmp_path / "shards").glob("*.tar"))]
    assert len(shard_sizes) == 10
    with serve_folder(tmp_path) as base:
        # a buffer of every sample: each batch draws from every shard, all held at once
        source = TarSource(base + "shards/shard-*.tar", shuffle_buffer=1000)
        loader = loader_for(source, tmp_path / "cache", sum(shard_sizes) // 2)
        with pytest.raises(OSError, match="cache_limit") as raised:
            list(loader)
    message = str(raised.value)
    assert f"up to 10 shards at once, {sum(shard_sizes)} bytes" in message
    assert "shuffle_buffer of 1000 samples" in message and "about ten" not in message


def test_a_folder_at_a_streamed_shards_name_is_an_error_naming_it_and_the_fix(
    tmp_path: Path, private_cache: Path
) -> None:
    # a shard is read where the spool keeps it: without its copy there is nothing to read
    train = write_set(tmp_path)
    write_shards(train, tmp_path / "shards", format="tar", shard_size=10, shuffle=False)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    with serve_folder(tmp_path) as base:
        source = TarSource(base + "shards/shard-*.tar", shuffle_buffer=4)
        (cache_dir / spooled_name(source.shards[1])).mkdir()
        with pytest.raises(OSError) as raised:
            list(loader_for(source, cache_dir, 10**6))
    message = str(raised.value)
    assert str(cache_dir / spooled_name(source.shards[1])) in message
    assert "is a folder, not a copy" in message and "remove it" in message
