"""Benchmark: keras.utils.image_dataset_from_directory vs prefetch.tf.image_dataset_from_directory.

On a folder of JPEGs (`--folder ROOT/<class>/<image>`, or `--images` generated ImageNet-sized
JPEGs, 500x375 quality 90, in a temporary folder), to 224x224:
  1. decode cost on one thread: ms per image of `prefetch.decode_image` with Pillow's
     antialiased resize (antialias=True) and with the Keras-parity resize (the drop-in's
     default: full-size decode, numpy resize like tf.image.resize), the median of `--repeats`
     passes over (at most) 200 files, in this process (which never imports TensorFlow);
  2. the steady state of each row, measured as a training job runs it (Keras `fit` on a
     repeated dataset, a custom loop): one dataset, `.repeat()` and ONE iterator, in a fresh
     spawned process per row (`prefetch.tools.bench.measure_row`); `--warmup-epochs`
     (default 2) untimed, then `--epochs` (default 6) timed; `--rounds` rounds (default 3),
     the rows' order reversed every other round; images/s as the median with its min-max over
     the rounds, and the drop-in's ratio to Keras (of the medians, and its range over rounds):
       keras     keras.utils.image_dataset_from_directory(folder, image_size, batch_size,
                 seed=0, verbose=False): shuffled, AUTOTUNE
       drop-in   prefetch.tf.image_dataset_from_directory with the same arguments, as
                 returned: its Loader's workers start and stop with every pass of the repeat
                 (every epoch), as with Keras `fit` outside `with ds.loader:`
       with      the same inside `with ds.loader:` (workers kept across epochs)
     "cold" is each row's warm-up rate counted from the dataset's construction (listing,
     tracing, workers starting, AUTOTUNE's ramp): what a job as short as the warm-up pays (a
     notebook cell, an evaluation pass); a long training job does not.

    python benchmarks/keras_dropin.py [--images 512 | --folder DIR] [--rounds 3]
        [--warmup-epochs 2] [--epochs 6] [--rows keras,drop-in,with] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import prefetch
from prefetch.runtime import usable_cores
from prefetch.testing import draw_shape
from prefetch.tools.bench import (
    Contender,
    KerasContender,
    RowResult,
    Setup,
    Span,
    TfDataContender,
    measure_rounds,
    measure_row,
    median_range,
)

IMAGE_SIZE = (224, 224)
PHOTO_SIZE = (500, 375)  # (width, height), an ImageNet-typical photo
ROWS = {
    "keras": "keras.utils.image_dataset_from_directory",
    "drop-in": "prefetch.tf.image_dataset_from_directory",
    "with": "  the same, inside `with ds.loader:`",
}
RATIOS = {"drop-in": "as returned", "with": "inside `with ds.loader:`"}


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


class DropIn(TfDataContender):
    """`prefetch.tf.image_dataset_from_directory` with the Keras row's arguments, iterated as
    the Keras row is (`.repeat()`, one iterator: `TfDataContender.stream`); `owned`: inside
    `with ds.loader:`. `setup.workers` 0 means the drop-in's default."""

    def __init__(self, setup: Setup, owned: bool) -> None:
        super().__init__(setup)
        self.owned = owned

    def open(self, stack: contextlib.ExitStack) -> None:
        import prefetch.tf  # TensorFlow only in the row's own process

        s = self.setup
        self.dataset = prefetch.tf.image_dataset_from_directory(
            str(s.folder.root),
            batch_size=s.batch_size,
            image_size=s.options.image_size,
            shuffle=True,
            seed=s.seed,
            verbose=False,
            workers=s.workers or None,
        )
        if self.owned:
            stack.enter_context(self.dataset.loader)

    def describe(self) -> dict[str, Any]:
        stats = self.dataset.loader.stats()
        return {"note": f"{stats.backend}, {stats.workers} workers, decoder {stats.decoder}"}


def make_row(key: str, setup: Setup) -> Contender:
    """The contender of row `key` (module level: the spawned row unpickles it from here)."""
    if key == "keras":
        return KerasContender(setup)
    return DropIn(setup, owned=key == "with")


