"""The real encodes the JPEG corpus (`prefetch.testing.corpus`) mutates: `encode_seeds(rng)`.

Pillow (libjpeg-turbo) makes 4:4:4, 4:2:2 and 4:2:0, optimized Huffman tables, progressive,
restart intervals (in blocks and in rows), gray, CMYK and RGB (no colour transform) files, and
images at and just over the corpus's pixel bound. Where installed, OpenCV adds 4:1:1 and 4:4:0
and libjpeg-turbo's `cjpeg` (Debian: libjpeg-turbo-progs) adds any sampling factors from 1x1 to
4x4 per component and arithmetic coding (sequential and progressive). Two files are crafted
from a Pillow encode: a 12-bit frame header (SOF1, precision 12: libjpeg-turbo's 8-bit build and
Pillow refuse it) and an arithmetic-coded frame (SOF9) over Huffman-coded data (any decoder
decodes it to some image, or refuses it). The pixels are a seeded picture (gradients, shapes,
noise), so every seed is deterministic for a given `rng` and the same encoders.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from PIL import Image, ImageDraw

from prefetch.testing._jpeg_segments import SOF_MARKERS, segments

# What a decoder owes a file (prefetch.testing.corpus.EXPECTATIONS says what each means).
DECODED, SAME, REFUSED, TOO_LARGE, ANY = "decoded", "same", "refused", "too large", "any"


@dataclass(frozen=True)
class Seed:
    """One real encode: its `name` (encoder and settings), its bytes, and what a decoder owes
    it. `standard_tables`: its Huffman tables are libjpeg's standard ones (Annex K), so the same
    file without its DHT segments is legal and decodes to the same pixels. `expect`: "decoded"
    (every decoder must decode it), "refused" or "too large" (every decoder must refuse it; the
    latter by its pixel count), or "any" (crafted: only the paths' agreement is asked)."""

    name: str
    data: bytes
    standard_tables: bool
    expect: str = DECODED


def picture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A seeded HxWx3 uint8 picture with smooth gradients, edges in every colour and noise:
    enough detail for every coefficient and table to be used."""
    rows = np.linspace(0.0, 1.0, height)[:, None, None]
    columns = np.linspace(0.0, 1.0, width)[None, :, None]
    low, high = rng.uniform(0, 255, (2, 1, 1, 3))
    gradient = low + (high - low) * (0.6 * rows + 0.4 * columns)
    image = Image.fromarray(np.clip(gradient, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, x1 = sorted(rng.integers(0, max(width, 2), 2).tolist())
        y0, y1 = sorted(rng.integers(0, max(height, 2), 2).tolist())
        colour = tuple(rng.integers(0, 256, 3).tolist())
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1, y1), fill=colour)
    noisy = np.asarray(image, np.int16) + rng.integers(-12, 13, (height, width, 3))
    pixels: np.ndarray = np.clip(noisy, 0, 255).astype(np.uint8)
    return pixels


def _pillow(pixels: np.ndarray, mode: str = "RGB", quality: int = 90, **options: object) -> bytes:
    """Pillow's encode of `pixels` converted to `mode`, with JPEG save `options`."""
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", quality=quality, **options)
    return out.getvalue()


def _opencv(pixels: np.ndarray, factor_name: str) -> bytes | None:
    """An OpenCV encode with sampling factor `factor_name` ("411", "440"), or None without
    OpenCV (the `fast` extra)."""
    try:
        import cv2
    except ImportError:
        return None
    factor = getattr(cv2, f"IMWRITE_JPEG_SAMPLING_FACTOR_{factor_name}")
    settings = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor]
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(pixels[:, :, ::-1]), settings)
    return bytes(encoded) if ok else None


def _cjpeg(arguments: tuple[str, ...], pixels: np.ndarray) -> bytes | None:
    """libjpeg-turbo's `cjpeg` of `pixels` (a PPM on its stdin) with `arguments`, or None where
    `cjpeg` is not on PATH."""
    program = shutil.which("cjpeg")
    if program is None:
        return None
    height, width = pixels.shape[:2]
    ppm = f"P6 {width} {height} 255\n".encode() + pixels.tobytes()
    done = subprocess.run(
        [program, "-quality", "90", *arguments], input=ppm, capture_output=True, check=True
    )
    return done.stdout


def _patched_frame(data: bytes, marker: int, precision: int | None = None) -> bytes:
    """`data` with its frame marker set to `marker` (and its sample precision to `precision`);
    for an arithmetic-coded frame (SOF9) its DHT segments are dropped."""
    parts = segments(data)
    frame = next(part for part in parts if part.marker in SOF_MARKERS)
    out = bytearray(data)
    out[frame.start + 1] = marker
    if precision is not None:
        out[frame.start + 4] = precision
    if marker == 0xC9:
        for part in reversed([p for p in parts if p.marker == 0xC4]):
            del out[part.start : part.end]
    return bytes(out)


