"""Benchmark: how far the crop path's pixels are from torchvision's and tf.data's, same windows.

For each JPEG of a folder, the window `RandomResizedCrop()` (or `CenterCrop()`) draws for
sample i is decoded and resized four ways, and compared with prefetch's output for it:

  prefetch          `prefetch.decode._window.decode_window` (what `Loader(crop=...)` delivers)
  tf.data           `tf.io.decode_and_crop_jpeg` of the same window at full size, then
                    `tf.image.resize` (bilinear, no antialiasing), rounded to uint8: TF Model
                    Garden's recipe
  torchvision       Pillow's full decode, `crop` of the window, `resize` bilinear (antialiased):
                    what torchvision's `RandomResizedCrop` does to a PIL image
  full + area       Pillow's full decode, the window cut, OpenCV's INTER_AREA (a true average)

Prints the mean absolute difference per value and its 99th percentile, averaged over images.

    python benchmarks/crop_pixels.py --folder /tmp/photos [--images 200] [--crop center]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import cv2
import numpy as np
from PIL import Image

from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions
from prefetch.plan._crops import Augment, Box, CenterCrop, RandomResizedCrop

SIZE = (224, 224)


def references(path: Path, box: Box, tf: object) -> dict[str, np.ndarray]:
    """The window decoded and resized by tf.data's recipe, torchvision's PIL path and an area
    average of a full decode."""
    top, left, height, width = box
    data = path.read_bytes()
    window = tf.io.decode_and_crop_jpeg(data, [top, left, height, width], channels=3)  # type: ignore[attr-defined]
    resized = tf.image.resize(window, SIZE)  # type: ignore[attr-defined]
    tf_pixels = np.clip(np.rint(resized.numpy()), 0, 255).astype(np.uint8)
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        torchvision = rgb.crop((left, top, left + width, top + height)).resize(
            SIZE[::-1], Image.Resampling.BILINEAR
        )
        full = np.asarray(rgb)[top : top + height, left : left + width]
    area = cv2.resize(full, SIZE[::-1], interpolation=cv2.INTER_AREA)
    return {"tf.data": tf_pixels, "torchvision": np.asarray(torchvision), "full + area": area}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--crop", choices=("random-resized", "center"), default="random-resized")
    args = parser.parse_args()
    import tensorflow as tf

    crop = RandomResizedCrop() if args.crop == "random-resized" else CenterCrop()
    options = DecodeOptions(SIZE)
    paths = sorted(Path(args.folder).rglob("*.jpg"))[: args.images]
    means: dict[str, list[float]] = {}
    p99s: dict[str, list[float]] = {}
    for index, path in enumerate(paths):
        ours = window_decode.decode_window(
            str(path), crop, Augment.rng(0, 0, index), options, "turbo"
        )
        with Image.open(path) as image:
            box = crop.box(image.height, image.width, SIZE, Augment.rng(0, 0, index))
        for name, pixels in references(path, box, tf).items():
            difference = np.abs(ours.astype(int) - pixels.astype(int))
            means.setdefault(name, []).append(float(difference.mean()))
            p99s.setdefault(name, []).append(float(np.percentile(difference, 99)))
    print(f"{len(paths)} images of {args.folder}, {crop!r} to {SIZE[0]}x{SIZE[1]}")
    print(f"{'prefetch against':16s} {'mean |diff|':>12s} {'p99 |diff|':>11s}")
    for name in means:
        print(f"{name:16s} {np.mean(means[name]):12.2f} {np.mean(p99s[name]):11.1f}")


if __name__ == "__main__":
    main()
