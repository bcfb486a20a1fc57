"""Benchmark: thread vs process workers, alone and with TensorFlow imported and `fit` running.

Each configuration runs in its own Python process, so "no TensorFlow" really has none and
TensorFlow's process-wide malloc change does not leak between rows. Workloads:
  plain       Pillow decode + resize (releases the GIL)
  python 2ms  the same plus a transform holding the GIL for 2 ms per image
Consumers:
  loop        a bare Python loop over the loader (no TensorFlow imported)
  fit         keras `fit` on prefetch.tf.dataset(loader), a small CNN, on the CPU

    python benchmarks/backends_under_fit.py [--images 384] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import prefetch
from prefetch.testing import GilHoldingTransform

IMAGE_SIZE = (160, 160)
BATCH_SIZE = 32


def run_one(folder: str, backend: str, transform_ms: float, consumer: str, epochs: int) -> dict:
    """One configuration in this process: `epochs` epochs timed after one warm-up epoch."""
    transform = GilHoldingTransform(transform_ms / 1000) if transform_ms else None
    loader = prefetch.Loader(
        folder,
        batch_size=BATCH_SIZE,
        image_size=IMAGE_SIZE,
        backend=backend,
        augment=prefetch.Augment(transform=transform),
        seed=0,
    )
    with loader:
        if consumer == "loop":
            for _ in loader:  # warm-up epoch: workers start, caches fill
                pass
            loader.reset_stats()
            began = time.perf_counter()
            for _ in range(epochs):
                for _ in loader:
                    pass
        else:
            from prefetch.testing import small_cnn
            from prefetch.tf import dataset

            model = small_cnn(IMAGE_SIZE[0], len(loader.class_names))
            data = dataset(loader)
            model.fit(data, epochs=1, verbose=0)
            loader.reset_stats()
            began = time.perf_counter()
            model.fit(data, epochs=epochs, verbose=0)
        wall = time.perf_counter() - began
    stats = loader.stats()
    return {
        "backend": stats.backend,
        "images_per_s": stats.images / wall,
        "wait": stats.consumer_wait_fraction,
        "reason": stats.backend_reason,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--folder", help="a folder of JPEGs (default: generate 500x375 ones)")
    parser.add_argument("--one", nargs=4, metavar=("BACKEND", "MS", "CONSUMER", "FOLDER"))
    args = parser.parse_args()
    if args.one:
        backend, ms, consumer, folder = args.one
        print(json.dumps(run_one(folder, backend, float(ms), consumer, args.epochs)))
        return

    from tf_handoff import write_photos

    folder = args.folder
    if folder is None:
        folder = tempfile.mkdtemp(prefix="prefetch-bench-")
        write_photos(Path(folder), args.images)
    print(f"{os.cpu_count()} CPUs; {folder}; batch {BATCH_SIZE}; image_size {IMAGE_SIZE}")
    print(
        f"{'workload':<11} {'consumer':<8} {'backend':<8} {'chose':<8} {'images/s':>9} "
        f"{'wait':>6} {'vs thread':>9}"
    )
    for ms in (0.0, 2.0):
        for consumer in ("loop", "fit"):
            thread_rate = None
            for backend in ("thread", "process", "auto"):
                command = [
                    sys.executable,
                    __file__,
                    "--epochs",
                    str(args.epochs),
                    "--one",
                    backend,
                    str(ms),
                    consumer,
                    folder,
                ]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                row = json.loads(done.stdout.strip().splitlines()[-1])
                thread_rate = thread_rate or row["images_per_s"]
                workload = "plain" if not ms else f"python {ms:g}ms"
                print(
                    f"{workload:<11} {consumer:<8} {backend:<8} {row['backend']:<8} "
                    f"{row['images_per_s']:>9.0f} {row['wait']:>6.1%} "
                    f"{row['images_per_s'] / thread_rate:>8.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
