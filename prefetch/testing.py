"""Test helpers that ship with prefetch: tiny image trees and fault-injecting decoders.

Image trees are real JPEG/PNG files with learnable classes (one shape per class), written with
Pillow. The fakes wrap the default decoder to sleep or raise at chosen files; they are
plain picklable classes, so they work in thread and process workers alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from prefetch.decode import DecodeOptions, decode_image

SHAPES = ("circle", "square", "triangle", "cross", "ring", "stripes")


def draw_shape(shape: str, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """An RGB image (width, height = size) of `shape` in a random colour, place and scale."""
    width, height = size
    background = tuple(int(v) for v in rng.integers(0, 90, size=3))
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    colour = tuple(int(v) for v in rng.integers(140, 256, size=3))
    radius = min(width, height) * rng.uniform(0.22, 0.38)
    cx = width / 2 + rng.uniform(-0.12, 0.12) * width
    cy = height / 2 + rng.uniform(-0.12, 0.12) * height
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    line = max(2, int(radius / 3))
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon(
            [(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], colour
        )
    elif shape == "cross":
        draw.rectangle((cx - radius, cy - line / 2, cx + radius, cy + line / 2), fill=colour)
        draw.rectangle((cx - line / 2, cy - radius, cx + line / 2, cy + radius), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=line)
    elif shape == "stripes":
        for x in range(0, width, 2 * line):
            draw.rectangle((x, 0, x + line - 1, height), fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; choose from {SHAPES}")
    noise = rng.integers(-12, 13, size=(height, width, 3))
    return Image.fromarray(np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8))


def write_image_folder(
    root: str | os.PathLike[str],
    *,
    class_names: Sequence[str] = ("circle", "square", "triangle"),
    per_class: int = 8,
    size: tuple[int, int] = (48, 40),
    image_format: str = "JPEG",
    seed: int = 0,
) -> Path:
    """Write `root/<class>/<class>_<i>.<ext>` images and return `root`.

    A class named after one of `SHAPES` draws that shape; other names take the shapes in turn.
    `size` is (width, height) in Pillow order. `image_format` is a Pillow format name.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    extension = {"JPEG": "jpg"}.get(image_format.upper(), image_format.lower())
    for class_index, name in enumerate(class_names):
        shape = name if name in SHAPES else SHAPES[class_index % len(SHAPES)]
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw_shape(shape, size, rng).save(folder / f"{name}_{i:04d}.{extension}", image_format)
    return root


def write_bad_files(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Write one file of each kind of bad input into `folder`; returns {kind: path}.

    Kinds: "corrupt" (JPEG header, garbage body), "truncated" (a JPEG cut in half), "zero_byte",
    and "text" (a text file named .jpg).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    good = folder / "_good.tmp.jpg"
    draw_shape("circle", (64, 64), rng).save(good, "JPEG")
    data = good.read_bytes()
    good.unlink()
    paths = {
        "corrupt": folder / "bad_corrupt.jpg",
        "truncated": folder / "bad_truncated.jpg",
        "zero_byte": folder / "bad_zero_byte.jpg",
        "text": folder / "bad_text.jpg",
    }
    paths["corrupt"].write_bytes(data[:20] + rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())
    paths["truncated"].write_bytes(data[: len(data) // 2])
    paths["zero_byte"].write_bytes(b"")
    paths["text"].write_text("this is not an image\n")
    return paths


class SlowDecoder:
    """The default decoder, after sleeping `delay_s` per image (a slow disk or heavy decode)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        time.sleep(self.delay_s)
        return decode_image(path, options)


class FailingDecoder:
    """The default decoder, raising `error(message)` for any path containing `marker`."""

    def __init__(self, marker: str, error: type[Exception] = ValueError) -> None:
        self.marker = marker
        self.error = error

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        if self.marker in path:
            raise self.error(f"injected failure for {path}")
        return decode_image(path, options)


def small_cnn(size: int, classes: int) -> Any:
    """A compiled Keras CNN (3 conv layers) that learns the shape classes in a few epochs.

    Takes uint8 images (size, size, 3); imports Keras when called.
    """
    import keras

    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def assert_same_batches(
    got: Sequence[tuple[np.ndarray, np.ndarray]], expected: Sequence[tuple[np.ndarray, np.ndarray]]
) -> None:
    """Assert two runs gave the same number of batches with equal images and labels, in order."""
    assert len(got) == len(expected), f"{len(got)} batches, expected {len(expected)}"
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def random_flip_and_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A sample augmentation that uses its random generator: flip half the images, add noise."""
    if rng.random() < 0.5:
        image = image[:, ::-1]
    noisy = image.astype(np.int16) + rng.integers(-8, 9, size=image.shape, dtype=np.int16)
    result: np.ndarray = np.clip(noisy, 0, 255).astype(np.uint8)
    return result


class CrashingDecoder:
    """The default decoder, killing its worker process (`os._exit`) at any path with `marker`.

    With `once_flag` (a file path), it crashes only the first time: it creates the file before
    dying, so the restarted worker decodes the file normally. Use with backend="process".
    """

    def __init__(self, marker: str, once_flag: str | None = None, exit_code: int = 13) -> None:
        self.marker = marker
        self.once_flag = once_flag
        self.exit_code = exit_code

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        if self.marker in path:
            if self.once_flag is None:
                os._exit(self.exit_code)
            try:
                with open(self.once_flag, "x"):
                    pass
            except FileExistsError:
                pass
            else:
                os._exit(self.exit_code)
        return decode_image(path, options)