# cjpeg's -sample settings beyond Pillow's (luma first; a component's factors are HxV, 1-4 each;
# libjpeg decodes at most 10 blocks an MCU, so the sums stay within that).
_CJPEG_SAMPLINGS = (
    "1x1",
    "2x1,1x1,1x1",
    "1x2,1x1,1x1",
    "4x1,1x1,1x1",
    "1x4,1x1,1x1",
    "4x2,1x1,1x1",
    "3x2,1x1,1x1",
    "3x1,1x1,1x1",
    "2x2,2x1,1x2",
    "1x1,2x2,1x1",
)


# What makes each seed from a picture: (name, encoder, whether its Huffman tables are the
# standard ones). An encoder returns None where its program or package is not installed.
Recipe = tuple[str, Callable[[np.ndarray], "bytes | None"], bool]


def _recipes() -> list[Recipe]:
    recipes: list[Recipe] = []
    for sampling in ("4:4:4", "4:2:2", "4:2:0"):
        recipes.append((f"pillow-{sampling}", partial(_pillow, subsampling=sampling), True))
        optimized = partial(_pillow, subsampling=sampling, optimize=True, quality=60)
        recipes.append((f"pillow-{sampling}-optimized", optimized, False))
    recipes += [
        ("pillow-progressive", partial(_pillow, progressive=True), False),
        ("pillow-restart-blocks", partial(_pillow, restart_marker_blocks=3), True),
        ("pillow-restart-rows", partial(_pillow, restart_marker_rows=1), True),
        ("pillow-gray", partial(_pillow, mode="L"), True),
        ("pillow-gray-optimized", partial(_pillow, mode="L", optimize=True), False),
        ("pillow-cmyk", partial(_pillow, mode="CMYK"), True),
        ("pillow-rgb", partial(_pillow, keep_rgb=True, subsampling="4:4:4"), True),
        ("pillow-q100", partial(_pillow, quality=100), True),
        ("opencv-411", partial(_opencv, factor_name="411"), True),
        ("opencv-440", partial(_opencv, factor_name="440"), True),
    ]
    for sampling in _CJPEG_SAMPLINGS:
        recipes.append((f"cjpeg-{sampling}", partial(_cjpeg, ("-sample", sampling)), True))
    restart = partial(_cjpeg, ("-restart", "2B", "-sample", "2x2,1x1,1x1"))
    progressive = partial(_cjpeg, ("-arithmetic", "-progressive", "-sample", "2x1,1x1,1x1"))
    return [
        *recipes,
        ("cjpeg-gray-4x4", partial(_cjpeg, ("-grayscale", "-sample", "4x4")), True),
        ("cjpeg-restart", restart, True),
        ("cjpeg-arithmetic", partial(_cjpeg, ("-arithmetic",)), False),
        ("cjpeg-arithmetic-progressive", progressive, False),
    ]


def encode_seeds(rng: np.random.Generator, bound: int) -> list[Seed]:
    """The corpus's seeds, drawn from `rng`: every encode this machine can make (OpenCV's and
    cjpeg's only where installed), at sizes under `bound` pixels, and one of exactly `bound`
    pixels and one just over it ("too large" for a loader with `max_pixels=bound`)."""
    side = int(bound**0.5)
    bound_width = next(w for w in range(side, 0, -1) if bound % w == 0)
    at_bound = (bound // bound_width, bound_width)  # exactly `bound` pixels

    def size() -> tuple[int, int]:  # (height, width), from 17 pixels up to about bound / 2
        height = int(rng.integers(17, side))
        return height, int(rng.integers(17, max(18, bound // 2 // height)))

    seeds = []
    for name, encode, standard in _recipes():
        data = encode(picture(rng, *size()))
        if data is not None:
            seeds.append(Seed(name, data, standard))
    tiny = Image.fromarray(picture(rng, 3, 5))
    seeds.append(Seed("pillow-5x3", _jpeg(tiny), True))
    seeds.append(Seed("pillow-1x1", _jpeg(tiny.resize((1, 1))), True))
    seeds.append(Seed("pillow-at-bound", _pillow(picture(rng, *at_bound)), True))
    over = _pillow(picture(rng, at_bound[0], at_bound[1] + 1))
    seeds.append(Seed("pillow-over-bound", over, True, expect=TOO_LARGE))
    base = _pillow(picture(rng, *size()))
    seeds.append(Seed("crafted-12-bit", _patched_frame(base, 0xC1, 12), False, expect=REFUSED))
    seeds.append(Seed("crafted-arithmetic", _patched_frame(base, 0xC9), False, expect=ANY))
    return seeds


def _jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()
