"""Benchmark: recipe-resolution shards (`prefetch shards write --fit-crop 224`), issue 25.

On an image folder ROOT/<class>/<image>.jpg (default /tmp/photos-large), into a temp dir:

1. Bytes: the folder written as tar shards twice with `write_shards` (100 samples a shard,
   the same seed, so the same keys in the same shards), the originals and with
   `fit_crop=224` (JPEGs re-encoded at `--jpeg-quality`, passed as `fit_crop_quality`;
   default the writer's, `prefetch.tools.shards.DEFAULT_QUALITY`, 90); bytes on disk of
   each set (shards, indexes, manifest) and their ratio.
2. Speed at steady state, rows as in training_shape.py (its functions, imported): each row in
   a fresh process, one long-lived pipeline, `--warmup-epochs` untimed then `--epochs` timed,
   `--rounds` rounds with the rows' order reversed every other round; medians (min-max).
     tf.data recipe      training_shape.py's row 1 (Model Garden's training input) on the
                         original photo folder
     prefetch originals  Loader(TarSource(originals), crop=RandomResizedCrop(), flip=True,
                         image_size=224, batch_size=64)
     prefetch fit-crop   the same on the --fit-crop 224 shards
3. Pixels: for each sample and `--draws` draws, a torchvision RandomResizedCrop box drawn on
   the original's size (training_shape.PillowCropSource.box), scaled by the fitted image's
   width and height ratios to the fit-crop image; both images fully decoded with Pillow (RGB)
   and the box resized to 224x224 with Pillow's bilinear filter (which antialiases when it
   shrinks, so neither crop aliases). Mean and p99 absolute difference of the channel values
   (0-255) over all crops. Same boxes, same resize: the difference is what the shards lost
   (the second JPEG compression and the Lanczos resize to the fitted size).

    PYTHONPATH=$PWD python benchmarks/fit_crop.py [--folder /tmp/photos-large] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from training_shape import (  # benchmarks/training_shape.py, beside this
    BATCH,
    SIZE,
    PillowCropSource,
    list_folder,
    loader_batches,
    loader_note,
    tf_stream,
)

import prefetch
from prefetch.runtime import usable_cores
from prefetch.tools.bench import Span, steady_rate
from prefetch.tools.shards import DEFAULT_QUALITY, write_shards

ROWS = {1: "tf.data recipe", 2: "prefetch originals", 3: "prefetch fit-crop"}
SETS = {2: "originals", 3: "fit-crop"}


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def one_row(args: argparse.Namespace) -> dict[str, Any]:
    """Measure row `args.one_row` in this (fresh) process."""
    images = len(list_folder(args.folder)[0])
    span = Span(args.warmup_epochs * images, args.epochs * images)
    began = time.perf_counter()
    if args.one_row == 1:
        stream, note = tf_stream(args.folder, "train")
        rate, _, _ = steady_rate(stream, span, began)
        return {"rate": rate, "note": note}
    source = prefetch.TarSource(str(Path(args.shards) / SETS[args.one_row]))
    crop = prefetch.RandomResizedCrop()
    with prefetch.Loader(
        source,
        augment=prefetch.Augment(crop=crop, flip=True),
        image_size=SIZE,
        batch_size=BATCH,
        seed=0,
    ) as loader:
        rate, _, _ = steady_rate(loader_batches(loader), span, began)
        return {"rate": rate, "note": loader_note(loader)}


def tar_images(folder: Path) -> dict[str, bytes]:
    """Image members of the folder's tar shards, by shard and member name."""
    found = {}
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.lower().endswith((".jpg", ".jpeg", ".png")):
                    found[f"{shard.name}/{member.name}"] = tar.extractfile(member).read()  # type: ignore[union-attr]
    return found


