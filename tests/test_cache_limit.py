"""RemoteOptions(cache_dir=..., cache_limit=...): a cache folder of bounded size, shared by the
processes of a host, that evicts the least recently read copies and fetches each object once.

Real JPEG and PNG objects behind the loopback server (`prefetch.testing.serve_folder`, which
logs every GET: how often each object was fetched), real spawned processes sharing the folder
(in lockstep by a barrier: the same objects wanted at once), real SIGKILLs. The folder's size
is sampled every few milliseconds while they run, bookkeeping files included.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import multiprocessing
import multiprocessing.resource_tracker
import os
import pickle
import signal
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch.io._cache
import prefetch.io._cache_files
from prefetch import Loader, RemoteOptions, TarSource
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.io._cache import ObjectCache
from prefetch.io._cache_files import pin
from prefetch.io._local_files import read_local
from prefetch.testing import FolderSizeSampler, folder_bytes, serve_folder, write_image_folder
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.usefixtures("fsspec_io_thread", "resource_tracker_running")

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")

SIZE = (8, 8)
EPOCHS = 3
WAIT_S = 60.0  # the longest a child waits for the other at a barrier (a busy machine)


@pytest.fixture(scope="module")
def resource_tracker_running() -> Iterator[None]:
    """The spawn context's helper process, started before the leak checks look (it lives as
    long as the interpreter: not a leak)."""
    multiprocessing.resource_tracker.ensure_running()
    yield


def write_set(root: Path) -> Path:
    """`root/train`: 30 small images, JPEG and PNG, in 3 classes."""
    train = root / "train"
    write_image_folder(train, class_names=("a", "b", "c"), per_class=9, size=(20, 16))
    write_image_folder(train, class_names=("c",), per_class=3, image_format="PNG", seed=1)
    return train


def objects(train: Path) -> dict[str, int]:
    """Each image's request path on the server and its size in bytes."""
    return {
        f"/train/{path.relative_to(train).as_posix()}": path.stat().st_size
        for path in sorted(train.rglob("*.*"))
    }


def ledger_count(folder: Path) -> int:
    """The bytes the folder's ledger counts (its header: magic, bytes, queue head, length,
    the oldest mtime not queued)."""
    magic, used, _, _, _ = struct.unpack("<8sqqqq", (folder / ".ledger").read_bytes()[:40])
    assert magic == b"pfcache2"
    return int(used)


def loader_for(
    source: object,
    cache_dir: Path | None = None,
    limit: int | None = None,
    policy: str = "keep",
    shard: int | None = None,
) -> Loader:
    """A thread loader of `source` (shuffled), through a cache when `cache_dir` is given;
    `shard`: this loader reads that one of 2 shards."""
    remote = (
        RemoteOptions(cache_dir=cache_dir, cache_limit=limit, cache_policy=policy)
        if cache_dir
        else None
    )
    loader = Loader(
        source,  # type: ignore[arg-type]
        batch_size=4,
        image_size=SIZE,
        seed=5,
        workers=2,
        backend="thread",
        depth=1,
        remote=remote,
    )
    if shard is not None:
        loader.shard(2, shard)
    return loader


def read_in_lockstep(
    url: str,
    cache_dir: Path,
    limit: int,
    barrier: Any,
    out: Path,
    policy: str = "lru",
    shard: int | None = None,
) -> None:
    """A spawned rank: EPOCHS epochs of `url` (the whole set, the same order as the other
    rank; or its `shard` of 2), waiting for the other rank after each batch; their images and
    statistics are pickled to `out`."""
    try:
        loader = loader_for(url, cache_dir, limit, policy, shard)
        results = []
        for _ in range(EPOCHS):
            images = []
            for batch in loader:
                images.append(batch.images.copy())
                barrier.wait(WAIT_S)
            barrier.wait(WAIT_S)
            results.append((np.concatenate(images), loader.stats().as_dict()))
            loader.reset_stats()
        out.write_bytes(pickle.dumps(results))
    except BaseException:
        barrier.abort()
        raise


