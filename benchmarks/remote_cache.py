"""What `cache_dir` buys: images/s per epoch of a remote folder, with and without local copies.

A loopback HTTP server (`prefetch.testing.serve_folder`, in a spawned child process:
`remote_latency.served_in_child`) serves an
image folder with a latency per request and a bandwidth cap (one link shared by all requests:
a store reached over a network, where bytes cost time, not only requests). Two loaders, each a
user's `prefetch.Loader(url, batch_size=32, image_size=(size, size), seed=0)` with the default
workers and backend, run `--epochs` whole epochs each: one without a cache, one with
`cache_dir` in a new temporary folder. Printed: images/s of each epoch (the first includes
starting the workers), and the folder's size after the cached run.

With `--ranks N`, instead: N spawned processes (the ranks of one host) each read the whole
folder for `--epochs` epochs (the same order: the same seed; with `--split`, each its own
shard, `loader.shard(N, rank)`, as data-parallel ranks do), starting each epoch together (and
its workers: an epoch's rate includes their start) and taking each batch together (the step
of synchronous training),
through one shared `cache_dir`: without a cache, with one of no bound, and with `cache_limit`
= `--limit-fraction` of the folder's bytes under each `--policies` (`cache_policy`). The
server logs each GET with its time; the folder's size is sampled every 5 ms. Printed for each
epoch: images/s of all ranks together, the ranks' cache hits, misses and evictions, the GETs of
images the server answered in that epoch and the most of one image, and the largest size the
folder reached.

With `--steps DIR`, instead: the cost of each step a cache folder in DIR (its filesystem) takes,
20,000 times each: a read's pin (open, shared flock, fstat, touch, close) beside a bare open
and close, counting bytes in or out of the ledger, taking and releasing an object's lock (and
checking it for a killed holder's reservation), and a kept miss's reservation (counted in,
recorded in the lock file, settled: its record counted out; then released here).

    .venv/bin/python benchmarks/remote_cache.py --folder /tmp/photos [--size 224]
        [--latency-ms 80] [--bandwidth-mbps 20] [--epochs 3]
        [--ranks 2 [--limit-fraction 0.5] [--split] [--policies keep,lru]]
    .venv/bin/python benchmarks/remote_cache.py --steps /tmp
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from remote_latency import served_in_child

import prefetch
from prefetch.io._cache import ObjectCache
from prefetch.io._cache_files import pin, unlock_object
from prefetch.testing import FolderSizeSampler, folder_bytes, serve_folder


def epoch_rates(url: str, size: int, epochs: int, cache_dir: str | None) -> list[float]:
    """Images/s of each of `epochs` epochs of one loader (workers started once)."""
    rates = []
    loader = prefetch.Loader(
        url,
        batch_size=32,
        image_size=(size, size),
        seed=0,
        remote=prefetch.RemoteOptions(cache_dir=cache_dir),
    )
    with loader:
        for _ in range(epochs):
            start, images = time.perf_counter(), 0
            for batch in loader:
                images += len(batch.images)
            rates.append(images / (time.perf_counter() - start))
    return rates


class _TimedLog(list):  # type: ignore[type-arg]
    """The server's `requests` log, each path with the time it arrived."""

    def append(self, path: Any) -> None:
        super().append((time.time(), path))


def _serve_logged(
    root: str, latency_s: float, bandwidth: float | None, urls: Any, stop: Any, log: Any
) -> None:
    requests = _TimedLog()
    with serve_folder(
        root, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth, requests=requests
    ) as url:
        urls.put(url)
        stop.wait()
    log.put(list(requests))


@contextlib.contextmanager
def served_and_logged(
    root: Path, latency_s: float, bandwidth: float | None, requests: list[tuple[float, str]]
) -> Iterator[str]:
    """`serve_folder(root)` in a spawned child; yields its URL; on exit `requests` holds
    (time, path) of every GET it answered."""
    context = multiprocessing.get_context("spawn")
    urls, stop, log = context.Queue(), context.Event(), context.Queue()
    args = (str(root), latency_s, bandwidth, urls, stop, log)
    server = context.Process(target=_serve_logged, args=args, daemon=True)
    server.start()
    try:
        yield urls.get(timeout=60)
    finally:
        stop.set()
        requests.extend(log.get(timeout=60))
        server.join(10)


