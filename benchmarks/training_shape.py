"""Benchmark: the training shape of image loading, at steady state, against the entropy floor.

On an image folder ROOT/<class>/<image>.jpg, 224x224 uint8 batches of 64, each row measured as a
training job runs it: one long-lived pipeline (tf.data: `.repeat()` and ONE iterator; prefetch:
one open Loader, epoch after epoch), `--warmup-epochs` (default 2) untimed, then `--epochs`
(default 6) timed, in a fresh process per row; `--rounds` rounds (default 3), the rows'
order reversed every other round; medians with their min-max range. "cold" is the rate of the
warm-up counted from the pipeline's construction: what a short job, or one that rebuilds its
pipeline every epoch (the old harness did), pays.

  1 tf.data train recipe  Model Garden's ImageNet training input: extract_jpeg_shape,
                          sample_distorted_bounding_box (area 0.08-1, ratio 3/4-4/3, 10 attempts;
                          a failed draw falls back to the centre crop), decode_and_crop_jpeg,
                          bilinear resize, random flip, map(AUTOTUNE), batch, prefetch; files
                          shuffled every epoch
  2 tf.data eval recipe   Model Garden's centre crop: a square of int(224 / 256 x short side),
                          decode_and_crop_jpeg, bilinear resize, map(AUTOTUNE), batch, prefetch
  3 user Pillow source    what a user writes today: a __getitem__ that opens the file with
                          Pillow, picks a torchvision RandomResizedCrop box, resizes that box to
                          224x224 (bilinear) and flips; in prefetch.Loader(workers=2)
  4 prefetch train        Loader(augment=Augment(RandomResizedCrop(...), flip=True))
  5 prefetch eval         Loader(augment=Augment(CenterCrop(fraction=0.875)))
  6 tf.data resize        the whole image resized (Keras's shape of the work): decode_jpeg,
                          bilinear resize, map(AUTOTUNE), batch, prefetch; shuffled
  7 prefetch resize       prefetch.Loader(folder) with its defaults
  8 floor train           the entropy floor (prefetch.tools.bench.floor_rate): libjpeg-turbo's
  9 floor eval            entropy decoding alone of the rows each sample needs (down to the
 10 floor resize          bottom of a RandomResizedCrop window, of the CenterCrop window, of the
                          whole image), no IDCT, colour or resize, one core, x usable cores: the
                          limit of any libjpeg-turbo loader on this machine

Every loader row is also shown as a fraction of its shape's floor.

    python benchmarks/training_shape.py --folder /tmp/photos [--rounds 3] [--rows 1,4,8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import prefetch
from prefetch.decode._decoders import DecodeOptions
from prefetch.runtime import usable_cores
from prefetch.tools.bench import Span, entropy_decoder, floor_rate, floor_sample, steady_rate

SIZE = 224
BATCH = 64
CROP_PADDING = 32  # Model Garden: centre crop = SIZE / (SIZE + 32) of the short side


def list_folder(folder: str) -> tuple[list[str], list[int]]:
    """ROOT/<class>/<file>.jpg, classes and files sorted (what a user's own source would do)."""
    classes = sorted(p for p in Path(folder).iterdir() if p.is_dir())
    pairs = [(str(f), c) for c, d in enumerate(classes) for f in sorted(d.glob("*.jp*g"))]
    return [p for p, _ in pairs], [c for _, c in pairs]


def centre_window(shape: Any) -> Any:
    """Model Garden's evaluation window of an image of `shape` (a tensor: height, width, ...):
    the centred square of SIZE / (SIZE + CROP_PADDING) of the short side, as
    [top, left, height, width] for `tf.io.decode_and_crop_jpeg`."""
    import tensorflow as tf

    height, width = shape[0], shape[1]
    short = tf.cast(tf.minimum(height, width), tf.float32)
    crop = tf.cast(SIZE / (SIZE + CROP_PADDING) * short, tf.int32)
    return tf.stack([((height - crop) + 1) // 2, ((width - crop) + 1) // 2, crop, crop])


def random_window(shape: Any) -> Any:
    """Model Garden's training window (`sample_distorted_bounding_box`, area 0.08-1, ratio
    3/4-4/3, 10 attempts), the centre window when every attempt failed."""
    import tensorflow as tf

    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(0.08, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    # Model Garden: a draw that failed returns the whole image; use the centre crop then
    # (decided before decoding here, so the fallback decodes once).
    failed = tf.logical_and(tf.equal(size[0], shape[0]), tf.equal(size[1], shape[1]))
    return tf.cond(failed, lambda: centre_window(shape), lambda: window)


def tf_dataset(folder: str, shape: str) -> Any:
    """Model Garden's ImageNet input ("train": random crop and flip; "eval": centre crop), or
    the whole image resized ("resize"), batched and prefetched."""
    import tensorflow as tf

    tf.random.set_seed(0)
    paths, labels = list_folder(folder)

    def load(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        contents = tf.io.read_file(path)
        if shape == "resize":
            image = tf.io.decode_jpeg(contents, channels=3)
        else:
            jpeg_shape = tf.io.extract_jpeg_shape(contents)
            window = random_window(jpeg_shape) if shape == "train" else centre_window(jpeg_shape)
            image = tf.io.decode_and_crop_jpeg(contents, window, channels=3)
        image = tf.image.resize(image, [SIZE, SIZE], method="bilinear")
        if shape == "train":
            image = tf.image.random_flip_left_right(image)
        return tf.cast(image, tf.uint8), label

    data = tf.data.Dataset.from_tensor_slices((paths, labels))
    if shape != "eval":
        data = data.shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
    data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return data.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def tf_stream(folder: str, shape: str) -> tuple[Iterator[int], str]:
    """One iterator over the dataset repeated, as a training job iterates it."""
    data = tf_dataset(folder, shape).repeat()
    return (int(images.shape[0]) for images, _ in data), "AUTOTUNE, .repeat(), one iterator"


class PillowCropSource:
    """A user's training source: Pillow, a torchvision RandomResizedCrop box, a flip.

    Not `paths`/`labels`: a source with a `paths` attribute is read as a file source, and
    the Loader would decode the files itself and never call `__getitem__`."""

    def __init__(self, folder: str, seed: int = 0) -> None:
        self.files, self.targets = list_folder(folder)
        self.seed = seed

    def __len__(self) -> int:
        return len(self.files)

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, ...]:
        """torchvision RandomResizedCrop.get_params: scale (0.08, 1), ratio (3/4, 4/3)."""
        area, log_ratio = width * height, (np.log(3 / 4), np.log(4 / 3))
        for _ in range(10):
            target_area = area * rng.uniform(0.08, 1.0)
            aspect = np.exp(rng.uniform(*log_ratio))
            w, h = round(np.sqrt(target_area * aspect)), round(np.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                left, top = (
                    int(rng.integers(0, width - w + 1)),
                    int(rng.integers(0, height - h + 1)),
                )
                return left, top, left + w, top + h
        if width / height < 3 / 4:
            w, h = width, round(width / (3 / 4))
        elif width / height > 4 / 3:
            w, h = round(height * 4 / 3), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng([self.seed, index])
        with Image.open(self.files[index]) as image:
            image = image.convert("RGB")
            box = self.box(image.width, image.height, rng)
            image = image.resize((SIZE, SIZE), Image.BILINEAR, box=box)
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(image), self.targets[index]


def loader_batches(loader: prefetch.Loader) -> Iterator[int]:
    """One open Loader, epoch after epoch."""
    while True:
        for batch in loader:
            count = len(batch.images)
            del batch
            yield count


def loader_note(loader: prefetch.Loader) -> str:
    stats = loader.stats()
    decoder = f", decoder {stats.decoder}" if hasattr(loader.source, "paths") else ""
    return f"{stats.backend}, {stats.workers} workers{decoder}"


FLOOR_CROPS: dict[str, Callable[[], Any]] = {
    "train": lambda: prefetch.RandomResizedCrop(),
    "eval": lambda: prefetch.CenterCrop(0.875),
    "resize": lambda: None,
}


def floor_row(folder: str, shape: str, warmup: int, epochs: int) -> dict[str, Any]:
    """The entropy floor of `shape` on the folder's files: images/s of one core x cores."""
    decode = entropy_decoder()
    if decode is None:
        return {
            "skipped": "no entropy-only decoder in this build (window_decode.entropy_decode_rows)"
        }
    paths, _ = list_folder(folder)
    options = DecodeOptions((SIZE, SIZE))
    sample = floor_sample(paths, FLOOR_CROPS[shape](), options)
    for _ in range(warmup):
        floor_rate(sample, decode)
    began = time.perf_counter()
    for _ in range(epochs):
        floor_rate(sample, decode)
    one_core = len(sample.data) * epochs / (time.perf_counter() - began)
    cores = usable_cores()
    return {
        "rate": one_core * cores,
        "cold": float("nan"),
        "note": f"{one_core:.0f}/s on 1 core x {cores}; rows needed: "
        f"{sample.rows_fraction:.0%} of each image on average",
    }


# row number -> (name, shape, what it runs: a stream factory, or "floor")
ROWS: dict[int, tuple[str, str, str]] = {
    1: ("tf.data train recipe", "train", "tf"),
    2: ("tf.data eval recipe", "eval", "tf"),
    3: ("user Pillow source", "train", "pillow"),
    4: ("prefetch train", "train", "prefetch"),
    5: ("prefetch eval", "eval", "prefetch"),
    6: ("tf.data resize", "resize", "tf"),
    7: ("prefetch resize", "resize", "prefetch"),
    8: ("floor train", "train", "floor"),
    9: ("floor eval", "eval", "floor"),
    10: ("floor resize", "resize", "floor"),
}


def one_row(args: argparse.Namespace) -> dict[str, Any]:
    """Measure row `args.one_row` in this (fresh) process."""
    folder = args.folder
    _, shape, kind = ROWS[args.one_row]
    if kind == "floor":
        return floor_row(folder, shape, args.warmup_epochs, args.epochs)
    images = len(list_folder(folder)[0])
    span = Span(args.warmup_epochs * images, args.epochs * images)
    common: dict[str, Any] = dict(batch_size=BATCH, image_size=(SIZE, SIZE), seed=0)
    if args.backend:
        common["backend"] = args.backend
    if args.workers:
        common["workers"] = args.workers if args.workers == "auto" else int(args.workers)
    began = time.perf_counter()
    if kind == "tf":
        stream, note = tf_stream(folder, shape)
        rate, _, cold = steady_rate(stream, span, began)
        return {"rate": rate, "cold": cold, "note": note}
    if kind == "pillow":
        loader = prefetch.Loader(PillowCropSource(folder), workers=2, batch_size=BATCH, seed=0)
    else:
        augment: dict[str, Any] = {
            "train": {"augment": prefetch.Augment(prefetch.RandomResizedCrop(), flip=True)},
            "eval": {"augment": prefetch.Augment(prefetch.CenterCrop(0.875))},
            "resize": {},
        }[shape]
        loader = prefetch.Loader(folder, **augment, **common)
    with loader:
        rate, _, cold = steady_rate(loader_batches(loader), span, began)
        note = loader_note(loader)
    return {"rate": rate, "cold": cold, "note": note}


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    return f"({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="ROOT/<class>/<image>.jpg")
    parser.add_argument("--rows", default="1,2,3,4,5,6,7,8,9,10", help="comma list (1-10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, rows alternating")
    parser.add_argument("--warmup-epochs", type=int, default=2, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=6, help="timed epochs per row")
    parser.add_argument("--backend", help="backend of the prefetch rows (default: theirs)")
    parser.add_argument("--workers", help="workers of the prefetch rows (default: theirs)")
    parser.add_argument("--one-row", type=int, help=argparse.SUPPRESS)  # a row's own process
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.one_row:
        print(json.dumps(one_row(args)), flush=True)
        os._exit(0)  # TensorFlow's threads end with the process (every Loader is closed)
    chosen = [int(r) for r in args.rows.split(",")]
    print_header(args)
    results: dict[int, list[dict[str, Any]]] = {number: [] for number in chosen}
    for round_index in range(args.rounds):
        for number in chosen if round_index % 2 == 0 else chosen[::-1]:
            command = [sys.executable, __file__, "--one-row", str(number)]
            command += [a for a in sys.argv[1:] if a != "--one-row"]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            lines = done.stdout.strip().splitlines()
            if done.returncode != 0 or not lines:
                error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                results[number].append({"skipped": f"failed: {error}"})
            else:
                results[number].append(json.loads(lines[-1]))
            row = results[number][-1]
            rate = f"{row['rate']:.0f} images/s" if "rate" in row else row["skipped"]
            print(f"round {round_index + 1}: {ROWS[number][0]:<22} {rate}", file=sys.stderr)
    print_table(chosen, results)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


def print_header(args: argparse.Namespace) -> None:
    paths, _ = list_folder(args.folder)
    sizes = []
    for path in paths[:: max(1, len(paths) // 200)]:
        with Image.open(path) as image:
            sizes.append(image.width * image.height)
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), cpu)
    print(f"$ python {shlex.join(sys.argv)}")
    print(f"{cpu}; {usable_cores()} cores; load average (1 min) {os.getloadavg()[0]:.2f}")
    print(
        f"{len(paths)} JPEGs, median {np.median(sizes) / 1e3:.0f} kpixel, "
        f"mean {np.mean([os.path.getsize(p) for p in paths]) / 1024:.0f} KiB -> "
        f"{SIZE}x{SIZE}, batch {BATCH}; each row in a fresh process, one pipeline, "
        f"{args.warmup_epochs} epochs untimed, then {args.epochs} timed; median of "
        f"{args.rounds} rounds (min-max), rows alternating\n"
    )


def print_table(chosen: list[int], results: dict[int, list[dict[str, Any]]]) -> None:
    medians: dict[int, float] = {}
    rates: dict[int, list[float]] = {}
    for number in chosen:
        rates[number] = [r["rate"] for r in results[number] if "rate" in r]
        if rates[number]:
            medians[number] = statistics.median(rates[number])
    floors = {shape: n for n, (_, shape, kind) in ROWS.items() if kind == "floor"}
    print(f"{'row':<22} {'images/s':>9} {'(min-max)':>13} {'cold':>6} {'of floor':>9}  notes")
    for number in chosen:
        name, shape, kind = ROWS[number]
        runs = results[number]
        if number not in medians:
            print(f"{name:<22} {'-':>9} {'':>13} {'':>6} {'':>9}  {runs[-1].get('skipped')}")
            continue
        colds = [r["cold"] for r in runs if "rate" in r and r["cold"] == r["cold"]]
        cold = f"{statistics.median(colds):.0f}" if colds else "-"
        floor = medians.get(floors[shape])
        share = f"{medians[number] / floor:.2f}x" if floor and kind != "floor" else ""
        print(
            f"{name:<22} {medians[number]:>9.0f} {spread(rates[number]):>13} {cold:>6} "
            f"{share:>9}  {runs[-1]['note']}"
        )
    print()
    for top, bottom in [(4, 1), (4, 3), (5, 2), (7, 6)]:
        if top in medians and bottom in medians:
            pairs = [
                a["rate"] / b["rate"]
                for a, b in zip(results[top], results[bottom], strict=True)
                if "rate" in a and "rate" in b
            ]
            label = f"{ROWS[top][0]} / {ROWS[bottom][0]}"
            within = f" (rounds {min(pairs):.2f}x-{max(pairs):.2f}x)" if len(pairs) > 1 else ""
            print(f"{label:<44} {medians[top] / medians[bottom]:.2f}x{within}")


if __name__ == "__main__":
    main()
