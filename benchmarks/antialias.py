"""Benchmark: the cheapest antialiased JPEG decode + resize, and how close its pixels are.

For every JPEG of a folder (real photos: ../shared/tools/make_photo_folder.py), each candidate
decodes the file and resizes it to the target size (stretch layout, RGB, uint8). Per candidate:

- CPU ms per image on the calling thread (`time.thread_time`: robust to other busy processes)
  and of the whole process (where TensorFlow hands work to its own threads the two differ):
  medians over `--passes` passes, the candidates interleaved within each pass so that a change
  of load hits them alike; OpenCV and TensorFlow are limited to one thread;
- mean and 99th-percentile absolute difference per pixel value (0-255), over all images, from
  1. "exact": the full-size accurate-DCT decode (Pillow) resized in float64 with Pillow's
     BILINEAR filter (a triangle whose support widens with the scale), rounded once at the end
     (checked against Pillow's float ("F" mode) resize on the first photo);
  2. "tf AA": `tf.image.resize(antialias=True)` of the same full-size decode, rounded;
  3. "Keras": `tf.io.decode_jpeg` + `tf.image.resize` bilinear without antialiasing, rounded
     (what `keras.utils.image_dataset_from_directory` computes), for context;
- the GIL, on the first `--thread-images` photos in 1 and 2 threads: the wall-time speed-up
  and the parallel CPU (CPU time of both threads / wall time: it stays <= 1.0 for a candidate
  that holds the GIL, whatever the load; other processes can only lower it), with a control
  (decode_image under a lock); and the share of calls, on the largest photo (or
  `--gil-photo`), during which a pure-Python counter thread made progress (about 100%: the
  candidate releases the GIL; controls: time.sleep about 100%, sorted() about 15%).

The "recommended" row is `recommended()`, the cheapest path found within mean <= 1 and
p99 <= 4 of the exact reference, written out self-contained. Rows marked "(decode only)" are
decode costs without a resize, for scale; their pixels are not compared.

    python benchmarks/antialias.py --folder /tmp/aa_photos [--images 300] [--size 224x224]
        [--passes 5] [--thread-images 60] [--thread-passes 3] [--photo-size 500x375]
        [--only "recommended,decode_image"] [--gil-photo BIG.jpg]

Photo folders: `python ../shared/tools/make_photo_folder.py --root /tmp/aa_photos --n 300`
(ImageNet sizes) and `... --root /tmp/aa_large --n 60 --large` (1920x1080, 2048x1536).

Needs the `fast` extra (simplejpeg, OpenCV); TensorFlow rows and references are left out when
TensorFlow does not import.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from decoders import (  # benchmarks/decoders.py, beside this
    calls_with_other_thread_running,
    single_threaded_tensorflow,
)
from PIL import Image

from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.decode._turbo import decode_turbo

try:
    import cv2
    import simplejpeg
except ImportError as error:  # pragma: no cover - a message instead of a traceback
    raise SystemExit(f"benchmarks/antialias.py needs the fast extra: {error}") from error

Size = tuple[int, int]  # (height, width)
Candidate = Callable[[str, Size], np.ndarray]

BILINEAR = Image.Resampling.BILINEAR
# How long the GIL counter check (benchmarks/decoders.py's) runs per candidate.
GIL_CHECK_S = 0.3
# The 2-thread control: this row's candidate run under a lock (what a GIL-holding decoder does).
BASELINE = "decode_image (PIL draft>=2x + BILINEAR)"
SERIALISED = "decode_image under a lock (serialised)"


# ---------------------------------------------------------------------------------------------
# Decoders: path -> full-size (or DCT-scaled) HxWx3 uint8


def read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def pow2_factor(height: int, width: int, size: Size, keep: float) -> int:
    """Largest power-of-two DCT scale-down (1, 2, 4, 8) keeping >= keep x the target."""
    factor = 1
    while factor < 8 and (
        math.ceil(height / (2 * factor)) >= keep * size[0]
        and math.ceil(width / (2 * factor)) >= keep * size[1]
    ):
        factor *= 2
    return factor


def turbo(
    path: str,
    size: Size,
    *,
    fastdct: bool = False,
    fastupsample: bool = False,
    keep: float = 0.0,
    any_scale: bool = False,
) -> np.ndarray:
    """simplejpeg (libjpeg-turbo). With `keep` > 0, at the smallest DCT scale that keeps at
    least `keep` x the target on both axes: a power of two (1/2, 1/4, 1/8, as decode_turbo
    does), or with `any_scale` whatever simplejpeg's min_height / min_width pick, which
    includes libjpeg-turbo's M/8 scales (5/8 for 500x375 -> 224: 313x235)."""
    data = read(path)
    min_height = min_width = 0
    if keep and any_scale:
        min_height, min_width = math.ceil(keep * size[0]), math.ceil(keep * size[1])
    elif keep:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        factor = pow2_factor(height, width, size, keep)
        min_height, min_width = -(-height // factor), -(-width // factor)
    pixels: np.ndarray = simplejpeg.decode_jpeg(
        data,
        fastdct=fastdct,
        fastupsample=fastupsample,
        min_height=min_height,
        min_width=min_width,
    )
    return pixels


def opencv_decode(path: str, size: Size) -> np.ndarray:
    """cv2.imdecode straight to RGB (OpenCV's own libjpeg-turbo, accurate DCT)."""
    data = np.frombuffer(read(path), np.uint8)
    pixels: np.ndarray = cv2.imdecode(data, cv2.IMREAD_COLOR_RGB)
    return pixels


def pillow_decode(path: str, size: Size, *, draft: float = 0.0) -> Image.Image:
    """Pillow (accurate DCT); with `draft` > 0, at the smallest DCT scale whose size is at
    least `draft` x the target (Image.draft)."""
    with Image.open(path) as image:
        if draft:
            image.draft("RGB", (math.ceil(draft * size[1]), math.ceil(draft * size[0])))
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")


# ---------------------------------------------------------------------------------------------
# Resizers: HxWx3 uint8 (or a Pillow image) -> target HxWx3 uint8


def pil_bilinear(pixels: np.ndarray | Image.Image, size: Size, gap: float | None = None) -> Any:
    """Pillow's antialiased BILINEAR; with `gap`, its integer box `reduce` first (while the
    remaining scale stays >= gap), then the filter (Image.resize's reducing_gap)."""
    image = Image.fromarray(pixels) if isinstance(pixels, np.ndarray) else pixels
    return np.asarray(image.resize((size[1], size[0]), BILINEAR, reducing_gap=gap))


def pil_reduce_bilinear(image: Image.Image, size: Size) -> np.ndarray:
    """Pillow: Image.reduce by the integer part of the scale per axis, then BILINEAR."""
    factors = (max(1, image.width // size[1]), max(1, image.height // size[0]))
    if factors != (1, 1):
        image = image.reduce(factors)
    return np.asarray(image.resize((size[1], size[0]), BILINEAR))


def cv_area(pixels: np.ndarray, size: Size) -> np.ndarray:
    resized: np.ndarray = cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    return resized


def cv_linear(pixels: np.ndarray, size: Size, exact: bool = False) -> np.ndarray:
    if pixels.shape[:2] == size:
        return pixels
    method = cv2.INTER_LINEAR_EXACT if exact else cv2.INTER_LINEAR
    resized: np.ndarray = cv2.resize(pixels, (size[1], size[0]), interpolation=method)
    return resized


def box_factors(shape: tuple[int, ...], size: Size) -> tuple[int, int]:
    """Integer part of the scale per axis, (rows, columns), at least 1."""
    return max(1, shape[0] // size[0]), max(1, shape[1] // size[1])


def cv_box(pixels: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    """Mean of each factors[0] x factors[1] block: cv2.resize INTER_AREA by an integer factor
    (the last rows / columns that do not fill a block are dropped)."""
    fy, fx = factors
    if factors == (1, 1):
        return pixels
    height, width = pixels.shape[0] // fy, pixels.shape[1] // fx
    cropped = pixels[: height * fy, : width * fx]
    reduced: np.ndarray = cv2.resize(cropped, (width, height), interpolation=cv2.INTER_AREA)
    return reduced


def numpy_box(pixels: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    """cv_box with a numpy reshape-sum (rounded)."""
    fy, fx = factors
    if factors == (1, 1):
        return pixels
    height, width = pixels.shape[0] // fy, pixels.shape[1] // fx
    blocks = pixels[: height * fy, : width * fx].reshape(height, fy, width, fx, -1)
    total = blocks.sum(axis=(1, 3), dtype=np.uint32)
    return ((total + (fy * fx) // 2) // (fy * fx)).astype(np.uint8)


def box_linear(pixels: np.ndarray, size: Size, exact: bool = True, box: Any = cv_box) -> Any:
    """Integer box pre-reduction per axis, then bilinear interpolation (no antialiasing)."""
    return cv_linear(box(pixels, box_factors(pixels.shape, size)), size, exact)


def pyr_linear(pixels: np.ndarray, size: Size) -> np.ndarray:
    """cv2.pyrDown (5x5 Gaussian, halves both axes) while both scales are >= 2, then
    bilinear interpolation."""
    while pixels.shape[0] >= 2 * size[0] and pixels.shape[1] >= 2 * size[1]:
        pixels = cv2.pyrDown(pixels)
    return cv_linear(pixels, size)


def gauss_linear(
    pixels: np.ndarray,
    size: Size,
    *,
    beta: float = 0.5,
    reach: float = 2.0,
    pre: str = "",
) -> np.ndarray:
    """A separable Gaussian blur, then bilinear interpolation (cv2.INTER_LINEAR).

    Per axis of scale s (input / output pixels), Pillow's triangle has variance s^2 / 6
    (input pixels^2). The blur's variance is (s^2 - beta) / 6: beta = 1 subtracts the mean
    variance of bilinear interpolation (1/6), beta = 0.5 measured closer. The kernel covers
    +-reach sigma. `pre` reduces first, and the blur then only makes up the rest of the
    variance: "pyr" (cv2.pyrDown, variance 1, while both scales are >= 2) or "box" (the
    integer part of the scale per axis, cv_box: variance (f^2 - 1) / 12).
    """
    scale_y, scale_x = pixels.shape[0] / size[0], pixels.shape[1] / size[1]
    done = [0.0, 0.0]  # variance already applied, in input pixels^2
    step = [1.0, 1.0]  # input pixels per current pixel
    if pre == "pyr":
        while pixels.shape[0] >= 2 * size[0] and pixels.shape[1] >= 2 * size[1]:
            pixels = cv2.pyrDown(pixels)
            done = [d + s * s for d, s in zip(done, step, strict=True)]
            step = [2 * s for s in step]
    elif pre == "box":
        factors = box_factors(pixels.shape, size)
        pixels = cv_box(pixels, factors)
        done = [(f * f - 1) / 12 for f in factors]
        step = [float(f) for f in factors]
    sigmas = [
        math.sqrt(max(((s * s - beta) / 6 - d) / (p * p), 0.0))
        for s, d, p in zip((scale_y, scale_x), done, step, strict=True)
    ]
    ksize = tuple(2 * math.ceil(reach * s) + 1 if s > 0.05 else 1 for s in reversed(sigmas))
    if ksize != (1, 1):
        pixels = cv2.GaussianBlur(
            pixels, ksize, sigmaX=max(sigmas[1], 1e-3), sigmaY=max(sigmas[0], 1e-3)
        )
    return cv_linear(pixels, size)


def recommended(path: str, size: Size, keep: float = 2.0) -> np.ndarray:
    """The recommended antialiased path, self-contained: libjpeg-turbo's accurate DCT at the
    power-of-two DCT scale that keeps >= keep x the target (keep=2: decode_image's draft rule),
    then per axis of scale s a Gaussian of variance (s^2 - 0.5) / 6 (Pillow's triangle has
    s^2 / 6, bilinear interpolation adds about the rest), +-2 sigma, then cv2.INTER_LINEAR.
    Equal to the "sj acc dct2^k>=2x + gauss + LINEAR" row."""
    with open(path, "rb") as file:
        data = file.read()
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    factor = 1
    while factor < 8 and (
        -(-height // (2 * factor)) >= keep * size[0] and -(-width // (2 * factor)) >= keep * size[1]
    ):
        factor *= 2
    pixels = simplejpeg.decode_jpeg(
        data, fastdct=False, min_height=-(-height // factor), min_width=-(-width // factor)
    )
    scales = (pixels.shape[1] / size[1], pixels.shape[0] / size[0])  # x, y
    sigma_x, sigma_y = (math.sqrt(max((s * s - 0.5) / 6, 0.0)) for s in scales)
    ksize = tuple(2 * math.ceil(2 * s) + 1 if s > 0.05 else 1 for s in (sigma_x, sigma_y))
    if ksize != (1, 1):
        pixels = cv2.GaussianBlur(
            pixels, ksize, sigmaX=max(sigma_x, 1e-3), sigmaY=max(sigma_y, 1e-3)
        )
    resized: np.ndarray = cv2.resize(pixels, (size[1], size[0]), interpolation=cv2.INTER_LINEAR)
    return resized


# ---------------------------------------------------------------------------------------------
# Candidates


def chain(decode: Callable[..., Any], resize: Callable[..., Any], **decode_kw: Any) -> Candidate:
    def candidate(path: str, size: Size) -> np.ndarray:
        result: np.ndarray = resize(decode(path, size, **decode_kw), size)
        return result

    return candidate


def prefetch_decoder(decoder: Any, antialias: bool) -> Candidate:
    def candidate(path: str, size: Size) -> np.ndarray:
        result: np.ndarray = decoder(path, DecodeOptions(size, antialias=antialias))
        return result

    return candidate


def decode_only(decode: Callable[..., Any], **decode_kw: Any) -> Candidate:
    def candidate(path: str, size: Size) -> np.ndarray:
        return np.asarray(decode(path, size, **decode_kw))

    return candidate


def tf_candidate(tf: Any, antialias: bool, dct_method: str = "") -> Candidate:
    def candidate(path: str, size: Size) -> np.ndarray:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3, dct_method=dct_method)
        resized = tf.image.resize(image, size, "bilinear", antialias=antialias)
        return to_uint8(resized.numpy())

    return candidate


def candidates(tf: Any) -> dict[str, Candidate | None]:
    """Name -> candidate; None marks a section title. "acc" / "fast": libjpeg-turbo's
    accurate / fast integer DCT; "dct2^k>=Nx": a power-of-two DCT scale keeping >= N x the
    target; "dctM/8>=1x": simplejpeg's min_height / min_width (M/8 scales)."""
    fast: dict[str, Any] = {"fastdct": True}
    gauss = functools.partial
    table: dict[str, Candidate | None] = {
        "-- baselines": None,
        BASELINE: prefetch_decoder(decode_image, True),
        "decode_turbo (sj dct2^k>=1x + PIL)": prefetch_decoder(decode_turbo, True),
        "decode_turbo antialias=False (no AA)": prefetch_decoder(decode_turbo, False),
        "recommended: sj dct2^k>=2x+gauss+LINEAR": recommended,
        "-- Pillow decode (accurate DCT)": None,
        "PIL + BILINEAR (no draft)": chain(pillow_decode, pil_bilinear),
        "PIL + BILINEAR gap=1.0": chain(pillow_decode, gauss(pil_bilinear, gap=1.0)),
        "PIL + reduce + BILINEAR": chain(pillow_decode, pil_reduce_bilinear),
        "PIL draft>=1x + BILINEAR": chain(pillow_decode, pil_bilinear, draft=1.0),
        "PIL draft>=1x + BILINEAR gap=2.0": chain(
            pillow_decode, gauss(pil_bilinear, gap=2.0), draft=1.0
        ),
        "-- simplejpeg full size + Pillow": None,
    }
    for dct_name, dct in (("acc", {}), ("fast", fast)):
        for gap in (None, 1.0, 1.5, 2.0, 3.0):
            name = f"sj {dct_name} + PIL BILINEAR" + (f" gap={gap}" if gap else "")
            table[name] = chain(turbo, gauss(pil_bilinear, gap=gap), **dct)
    table.update(
        {
            "-- simplejpeg full size + OpenCV": None,
            "sj fast + LINEAR (no AA)": chain(turbo, cv_linear, **fast),
            "sj acc + AREA": chain(turbo, cv_area),
            "sj fast + AREA": chain(turbo, cv_area, **fast),
            "sj acc + box + LINEAR_EXACT": chain(turbo, box_linear),
            "sj acc + box + LINEAR": chain(turbo, gauss(box_linear, exact=False)),
            "sj acc + npbox + LINEAR": chain(turbo, gauss(box_linear, exact=False, box=numpy_box)),
            "sj acc + pyrDown + LINEAR": chain(turbo, pyr_linear),
            "sj acc + gauss b=1 r=3 + LINEAR": chain(turbo, gauss(gauss_linear, beta=1, reach=3)),
            "sj acc + gauss b=.5 r=2 + LINEAR": chain(turbo, gauss_linear),
            "sj acc + gauss b=.5 r=1.5 + LINEAR": chain(turbo, gauss(gauss_linear, reach=1.5)),
            "sj acc + box + gauss + LINEAR": chain(turbo, gauss(gauss_linear, pre="box")),
            "sj acc + pyrDown + gauss + LINEAR": chain(turbo, gauss(gauss_linear, pre="pyr")),
            "sj fast + gauss + LINEAR": chain(turbo, gauss_linear, **fast),
            "sj acc fastupsample + gauss + LINEAR": chain(turbo, gauss_linear, fastupsample=True),
            "cv2.imdecode + gauss + LINEAR": chain(opencv_decode, gauss_linear),
            "-- simplejpeg at a DCT scale": None,
            "sj acc dct2^k>=1x + AREA": chain(turbo, cv_area, keep=1.0),
            "sj acc dct2^k>=1x + LINEAR (no AA)": chain(turbo, cv_linear, keep=1.0),
            "sj acc dct2^k>=1x + gauss + LINEAR": chain(turbo, gauss_linear, keep=1.0),
            "sj acc dct2^k>=1.5x + PIL BILINEAR": chain(turbo, pil_bilinear, keep=1.5),
            "sj acc dct2^k>=1.5x + gauss + LINEAR": chain(turbo, gauss_linear, keep=1.5),
            "sj acc dct2^k>=2x + PIL BILINEAR": chain(turbo, pil_bilinear, keep=2.0),
            "sj acc dct2^k>=2x + gauss + LINEAR": chain(turbo, gauss_linear, keep=2.0),
            "sj acc dct2^k>=2x + pyr + gauss + LINEAR": chain(
                turbo, gauss(gauss_linear, pre="pyr"), keep=2.0
            ),
            "sj acc dctM/8>=1x + PIL BILINEAR": chain(
                turbo, pil_bilinear, keep=1.0, any_scale=True
            ),
            "sj acc dctM/8>=1x + AREA": chain(turbo, cv_area, keep=1.0, any_scale=True),
            "sj acc dctM/8>=1x + gauss + LINEAR": chain(
                turbo, gauss_linear, keep=1.0, any_scale=True
            ),
        }
    )
    if tf is not None:
        table["-- TensorFlow (one thread)"] = None
        table["tf decode_jpeg + resize (Keras, no AA)"] = tf_candidate(tf, False)
        table["tf decode_jpeg + resize antialias=True"] = tf_candidate(tf, True)
        table["tf decode_jpeg accurate + resize AA"] = tf_candidate(tf, True, "INTEGER_ACCURATE")
    table["-- decode only (no resize; pixels not compared)"] = None
    table["(decode only) PIL"] = decode_only(pillow_decode)
    table["(decode only) sj acc"] = decode_only(turbo)
    table["(decode only) sj fast"] = decode_only(turbo, **fast)
    table["(decode only) sj acc fastupsample"] = decode_only(turbo, fastupsample=True)
    table["(decode only) sj acc dct2^k>=1x"] = decode_only(turbo, keep=1.0)
    table["(decode only) sj acc dctM/8>=1x"] = decode_only(turbo, keep=1.0, any_scale=True)
    table["(decode only) cv2.imdecode"] = decode_only(opencv_decode)
    return table


# ---------------------------------------------------------------------------------------------
# References and pixel differences


def to_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


@functools.cache
def triangle_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights), each (n_out, taps): Pillow's BILINEAR coefficients
    (precompute_coeffs in Resample.c) in float64."""
    scale = n_in / n_out
    filter_scale = max(scale, 1.0)
    support = 1.0 * filter_scale  # the triangle's support is 1, widened by the scale
    centers = (np.arange(n_out) + 0.5) * scale
    low = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    high = np.minimum((centers + support + 0.5).astype(np.int64), n_in)
    taps = int((high - low).max())
    indices = low[:, None] + np.arange(taps)
    inside = indices < high[:, None]
    weights = np.clip(1 - np.abs((indices - centers[:, None] + 0.5) / filter_scale), 0, None)
    weights = weights * inside
    weights /= weights.sum(axis=1, keepdims=True)
    return np.minimum(indices, n_in - 1), weights


def exact_resize(pixels: np.ndarray, size: Size) -> np.ndarray:
    """Pillow's BILINEAR (antialiased triangle) in float64, not rounded."""
    rows, row_weights = triangle_taps(pixels.shape[0], size[0])
    cols, col_weights = triangle_taps(pixels.shape[1], size[1])
    source = pixels.astype(np.float64)
    tall = sum(row_weights[:, k, None, None] * source[rows[:, k]] for k in range(rows.shape[1]))
    return sum(col_weights[None, :, k, None] * tall[:, cols[:, k]] for k in range(cols.shape[1]))


def check_reference(pixels: np.ndarray, size: Size) -> float:
    """Largest difference between exact_resize and Pillow's float ("F") resize."""
    ours = exact_resize(pixels, size)
    worst = 0.0
    for channel in range(pixels.shape[2]):
        plane = Image.fromarray(pixels[:, :, channel].astype(np.float32), "F")
        theirs = np.asarray(plane.resize((size[1], size[0]), BILINEAR))
        worst = max(worst, float(np.abs(theirs - ours[:, :, channel]).max()))
    return worst


def references(path: str, size: Size, tf: Any) -> dict[str, np.ndarray]:
    full = np.asarray(pillow_decode(path, size))
    refs = {"exact": to_uint8(exact_resize(full, size))}
    if tf is not None:
        refs["tf AA"] = to_uint8(tf.image.resize(full, size, "bilinear", antialias=True).numpy())
        refs["Keras"] = tf_candidate(tf, False)(path, size)
    return refs


def summary(histogram: np.ndarray) -> tuple[float, int]:
    """(mean, 99th percentile) of the absolute differences counted in `histogram`."""
    total = histogram.sum()
    mean = float((histogram * np.arange(histogram.size)).sum() / total)
    p99 = int(np.searchsorted(np.cumsum(histogram), 0.99 * total))
    return mean, p99


def pixel_differences(
    table: dict[str, Candidate], paths: list[str], size: Size, tf: Any
) -> dict[str, dict[str, tuple[float, int]]]:
    """Candidate -> reference name -> (mean, p99) over all images."""
    histograms: dict[str, dict[str, np.ndarray]] = {}
    for path in paths:
        refs = references(path, size, tf)
        for name, candidate in table.items():
            got = candidate(path, size).astype(np.int16)
            if got.shape != (*size, 3):
                raise ValueError(f"{name}: shape {got.shape} for {path}")
            for ref_name, ref in refs.items():
                diff = np.abs(got - ref).ravel()
                histogram = histograms.setdefault(name, {}).setdefault(ref_name, np.zeros(256))
                histogram += np.bincount(diff, minlength=256)
    return {
        name: {ref: summary(histogram) for ref, histogram in by_ref.items()}
        for name, by_ref in histograms.items()
    }


# ---------------------------------------------------------------------------------------------
# Timing and the GIL


def cpu_ms(
    table: dict[str, Candidate], paths: list[str], size: Size, passes: int
) -> dict[str, tuple[float, float]]:
    """Candidate -> (thread CPU ms, process CPU ms) per image, medians over passes; the
    candidates are interleaved (their order rotates every pass)."""
    names = list(table)
    spent: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for name in names:
        table[name](paths[0], size)  # warm up: imports, lazily built tables
    for turn in range(passes):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            candidate = table[name]
            thread_began, process_began = time.thread_time(), time.process_time()
            for path in paths:
                candidate(path, size)
            thread_s = time.thread_time() - thread_began
            process_s = time.process_time() - process_began
            spent[name].append((thread_s / len(paths), process_s / len(paths)))
    return {
        name: (
            1000 * statistics.median(t for t, _ in runs),
            1000 * statistics.median(p for _, p in runs),
        )
        for name, runs in spent.items()
    }


def thread_speedups(
    table: dict[str, Candidate], paths: list[str], size: Size, passes: int
) -> dict[str, tuple[float, float]]:
    """Candidate -> (speed-up, parallel CPU): wall time in 1 thread / in 2 threads, and with
    2 threads the CPU time of both threads / wall time (medians over passes).

    The parallel CPU is the load-robust part: threads that hold the GIL cannot both run, so it
    stays <= 1.0 however quiet the machine, and a value above 1 shows that they ran at once;
    other processes can only lower it (and the speed-up), never raise it.
    """
    spent: dict[tuple[str, int], list[float]] = {}
    parallel: dict[str, list[float]] = {}
    for _ in range(passes):
        for name, candidate in table.items():
            for threads in (1, 2):
                cpu: list[float] = []

                def timed(path: str, c: Candidate = candidate, cpu: list[float] = cpu) -> None:
                    began = time.thread_time()
                    c(path, size)
                    cpu.append(time.thread_time() - began)  # list.append is thread-safe

                with ThreadPoolExecutor(threads, thread_name_prefix="antialias-bench") as pool:
                    began = time.perf_counter()
                    list(pool.map(timed, paths))
                    wall = time.perf_counter() - began
                spent.setdefault((name, threads), []).append(wall)
                if threads == 2:
                    parallel.setdefault(name, []).append(sum(cpu) / wall)
    return {
        name: (
            statistics.median(spent[name, 1]) / statistics.median(spent[name, 2]),
            statistics.median(parallel[name]),
        )
        for name in table
    }


# ---------------------------------------------------------------------------------------------


def photo_paths(folder: str, count: int, photo_size: str) -> list[str]:
    """The first `count` JPEGs under `folder` (sorted), of width x height `photo_size` if
    given."""
    paths = sorted(str(p) for p in Path(folder).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if photo_size:
        wanted = tuple(int(v) for v in photo_size.split("x"))
        paths = [p for p in paths if Image.open(p).size == wanted]
    if not paths:
        raise SystemExit(f"no JPEG under {folder}" + (f" of {photo_size}" if photo_size else ""))
    return paths[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="folder of JPEG photos (searched deep)")
    parser.add_argument("--images", type=int, default=300, help="at most this many photos")
    parser.add_argument("--photo-size", default="", help="only photos of this width x height")
    parser.add_argument("--size", default="224x224", help="target height x width")
    parser.add_argument("--passes", type=int, default=5, help="timed passes over the photos")
    parser.add_argument("--thread-images", type=int, default=60, help="photos per thread run")
    parser.add_argument("--thread-passes", type=int, default=3, help="0 skips the GIL checks")
    parser.add_argument("--only", default="", help="comma-separated substrings of row names")
    parser.add_argument(
        "--gil-photo", default="", help="photo for the GIL check (default: the largest one)"
    )
    args = parser.parse_args()
    size: Size = tuple(int(v) for v in args.size.split("x"))  # type: ignore[assignment]
    paths = photo_paths(args.folder, args.images, args.photo_size)
    cv2.setNumThreads(1)  # thread_time counts the calling thread only
    tf = single_threaded_tensorflow()

    rows = candidates(tf)
    if args.only:
        keep = args.only.split(",")
        rows = {n: c for n, c in rows.items() if c is None or any(k in n for k in keep)}
        titles = [i for i, c in enumerate(rows.values()) if c is None] + [len(rows)]
        empty = {t for t, after in itertools.pairwise(titles) if after == t + 1}
        rows = {n: c for i, (n, c) in enumerate(rows.items()) if i not in empty}
    table = {name: c for name, c in rows.items() if c is not None}
    compared = {name: c for name, c in table.items() if not name.startswith("(decode only)")}
    shapes = sorted({Image.open(p).size for p in paths}, key=lambda s: -s[0] * s[1])
    largest = args.gil_photo or next(p for p in paths if Image.open(p).size == shapes[0])

    first = np.asarray(pillow_decode(paths[0], size))
    reference_error = check_reference(first, size)
    differences = pixel_differences(compared, paths, size, tf)
    times = cpu_ms(table, paths, size, args.passes)
    speedups, shares, controls = {}, {}, {}
    if args.thread_passes:
        thread_paths = paths[: args.thread_images]
        lock = threading.Lock()

        def serialised(path: str, size: Size) -> np.ndarray:
            """A control that holds a lock throughout, as a GIL-holding decoder would."""
            with lock:
                return table[BASELINE](path, size)

        speedups = thread_speedups(
            {**table, SERIALISED: serialised}, thread_paths, size, args.thread_passes
        )
        # On the largest photo: a long call gives the counter thread time to be scheduled
        # even on a busy machine.
        shares = {
            name: calls_with_other_thread_running(lambda c=c: c(largest, size), GIL_CHECK_S)
            for name, c in table.items()
        }
        big = np.random.default_rng(0).integers(0, 1 << 30, 50_000).tolist()
        controls = {
            "time.sleep(1 ms) (releases the GIL)": calls_with_other_thread_running(
                lambda: time.sleep(0.001), GIL_CHECK_S
            ),
            "sorted() of 50k ints (holds the GIL)": calls_with_other_thread_running(
                lambda: sorted(big), GIL_CHECK_S
            ),
        }

    print(
        f"\n{len(paths)} JPEGs from {args.folder} ({len(shapes)} sizes, largest "
        f"{shapes[0][0]}x{shapes[0][1]}, smallest {shapes[-1][0]}x{shapes[-1][1]}) -> "
        f"{size[0]}x{size[1]} RGB; CPU ms per image, median of {args.passes} passes; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "exact = float64 Pillow-BILINEAR of the full accurate decode (vs Pillow 'F' resize: max "
        f"{reference_error:.1e}); tf AA = tf.image.resize(antialias=True) of it; "
        "Keras = tf decode_jpeg + resize, no AA"
    )
    if speedups:
        print(
            "2 threads: x = wall-time speed-up over 1 thread, CPU = CPU time of both threads / "
            f"wall time ({len(thread_paths)} photos, median of {args.thread_passes}; > 1 only if "
            f"they ran at once); GIL free: share of calls on {largest} "
            f"({Image.open(largest).size[0]}x{Image.open(largest).size[1]}) during which "
            "another Python thread ran"
        )
    references_seen = next(iter(differences.values())).keys()
    head = f"{'candidate':42s} {'thread':>6s} {'proc':>6s}"
    head += "".join(f" {ref:>10s}" for ref in references_seen)
    head += f" {'2 threads':>10s} {'GIL':>5s}" if speedups else ""
    print("\n" + head)
    sub = f"{'':42s} {'ms':>6s} {'ms':>6s}" + " mean   p99" * len(references_seen)
    print(sub + (f" {'x':>5s} {'CPU':>4s} {'free':>5s}" if speedups else ""))
    for name, candidate in rows.items():
        if candidate is None:
            print(name)
            continue
        thread_ms, process_ms = times[name]
        line = f"{name:42s} {thread_ms:6.2f} {process_ms:6.2f}"
        for ref in references_seen:
            if name in differences:
                mean, p99 = differences[name][ref]
                line += f" {mean:5.2f} {p99:4d}"
            else:
                line += f" {'-':>5s} {'-':>4s}"
        if speedups:
            speedup, cpus = speedups[name]
            line += f" {speedup:5.2f} {cpus:4.2f} {shares[name]:5.0%}"
        print(line)
    if speedups:
        speedup, cpus = speedups[SERIALISED]
        print(f"2-thread control: {SERIALISED}: x{speedup:.2f}, parallel CPU {cpus:.2f}")
    for name, share in controls.items():
        print(f"GIL check control: {name}: {share:.0%}")


if __name__ == "__main__":
    main()