def spawned(target: Callable[..., None], *runs: tuple[Any, ...]) -> list[int]:
    """Run `target(*args)` in a spawned process for each `args` at once; their exit codes."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=args, daemon=True) for args in runs]
    for process in processes:
        process.start()
    for process in processes:
        process.join(150)
        if process.is_alive():
            process.kill()
            process.join()
    return [process.exitcode or 0 for process in processes]


@pytest.mark.timeout(240)  # two spawned processes that import prefetch, three epochs each
@pytest.mark.parametrize("policy", ["lru", "keep"])
def test_two_processes_read_a_set_twice_the_limit_for_three_epochs_within_it(
    tmp_path: Path, policy: str
) -> None:
    # "lru": both read every object, in the same order: the copy one fetched is there for the
    # other. "keep" (the default): each reads its own shard, as ranks of one training job do;
    # the copies of the first epoch stay, and every later epoch reads all of them.
    train = write_set(tmp_path)
    sizes = objects(train)
    limit = sum(sizes.values()) // 2
    cache_dir = tmp_path / "cache"
    requests: list[str] = []
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    outs = [tmp_path / "rank0.pickle", tmp_path / "rank1.pickle"]
    shards: list[int | None] = [None, None] if policy == "lru" else [0, 1]
    with serve_folder(tmp_path, requests=requests) as base, FolderSizeSampler(cache_dir) as sampler:
        runs = [
            (base + "train/", cache_dir, limit, barrier, out, policy, shard)
            for out, shard in zip(outs, shards, strict=True)
        ]
        assert spawned(read_in_lockstep, *runs) == [0, 0]

    # the folder never held more than the limit and one object (the ledger counts it all)
    assert sampler.samples > 10
    assert sampler.largest <= limit + max(sizes.values())
    assert folder_bytes(cache_dir) <= limit
    # the ledger counted exactly the copies left (never fewer: it is what holds the limit)
    copies = [item for item in cache_dir.iterdir() if not item.name.startswith(".")]
    assert ledger_count(cache_dir) == sum(copy.stat().st_size for copy in copies)
    # every object was fetched at most once an epoch, for both ranks together
    fetched = collections.Counter(path for path in requests if path in sizes)
    assert set(fetched) == set(sizes)
    assert max(fetched.values()) <= EPOCHS
    # every sample exact, every epoch, on both ranks
    references = [loader_for(train, shard=shard) for shard in shards]
    ranks = [pickle.loads(out.read_bytes()) for out in outs]
    for rank, reference in zip(ranks, references, strict=True):
        for images, _ in rank:
            np.testing.assert_array_equal(
                images, np.concatenate([b.images.copy() for b in reference])
            )
    # the statistics agree with the server: a miss is a fetch; the rest were hits
    stats = [[epoch_stats for _, epoch_stats in rank] for rank in ranks]
    misses = [sum(rank[epoch]["cache_misses"] for rank in stats) for epoch in range(EPOCHS)]
    hits = [sum(rank[epoch]["cache_hits"] for rank in stats) for epoch in range(EPOCHS)]
    evictions = sum(rank[epoch]["cache_evictions"] for rank in stats for epoch in range(EPOCHS))
    assert sum(misses) == sum(fetched.values())
    readers = 2 if policy == "lru" else 1
    assert [h + m for h, m in zip(hits, misses, strict=True)] == [readers * len(sizes)] * EPOCHS
    assert misses[0] == len(sizes) and all(count <= len(sizes) for count in misses)
    if policy == "lru":
        assert sum(hits) > 0  # the other rank's copies, and the kept half of the last epoch
        assert evictions > 0
    else:  # nothing evicted: the first epoch's copies are read in every later one
        assert evictions == 0 and hits[0] == 0
        assert hits[1:] == [len(copies)] * (EPOCHS - 1) and len(copies) >= len(sizes) // 3
    fetched_bytes = sum(rank[epoch]["cache_fetched_bytes"] for rank in stats for epoch in range(3))
    assert fetched_bytes == sum(sizes[path] * count for path, count in fetched.items())
    assert all(0 < rank[-1]["cache_bytes"] <= limit for rank in stats)


def fetch_once(url: str, cache_dir: Path, barrier: Any, out: Path) -> None:
    """A spawned process: wait for the other, then decode `url` through the shared cache."""
    cache = ObjectCache.open(cache_dir, 10**6)
    barrier.wait(WAIT_S)
    image, kept = cache.decoded(url, decode)
    out.write_bytes(pickle.dumps((image, kept)))


def decode(path: str) -> np.ndarray:
    return decode_image(path, DecodeOptions(image_size=SIZE))


@pytest.mark.timeout(120)
def test_two_processes_asking_for_the_same_missing_object_fetch_it_once(tmp_path: Path) -> None:
    train = write_set(tmp_path)
    cache_dir = tmp_path / "cache"
    requests: list[str] = []
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    outs = [tmp_path / "first.pickle", tmp_path / "second.pickle"]
    slow = {"train/a/a_0000.jpg": 1.0}  # both ask before the first answer comes
    with serve_folder(tmp_path, requests=requests, slow_paths=slow) as base:
        url = base + "train/a/a_0000.jpg"
        assert spawned(fetch_once, *[(url, cache_dir, barrier, out) for out in outs]) == [0, 0]
    assert requests == ["/train/a/a_0000.jpg"]
    results = [pickle.loads(out.read_bytes()) for out in outs]
    assert sorted(kept for _, kept in results) == [False, True]  # one fetched, one waited
    for image, _ in results:
        np.testing.assert_array_equal(image, decode(str(train / "a" / "a_0000.jpg")))


def fetch_and_hang(url: str, cache_dir: Path, marker: Path) -> None:
    """A spawned process killed while it fetches `url` (a slow server) or, once fetched,
    while it decodes the partial copy (its decoder hangs): it never returns."""

    def hang(path: str) -> None:
        marker.write_text(path)
        time.sleep(600)

    ObjectCache.open(cache_dir).decoded(url, hang)


def start_and_kill(url: str, cache_dir: Path, marker: Path, ready: Callable[[], bool]) -> None:
    kill_when_ready(fetch_and_hang, (url, cache_dir, marker), ready)


def kill_when_ready(
    target: Callable[..., None], args: tuple[Any, ...], ready: Callable[[], bool]
) -> None:
    """Run `target(*args)` in a spawned process and SIGKILL it once `ready()` (within 60 s,
    a bound, not a measurement), as the out-of-memory killer or `kill -9` would."""
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert process.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join()
    assert process.exitcode == -signal.SIGKILL


def assert_lock_free(cache_dir: Path, name: str) -> None:
    """The lock of the object copied as `name` can be taken at once: a killed holder's flock
    was released by the kernel. (Its file is left as it is: it holds the record of what its
    holder had reserved, which the next holder returns.)"""
    lock = os.open(cache_dir / f".lock-{name.split('.')[0]}", os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if held
    finally:
        os.close(lock)


@pytest.mark.timeout(120)
def test_a_process_killed_mid_fetch_leaves_no_copy_and_no_held_lock(tmp_path: Path) -> None:
    train = write_set(tmp_path)
    cache_dir = tmp_path / "cache"
    path, requests = "/train/b/b_0001.jpg", []
    marker = tmp_path / "decoding"
    with serve_folder(tmp_path, requests=requests, slow_paths={path: 30.0}) as base:
        url = base + path[1:]
        start_and_kill(url, cache_dir, marker, lambda: path in requests)  # while fetching
    name = ObjectCache(str(cache_dir), 0, 0).name_for(url)
    assert sorted(os.listdir(cache_dir)) == [".ledger", f".lock-{name.split('.')[0]}", ".users"]
    assert_lock_free(cache_dir, name)  # the lock file it held is left, but not held
    cache = ObjectCache.open(cache_dir)
    with serve_folder(tmp_path, requests=requests) as base:
        url = base + path[1:]
        name = cache.name_for(url)
        start_and_kill(url, cache_dir, marker, marker.exists)  # while decoding its partial copy
        left = sorted(os.listdir(cache_dir))
        assert name not in left  # no copy under its name: never half of one
        assert f".partial-{name}" in left
        assert_lock_free(cache_dir, name)
        ObjectCache.open(cache_dir)  # removes what a killed process left
        assert sorted(os.listdir(cache_dir)) == [".ledger", ".users"]
        image, kept = cache.decoded(url, decode)
    assert not kept and requests.count(path) == 3
    np.testing.assert_array_equal(image, decode(str(train / "b" / "b_0001.jpg")))
    assert cache.used_bytes() == os.path.getsize(cache_dir / name)  # nothing counted twice


@pytest.fixture
def memory_objects() -> Iterator[Callable[[str, int], str]]:
    """Put objects of given sizes in fsspec's memory filesystem: `put(name, size) -> url`."""
    fs = fsspec.filesystem("memory")
    root = f"memory://limit-{uuid.uuid4().hex[:8]}"

    def put(name: str, size: int) -> str:
        fs.pipe_file(f"{root}/{name}", bytes([len(name)]) * size)
        return f"{root}/{name}"

    yield put
    if fs.exists(root):
        fs.rm(root, recursive=True)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


