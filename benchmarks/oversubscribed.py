"""Benchmark: what a worker count above the usable cores costs (issue 41.1).

`workers=16` copied from a 16-core GPU host to a small machine starts 16 worker processes on
its cores. Each row is one fresh Python process that opens `Loader(root, workers=W)` (the
default backend: processes, for files) and reads it as a training job does:

- first batch: seconds from `Loader(...)` to the first batch (the workers' start-up, each
  importing numpy and the decoders, on cores that the others are importing on too);
- steady: images/s over `--epochs` whole epochs after the first one, one open loader.

The rows alternate over `--rounds` rounds (the machine's load moves); medians and ranges.

    python benchmarks/oversubscribed.py --root /tmp/photos [--workers default,4,16,64]
        [--rounds 3] [--batch-size 32] [--image-size 224] [--epochs 1]

"default" is `workers=None` (the rank's share of the usable cores, less one from 4 cores on).
It imports no framework. The warning a count above the cores gives (`TooManyWorkersWarning`)
is silenced in the rows: the cost is what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

from prefetch import Loader, TooManyWorkersWarning
from prefetch.runtime import usable_cores


def one_row(root: str, workers: int | None, batch_size: int, size: int, epochs: int) -> dict:
    """Open a loader, time its first batch, then its steady rate over `epochs` more epochs."""
    warnings.simplefilter("ignore", TooManyWorkersWarning)
    began = time.perf_counter()
    loader = Loader(root, batch_size=batch_size, image_size=size, workers=workers, seed=0)
    with loader:
        stream = iter(loader)
        next(stream)
        first_s = time.perf_counter() - began
        for _ in stream:  # the rest of the first epoch: not timed
            pass
        images = 0
        started = time.perf_counter()
        for _ in range(epochs):
            for batch in loader:
                images += len(batch.images)
        steady = images / (time.perf_counter() - started)
        workers_run, backend = loader.workers, loader.backend_name
    return {"first_s": first_s, "steady": steady, "workers": workers_run, "backend": backend}


def measure(root: str, workers: str, args: argparse.Namespace) -> dict:
    """One row in a fresh interpreter."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--root",
        root,
        "--one",
        workers,
        "--batch-size",
        str(args.batch_size),
        "--image-size",
        str(args.image_size),
        "--epochs",
        str(args.epochs),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def span(values: list[float], digits: int) -> str:
    """The median and the range, e.g. "2.31 (2.10-2.52)"."""
    median = statistics.median(values)
    return f"{median:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="an image folder (class subfolders)")
    parser.add_argument("--workers", default="default,4,16", help="comma-separated counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs after the first")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one row here, print JSON
    args = parser.parse_args()
    if args.one is not None:
        workers = None if args.one == "default" else int(args.one)
        row = one_row(args.root, workers, args.batch_size, args.image_size, args.epochs)
        print(json.dumps(row))
        return
    keys = args.workers.split(",")
    rows: dict[str, list[dict]] = {key: [] for key in keys}
    for _ in range(args.rounds):
        for key in keys:
            rows[key].append(measure(args.root, key, args))
    load = os.getloadavg()[0]
    print(f"{usable_cores()} usable cores; load average (1 min) at the end {load:.2f}")
    print(f"{args.root}: batch {args.batch_size}, {args.image_size}px, {args.rounds} rounds")
    base = rows[keys[0]]
    base_first = statistics.median(r["first_s"] for r in base)
    base_steady = statistics.median(r["steady"] for r in base)
    print(f"{'workers':>10} {'first batch s':>22} {'x':>6} {'steady images/s':>22} {'x':>6}")
    for key in keys:
        first = [r["first_s"] for r in rows[key]]
        steady = [r["steady"] for r in rows[key]]
        name = f"{key} ({rows[key][0]['workers']})" if key == "default" else key
        print(
            f"{name:>10} {span(first, 2):>22} {statistics.median(first) / base_first:>6.2f}"
            f" {span(steady, 0):>22} {statistics.median(steady) / base_steady:>6.2f}"
        )


if __name__ == "__main__":
    main()
