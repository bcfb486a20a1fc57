"""OpenCV resizes of a decoded image to a target size, optionally written into a given array
(a batch slot's row): `resize_antialiased` (Pillow-like antialiasing for about half its time)
and `resize_no_antialias` (`tf.image.resize` parity). Used by the `fast` extra's decoder
(`prefetch.decode._turbo`) and the window decoder (`prefetch.decode._window`); `cv2` is passed in
by the caller, which imported it. Pure functions, thread-safe; OpenCV releases the GIL.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from prefetch.decode import _resize as resize

# The antialiased bilinear resize (`resize_antialiased`): the variance, in output pixels
# squared, that bilinear interpolation itself contributes (fitted: 0.25-0.5 measure alike,
# 1.0 worse), and the sigma below which an axis is not blurred.
_BILINEAR_VARIANCE = 0.5
_MIN_SIGMA = 0.05


def _blur_sigma(scale: float) -> float:
    """The Gaussian sigma (in input pixels) that, before a bilinear resize by `scale` (input
    size / output size), matches Pillow's antialiased bilinear (a triangle filter `scale` wide):
    the triangle's variance scale**2 / 6, less what bilinear interpolation itself smooths
    (fitted on ImageNet-sized photos: benchmarks/antialias.py). 0 when not shrinking."""
    return math.sqrt(max((scale * scale - _BILINEAR_VARIANCE) / 6.0, 0.0))


def resize_antialiased(
    pixels: np.ndarray,
    size: tuple[int, int],
    method: str,
    cv2: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """An antialiased bilinear resize: a per-axis Gaussian blur sized by `_blur_sigma`, then
    `cv2.INTER_LINEAR`. About half the time of Pillow's filter, 0.3-0.5 mean from it on photos
    (docs/decoders.md). `method` is always "bilinear" here. With `out` (HxWxC uint8), the
    result is written there and `out` returned."""
    out_h, out_w = size
    in_h, in_w = pixels.shape[:2]
    if (in_h, in_w) != (out_h, out_w):
        pixels = np.ascontiguousarray(pixels)
        sigma_x, sigma_y = _blur_sigma(in_w / out_w), _blur_sigma(in_h / out_h)
        if sigma_x > _MIN_SIGMA or sigma_y > _MIN_SIGMA:
            # A kernel of +-2 sigma on each axis (odd; 1 leaves that axis alone).
            kernel = tuple(
                2 * math.ceil(2 * sigma) + 1 if sigma > _MIN_SIGMA else 1
                for sigma in (sigma_x, sigma_y)
            )
            shape = pixels.shape  # OpenCV drops a single channel's axis
            pixels = cv2.GaussianBlur(
                pixels, kernel, sigmaX=max(sigma_x, _MIN_SIGMA), sigmaY=max(sigma_y, _MIN_SIGMA)
            ).reshape(shape)
    return resize_no_antialias(pixels, size, "bilinear", cv2, out)


def resize_no_antialias(
    pixels: np.ndarray,
    size: tuple[int, int],
    method: str,
    cv2: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """`tf.image.resize(method)`: OpenCV for bilinear (within 1 of TensorFlow per value),
    `prefetch.decode._resize` (TensorFlow's arithmetic) for the other methods. With `out` (HxWxC
    uint8), the result is written there and `out` returned."""
    out_h, out_w = size
    channels = pixels.shape[2]
    if pixels.shape[:2] == (out_h, out_w):
        return write_into(pixels, out)
    if method == "bilinear":
        resized: np.ndarray = cv2.resize(
            pixels, (out_w, out_h), dst=out, interpolation=cv2.INTER_LINEAR
        )
        return write_into(resized.reshape(out_h, out_w, channels), out)
    return write_into(resize.resize(np.ascontiguousarray(pixels), size, method), out)


def write_into(image: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """`image`, or with `out`: `out` holding it (copied, unless OpenCV wrote it there)."""
    if out is None:
        return image
    if not np.may_share_memory(image, out):
        out[...] = image.reshape(out.shape)
    return out
