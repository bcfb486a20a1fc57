"""What `cache_dir` buys: images/s per epoch of a remote folder, with and without local copies.

A loopback HTTP server (`prefetch.testing.serve_folder`, in a spawned child process:
`remote_latency.served_in_child`) serves an
image folder with a latency per request and a bandwidth cap (one link shared by all requests:
a store reached over a network, where bytes cost time, not only requests). Two loaders, each a
user's `prefetch.Loader(url, batch_size=32, image_size=(size, size), seed=0)` with the default
workers and backend, run `--epochs` whole epochs each: one without a cache, one with
`cache_dir` in a new temporary folder. Printed: images/s of each epoch (the first includes
starting the workers), and the folder's size after the cached run.

    .venv/bin/python benchmarks/remote_cache.py --folder /tmp/photos [--size 224]
        [--latency-ms 80] [--bandwidth-mbps 20] [--epochs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from remote_latency import served_in_child

import prefetch


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


def folder_bytes(folder: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(folder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="root/<class>/<image>")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--latency-ms", type=float, default=80.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=20.0, help="MB/s; 0: no cap")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    bandwidth = args.bandwidth_mbps * 1e6 if args.bandwidth_mbps > 0 else None
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
