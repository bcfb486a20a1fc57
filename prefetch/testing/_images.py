"""Files to test on: small image trees with one learnable shape per class, bad files of
every kind a loader must refuse, and valid images in unusual modes (with what to expect)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from prefetch.testing.bombs import (
    write_decompression_bomb,
    write_scan_bomb,
)

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


# The kinds of bad input that `write_bad_files` writes; the first four are its default.
BAD_FILE_KINDS = ("corrupt", "truncated", "zero_byte", "text", "bomb", "scans", "unreadable")


def write_bad_files(
    folder: str | os.PathLike[str],
    kinds: Sequence[str] = ("corrupt", "truncated", "zero_byte", "text"),
) -> dict[str, Path]:
    """Write one file of each of `kinds` of bad input into `folder`; returns {kind: path}.

    Kinds (see `BAD_FILE_KINDS`): "corrupt" (JPEG header, garbage body), "truncated" (a JPEG
    cut in half), "zero_byte", "text" (a text file named .jpg), "bomb" (`bad_bomb.png`, see
    `write_decompression_bomb`), "scans" (a JPEG of too many scans, `write_scan_bomb`) and
    "unreadable" (a valid JPEG with permission bits 000; a
    process with CAP_DAC_OVERRIDE, such as root, still reads it: check with `os.access`).
    """
    unknown = [kind for kind in kinds if kind not in BAD_FILE_KINDS]
    if unknown:
        raise ValueError(f"unknown bad file kinds {unknown}; choose from {BAD_FILE_KINDS}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    good = folder / "_good.tmp.jpg"
    draw_shape("circle", (64, 64), rng).save(good, "JPEG")
    data = good.read_bytes()
    good.unlink()
    garbage = rng.integers(0, 256, 2000, dtype=np.uint8).tobytes()
    paths = {}
    for kind in kinds:
        target = folder / (f"bad_{kind}.png" if kind == "bomb" else f"bad_{kind}.jpg")
        target.unlink(missing_ok=True)  # an earlier "unreadable" file cannot be overwritten
        if kind == "corrupt":
            target.write_bytes(data[:20] + garbage)
        elif kind == "truncated":
            target.write_bytes(data[: len(data) // 2])
        elif kind == "zero_byte":
            target.write_bytes(b"")
        elif kind == "text":
            target.write_text("this is not an image\n")
        elif kind == "bomb":
            write_decompression_bomb(target)
        elif kind == "scans":
            write_scan_bomb(target)
        else:
            target.write_bytes(data)
            target.chmod(0)
        paths[kind] = target
    return paths


class OddImage(NamedTuple):
    """A valid image in an unusual mode, and what a correct decoder makes of it.

    `rgba` is the expected (height, width, 4) uint8 result at the file's own size with
    `color_mode="rgba"`; `rgba[..., :3]` is the expected "rgb" result. Each channel may differ
    from it by at most `tolerance` (JPEG is lossy; PNGs are exact).
    """

    path: Path
    rgba: np.ndarray
    tolerance: int


def write_odd_images(
    folder: str | os.PathLike[str], size: tuple[int, int] = (16, 16)
) -> dict[str, OddImage]:
    """Write valid images in unusual modes into `folder`; returns {kind: OddImage}.

    `size` is (width, height), even. Kinds: "gray_jpeg" (mode L, gray 200), "cmyk_jpeg" (CMYK
    (0, 200, 255, 55), which is RGB (200, 43, 0)), "gray16_png" (16-bit gray, 0x3210 on the
    left half and 0xC8FF on the right: 50 and 200 in 8 bits, where clipping would give 255),
    and "palette_png" (a palette PNG whose left half is a transparent magenta palette entry and
    whose right half is opaque (0, 128, 255)).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    half = width // 2

    def expected(left: tuple[int, ...], right: tuple[int, ...]) -> np.ndarray:
        rgba = np.empty((height, width, 4), np.uint8)
        rgba[:, :half], rgba[:, half:] = left, right
        return rgba

    gray, orange = (200, 200, 200, 255), (200, 43, 0, 255)
    images = {
        "gray_jpeg": OddImage(folder / "odd_gray.jpg", expected(gray, gray), 3),
        "cmyk_jpeg": OddImage(folder / "odd_cmyk.jpg", expected(orange, orange), 3),
        "gray16_png": OddImage(
            folder / "odd_gray16.png", expected((50, 50, 50, 255), (200, 200, 200, 255)), 0
        ),
        "palette_png": OddImage(
            folder / "odd_palette.png", expected((255, 0, 255, 0), (0, 128, 255, 255)), 0
        ),
    }
    Image.new("L", size, 200).save(images["gray_jpeg"].path, "JPEG")
    Image.new("CMYK", size, (0, 200, 255, 55)).save(images["cmyk_jpeg"].path, "JPEG")
    gray16 = np.full((height, width), 0xC8FF, np.uint16)
    gray16[:, :half] = 0x3210
    Image.fromarray(gray16).save(images["gray16_png"].path)
    indices = np.zeros((height, width), np.uint8)
    indices[:, half:] = 1
    palette = Image.fromarray(indices, "P")
    palette.putpalette([255, 0, 255, 0, 128, 255])
    palette.save(images["palette_png"].path, transparency=0)
    return images
