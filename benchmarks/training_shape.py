"""Benchmark: the training shape of image loading (random crop + flip, and the eval centre crop).

On an image folder ROOT/<class>/<image>.jpg, 224x224 uint8 batches of 64, in one run:

  tf.data train recipe   Model Garden's ImageNet training input: extract_jpeg_shape,
                         sample_distorted_bounding_box (area 0.08-1, ratio 3/4-4/3, 10 attempts;
                         a failed draw falls back to the centre crop), decode_and_crop_jpeg,
                         bilinear resize, random flip, map(AUTOTUNE), batch, prefetch; files
                         shuffled every epoch
  tf.data eval recipe    Model Garden's centre crop: a square of int(224 / 256 x short side),
                         decode_and_crop_jpeg, bilinear resize, map(AUTOTUNE), batch, prefetch
  user Pillow source     what a user writes today: a __getitem__ that opens the file with
                         Pillow, picks a torchvision RandomResizedCrop box, resizes that box to
                         224x224 (bilinear) and flips; in prefetch.Loader(workers=2)
  prefetch train         prefetch.Loader(crop=RandomResizedCrop(...), flip=True)
  prefetch eval          prefetch.Loader(crop=CenterCrop(fraction=0.875))

Each row: one warm-up epoch, then whole epochs until --seconds have passed (or --epochs).

    python benchmarks/training_shape.py --folder /tmp/photos [--seconds 10] [--rows 1,3]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import prefetch

SIZE = 224
BATCH = 64
CROP_PADDING = 32  # Model Garden: centre crop = SIZE / (SIZE + 32) of the short side
Rate = tuple[float, int, int]  # images/s, images, epochs


def timed(epoch: Callable[[], int], seconds: float, epochs: int | None) -> Rate:
    """Images/s over whole epochs after one warm-up epoch: `epochs` of them, or until
    `seconds` have passed. `epoch()` runs one epoch and returns its image count."""
    epoch()
    began = time.perf_counter()
    images = done = 0
    while (done < epochs) if epochs else (done == 0 or time.perf_counter() - began < seconds):
        images += epoch()
        done += 1
    return images / (time.perf_counter() - began), images, done


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


def tf_dataset(folder: str, train: bool) -> Any:
    """Model Garden's ImageNet input (train: random crop and flip; eval: centre crop)."""
    import tensorflow as tf

    tf.random.set_seed(0)
    paths, labels = list_folder(folder)

    def load(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        contents = tf.io.read_file(path)
        shape = tf.io.extract_jpeg_shape(contents)
        window = random_window(shape) if train else centre_window(shape)
        image = tf.io.decode_and_crop_jpeg(contents, window, channels=3)
        image = tf.image.resize(image, [SIZE, SIZE], method="bilinear")
        if train:
            image = tf.image.random_flip_left_right(image)
        return tf.cast(image, tf.uint8), label

    data = tf.data.Dataset.from_tensor_slices((paths, labels))
    if train:
        data = data.shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
    data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return data.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def tf_rate(folder: str, train: bool, seconds: float, epochs: int | None) -> Rate:
    data = tf_dataset(folder, train)
    return timed(lambda: sum(int(images.shape[0]) for images, _ in data), seconds, epochs)


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


def loader_rate(loader: prefetch.Loader, seconds: float, epochs: int | None) -> tuple[Rate, str]:
    """Images/s of a Loader held open (`with`) across the warm-up and the timed epochs."""
    with loader:
        rate = timed(lambda: sum(len(batch.images) for batch in loader), seconds, epochs)
        stats = loader.stats()
    decoder = f", decoder {stats.decoder}" if hasattr(loader.source, "paths") else ""
    return rate, f"{stats.backend}, {stats.workers} workers{decoder}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="ROOT/<class>/<image>.jpg")
    parser.add_argument("--rows", default="1,2,3,4,5", help="comma list of row numbers (1-5)")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per row")
    parser.add_argument("--epochs", type=int, help="timed epochs per row (instead of --seconds)")
    parser.add_argument("--backend", help="backend of rows 4-5 (default: theirs)")
    parser.add_argument("--workers", help="workers of rows 4-5 (default: theirs)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    folder, seconds, epochs = args.folder, args.seconds, args.epochs
    passthrough: dict[str, Any] = {}
    if args.backend:
        passthrough["backend"] = args.backend
    if args.workers:
        passthrough["workers"] = args.workers if args.workers == "auto" else int(args.workers)
    common: dict[str, Any] = dict(batch_size=BATCH, image_size=(SIZE, SIZE), seed=0)

    def prefetch_row(crop: Callable[[], Any], flip: bool) -> tuple[Rate, str] | str:
        if not hasattr(prefetch, "RandomResizedCrop"):
            return "skipped: this prefetch has no RandomResizedCrop / CenterCrop yet"
        try:
            loader = prefetch.Loader(folder, crop=crop(), flip=flip, **common, **passthrough)
        except TypeError as error:
            return f"skipped: {error}"
        return loader_rate(loader, seconds, epochs)

    rows: dict[int, tuple[str, Callable[[], tuple[Rate, str] | str]]] = {
        1: ("tf.data train recipe", lambda: (tf_rate(folder, True, seconds, epochs), "AUTOTUNE")),
        2: ("tf.data eval recipe", lambda: (tf_rate(folder, False, seconds, epochs), "AUTOTUNE")),
        3: (
            "user Pillow source",
            lambda: loader_rate(
                prefetch.Loader(PillowCropSource(folder), workers=2, **common), seconds, epochs
            ),
        ),
        4: (
            "prefetch train",
            lambda: prefetch_row(
                lambda: prefetch.RandomResizedCrop(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)), True
            ),
        ),
        5: (
            "prefetch eval",
            lambda: prefetch_row(lambda: prefetch.CenterCrop(fraction=0.875), False),
        ),
    }
    chosen = [int(r) for r in args.rows.split(",")]

    paths, _ = list_folder(folder)
    sizes = []
    for path in paths[:: max(1, len(paths) // 200)]:
        with Image.open(path) as image:
            sizes.append(image.width * image.height)
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), cpu)
    load_before = os.getloadavg()[0]
    print(f"$ python {shlex.join(sys.argv)}")
    print(f"{cpu}; {len(os.sched_getaffinity(0))} cores; load average (1 min) {load_before:.2f}")
    print(
        f"{len(paths)} JPEGs, median {np.median(sizes) / 1e3:.0f} kpixel, "
        f"mean {np.mean([os.path.getsize(p) for p in paths]) / 1024:.0f} KiB -> "
        f"{SIZE}x{SIZE}, batch {BATCH}; "
        + (f"{epochs} epochs" if epochs else f"{seconds:g} s")
        + " per row after one warm-up epoch\n"
    )
    print(f"{'row':<24} {'images/s':>9}  {'timed':<18} notes")
    measured: dict[int, float] = {}
    for number in chosen:
        name, run = rows[number]
        result = run()
        if isinstance(result, str):
            print(f"{name:<24} {'-':>9}  {'':<18} {result}", flush=True)
            continue
        (rate, images, done), note = result
        measured[number] = rate
        print(f"{name:<24} {rate:>9.0f}  {f'{images} img, {done} ep':<18} {note}", flush=True)

    print()
    for top, bottom, label in [
        (4, 1, "prefetch train / tf.data train"),
        (4, 3, "prefetch train / user Pillow source"),
        (5, 2, "prefetch eval / tf.data eval"),
    ]:
        if top in measured and bottom in measured:
            print(f"{label:<38} {measured[top] / measured[bottom]:.2f}x")
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
