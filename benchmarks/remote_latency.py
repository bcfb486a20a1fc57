"""Remote storage without the internet: images/s against per-request latency, prefetch and tf.data.

A loopback HTTP server (`prefetch.testing.serve_folder`, run in a spawned child process so that
it does not share the readers' GIL) serves an image folder (one subfolder per class) with an
injected latency per request (0, 5, 20 and 80 ms by default; directory listings pay it too).
A new server starts for each latency, and every row below reads it for `--seconds` of epochs:

- prefetch, as a user calls it on a URL: `prefetch.Loader(url, batch_size=32,
  image_size=(size, size), workers=W, seed=0)` with the default backend ("auto"), in a
  `with loader:` block. Constructing the Loader lists the folder over HTTP (one index
  page per folder, 16 at a time); each image is then one GET. Rows: `workers` 2, 8, 32,
  "auto" and "default" (workers=None, the Loader's default, which on URL sources is tuned as
  "auto" is). `--backend process` measures the process backend instead.
- tf.data, as a user writes it for HTTP URLs (TensorFlow's `tf.io.gfile` has no http
  filesystem): `Dataset.from_tensor_slices((urls, labels))` (the same listing, from
  `prefetch.sources._folders.index_directory(url)`), `.shuffle(len(urls), seed=0)`, `.map(load,
  num_parallel_calls=P)`, `.batch(32).prefetch(AUTOTUNE)`. `load` fetches the bytes in a
  `tf.py_function` (`urllib.request.urlopen(url).read()`: the one step TensorFlow has no op
  for) and decodes with TensorFlow's own ops after it (`tf.io.decode_jpeg` then
  `tf.image.resize` to (size, size), bilinear), which is where a tf.data user keeps decoding:
  outside Python, in parallel. Rows: P = `tf.data.AUTOTUNE` and P = 64. tf.data runs map
  calls on its thread pool, one thread per core by default, and a py_function waiting on the
  network holds its thread: on 2 cores both rows fetch 2 images at a time whatever P says.
  `--tf-threadpool N` adds a row with P = 64 on a private pool of N threads
  (`tf.data.Options().threading.private_threadpool_size`), the fix a tf.data user who found
  this would add.
- with `--mount`, the same folder through a local FUSE mount that waits the same latency at
  every file open (`benchmarks/latency_mount.py`: needs /dev/fuse, the right to mount,
  fusermount3 and the mfusepy package): `keras.utils.image_dataset_from_directory(mountpoint,
  batch_size=32, image_size=(size, size), seed=0)` as Keras users read a mounted bucket, and
  `prefetch.Loader(mountpoint, workers="auto")`. A mount's listing pays no latency here.
  Keras reads each file with a TensorFlow op on the same per-core thread pool; to prefetch
  the mount is a local path (`storage.reads_over_network` is false), so workers="auto" starts
  at one worker per core rather than at a URL's threads per core.

Columns: the reader; the latency; the backend the Loader chose (`loader.backend_name`;
"tf.data" for TensorFlow rows); the listing time (constructing the Loader, or the tf.data
row's `index_directory`, or `image_dataset_from_directory` itself; the run's first listing
also imports fsspec and aiohttp); images/s over the last third of the row (the steady rate;
over the last two batches when the last third holds fewer); its ratio to the same row at
0 ms; the time until the trailing 1 s rate first reached 90% of that steady rate, and 90% of
the same row's 0 ms rate ("never" when it did not); the worker count at the end (prefetch
rows). Each prefetch row's backend choice, and the worker decisions of the tuned rows (auto,
default), go to stderr.
The issue's targets (issue 12): at 20 ms, workers="auto" at >= 90% of its 0 ms rate within
5 s; at 80 ms, >= 75%.

    .venv/bin/python benchmarks/remote_latency.py [--images 300] [--size 64] [--seconds 8]
        [--latencies-ms 0,5,20,80] [--workers 2,8,32,auto,default]
        [--tf-parallel autotune,64] [--tf-threadpool N] [--mount] [--folder PATH]
        [--backend auto|thread|process] [--bandwidth-mbps MB_PER_S]

(`--tf-parallel ""` leaves the tf.data rows out.) The server, and the FUSE daemon with
`--mount`, share this machine's cores with the readers (a real store would not): their request
handling is part of every row, the 0 ms one included.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import platform
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from latency_mount import mounted, unavailable

import prefetch
from prefetch.sources._folders import index_directory
from prefetch.testing import serve_folder, write_image_folder

BATCH = 32


def _serve(root: str, latency_s: float, bandwidth: float | None, urls: Any, stop: Any) -> None:
    with serve_folder(root, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth) as url:
        urls.put(url)
        stop.wait()


@contextlib.contextmanager
def served_in_child(
    root: str | os.PathLike[str], latency_s: float, bandwidth: float | None
) -> Iterator[str]:
    """`serve_folder(root)` in a spawned child process (so that the server does not share
    the readers' GIL); yields its base URL and stops it on exit."""
    context = multiprocessing.get_context("spawn")
    urls, stop = context.Queue(), context.Event()
    server = context.Process(
        target=_serve, args=(str(root), latency_s, bandwidth, urls, stop), daemon=True
    )
    server.start()
    try:
        yield urls.get(timeout=60)
    finally:
        stop.set()
        server.join(10)


def time_epochs(epoch: Callable[[], Generator[int]], seconds: float) -> dict[str, Any]:
    """Run epochs (each an iterator of batch sizes) for `seconds`: each batch's time and size."""
    times: list[float] = []
    counts: list[int] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        with contextlib.closing(epoch()) as batches:
            for count in batches:
                times.append(time.perf_counter() - start)
                counts.append(count)
                if times[-1] >= seconds:
                    break
    return {"times": np.array(times), "counts": np.array(counts)}


def prefetch_row(
    source: str, workers: str, size: int, seconds: float, backend: str = "auto"
) -> dict[str, Any]:
    """A Loader on `source` as a user makes it; `workers` "default" passes None."""
    count: int | str | None = {"default": None, "auto": "auto"}.get(workers, workers)
    start = time.perf_counter()
    loader = prefetch.Loader(
        source,
        batch_size=BATCH,
        image_size=(size, size),
        workers=int(count) if isinstance(count, str) and count != "auto" else count,
        backend=backend,
        seed=0,
    )
    listing = time.perf_counter() - start
    with loader:
        row = time_epochs(lambda: (len(batch.images) for batch in loader), seconds)
        decisions = loader.stats().worker_decisions
        backend, reason = loader.backend_name, loader.backend_reason
    return row | {
        "listing": listing,
        "backend": backend,
        "reason": reason,
        "workers": str(loader.workers),
        "decisions": decisions,
    }


def tf_row(
    url: str, parallel: str, size: int, seconds: float, threadpool: int = 0
) -> dict[str, Any]:
    """The tf.data pipeline a user writes for HTTP URLs (see the module docstring); with
    `threadpool`, on a private thread pool of that many threads."""
    import tensorflow as tf

    start = time.perf_counter()
    paths, labels, _ = index_directory(url)
    listing = time.perf_counter() - start
    urls = paths.tolist()

    def fetch(url: Any) -> bytes:
        with urllib.request.urlopen(url.numpy().decode(), timeout=30) as response:
            data: bytes = response.read()
        return data

    def load(url: Any, label: Any) -> tuple[Any, Any]:
        data = tf.py_function(fetch, [url], tf.string)
        image = tf.image.resize(tf.io.decode_jpeg(data, channels=3), (size, size))
        image.set_shape((size, size, 3))
        return image, label

    calls = tf.data.AUTOTUNE if parallel == "autotune" else int(parallel)
    dataset = (
        tf.data.Dataset.from_tensor_slices((urls, labels))
        .shuffle(len(urls), seed=0)
        .map(load, num_parallel_calls=calls)
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    if threadpool:
        options = tf.data.Options()
        options.threading.private_threadpool_size = threadpool
        dataset = dataset.with_options(options)
    # One iterator over the dataset repeated, as a training job iterates it.
    row = time_epochs(lambda: (int(labels.shape[0]) for _, labels in dataset.repeat()), seconds)
    return row | {"listing": listing, "backend": "tf.data", "workers": "-"}


def keras_row(folder: str, size: int, seconds: float) -> dict[str, Any]:
    """`keras.utils.image_dataset_from_directory` on a (mounted) folder, as Keras users call it."""
    import keras

    start = time.perf_counter()
    dataset = keras.utils.image_dataset_from_directory(
        folder, batch_size=BATCH, image_size=(size, size), seed=0, verbose=False
    )
    listing = time.perf_counter() - start
    # One iterator over the dataset repeated, as a training job iterates it.
    row = time_epochs(lambda: (int(labels.shape[0]) for _, labels in dataset.repeat()), seconds)
    return row | {"listing": listing, "backend": "tf.data", "workers": "-"}


def steady_rate(row: dict[str, Any], seconds: float) -> float:
    """Images/s from the first batch of the row's last third to its last batch (from the
    second-to-last batch when the last third holds fewer than two: a slow row)."""
    times, counts = row["times"], row["counts"]
    if len(times) < 2:
        return 0.0
    first = min(int(np.searchsorted(times, seconds * 2 / 3)), len(times) - 2)
    span = times[-1] - times[first]
    return float(counts[first + 1 :].sum() / span) if span > 0 else 0.0


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


def report(name: str, latency_ms: float, row: dict[str, Any], seconds: float) -> None:
    """One finished row on stderr: its rate, backend, listing, and the tuner's decisions."""
    print(
        f"  {latency_ms:g} ms, {name}: {steady_rate(row, seconds):.0f} images/s, "
        f"backend {row['backend']}, listing {row['listing']:.2f} s",
        file=sys.stderr,
    )
    if row.get("reason"):
        print(f"    {row['reason']}", file=sys.stderr)
    if "workers=auto" in name or "workers=None" in name:  # the tuned rows
        for decision in row.get("decisions", ()):
            print(f"    {decision}", file=sys.stderr)


def tf_name(spec: str) -> str:
    """A tf.data row's name: "autotune", "64", or "64/N" (on a private pool of N threads)."""
    parallel, _, threads = spec.partition("/")
    name = "tf.data AUTOTUNE" if parallel == "autotune" else f"tf.data parallel={parallel}"
    return f"{name}, private_threadpool_size={threads}" if threads else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--latencies-ms", default="0,5,20,80")
    parser.add_argument("--workers", default="2,8,32,auto,default")
    parser.add_argument("--tf-parallel", default="autotune,64", help='"" for no tf.data rows')
    parser.add_argument(
        "--tf-threadpool",
        type=int,
        default=0,
        help="add a tf.data parallel=64 row on a private thread pool of this many threads",
    )
    parser.add_argument("--mount", action="store_true", help="add rows on a FUSE mount")
    parser.add_argument(
        "--bandwidth-mbps",
        type=float,
        help="cap the server's responses, all connections together, at this many MB/s",
    )
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "thread", "process"),
        help="the prefetch rows' backend on the URL (default: auto, as users get)",
    )
    parser.add_argument("--folder", type=Path, help="an image folder to serve (else generated)")
    args = parser.parse_args()
    latencies = [float(v) for v in args.latencies_ms.split(",")]
    if 0.0 not in latencies:
        latencies.insert(0, 0.0)
    workers_rows = [w for w in args.workers.split(",") if w]
    tf_rows = [p.lower() for p in args.tf_parallel.split(",") if p]
    if args.tf_threadpool:
        tf_rows.append(f"64/{args.tf_threadpool}")
    if args.mount and (why := unavailable()) is not None:
        parser.error(f"--mount: no FUSE mount here: {why}")
    if tf_rows or args.mount:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    print(
        f"# {platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"prefetch {prefetch.__version__}; {' '.join(sys.argv)}"
    )
    prefetch_names = {
        w: f"prefetch workers={'None (default)' if w == 'default' else w}" for w in workers_rows
    }
    tf_names = {p: tf_name(p) for p in tf_rows}
    mount_names = ["tf.data image_dataset_from_directory (mount)", "prefetch workers=auto (mount)"]
    names = [*prefetch_names.values(), *tf_names.values(), *(mount_names if args.mount else [])]
    results: dict[tuple[str, float], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.folder
        if folder is None:
            per_class = -(-args.images // 3)
            folder = write_image_folder(
                Path(tmp) / "images", per_class=per_class, size=(args.size, args.size)
            )
        size, seconds = args.size, args.seconds
        bandwidth = args.bandwidth_mbps * 1e6 if args.bandwidth_mbps else None
        for latency_ms in latencies:
            with served_in_child(folder, latency_ms / 1000, bandwidth) as url:
                for w, name in prefetch_names.items():
                    row = prefetch_row(url, w, size, seconds, args.backend)
                    results[(name, latency_ms)] = row
                    report(name, latency_ms, results[(name, latency_ms)], seconds)
                for p, name in tf_names.items():
                    parallel, _, threads = p.partition("/")
                    row = tf_row(url, parallel, size, seconds, int(threads or 0))
                    results[(name, latency_ms)] = row
                    report(name, latency_ms, results[(name, latency_ms)], seconds)
            if args.mount:
                mountpoint = os.path.join(tmp, "mount")
                os.makedirs(mountpoint, exist_ok=True)
                with mounted(folder, mountpoint, latency_ms / 1000):
                    keras_name, prefetch_name = mount_names
                    results[(keras_name, latency_ms)] = keras_row(mountpoint, size, seconds)
                    report(keras_name, latency_ms, results[(keras_name, latency_ms)], seconds)
                    row = prefetch_row(mountpoint, "auto", size, seconds)
                    results[(prefetch_name, latency_ms)] = row
                    report(prefetch_name, latency_ms, row, seconds)

    print()
    print(
        "| reader | latency | backend | listing | images/s | vs 0 ms | 90% of own rate at | "
        "90% of 0 ms rate at | workers at end |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        base = steady_rate(results[(name, 0.0)], args.seconds)
        for latency_ms in latencies:
            row = results[(name, latency_ms)]
            rate = steady_rate(row, args.seconds)
            own = time_to(row, 0.9 * rate)
            zero = time_to(row, 0.9 * base)
            print(
                f"| {name} | {latency_ms:g} ms | {row['backend']} | {row['listing']:.2f} s | "
                f"{rate:.0f} | {rate / base if base else float('nan'):.2f} | "
                f"{'never' if own is None else f'{own:.1f} s'} | "
                f"{'never' if zero is None else f'{zero:.1f} s'} | {row['workers']} |"
            )


if __name__ == "__main__":
    main()
