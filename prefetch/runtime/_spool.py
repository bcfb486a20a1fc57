"""The spool of a streamed shard source: whole shards fetched ahead of the batches that read them.

`ShardSpool` fetches the shards an epoch needs (in the order of its `StreamingPlan`,
`prefetch.plan`), whole and a few ahead, into a local folder (`RemoteOptions.cache_dir`, where
they stay, at most `cache_limit` bytes of them, pinned while batches still need them so that
no eviction removes them; else a private temporary folder, where each is removed once its last
batch has been delivered), so the workers read samples locally with `pread`
(`SampleReader.spool_folder`). It
lives in the main process, runs its own fetching threads, and is driven by the loader's epochs
(`prefetch.runtime._epoch`), one epoch at a time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import tempfile
import threading
from typing import Any, BinaryIO

import numpy as np

from prefetch._messages import counted
from prefetch.io import ObjectCache, RemoteOptions, download, is_url, spooled_name, using
from prefetch.plan import EpochPlan, StreamingPlan
from prefetch.runtime._workers import forget_dummy_thread
from prefetch.sources.shards import ShardIdentity, ShardSource, local_identity, open_shard

# Shards fetched at once, and fetched ahead of the batches being decoded.
FETCH_THREADS = 4
READAHEAD_SHARDS = 4


class _Stop(Exception):
    """A fetch abandoned because the spool is closing."""


class _Stoppable:
    """A file whose writes raise `_Stop` once `stop` is set, so a download ends at its next
    chunk when the epoch ends."""

    def __init__(self, file: BinaryIO, stop: threading.Event) -> None:
        self._file, self._stop = file, stop

    def write(self, data: bytes) -> int:
        if self._stop.is_set():
            raise _Stop()
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class ShardSpool:
    """Local copies of the shards of a streamed source, fetched ahead of the batches that need
    them. `folder` holds them: `cache`'s for a `cache_dir` (`keep`: copies stay, a copy of
    the bytes indexed is not fetched again, and each is pinned from its fetch until its last
    batch is delivered), else a private temporary folder removed by `close()`. Not
    thread-safe: one epoch's stream drives it at a time."""

    def __init__(self, source: Any, cache: ObjectCache | None, remote: RemoteOptions) -> None:
        self.source = source
        self.cache = cache
        self.keep = cache is not None
        self.folder = (
            cache.folder if cache is not None else tempfile.mkdtemp(prefix="prefetch-spool-")
        )
        self.remote = remote
        self._pins: dict[int, int] = {}  # shard -> a pinned descriptor of its kept copy
        self._pins_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._fetches: dict[int, concurrent.futures.Future[None]] = {}
        self._first_use: list[tuple[int, int]] = []  # (batch, shard) in the order first needed
        self._last_use: dict[int, int] = {}
        self.fetched = 0  # shards fetched from storage (stats)
        self._begun: tuple[int, int] | None = None
        self._needed = ""  # what the epoch holds at once, for a cache_limit too small

    def path(self, shard: int) -> str:
        """Where the copy of shard number `shard` is kept."""
        return os.path.join(self.folder, spooled_name(self.source.shards[shard]))

    def begin(self, epoch: int, batches: list[np.ndarray], position: int) -> None:
        """Epoch `epoch` begins (or resumes at batch `position`) with `batches` still to come.
        Begun again at the same place (the workers started first), it goes on as it was."""
        if self._begun == (epoch, position):
            return
        self.end()
        self._begun = (epoch, position)
        self._stop.clear()
        first: dict[int, int] = {}
        self._last_use = {}
        for number, indices in enumerate(batches, start=position):
            for shard in np.unique(np.searchsorted(self.source.shard_starts, indices, "right") - 1):
                first.setdefault(int(shard), number)
                self._last_use[int(shard)] = number
        self._first_use = sorted((batch, shard) for shard, batch in first.items())
        self._needed = self._at_once(first)

    def _at_once(self, first: dict[int, int]) -> str:
        """What the epoch whose shards are first read by the batches `first` (and last by
        `_last_use`) holds at once, at least: at each batch, the shards read from their first
        batch to their last and the `READAHEAD_SHARDS` fetched ahead, as the advice of a
        `cache_limit` that cannot hold them ("" for none)."""
        if self.cache is None or not first:
            return ""
        order = sorted(first, key=first.__getitem__)
        starts = np.array([first[shard] for shard in order], np.int64)
        sizes = np.array([self.source.indexes[shard].identity.size for shard in order], np.int64)
        ends = np.array([self._last_use[shard] for shard in order], np.int64)
        by_end = np.argsort(ends, kind="stable")
        # at each batch that first reads a shard: those begun and not ended, and those ahead
        begun = np.searchsorted(starts, starts, "right")
        ended = np.searchsorted(ends[by_end], starts, "left")
        sums = np.concatenate([[0], np.cumsum(sizes)])
        ended_sums = np.concatenate([[0], np.cumsum(sizes[by_end])])
        ahead = np.minimum(begun + READAHEAD_SHARDS, len(order))
        shards = int(np.max(ahead - ended))
        held = int(np.max(sums[ahead] - ended_sums[ended]))
        return (
            f"this epoch reads up to {counted(shards, 'shard')} at once, {held} bytes: those "
            f"of the batches in flight (a shuffle_buffer of {self.source.shuffle_buffer} "
            f"samples draws from every shard it spans) and {READAHEAD_SHARDS} fetched ahead"
        )

    def ready(self, batch: int) -> None:
        """Return once the shards batch `batch` reads are local; start fetching the next
        `READAHEAD_SHARDS` beyond them."""
        needed = [shard for first, shard in self._first_use if first <= batch]
        ahead = [shard for first, shard in self._first_use if first > batch][:READAHEAD_SHARDS]
        for shard in needed + ahead:
            self._fetch(shard)
        for shard in needed:
            future = self._fetches.get(shard)
            if future is not None and not (future.done() and future.exception() is None):
                future.result()  # raises the fetch's error, naming the shard
        self._first_use = [(first, shard) for first, shard in self._first_use if first > batch]

    def release(self, delivered: int) -> None:
        """Batches before `delivered` were handed out: copies no later batch reads are removed
        (unless kept)."""
        self._begun = None
        for shard, last in list(self._last_use.items()):
            if last < delivered:
                del self._last_use[shard]
                self._unpin(shard)
                future = self._fetches.pop(shard, None)
                if not self.keep and future is not None:
                    future.cancel()
                    with contextlib.suppress(FileNotFoundError):
                        if future.done():
                            os.unlink(self.path(shard))

    def _fetch(self, shard: int) -> None:
        if shard in self._fetches:
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                FETCH_THREADS, thread_name_prefix="prefetch-shard-fetch"
            )
        self._fetches[shard] = self._pool.submit(self._copy, shard)

    def _unpin(self, shard: int) -> None:
        with self._pins_lock:
            pinned = self._pins.pop(shard, None)
        if pinned is not None:
            os.close(pinned)

    def _copy(self, shard: int) -> None:
        url, index = self.source.shards[shard], self.source.indexes[shard]
        if not is_url(url):
            return  # a local shard streamed (streaming=True) is read where it lies
        if self.cache is not None:
            self._keep(shard, url, index)
            return
        final = self.path(shard)
        with contextlib.suppress(OSError):
            if index.identity.matches(_copy_identity(final)):
                return  # fetched already, and the bytes indexed
        handle, partial = tempfile.mkstemp(dir=self.folder, prefix=".partial-")
        try:
            with os.fdopen(handle, "w+b") as file, using(self.remote):
                download(url, _Stoppable(file, self._stop))  # type: ignore[arg-type]
                file.flush()
                index.check_copy(url, _identity_of(file.fileno()))
            os.replace(partial, final)
            self.fetched += 1
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise

    def _keep(self, shard: int, url: str, index: Any) -> None:
        """Fetch shard `shard` into the cache folder unless a copy of the bytes indexed is
        kept there (from an earlier epoch, run or rank), and pin it."""
        assert self.cache is not None

        def fetch(file: BinaryIO) -> None:
            download(url, _Stoppable(file, self._stop))  # type: ignore[arg-type]
            file.flush()
            index.check_copy(url, _identity_of(file.fileno()))

        def good(handle: int) -> bool:
            return bool(index.identity.matches(_identity_of(handle)))

        with using(self.remote):
            pinned, fetched = self.cache.pinned_copy(
                spooled_name(url), index.identity.size, fetch, good, self._needed
            )
        with self._pins_lock:
            self._pins[shard], earlier = pinned, self._pins.get(shard)
        if earlier is not None:
            os.close(earlier)
        self.fetched += fetched

    def end(self) -> None:
        """The epoch ended: abandon fetches (a download stops at its next chunk), wait for the
        fetching threads, and remove the copies that are not kept."""
        self._stop.set()
        self._begun = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            forget_dummy_thread()  # the pool started (and was joined) on tf.data's thread
        if not self.keep:
            for shard in self._fetches:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(shard))
        for shard in list(self._pins):
            self._unpin(shard)
        self._fetches = {}

    def close(self) -> None:
        """`end()`, and remove the temporary folder. Idempotent."""
        self.end()
        if not self.keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _copy_identity(path: str) -> ShardIdentity:
    """The size and edges' digest of the spooled copy at `path` (`_identity_of`)."""
    handle = open_shard(path)
    try:
        return _identity_of(handle)
    finally:
        os.close(handle)


