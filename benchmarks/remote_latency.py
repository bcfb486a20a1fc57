"""Remote storage without the internet: images/s against per-request latency and workers.

A loopback HTTP server (`prefetch.testing.serve_folder`, run in a child process so that it does
not share the loader's GIL) serves an image folder with an injected latency per request (0, 5,
20 and 80 ms by default). prefetch reads it with thread workers and a decoder that fetches each
image's URL with `urllib.request` (one GET, one connection per image) and decodes it with
Pillow as `decode_image` does. Rows: fixed `workers` 2, 8, 32 and `workers="auto"`, each at
every latency, each for `--seconds` of epochs over the folder in a `with loader:` block.

Columns: images/s over the last third of the row (the steady rate), its ratio to the same
loader at 0 ms, the time until the trailing 1 s rate first reached 90% of that steady rate,
the time until it reached 90% of the same loader's 0 ms rate ("never" when it did not), and the
worker count at the end. The issue's targets (issue 12): at 20 ms, workers="auto" at >= 90% of
its 0 ms rate within 5 s; at 80 ms, >= 75%.

    .venv/bin/python benchmarks/remote_latency.py [--images 300] [--size 64] [--seconds 8]
        [--latencies-ms 0,5,20,80] [--workers 2,8,32,auto] [--folder PATH]

The server shares this machine's cores with the loader (a real store would not): its request
handling is part of every row, the 0 ms one included.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import prefetch
from prefetch.decode import DecodeOptions, to_target_size
from prefetch.testing import serve_folder, write_image_folder

BATCH = 32


class HttpDecoder:
    """Fetch `path`'s URL under `base_url` (the path relative to `root`) and decode it."""

    name = "http"

    def __init__(self, root: str, base_url: str) -> None:
        self.root = root
        self.base_url = base_url

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        relative = os.path.relpath(path, self.root).replace(os.sep, "/")
        with urllib.request.urlopen(self.base_url + urllib.parse.quote(relative), timeout=30) as r:
            data = r.read()
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return to_target_size(image, options)


def _serve(root: str, latency_s: float, urls: Any, stop: Any) -> None:
    with serve_folder(root, latency_s=latency_s) as url:
        urls.put(url)
        stop.wait()


def run_row(
    folder: Path, base_url: str, workers: int | str, size: int, seconds: float
) -> dict[str, Any]:
    """Iterate epochs for `seconds`; the time of each batch, the images and the final workers."""
    loader = prefetch.Loader(
        folder,
        batch_size=BATCH,
        image_size=(size, size),
        workers=workers,
        backend="thread",
        decoder=HttpDecoder(str(folder), base_url),
        seed=0,
    )
    times: list[float] = []
    counts: list[int] = []
    with loader:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for batch in loader:
                times.append(time.perf_counter() - start)
                counts.append(len(batch.labels))
                if times[-1] >= seconds:
                    break
        decisions = loader.stats().worker_decisions
    return {
        "times": np.array(times),
        "counts": np.array(counts),
        "workers": loader.workers,
        "decisions": decisions,
    }


def steady_rate(row: dict[str, Any], seconds: float) -> float:
    times, counts = row["times"], row["counts"]
    late = times >= seconds * 2 / 3
    first = times[late][0] if late.any() else 0.0
    span = times[-1] - first
    return float(counts[late][1:].sum() / span) if span > 0 else 0.0


def time_to(row: dict[str, Any], rate: float) -> float | None:
    """When the trailing 1 s rate first reached `rate` (None: never)."""
    times, counts = row["times"], row["counts"]
    cumulative = np.cumsum(counts)
    for i, t in enumerate(times):
        if t < 1.0:
            continue
        before = np.searchsorted(times, t - 1.0, side="right") - 1
        done = cumulative[i] - (cumulative[before] if before >= 0 else 0)
        if done / 1.0 >= rate:
            return float(t)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--latencies-ms", default="0,5,20,80")
    parser.add_argument("--workers", default="2,8,32,auto")
    parser.add_argument("--folder", type=Path, help="an image folder to serve (else generated)")
    args = parser.parse_args()
    latencies = [float(v) for v in args.latencies_ms.split(",")]
    worker_rows: list[int | str] = [w if w == "auto" else int(w) for w in args.workers.split(",")]
    if 0.0 not in latencies:
        latencies.insert(0, 0.0)

    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"prefetch {prefetch.__version__}; {' '.join(sys.argv)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder
        if folder is None:
            per_class = -(-args.images // 3)
            folder = write_image_folder(
                Path(tmp) / "images", per_class=per_class, size=(args.size, args.size)
            )
        context = multiprocessing.get_context("spawn")
        results: dict[tuple[str, float], dict[str, Any]] = {}
        for latency_ms in latencies:
            urls, stop = context.Queue(), context.Event()
            server = context.Process(
                target=_serve, args=(str(folder), latency_ms / 1000, urls, stop), daemon=True
            )
            server.start()
            try:
                url = urls.get(timeout=60)
                for workers in worker_rows:
                    row = run_row(folder, url, workers, args.size, args.seconds)
                    results[(str(workers), latency_ms)] = row
                    print(
                        f"  {latency_ms:g} ms, workers={workers}: "
                        f"{steady_rate(row, args.seconds):.0f} images/s",
                        file=sys.stderr,
                    )
                    if workers == "auto":
                        for decision in row["decisions"]:
                            print(f"    {decision}", file=sys.stderr)
            finally:
                stop.set()
                server.join(10)

    print()
    print(
        "| workers | latency | images/s | vs 0 ms | 90% of own rate at | "
        "90% of 0 ms rate at | workers at end |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for workers in worker_rows:
        base = steady_rate(results[(str(workers), 0.0)], args.seconds)
        for latency_ms in latencies:
            row = results[(str(workers), latency_ms)]
            rate = steady_rate(row, args.seconds)
            own = time_to(row, 0.9 * rate)
            zero = time_to(row, 0.9 * base)
            print(
                f"| {workers} | {latency_ms:g} ms | {rate:.0f} | {rate / base:.2f} | "
                f"{'never' if own is None else f'{own:.1f} s'} | "
                f"{'never' if zero is None else f'{zero:.1f} s'} | {row['workers']} |"
            )


if __name__ == "__main__":
    main()