def rank(
    url: str, size: int, epochs: int, remote: Any, barrier: Any, results: Any, split: int | None
) -> None:
    """One rank: `epochs` epochs of `url` (of its shard `split` of the ranks, if given), each
    begun with the other ranks (and starting its workers), each batch taken when every rank
    has one (a synchronous training step); per epoch its start and end times, images and
    cache statistics, put on `results`."""
    loader = prefetch.Loader(url, batch_size=32, image_size=(size, size), seed=0, remote=remote)
    if split is not None:
        loader.shard(barrier.parties, split)
    rows = []
    for _ in range(epochs):  # each on its own (no `with loader:`, which reads the next ahead)
        barrier.wait(600)
        start, images = time.time(), 0
        for batch in loader:
            images += len(batch.images)
            barrier.wait(600)
        stats = loader.stats()
        loader.reset_stats()
        rows.append({"start": start, "end": time.time(), "images": images, **stats.as_dict()})
    results.put(rows)


def shared_rows(args: argparse.Namespace, bandwidth: float | None) -> None:
    """The `--ranks` table: each configuration's epochs, all ranks together."""
    sizes = [path.stat().st_size for path in args.folder.rglob("*") if path.is_file()]
    total, largest_file = sum(sizes), max(sizes)
    limit = int(total * args.limit_fraction)
    reads = "its own shard" if args.split else "every image, in the same order"
    print(
        f"# {args.ranks} ranks share cache_dir, each reads {reads}; the folder holds "
        f"{total / 1e6:.2f} MB; cache_limit = {args.limit_fraction:g} of it = "
        f"{limit / 1e6:.2f} MB; its largest image {largest_file / 1e6:.2f} MB\n"
    )
    print(
        "| cache | epoch | images/s | hits | misses | evictions | image GETs "
        "| most GETs of one image | largest folder |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    context = multiprocessing.get_context("spawn")
    configurations = [("none", None, "keep"), ("no limit", 0, "keep")] + [
        (f'`cache_limit`, "{policy}"', limit, policy) for policy in args.policies.split(",")
    ]
    for name, bound, policy in configurations:
        requests: list[tuple[float, str]] = []
        with tempfile.TemporaryDirectory(prefix="prefetch-cache-bench-") as scratch:
            cache_dir = os.path.join(scratch, "cache")
            remote = prefetch.RemoteOptions(
                cache_dir=cache_dir if bound is not None else None,
                cache_limit=bound or None,
                cache_policy=policy,
            )
            with (
                served_and_logged(
                    args.folder.parent, args.latency_ms / 1000, bandwidth, requests
                ) as base,
                FolderSizeSampler(cache_dir, every_s=0.005) as sampler,
            ):
                url = f"{base}{args.folder.name}/"
                barrier, results = context.Barrier(args.ranks), context.Queue()
                ranks = [
                    context.Process(
                        target=rank,
                        args=(url, args.size, args.epochs, remote, barrier, results, split),
                    )
                    for split in (range(args.ranks) if args.split else [None] * args.ranks)
                ]
                for process in ranks:
                    process.start()
                rows = [results.get(timeout=3600) for _ in ranks]
                for process in ranks:
                    process.join()
        for epoch in range(args.epochs):
            each = [rows[r][epoch] for r in range(args.ranks)]
            start, end = min(e["start"] for e in each), max(e["end"] for e in each)
            gets = collections.Counter(
                path for when, path in requests if start <= when <= end and not path.endswith("/")
            )
            rate = sum(e["images"] for e in each) / (end - start)
            hits, misses = sum(e["cache_hits"] for e in each), sum(e["cache_misses"] for e in each)
            evictions = sum(e["cache_evictions"] for e in each)
            folder = f"{sampler.largest / 1e6:.2f} MB" if bound is not None else "-"
            print(
                f"| {name} | {epoch + 1} | {rate:.0f} | {hits} | {misses} | {evictions} "
                f"| {sum(gets.values())} | {max(gets.values(), default=0)} | {folder} |"
            )


def step_costs(where: str, count: int = 20_000) -> None:
    """Microseconds per step of a cache folder made in `where` (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="prefetch-cache-steps-", dir=where) as scratch:
        cache = ObjectCache.open(os.path.join(scratch, "cache"), limit=10**9)
        handle, ledger, name = cache._dir(), cache._books(), "a" * 40 + ".jpg"
        with open(os.path.join(cache.folder, name), "wb") as file:
            file.write(bytes(100_000))

        def timed(step: Callable[[], None]) -> float:
            start = time.perf_counter()
            for _ in range(count):
                step()
            return (time.perf_counter() - start) / count * 1e6

        def read() -> None:
            os.close(pin(handle, name))  # type: ignore[arg-type]

        def bare() -> None:
            os.close(os.open(name, os.O_RDONLY, dir_fd=handle))

        def count_in_and_out() -> None:
            ledger.reserve(100)
            ledger.release(100)

        def lock() -> None:  # a miss's: the lock, and the check for a killed holder's record
            unlock_object(handle, "b" * 40, ledger.lock("b" * 40, 0))  # type: ignore[arg-type]

        held = ledger.lock("c" * 40, 0)
        assert held is not None

        def reservation() -> None:  # a kept miss's: counted, recorded, settled (and released)
            ledger.reserve(100, None, held, "c" * 40 + ".jpg")
            ledger.settle(held)
            ledger.release(100)

        print(f"# {platform.platform()}, {os.cpu_count()} cores; {' '.join(sys.argv)}")
        print("| step | us |\n|---|---:|")
        print(f"| a read's pin and close | {timed(read):.1f} |")
        print(f"| a bare open and close | {timed(bare):.1f} |")
        print(f"| bytes counted into the ledger, or out | {timed(count_in_and_out) / 2:.1f} |")
        print(f"| an object's lock taken and released | {timed(lock):.1f} |")
        print(f"| a reservation counted, recorded, settled, released | {timed(reservation):.1f} |")
        unlock_object(handle, "c" * 40, held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, help="root/<class>/<image>")
    parser.add_argument("--steps", metavar="DIR", help="time a cache folder's steps in DIR")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--latency-ms", type=float, default=80.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=20.0, help="MB/s; 0: no cap")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=0, help="processes sharing cache_dir")
    parser.add_argument("--limit-fraction", type=float, default=0.5, help="of the folder")
    parser.add_argument("--split", action="store_true", help="each rank reads its own shard")
    parser.add_argument(
        "--policies", default="keep,lru", help="the cache_policy values of the cache_limit rows"
    )
    args = parser.parse_args()
    if args.steps:
        step_costs(args.steps)
        return
    if args.folder is None:
        parser.error("--folder is required (or --steps DIR)")
    bandwidth = args.bandwidth_mbps * 1e6 if args.bandwidth_mbps > 0 else None
    if args.ranks:
        print(f"# {platform.platform()}, {os.cpu_count()} cores; {' '.join(sys.argv)}")
        link = f"a {args.bandwidth_mbps:g} MB/s link" if bandwidth else "no bandwidth cap"
        print(f"# {args.latency_ms:g} ms per request, {link}")
        shared_rows(args, bandwidth)
        return
    with served_in_child(args.folder, args.latency_ms / 1000, bandwidth) as url:
        print(f"# {platform.platform()}, {os.cpu_count()} cores; {' '.join(sys.argv)}")
        link = f"a {args.bandwidth_mbps:g} MB/s link" if bandwidth else "no bandwidth cap"
        print(f"# {args.latency_ms:g} ms per request, {link}\n")
        header = " | ".join(f"epoch {n + 1}" for n in range(args.epochs))
        print(f"| loader | {header} |")
        print("|---" * (args.epochs + 1) + "|")
        plain = epoch_rates(url, args.size, args.epochs, None)
        print("| Loader(url) | " + " | ".join(f"{rate:.0f}" for rate in plain) + " |")
        with tempfile.TemporaryDirectory(prefix="prefetch-cache-bench-") as folder:
            cache_dir = os.path.join(folder, "cache")
            cached = epoch_rates(url, args.size, args.epochs, cache_dir)
            row = " | ".join(f"{rate:.0f}" for rate in cached)
            print(f"| Loader(url, remote=RemoteOptions(cache_dir=...)) | {row} |")
            print(f"\ncache_dir holds {folder_bytes(cache_dir) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
