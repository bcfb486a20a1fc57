"""Benchmark: the Loader alone vs through prefetch.tf.dataset, and TensorFlow's malloc patch.

Runs in one process, in this order, because TensorFlow's patch is process-wide and permanent:
  1. single-core decode rate (the decode limit is usable cores x this rate)
  2. the Loader alone (thread backend), and plain threads decoding into fresh arrays
  3. prefetch.tf.dataset without the malloc fix, then the Loader alone again (TF patched malloc)
  4. restore_malloc_thresholds(), then the Loader alone and prefetch.tf.dataset again

    python benchmarks/tf_handoff.py [--images 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

import prefetch
from prefetch.testing import draw_shape

IMAGE_SIZE = (224, 224)
BATCH_SIZE = 64


def write_photos(folder: Path, count: int) -> None:
    """ImageNet-sized JPEGs (500x375, quality 90) with some texture, in two classes."""
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = folder / f"class_{i % 2}"
        sub.mkdir(parents=True, exist_ok=True)
        image = np.asarray(draw_shape("circle", (500, 375), rng)).astype(np.int16)
        image += rng.integers(-30, 31, size=image.shape, dtype=np.int16)
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
            sub / f"{i:05d}.jpg", quality=90
        )


def rate(run: Callable[[], int], repeats: int) -> float:
    """Median images/s of `run` (which returns the number of images it produced)."""
    rates = []
    for _ in range(repeats):
        began = time.perf_counter()
        count = run()
        rates.append(count / (time.perf_counter() - began))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_photos(Path(tmp), args.images)
        folder = prefetch.ImageFolder(tmp)
        options = prefetch.DecodeOptions(IMAGE_SIZE)
        decode = prefetch.decode._choice.get_decoder("auto")  # the Loader's default decoder
        loader = prefetch.Loader(
            folder, batch_size=BATCH_SIZE, image_size=IMAGE_SIZE, workers=args.workers, seed=0
        )

        def single_core() -> int:
            for path in folder.paths[:200]:
                decode(str(path), options)
            return 200

        def plain_threads() -> int:
            # What users without preallocated buffers do: a fresh array per image, in threads.
            with ThreadPoolExecutor(args.workers) as pool:
                list(pool.map(lambda p: decode(str(p), options), folder.paths))
            return len(folder)

        def loader_alone() -> int:
            return sum(len(images) for images, _ in loader)

        def through_tf(ds: object) -> Callable[[], int]:
            return lambda: sum(int(images.shape[0]) for images, _ in ds)  # type: ignore[attr-defined]

        rows: list[tuple[str, float]] = []
        single_core()  # warm the page cache
        core_rate = rate(single_core, args.repeats)
        limit = core_rate * args.workers
        with loader:
            rows.append(("loader alone, before TensorFlow", rate(loader_alone, args.repeats)))
            rows.append(("plain threads, before TensorFlow", rate(plain_threads, args.repeats)))
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            tf_stages = importlib.import_module("prefetch.tf")  # imports TensorFlow now
            patched = tf_stages.dataset(loader, malloc_fix=False)
            rows.append(
                ("tf.dataset, TF malloc patch active", rate(through_tf(patched), args.repeats))
            )
            rows.append(("loader alone, TF malloc patch active", rate(loader_alone, args.repeats)))
            rows.append(
                ("plain threads, TF malloc patch active", rate(plain_threads, args.repeats))
            )
            tf_stages.restore_malloc_thresholds()
            rows.append(("loader alone, thresholds restored", rate(loader_alone, args.repeats)))
            rows.append(("plain threads, thresholds restored", rate(plain_threads, args.repeats)))
            fixed = tf_stages.dataset(loader)
            rows.append(("tf.dataset, thresholds restored", rate(through_tf(fixed), args.repeats)))
    print(
        f"\n{args.images} JPEGs 500x375 -> {IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, batch {BATCH_SIZE}, "
        f"{args.workers} workers, median of {args.repeats}"
    )
    print(f"single-core decode: {core_rate:.0f} images/s; decode limit {limit:.0f} images/s\n")
    print(f"{'pipeline':40s} {'images/s':>9s} {'of limit':>9s} {'of loader':>10s}")
    base = rows[0][1]
    for name, value in rows:
        print(f"{name:40s} {value:9.0f} {value / limit:9.0%} {value / base:10.0%}")


if __name__ == "__main__":
    main()
