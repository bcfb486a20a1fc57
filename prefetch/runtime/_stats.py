"""Loader statistics: counters kept by the consumer side, and the snapshot users read.

`StatsRecorder` is updated only from the thread that iterates the Loader; `snapshot()` may be
called from any thread (it reads plain numbers). Time is counted only while an epoch is being
iterated, so pauses between epochs (validation, checkpoints) do not dilute the rates.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from prefetch._messages import counted
from prefetch.backends import DecodePlace
from prefetch.io import CacheCounts
from prefetch.sample import Work

# How many skipped paths the stats keep (the most recent ones); the count is exact.
SKIPPED_PATHS_KEPT = 100
# How many of the latest samples' read times the latency percentiles are taken over.
READ_TIMES_KEPT = 4096
# Up to this many samples read at once per worker, on average, the workers read one sample each
# at a time (the excess is timing slack) and are said to be busy a share of the time; above it,
# reader threads overlap reads, and the count of reads in progress is given instead.
READS_OVER_WORKERS = 1.05


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of a Loader's work since it was created (or since `reset_stats`).

    - `backend`: "thread" or "process" ("auto" before the loader starts).
    - `workers`: the worker count now.
    - `depth`: the loader's `depth`.
    - `epochs`: epochs begun.
    - `batches`: batches delivered.
    - `images`: images delivered.
    - `elapsed_s`: seconds of iteration (from each epoch's first request to its end).
    - `images_per_s`: images delivered per second of iteration.
    - `consumer_wait_s`: time the consumer spent blocked waiting for a batch. Near 0:
      compute-bound (the loader keeps up). Large: input-bound (add workers, or make decode
      cheaper).
    - `consumer_wait_fraction`: the same as a fraction of iteration time.
    - `producer_busy_s`: worker time spent reading samples, summed over workers (and over
      reader threads, so with remote storage it can be many times `elapsed_s`); printed as
      samples read at once on average, `producer_busy_s / elapsed_s`.
    - `mean_ready_batches`: batches already decoded when the consumer asked, on average (out
      of the batches in flight); near that count means the producers are ahead.
    - `skipped`: samples dropped under `on_error="skip"` (the count is exact).
    - `skipped_paths`: the most recent of their files (at most `SKIPPED_PATHS_KEPT`).
    - `backend_reason`: how the backend was chosen (the measurement, for `backend="auto"`),
      the worker count and the cores it was sized by (this rank's share of the host, and where
      the ranks came from), and the bytes of batch slots (`prefetch.runtime._choice.decide`).
    - `worker_decisions`: with `workers="auto"`, each change (or hold) of the worker count and
      why.
    - `decoder`: the decoder that ran ("turbo", "pillow", a callable's own name, or with a
      `crop` the window decoder: "libjpeg-turbo window", "simplejpeg + cut", "pillow").
    - `reads_in_flight`: samples being read at the moment of the snapshot (at most the
      workers, or workers x threads_per_worker): with remote storage, how many requests wait.
    - `read_p50_s`: the median time one sample took to read, decode and transform, over the
      latest `READ_TIMES_KEPT` samples (0 before any).
    - `read_p90_s`: the 90th percentile of the same.
    - `read_p99_s`: the 99th percentile of the same.
    - `in_flight`: batches an epoch keeps submitted to the workers: `depth`, and more when many
      workers wait on remote storage (two rows per thread, two batches per reader process).
    - `cache`: with `cache_dir`, what the object cache did, a `CacheCounts`: `hits`, samples
      read from a kept local copy; `misses`, samples whose object was read from storage (and
      copied) first; `fetched_bytes`, the bytes read from storage into it (objects, or
      streamed shards); `evictions` and `evicted_bytes`, the copies this loader evicted from
      `cache_dir` to make room, with a `cache_limit`. Also read as `cache_hits`,
      `cache_misses`, `cache_fetched_bytes`, `cache_evictions`, `cache_evicted_bytes`.
    - `cache_bytes`: the bytes `cache_dir` holds now, copies being written included, for
      every process that shares it (its ledger's count); 0 without a cache.
    - `decoded_on`: with the Ray backend, where batches were decoded and at what rate: a
      `DecodePlace` per node (this process's own first); () with the other backends.
    """

    backend: str
    workers: int
    depth: int
    epochs: int
    batches: int
    images: int
    elapsed_s: float
    images_per_s: float
    consumer_wait_s: float
    consumer_wait_fraction: float
    producer_busy_s: float
    mean_ready_batches: float
    skipped: int
    skipped_paths: tuple[str, ...]
    backend_reason: str = ""
    worker_decisions: tuple[str, ...] = ()
    decoder: str = ""
    reads_in_flight: int = 0
    read_p50_s: float = 0.0
    read_p90_s: float = 0.0
    read_p99_s: float = 0.0
    in_flight: int = 0
    cache: CacheCounts = field(default_factory=CacheCounts)
    cache_bytes: int = 0
    decoded_on: tuple[DecodePlace, ...] = ()

    cache_hits = property(lambda self: self.cache.hits, doc="`cache.hits`.")
    cache_misses = property(lambda self: self.cache.misses, doc="`cache.misses`.")
    cache_fetched_bytes = property(
        lambda self: self.cache.fetched_bytes, doc="`cache.fetched_bytes`."
    )
    cache_evictions = property(lambda self: self.cache.evictions, doc="`cache.evictions`.")
    cache_evicted_bytes = property(
        lambda self: self.cache.evicted_bytes, doc="`cache.evicted_bytes`."
    )

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as a plain dict (JSON-ready); the cache's counters flat, as
        `cache_hits`, `cache_misses`, ... (`Tally.flat`)."""
        snapshot = asdict(self)
        del snapshot["cache"]
        return {**snapshot, **self.cache.flat("cache_")}

    def __str__(self) -> str:
        """One line in plain words: what was delivered, how long the consumer waited, how
        busy the workers were (on average, over the iteration time), how many batches were
        ready when asked for, a sample's typical and slow read time, what was skipped.

        Worker time is given as the share of the time the workers were busy (or, with reader
        threads, as samples read at once on average), not as seconds summed over workers and
        reader threads (which, on remote storage, can be many times the run).
        """
        parts = [
            f"{counted(self.images, 'image')} in {counted(self.batches, 'batch')}, "
            f"{self.images_per_s:.0f} images/s",
            f"the consumer waited {self.consumer_wait_s:.2f} s for batches "
            f"({self.consumer_wait_fraction:.1%} of the time)",
            f"{self.backend} backend, {self.decoder or 'own'} decoder, {self._busy_words()}",
            f"when a batch was asked for, {self.mean_ready_batches:.1f} of the "
            f"{self.in_flight or self.depth} in flight were ready (average)",
        ]
        if self.reads_in_flight:
            parts.append(f"{counted(self.reads_in_flight, 'sample')} being read now")
        parts.append(
            f"reading and decoding a sample took typically {1000 * self.read_p50_s:.1f} ms "
            f"(p50), 1 in 100 over {1000 * self.read_p99_s:.1f} ms (p99)"
        )
        if self.decoded_on:
            parts.append("decoded on " + ", ".join(map(_place_words, self.decoded_on)))
        skipped = f"{counted(self.skipped, 'sample')} skipped"
        return "; ".join([*parts, skipped + self._cache_words()])

    def _busy_words(self) -> str:
        """The workers and how busy they were, from `producer_busy_s / elapsed_s` (how many
        samples were being read at once, on average): "4 workers busy 90% of the time". Worker
        processes with reader threads (remote storage) read many samples at once, and the
        figure can exceed the workers: "4 workers with 50.6 samples being read at once on
        average"."""
        workers = counted(self.workers, "worker")
        if self.elapsed_s <= 0:
            return workers
        busy = self.producer_busy_s / self.elapsed_s
        if self.workers and busy <= self.workers * READS_OVER_WORKERS:
            return f"{workers} busy {min(busy / self.workers, 1.0):.0%} of the time"
        return f"{workers} with {busy:.1f} samples being read at once on average"

    def _cache_words(self) -> str:
        """The cache's hits, evictions and size, as in "; cache: 5 of 12 read from local
        copies, 3 evicted, 1.2 MB held"; "" without one."""
        cache = self.cache_hits + self.cache_misses
        words = [f"{self.cache_hits} of {cache} read from local copies"] if cache else []
        if self.cache_evictions:
            words.append(f"{self.cache_evictions} evicted")
        if self.cache_bytes:
            words.append(f"{self.cache_bytes / 1e6:.1f} MB held")
        return f"; cache: {', '.join(words)}" if words else ""