def _identity_of(handle: int) -> ShardIdentity:
    """The size and edges' digest of the open copy `handle` (its own times and inode are not
    the shard's)."""
    identity = local_identity(handle)
    return ShardIdentity(identity.size, identity.digest)


def streaming_parts(
    source: Any,
    plan: EpochPlan,
    cache_dir: str | os.PathLike[str] | None,
    remote: RemoteOptions,
) -> tuple[EpochPlan, ShardSpool | None]:
    """A Loader's plan and spool for `source`: a `StreamingPlan` and a `ShardSpool` (in
    `cache_dir` when given) for a streamed shard source, else `plan` as it is and None.
    ValueError for `cache_dir` with a shard source it cannot serve."""
    if not isinstance(source, ShardSource):
        return plan, None
    if not source.streaming:
        if cache_dir is not None:
            raise ValueError(
                "cache_dir keeps whole copies of streamed shards; this source reads its "
                "samples where they lie (streaming=False): leave cache_dir out, or make the "
                "source with streaming=True"
            )
        return plan, None
    streaming = StreamingPlan.of(plan, source.shard_starts, source.shuffle_buffer)
    cache = ObjectCache.open(cache_dir, remote.cache_limit) if cache_dir is not None else None
    return streaming, ShardSpool(source, cache, remote)