def measure(args: argparse.Namespace, root: str, keys: list[str]) -> None:
    """Part 2 of the module docstring: the rows at steady state, and their table."""
    setup = Setup(
        prefetch.ImageFolder(root),
        prefetch.DecodeOptions(IMAGE_SIZE),
        args.batch_size,
        args.workers or 0,
        2,
        0,
        prefetch.decode_image,  # unused: every row decodes with its own
    )
    images = len(setup.folder)
    span = Span(args.warmup_epochs * images, args.epochs * images)

    def measure_one(key: str) -> RowResult:
        return measure_row(key, setup, span, 0.0, lambda: None, make=make_row)

    def on_row(number: int, key: str, result: RowResult | str) -> None:
        shown = f"{result.images_per_s:.0f} images/s" if isinstance(result, RowResult) else result
        print(f"round {number}: {ROWS[key].strip():<42} {shown}", file=sys.stderr, flush=True)

    results, failed = measure_rounds(keys, args.rounds, measure_one, on_row)
    print(
        f"\n2. steady state, batch {args.batch_size}: one dataset per row (.repeat(), one "
        f"iterator) in a fresh process, {args.warmup_epochs} epoch(s) untimed, then "
        f"{args.epochs} timed; images/s, median of {args.rounds} round(s) (min-max), rows "
        f"alternating; cold: the warm-up's rate from the dataset's construction"
    )
    print(f"   {'row':<42} {'images/s':>18} {'cold':>6}  notes")
    for key in keys:
        runs = results[key]
        if not runs:
            print(f"   {ROWS[key]:<42} {'-':>18} {'':>6}  {failed[key]}")
            continue
        rates = median_range([r.images_per_s for r in runs])
        cold = statistics.median(r.cold_images_per_s for r in runs)
        note = failed.get(key, runs[-1].described.get("note", ""))
        print(f"   {ROWS[key]:<42} {rates:>18} {cold:>6.0f}  {note}")
    for key, label in RATIOS.items():
        if results.get("keras") and results.get(key):
            pairs = [
                a.images_per_s / b.images_per_s
                for a, b in zip(results[key], results["keras"], strict=False)
            ]
            ratio = statistics.median(r.images_per_s for r in results[key]) / statistics.median(
                r.images_per_s for r in results["keras"]
            )
            within = f" (rounds {min(pairs):.2f}x-{max(pairs):.2f}x)" if len(pairs) > 1 else ""
            print(f"   drop-in / Keras, {label}: {ratio:.2f}x{within}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512, help="generated JPEGs (no --folder)")
    parser.add_argument("--folder", help="measure this folder ROOT/<class>/<image> instead")
    parser.add_argument("--repeats", type=int, default=3, help="passes of the decode timing")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, rows alternating")
    parser.add_argument("--warmup-epochs", type=int, default=2, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=6, help="timed epochs per row")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {list(ROWS)}")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--workers", type=int, default=None, help="drop-in worker threads (default: its own)"
    )
    args = parser.parse_args()
    keys = [key.strip() for key in args.rows.split(",")]
    unknown = [key for key in keys if key not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # inherited by the rows' processes

    with contextlib.ExitStack() as stack:
        if args.folder:
            root = args.folder
        else:
            root = stack.enter_context(tempfile.TemporaryDirectory())
            write_photos(Path(root), args.images)
        paths = [str(p) for p in sorted(Path(root).rglob("*.jp*g"))][:200]
        print(f"$ python {' '.join(sys.argv)}")
        what = args.folder or f"generated JPEGs of {PHOTO_SIZE[0]}x{PHOTO_SIZE[1]}"
        size = f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}"
        print(
            f"{len(prefetch.ImageFolder(root))} images ({what}) -> {size}; "
            f"{usable_cores()} cores; load average (1 min) {os.getloadavg()[0]:.2f}"
        )
        print("\n1. decode_image on one thread (ms per image, median of repeats)")
        pillow = decode_ms(paths, prefetch.DecodeOptions(IMAGE_SIZE, antialias=True), args.repeats)
        parity = decode_ms(paths, prefetch.DecodeOptions(IMAGE_SIZE, antialias=False), args.repeats)
        print(f"   Pillow antialiased resize (antialias=True):      {pillow:6.2f} ms")
        print(f"   Keras-parity numpy resize (antialias=False):     {parity:6.2f} ms")
        measure(args, root, keys)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