def _place_words(place: DecodePlace) -> str:
    """One node's share in words: "this node (2 actors): 640 images, 950 images/s busy"."""
    where = "this node" if place.local else place.node
    lost = f", {counted(place.lost_actors, 'actor')} lost" if place.lost_actors else ""
    return (
        f"{where} ({counted(place.actors, 'actor')}): {place.images} images, "
        f"{place.images_per_s:.0f} images/s busy{lost}"
    )


class StatsRecorder:
    """Mutable counters behind `Loader.stats()`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.epochs = 0
        self.batches = 0
        self.images = 0
        self.elapsed_s = 0.0
        self.consumer_wait_s = 0.0
        self.work = Work()  # the workers' counters, added up as batches are delivered
        self.ready_sum = 0
        self.requests = 0
        self.skipped = 0
        self.skipped_paths: deque[str] = deque(maxlen=SKIPPED_PATHS_KEPT)
        self.read_s: deque[float] = deque(maxlen=READ_TIMES_KEPT)

    def snapshot(
        self,
        backend: str,
        workers: int,
        depth: int,
        backend_reason: str = "",
        worker_decisions: tuple[str, ...] = (),
        decoder: str = "",
        reads_in_flight: int = 0,
        in_flight: int = 0,
        cache_bytes: int = 0,
        decoded_on: tuple[DecodePlace, ...] = (),
    ) -> LoaderStats:
        elapsed = self.elapsed_s
        p50, p90, p99 = (
            np.percentile(np.fromiter(self.read_s, float), (50, 90, 99))
            if self.read_s
            else (0, 0, 0)
        )
        return LoaderStats(
            backend=backend,
            workers=workers,
            depth=depth,
            epochs=self.epochs,
            batches=self.batches,
            images=self.images,
            elapsed_s=elapsed,
            images_per_s=self.images / elapsed if elapsed > 0 else 0.0,
            consumer_wait_s=self.consumer_wait_s,
            consumer_wait_fraction=self.consumer_wait_s / elapsed if elapsed > 0 else 0.0,
            producer_busy_s=self.work.busy_s,
            mean_ready_batches=self.ready_sum / self.requests if self.requests else 0.0,
            skipped=self.skipped,
            skipped_paths=tuple(self.skipped_paths),
            backend_reason=backend_reason,
            worker_decisions=worker_decisions,
            decoder=decoder,
            reads_in_flight=reads_in_flight,
            read_p50_s=float(p50),
            read_p90_s=float(p90),
            read_p99_s=float(p99),
            in_flight=in_flight or depth,
            cache=self.work.cache,
            cache_bytes=cache_bytes,
            decoded_on=decoded_on,
        )
