"""Benchmark: keras.utils.image_dataset_from_directory vs prefetch.tf.image_dataset_from_directory.

Writes a folder of ImageNet-sized JPEGs (500x375, quality 90) and, in one process:
  1. decodes them one by one on one core to 224x224 with prefetch's decoder, with Pillow's
     antialiased resize (antialias=True) and with the Keras-parity resize (the default) the drop-in
     uses (full-size decode, numpy resize like tf.image.resize): ms per image;
  2. reads whole epochs of the folder through Keras's function and through the drop-in (same
     arguments, alternating, after one warm-up epoch each): images/s, median of the repeats,
     and the drop-in's ratio to Keras. The drop-in runs twice: as returned (its workers start
     and stop with every epoch) and inside `with ds.loader:` (workers kept across epochs).

    python benchmarks/keras_dropin.py [--images 512] [--repeats 3] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import prefetch
from prefetch.testing import draw_shape

IMAGE_SIZE = (224, 224)
PHOTO_SIZE = (500, 375)  # (width, height), an ImageNet-typical photo


def write_photos(folder: Path, count: int) -> None:
    """500x375 JPEGs (quality 90) with some texture, in four classes."""
    rng = np.random.default_rng(0)
    for i in range(count):
        sub = folder / f"class_{i % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        image = np.asarray(draw_shape("circle", PHOTO_SIZE, rng)).astype(np.int16)
        image += rng.integers(-30, 31, size=image.shape, dtype=np.int16)
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
            sub / f"{i:05d}.jpg", quality=90
        )


def decode_ms(paths: list[str], options: prefetch.DecodeOptions, repeats: int) -> float:
    """Median over repeats of the mean ms per image of decode_image, on this thread."""
    prefetch.decode_image(paths[0], options)  # warm up caches
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for path in paths:
            prefetch.decode_image(path, options)
        times.append((time.perf_counter() - began) / len(paths) * 1e3)
    return statistics.median(times)


def epoch_rate(ds: Any) -> float:
    """Images/s of one full epoch of a batched dataset of (images, labels)."""
    began = time.perf_counter()
    count = 0
    for images, _ in ds:
        count += int(images.shape[0])
    return count / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512, help="JPEGs in the folder")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per pipeline")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--workers", type=int, default=None, help="drop-in worker threads (default: cores)"
    )
    args = parser.parse_args()

    import keras  # after argparse, so --help is quick

    import prefetch.tf

    cores = len(os.sched_getaffinity(0))
    print(f"{args.images} JPEGs of {PHOTO_SIZE[0]}x{PHOTO_SIZE[1]} -> {IMAGE_SIZE}, {cores} cores")
    with tempfile.TemporaryDirectory() as tmp:
        write_photos(Path(tmp), args.images)
        paths = [str(p) for p in sorted(Path(tmp).rglob("*.jpg"))][:200]

        print("\n1. decode_image on one thread (ms per image, median of repeats)")
        pillow = decode_ms(paths, prefetch.DecodeOptions(IMAGE_SIZE, antialias=True), args.repeats)
        parity = decode_ms(paths, prefetch.DecodeOptions(IMAGE_SIZE, antialias=False), args.repeats)
        print(f"   Pillow antialiased resize (antialias=True):      {pillow:6.2f} ms")
        print(f"   Keras-parity numpy resize (antialias=False):     {parity:6.2f} ms")

        options: dict[str, Any] = dict(
            image_size=IMAGE_SIZE, batch_size=args.batch_size, seed=0, verbose=False
        )

        def drop_in() -> Any:
            return prefetch.tf.image_dataset_from_directory(tmp, workers=args.workers, **options)

        pipelines: dict[str, Callable[[], Any]] = {
            "keras.utils.image_dataset_from_directory": lambda: (
                keras.utils.image_dataset_from_directory(tmp, **options)
            ),
            "prefetch.tf.image_dataset_from_directory": drop_in,
            "  the same, inside `with ds.loader:`": drop_in,
        }
        datasets = {name: make() for name, make in pipelines.items()}
        rates: dict[str, list[float]] = {name: [] for name in datasets}
        with contextlib.ExitStack() as stack:
            stack.enter_context(datasets["  the same, inside `with ds.loader:`"].loader)
            for ds in datasets.values():
                epoch_rate(ds)  # warm-up epoch: tracing, file cache
            for _ in range(args.repeats):
                for name, ds in datasets.items():
                    rates[name].append(epoch_rate(ds))

        print(f"\n2. whole epochs, batch {args.batch_size} (images/s, median of {args.repeats})")
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, value in medians.items():
            runs = ", ".join(f"{v:.0f}" for v in rates[name])
            print(f"   {name:42s} {value:8.0f}   ({runs})")
        keras_rate, *drop_in_rates = medians.values()
        ratios = ", ".join(f"{rate / keras_rate:.2f}" for rate in drop_in_rates)
        print(f"   ratio drop-in / Keras (as returned, inside with): {ratios}")


if __name__ == "__main__":
    main()