@pytest.fixture
def touch_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read marks its copy used (not once a second): reads a few ms apart are ordered."""
    monkeypatch.setattr(prefetch.io._cache_files, "TOUCH_AFTER_S", 0.0)


@pytest.mark.usefixtures("touch_every_read")
def test_the_least_recently_read_copy_goes_first_and_a_pinned_one_stays(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    # room for three 1000-byte copies and the ledger (a header and one queued copy)
    cache = ObjectCache.open(tmp_path / "cache", limit=3 * 1000 + 200)
    urls = {name: memory_objects(f"{name}.bin", 1000) for name in "abcde"}
    (tmp_path / "cache" / "notes.txt").write_text("mine")  # not a copy: never evicted

    def read(name: str) -> bool:
        time.sleep(0.02)  # mtimes a clock tick apart: the order of the reads
        data, kept = cache.decoded(urls[name], read_bytes)
        assert data == bytes([5]) * 1000
        return kept

    def held() -> str:
        copies = {cache.name_for(url): name for name, url in urls.items()}
        return "".join(sorted(copies[item] for item in os.listdir(cache.folder) if item in copies))

    assert [read(name) for name in "abca"] == [False, False, False, True]
    assert read("d") is False and held() == "acd"  # b was read least recently
    pinned = pin(cache._dir(), cache.name_for(urls["c"]))  # c is being read: it stays
    assert pinned is not None
    try:
        assert read("e") is False and held() == "cde"  # a went instead
    finally:
        os.close(pinned)
    counts = cache.take_counts()
    assert (counts.evictions, counts.evicted_bytes, counts.fetched_bytes) == (2, 2000, 5000)
    assert folder_bytes(cache.folder) <= cache.limit  # type: ignore[operator]
    assert (tmp_path / "cache" / "notes.txt").read_text() == "mine"


def test_a_copy_of_a_url_with_an_unusual_extension_is_counted_and_evicted_as_any(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    cache = ObjectCache.open(tmp_path / "cache", limit=1000 + 200)
    odd, plain = memory_objects("photo.jpé", 1000), memory_objects("plain.bin", 1000)
    assert cache.decoded(odd, read_bytes) == (bytes([9]) * 1000, False)  # 9: the names' length
    assert cache.decoded(plain, read_bytes) == (bytes([9]) * 1000, False)
    assert cache.decoded(plain, read_bytes)[1] is True  # kept: the other one was evicted
    assert not os.path.exists(cache.path_for(odd))
    assert cache.take_counts().evictions == 1


def test_an_object_larger_than_the_limit_is_read_but_not_kept(
    tmp_path: Path,
    memory_objects: Callable[[str, int], str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetch.io._cache, "_warned", set())  # each warning is once per process
    cache = ObjectCache.open(tmp_path / "cache", limit=500)
    url = memory_objects("big.bin", 1000)
    with caplog.at_level(logging.WARNING, "prefetch.cache"):
        for _ in range(2):
            data, kept = cache.decoded(url, read_bytes)
            assert data == bytes([7]) * 1000 and not kept
    assert "does not fit cache_limit=500" in caplog.text
    assert caplog.text.count("does not fit") == 1
    assert sorted(os.listdir(cache.folder)) == [".ledger", ".users"] and cache.used_bytes() == 0


def test_an_object_larger_than_the_limit_evicts_no_copy(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    cache = ObjectCache.open(tmp_path / "cache", limit=3 * 1000 + 200)
    kept = [memory_objects(f"{name}.bin", 1000) for name in "abc"]
    for url in kept:
        cache.decoded(url, read_bytes)
    huge = memory_objects("huge.bin", 5000)
    assert cache.decoded(huge, read_bytes)[1] is False
    assert [cache.decoded(url, read_bytes)[1] for url in kept] == [True, True, True]
    assert cache.take_counts().evictions == 0 and cache.used_bytes() == 3000


def test_cache_limit_is_a_number_of_bytes_for_a_cache_dir(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, "10GB", True):
        with pytest.raises(ValueError, match=r"cache_limit must be a number of bytes >= 1"):
            RemoteOptions(cache_dir=tmp_path, cache_limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cache_dir, which is not given"):
        RemoteOptions(cache_limit=10**9)
    assert RemoteOptions(cache_dir=tmp_path, cache_limit=10**9).cache_limit == 10**9


@pytest.mark.timeout(120)
def test_streamed_shards_stay_within_the_limit_and_read_exactly(
    tmp_path: Path, private_cache: Path
) -> None:
    train = write_set(tmp_path)
    out = tmp_path / "shards"
    write_shards(train, out, format="tar", shard_size=1, shuffle=False)  # 30 shards
    shard_sizes = [path.stat().st_size for path in sorted(out.glob("*.tar"))]
    # room for the shards in use and being fetched (about ten of them), not for all
    limit = sum(shard_sizes) * 6 // 10
    cache_dir = tmp_path / "cache"
    with serve_folder(tmp_path) as base:
        source = TarSource(base + "shards/shard-*.tar", shuffle_buffer=6)
        with FolderSizeSampler(cache_dir) as sampler:
            cached = loader_for(source, cache_dir, limit)
            with cached:
                got = [[b.images.copy() for b in cached] for _ in range(EPOCHS)]
                stats = cached.stats()
        with loader_for(source) as plain:
            want = [[b.images.copy() for b in plain] for _ in range(EPOCHS)]
    for epoch, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.concatenate(epoch), np.concatenate(expected))
    assert sampler.largest <= limit + max(shard_sizes)
    assert stats.cache_evictions > 0 and 0 < stats.cache_bytes <= limit
    assert stats.cache_fetched_bytes >= sum(shard_sizes)


def forty_objects(
    put: Callable[[str, int], str], rng: np.random.Generator
) -> tuple[list[int], list[str], int]:
    """40 objects of 200 to 1,200 bytes: their sizes, URLs, and a limit of half their bytes."""
    sizes = [int(size) for size in rng.integers(200, 1200, 40)]
    urls = [put(f"{number}.bin", size) for number, size in enumerate(sizes)]
    return sizes, urls, sum(sizes) // 2


@pytest.mark.usefixtures("touch_every_read")
def test_shuffled_epochs_read_one_at_a_time_hit_as_least_recently_used_does(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    rng = np.random.default_rng(4)
    sizes, urls, limit = forty_objects(memory_objects, rng)
    cache = ObjectCache.open(tmp_path / "cache", limit)
    held: collections.OrderedDict[int, int] = collections.OrderedDict()  # the simulation
    got, want = [], []
    for _ in range(4):
        hits = expected = 0
        for number in map(int, rng.permutation(len(urls))):
            time.sleep(0.002)  # each read at a time of its own (a copy's mtime)
            hits += cache.decoded(urls[number], read_bytes)[1]
            if number in held:
                expected += 1
                held.move_to_end(number)
                continue
            held[number] = sizes[number]
            ledger = 32 + 64 * 4  # its header and queue, about
            while sum(held.values()) + ledger > limit:
                held.popitem(last=False)
        got.append(hits)
        want.append(expected)
    assert got == want and sum(got) > 0


def test_a_copy_marked_used_by_another_reader_mid_decode_is_decoded_again_not_refetched(
    tmp_path: Path, memory_objects: Callable[[str, int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Marking a copy used sets its times; a reader of it at that moment sees a file "changed
    # while it was read" (its check for a rewrite in place). It decodes the copy again.
    cache = ObjectCache.open(tmp_path / "cache", limit=10_000)
    url = memory_objects("a.jpg", 1000)
    assert cache.decoded(url, read_bytes) == (bytes([5]) * 1000, False)
    copy = cache.path_for(url)
    os.utime(copy, (time.time() - 60, time.time() - 60))  # read a minute ago
    fsspec.filesystem("memory").rm(url)  # the store is gone: only the copy can answer
    real_pread, other_reads = os.pread, []

    def pread(fd: int, length: int, offset: int) -> bytes:
        if not other_reads:  # another reader pins the copy while this one reads it
            other_reads.append(cache.decoded(url, lambda path: None))
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    data, kept = cache.decoded(url, read_local)
    assert (data, kept) == (bytes([5]) * 1000, True) and other_reads == [(None, True)]
    assert time.time() - os.path.getmtime(copy) < 30  # marked used


def test_a_copy_is_marked_used_at_most_once_a_second(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    cache = ObjectCache.open(tmp_path / "cache")
    url = memory_objects("a.bin", 100)
    cache.decoded(url, read_bytes)
    copy = cache.path_for(url)
    os.utime(copy, (1, 1))
    cache.decoded(url, read_bytes)
    marked = os.stat(copy)
    assert marked.st_mtime > 1  # an old copy read is marked used
    cache.decoded(url, read_bytes)
    assert os.stat(copy).st_ctime_ns == marked.st_ctime_ns  # not again within the second


def test_shuffled_epochs_keep_the_first_epochs_copies_and_read_them_every_epoch(
    tmp_path: Path, memory_objects: Callable[[str, int], str]
) -> None:
    rng = np.random.default_rng(4)
    sizes, urls, limit = forty_objects(memory_objects, rng)
    orders = [rng.permutation(len(urls)) for _ in range(5)]
    hits: dict[str, list[int]] = {}
    for policy in ("keep", "lru"):
        cache = ObjectCache.open(tmp_path / policy, limit, policy)
        hits[policy] = []
        for epoch, order in enumerate(orders):
            hits[policy].append(sum(cache.decoded(urls[n], read_bytes, epoch)[1] for n in order))
            if epoch == 0:
                kept = cache.used_bytes()
        if policy == "keep":
            assert cache.take_counts().evictions == 0
            copies = [name for name in os.listdir(cache.folder) if not name.startswith(".")]
            assert hits["keep"] == [0] + [len(copies)] * 4  # every copy, every epoch
            assert cache.used_bytes() == kept > limit - max(sizes) - 1000
    # least recently read drops each copy shortly before its next read
    assert sum(hits["keep"]) > 2 * sum(hits["lru"])


def test_copies_nobody_read_in_the_last_epoch_make_room_from_the_second_epoch_on(
    tmp_path: Path,
    memory_objects: Callable[[str, int], str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetch.io._cache, "_warned", set())  # each note is once per process
    caplog.set_level(logging.INFO, "prefetch.cache")
    cache = ObjectCache.open(tmp_path / "cache", limit=3 * 1000 + 200)
    earlier = [memory_objects(f"old{n}.bin", 1000) for n in range(3)]
    for url in earlier:  # an earlier run's copies, read an hour ago
        cache.decoded(url, read_bytes)
        os.utime(cache.path_for(url), (time.time() - 3600, time.time() - 3600))
    urls = [memory_objects(f"new{n}.bin", 1000) for n in range(3)]
    # the first epoch this process reads keeps every copy there: the earlier run's may be
    # this run's set (read again, each is marked used before it could go)
    assert [cache.decoded(url, read_bytes, 0)[1] for url in urls] == [False] * 3
    assert all(os.path.exists(cache.path_for(url)) for url in earlier)
    # the policy at work, not a fault: said once, below the warnings a user sees by default
    notes = [record for record in caplog.records if "is full" in record.getMessage()]
    assert [record.levelno for record in notes] == [logging.INFO]
    # from the second on, copies nobody read since the first read of the epoch before go
    assert [cache.decoded(url, read_bytes, 1)[1] for url in urls] == [False] * 3
    assert not any(os.path.exists(cache.path_for(url)) for url in earlier)
    assert [cache.decoded(url, read_bytes, 2)[1] for url in urls] == [True] * 3
    assert cache.take_counts().evictions == 3


def test_cache_policy_is_keep_or_lru(tmp_path: Path) -> None:
    assert RemoteOptions(cache_dir=tmp_path, cache_limit=10**9).cache_policy == "keep"
    with pytest.raises(ValueError, match=r"cache_policy must be one of \('keep', 'lru'\)"):
        RemoteOptions(cache_dir=tmp_path, cache_limit=10**9, cache_policy="LRU")
    cache = ObjectCache.open(tmp_path / "cache", 10**6, "lru")
    assert pickle.loads(pickle.dumps(cache)).policy == "lru"  # as worker processes get it
