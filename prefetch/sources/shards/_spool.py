"""Streaming shards: each epoch's order through a shuffle buffer, and whole shards fetched ahead.

A streamed shard source (`ShardSource.streaming`, the default for URLs) is never read one
sample at a time from its store. `StreamingPlan` orders an epoch as a streaming reader would
see it: this host's shards in an order drawn from `(seed, epoch)`, their samples in sequence,
mixed by a shuffle buffer of `buffer` samples (tf.data's algorithm: each sample that comes in
replaces a uniformly drawn one of the buffer, which goes out). The order is a pure function
of `(seed, epoch)` and the shards' sample counts, so resume (`state_dict`) and every backend
give the same batches, as with a folder. It is not an exact permutation of the dataset: a
sample leaves at most about `buffer` places before... anywhere after its shard arrives
(docs/shards.md).

Hosts (`num_shards`) take whole shard files: file `f` goes to host `f % num_shards`, every
epoch. Each host reads the same number of samples per epoch, the smallest host's count; a
larger host's extra samples are the last ones of its order, a different few each epoch.

`ShardSpool` fetches the shards an epoch needs, whole and a few ahead, into a local folder
(`cache_dir`, where they stay; else a private temporary folder, where each is removed once
its last batch has been delivered), so the workers read samples locally with `pread`. It
lives in the main process and is driven by the epoch's `Stream`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from prefetch.io import _storage as storage
from prefetch.io._members import spooled_name
from prefetch.plan._epochs import EpochPlan
from prefetch.runtime._session import forget_dummy_thread
from prefetch.sources.shards._index import open_shard
from prefetch.sources.shards._index_file import ShardIdentity, local_identity

# Appended to the seed for the shard order and the shuffle buffer's draws.
_SHARD_ORDER_KEY = (2, 0)
_BUFFER_KEY = (2, 1)
# Epoch orders a StreamingPlan keeps (the current epoch's and the next one's).
KEPT_ORDERS = 2
# Samples of the shuffle buffer's draws computed at once (a few arrays of this length).
STEPS_AT_ONCE = 1 << 18
# Shards fetched at once, and fetched ahead of the batches being decoded.
FETCH_THREADS = 4
READAHEAD_SHARDS = 4


@dataclass(frozen=True, kw_only=True, eq=False)
class StreamingPlan(EpochPlan):
    """The batches of each epoch of a streamed shard source (see the module docstring).

    `shard_starts` (int64, one more than the shards) is where each shard's samples begin;
    `buffer` the shuffle buffer's size in samples. `shuffle="batches"` is not offered.
    """

    shard_starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    buffer: int = 1
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shuffle == "batches":
            raise ValueError(
                "shuffle='batches' is not offered for streamed shards (their order comes "
                "through a shuffle buffer): pass shuffle=True or False"
            )
        object.__setattr__(self, "_orders", {})

    def replace(self, **changes: object) -> StreamingPlan:
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def host_shards(self, host: int | None = None) -> np.ndarray:
        """The shard files of `host` (default: this plan's `shard_index`)."""
        count = len(self.shard_starts) - 1
        return np.arange(count)[self.shard_index if host is None else host :: self.num_shards]

    @property
    def shard_size(self) -> int:
        """Samples per epoch on each host: the smallest host's count."""
        counts = np.diff(self.shard_starts)
        return min(int(counts[self.host_shards(host)].sum()) for host in range(self.num_shards))

    def shard_order(self, epoch: int) -> np.ndarray:
        """This host's shards in the order `epoch` streams them."""
        shards = self.host_shards()
        if not self.shuffle:
            return shards
        rng = np.random.default_rng([self.seed, epoch, *_SHARD_ORDER_KEY])
        return shards[rng.permutation(len(shards))]

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of `epoch` on this host, in order: 8 bytes per sample (int64),
        and the last `KEPT_ORDERS` epochs' orders are kept."""
        found = self._orders.get(epoch)
        if found is not None:
            return found
        starts = self.shard_starts
        shards = self.shard_order(epoch)
        counts = (starts[shards + 1] - starts[shards]).astype(np.int64)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, *_BUFFER_KEY])
            order = _through_buffer(starts[shards], counts, self.buffer, rng)
        else:
            order = np.empty(int(counts.sum()), np.int64)
            for begin in range(0, len(order), STEPS_AT_ONCE):
                end = min(begin + STEPS_AT_ONCE, len(order))
                order[begin:end] = _incoming(starts[shards], counts, begin, end)
        order = order[: self.shard_size]
        if len(self._orders) >= KEPT_ORDERS:
            self._orders.pop(next(iter(self._orders)))
        self._orders[epoch] = order
        return order

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """The sample indices of each batch of `epoch` from batch `start` on, in order."""
        order, size = self.order(epoch), self.batch_size
        return [order[i : i + size] for i in range(0, len(self) * size, size)][start:]