def pixel_difference(shards: Path, draws: int) -> tuple[float, float, int]:
    """(mean, p99 absolute difference, crops) of same-box crops (module docstring, 3.)."""
    originals, fitted = tar_images(shards / "originals"), tar_images(shards / "fit-crop")
    rng = np.random.default_rng(0)
    box_of = PillowCropSource.__new__(PillowCropSource).box  # box() uses no instance state
    diffs = []
    for key, data in originals.items():
        with Image.open(io.BytesIO(data)) as a, Image.open(io.BytesIO(fitted[key])) as b:
            a, b = a.convert("RGB"), b.convert("RGB")
        sx, sy = b.width / a.width, b.height / a.height
        for _ in range(draws):
            left, top, right, bottom = box_of(a.width, a.height, rng)
            crop_a = a.resize((SIZE, SIZE), Image.BILINEAR, box=(left, top, right, bottom))
            box_b = (left * sx, top * sy, right * sx, bottom * sy)
            crop_b = b.resize((SIZE, SIZE), Image.BILINEAR, box=box_b)
            diffs.append(np.abs(np.asarray(crop_a, np.int16) - np.asarray(crop_b, np.int16)))
    every = np.stack(diffs).astype(np.uint8)
    return float(every.mean()), float(np.percentile(every, 99)), len(diffs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/photos-large", help="ROOT/<class>/<image>")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, rows alternating")
    parser.add_argument("--warmup-epochs", type=int, default=2, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=8, help="timed epochs per row")
    parser.add_argument("--draws", type=int, default=3, help="crops per image (pixels)")
    parser.add_argument(
        "--jpeg-quality",
        type=int,
        default=DEFAULT_QUALITY,
        help="the writer's fit_crop_quality, --fit-crop-quality (default: the writer's, "
        f"{DEFAULT_QUALITY})",
    )
    parser.add_argument("--shards", help=argparse.SUPPRESS)  # a row's process: the temp dir
    parser.add_argument("--one-row", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.one_row:
        print(json.dumps(one_row(args)), flush=True)
        os._exit(0)  # TensorFlow's threads end with the process (the Loader is closed)
    print(f"$ python {' '.join(sys.argv)}")
    print(f"{usable_cores()} cores; load average (1 min) {os.getloadavg()[0]:.2f}")
    print(f"--fit-crop re-encodes JPEGs at --fit-crop-quality {args.jpeg_quality}")
    with tempfile.TemporaryDirectory() as temp:
        shards = Path(temp)
        fitted = {"fit_crop": SIZE, "fit_crop_quality": args.jpeg_quality}
        for name, options in (("originals", {}), ("fit-crop", fitted)):
            began = time.perf_counter()
            write_shards(args.folder, shards / name, format="tar", shard_size=100, **options)
            print(f"wrote {name} shards in {time.perf_counter() - began:.1f} s")
        sizes = {name: disk_bytes(shards / name) for name in ("originals", "fit-crop")}
        print(f"folder: {disk_bytes(Path(args.folder)) / 2**20:.1f} MiB")
        for name, size in sizes.items():
            print(f"{name} shards: {size / 2**20:.1f} MiB")
        print(f"fit-crop / originals bytes: {sizes['fit-crop'] / sizes['originals']:.3f}\n")

        results: dict[int, list[dict[str, Any]]] = {n: [] for n in ROWS}
        for round_index in range(args.rounds):
            for number in list(ROWS) if round_index % 2 == 0 else list(ROWS)[::-1]:
                command = [sys.executable, __file__, "--one-row", str(number), "--shards", temp]
                command += sys.argv[1:]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                results[number].append(json.loads(done.stdout.strip().splitlines()[-1]))
                rate = results[number][-1]["rate"]
                print(f"round {round_index + 1}: {ROWS[number]:<20} {rate:.0f} images/s")
        print_speed(results, args)

        mean, p99, crops = pixel_difference(shards, args.draws)
        print(f"\npixels, {crops} same-box 224x224 crops: mean |diff| {mean:.2f}, p99 {p99:.0f}")
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


def print_speed(results: dict[int, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    rates = {n: [r["rate"] for r in runs] for n, runs in results.items()}
    medians = {n: statistics.median(r) for n, r in rates.items()}
    print(
        f"\n{args.warmup_epochs} epoch(s) untimed, {args.epochs} timed; "
        f"median of {args.rounds} rounds (min-max)"
    )
    for number, name in ROWS.items():
        low, high = min(rates[number]), max(rates[number])
        note = results[number][-1]["note"]
        print(f"{name:<20} {medians[number]:>6.0f} ({low:.0f}-{high:.0f})  {note}")
    for top, bottom in [(3, 1), (3, 2), (2, 1)]:
        pairs = [a / b for a, b in zip(rates[top], rates[bottom], strict=True)]
        print(
            f"{ROWS[top]} / {ROWS[bottom]}: {medians[top] / medians[bottom]:.2f}x "
            f"(rounds {min(pairs):.2f}x-{max(pairs):.2f}x)"
        )


if __name__ == "__main__":
    main()