def _incoming(firsts: np.ndarray, counts: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Items [begin, end) of the samples of shards whose first samples are `firsts` and
    sample counts `counts`, taken in that order (without the whole sequence in memory)."""
    ends = np.cumsum(counts)
    positions = np.arange(begin, end, dtype=np.int64)
    shard = np.searchsorted(ends, positions, "right")
    items: np.ndarray = (
        np.asarray(firsts, np.int64)[shard] + positions - (ends[shard] - counts[shard])
    )
    return items


def _through_buffer(
    firsts: np.ndarray, counts: np.ndarray, buffer: int, rng: np.random.Generator
) -> np.ndarray:
    """The samples of the shards (`_incoming`) as they leave a shuffle buffer of `buffer`
    samples: the buffer fills first; then each sample that comes in takes the place of a
    uniformly drawn one, which goes out; at the end the rest go out in a random order.
    Computed `STEPS_AT_ONCE` samples at a time with numpy (a sample leaving at step k is the
    last one put in its drawn place before k, or the place's first occupant): the result's
    8 bytes per sample and a fixed amount for each step."""
    total = int(counts.sum())
    size = min(buffer, total)
    held = _incoming(firsts, counts, 0, size)
    out = np.empty(total, np.int64)
    for begin in range(size, total, STEPS_AT_ONCE):
        end = min(begin + STEPS_AT_ONCE, total)
        arriving = _incoming(firsts, counts, begin, end)
        picks = rng.integers(0, size, end - begin)
        by_place = np.argsort(picks, kind="stable")
        places = picks[by_place]
        after_same = np.zeros(len(places), bool)
        after_same[1:] = places[1:] == places[:-1]
        leaving = held[places]
        leaving[after_same] = arriving[by_place[:-1][after_same[1:]]]
        out[begin - size + by_place] = leaving
        last = np.ones(len(places), bool)
        last[:-1] = ~after_same[1:]
        held[places[last]] = arriving[by_place[last]]
    out[total - size :] = held[rng.permutation(size)]
    return out


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
    them. `folder` holds them: `keep=True` for a `cache_dir` (copies stay, and a copy of the
    right size is not fetched again), else a private temporary folder removed by `close()`.
    Not thread-safe: one epoch's stream drives it at a time."""

    def __init__(self, source: Any, folder: str | None, remote: storage.RemoteOptions) -> None:
        self.source = source
        self.keep = folder is not None
        self.folder = folder or tempfile.mkdtemp(prefix="prefetch-spool-")
        self.remote = remote
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._fetches: dict[int, concurrent.futures.Future[None]] = {}
        self._first_use: list[tuple[int, int]] = []  # (batch, shard) in the order first needed
        self._last_use: dict[int, int] = {}
        self.fetched = 0  # shards fetched from storage (stats)
        self._begun: tuple[int, int] | None = None

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

    def _copy(self, shard: int) -> None:
        url, index = self.source.shards[shard], self.source.indexes[shard]
        if not storage.is_url(url):
            return  # a local shard streamed (streaming=True) is read where it lies
        final = self.path(shard)
        with contextlib.suppress(OSError):
            if index.identity.matches(_copy_identity(final)):
                return  # kept from an earlier epoch or run, and the bytes indexed
        handle, partial = tempfile.mkstemp(dir=self.folder, prefix=".partial-")
        try:
            with os.fdopen(handle, "w+b") as file, storage.using(self.remote):
                storage.download(url, _Stoppable(file, self._stop))  # type: ignore[arg-type]
                file.flush()
                index.check_copy(url, _identity_of(file.fileno()))
            os.replace(partial, final)
            self.fetched += 1
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise

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
    remote: storage.RemoteOptions,
) -> tuple[EpochPlan, ShardSpool | None]:
    """A Loader's plan and spool for `source`: a `StreamingPlan` and a `ShardSpool` (in
    `cache_dir` when given) for a streamed shard source, else `plan` as it is and None.
    ValueError for `cache_dir` with a shard source it cannot serve."""
    from prefetch.io._cache import ObjectCache
    from prefetch.sources.shards._sources import ShardSource

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
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(EpochPlan)}
    streaming = StreamingPlan(
        **fields, shard_starts=source.shard_starts, buffer=source.shuffle_buffer
    )
    if streaming.shard_size == 0:
        raise ValueError(
            f"{plan.num_shards} hosts (num_shards) for {len(source.shards)} shard files: "
            "a streamed source gives each host whole files, so some hosts get none; use at "
            "most as many hosts as files, or streaming=False"
        )
    folder = ObjectCache.open(cache_dir).folder if cache_dir is not None else None
    return streaming, ShardSpool(source, folder, remote)
