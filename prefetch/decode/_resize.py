"""Resize, crop and pad uint8 images in numpy exactly as `tf.image.resize` does (antialias=False).

This is the Keras-parity path of the decoder (`DecodeOptions(antialias=False)`): Keras's
`image_dataset_from_directory` decodes at full size and resizes with `tf.image.resize`, whose
filters do not widen when shrinking (no antialiasing) and sample at half-pixel centres. Every
method here is separable: a resize is a gather of a few source rows (or columns) per output
row, weighted, summed in float32 and rounded to uint8. Tap positions and weights follow
TensorFlow's kernels (resize_bilinear, resize_nearest_neighbor, resize_bicubic with Keys
a=-0.5, resize_area, and scale_and_translate for lanczos3/lanczos5/gaussian/mitchellcubic), in
float32, so results differ from TensorFlow's float output only by the final rounding.

`crop_box` and `pad_layout` reproduce Keras's crop (smart_resize) and `tf.image.resize_with_pad`
arithmetic. `resize` is the reference; `resize_image` is the fast route from a Pillow image that
`decode_image` takes: Pillow's own nearest-neighbour resize where it provably picks TensorFlow's
source pixels (equal results), and for bilinear TensorFlow's lerps in float32 done rows first
(within 1 of `resize` per value: only the order of the float operations differs). Nothing here
holds state beyond caches and per-thread scratch buffers, so it is safe to call from many threads.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import numpy as np
from PIL import Image

from prefetch.decode._resize_taps import METHODS as METHODS
from prefetch.decode._resize_taps import Taps, bilinear_taps, nearest_indices, taps

_F32 = np.float32


def resize(image: np.ndarray, size: tuple[int, int], method: str) -> np.ndarray:
    """Resize an HxWxC uint8 array to `size` (height, width) like `tf.image.resize`, as uint8."""
    height, width, channels = image.shape
    out_h, out_w = size
    flat = image.reshape(height, width * channels)  # rows of interleaved channel values
    if method == "nearest":
        rows = nearest_indices(height, out_h)
        cols = _lanes(nearest_indices(width, out_w), channels)
        picked: np.ndarray = flat[rows][:, cols]
        return picked.reshape(out_h, out_w, channels)
    # TensorFlow interpolates along x first, then along y; so do we.
    across = _weighted_sum(flat, _plan(method, width, out_w, channels), rows=False)
    result = _weighted_sum(across, _plan(method, height, out_h, 1), rows=True)
    np.rint(result, out=result)
    np.clip(result, 0, 255, out=result)
    return result.astype(np.uint8).reshape(out_h, out_w, channels)  # a copy: scratch is reused


def resize_image(
    image: Image.Image,
    size: tuple[int, int],
    method: str,
    box: tuple[int, int, int, int] | None = None,
) -> np.ndarray:
    """`resize(np.asarray(image)[region], size, method)` for a Pillow image in an 8-bit mode
    ("L", "RGB", "RGBA"), faster.

    `box` is the region to resize, (top, left, height, width) as `crop_box` gives it; by default
    the whole image. Returns an (out height, out width, channels) uint8 array.

    - "nearest": Pillow's nearest-neighbour resize (in C, on whole pixels) wherever its source
      pixels are TensorFlow's, which `_pillow_nearest_agrees` checks once per geometry; else the
      same gather in numpy. Equal to `resize` either way.
    - "bilinear": resize_bilinear's lerps (`a + (b - a) * t`) in float32, rows first when the
      height does not grow (the column gathers then see the output's rows only), else columns
      first (TensorFlow's order). Within 1 of `resize` per value, about 1e-5 of values off by 1.
    - the other methods: `resize` on a copy of the region.
    """
    height, width = image.height, image.width
    top, left, box_h, box_w = box if box is not None else (0, 0, height, width)
    out_h, out_w = size
    if method == "nearest" and all(
        _pillow_nearest_agrees(axis, start, span, out)
        for axis, start, span, out in ((0, top, box_h, out_h), (1, left, box_w, out_w))
    ):
        resized = image.resize(
            (out_w, out_h), Image.Resampling.NEAREST, box=(left, top, left + box_w, top + box_h)
        )
        return np.asarray(resized).reshape(out_h, out_w, -1)
    pixels = np.asarray(image).reshape(height, width, -1)
    if method == "nearest":
        rows = nearest_indices(box_h, out_h) + top
        cols = nearest_indices(box_w, out_w) + left
        picked: np.ndarray = np.take(pixels, rows, axis=0, mode="clip")
        return np.take(picked, cols, axis=1, mode="clip")
    if method == "bilinear":
        return _bilinear(pixels, size, (top, left, box_h, box_w))
    region = pixels[top : top + box_h, left : left + box_w]
    return resize(np.ascontiguousarray(region), size, method)


def crop_box(height: int, width: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Keras's centred crop with the aspect ratio of `size`: (top, left, crop height, width).

    The arithmetic of `keras.utils.image_dataset_from_directory(crop_to_aspect_ratio=True)`
    (smart_resize on a TensorFlow tensor): float32 divisions, truncated to int.
    """
    target_h, target_w = size
    crop_h = int(_F32(width * target_h) / _F32(target_w))
    crop_h = max(min(height, crop_h), 1)
    crop_w = int(_F32(height * target_w) / _F32(target_h))
    crop_w = max(min(width, crop_w), 1)
    top = int(_F32(height - crop_h) / _F32(2))
    left = int(_F32(width - crop_w) / _F32(2))
    return top, left, crop_h, crop_w


def pad_layout(height: int, width: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Where `tf.image.resize_with_pad` puts the image: (top, left, resized height, width).

    The image is resized, keeping its aspect ratio, to fit inside `size`, then placed at
    (top, left) on a zero background of `size`: the arithmetic of
    `keras.utils.image_dataset_from_directory(pad_to_aspect_ratio=True)`.
    """
    target_h, target_w = _F32(size[0]), _F32(size[1])
    f_height, f_width = _F32(height), _F32(width)
    ratio = max(f_width / target_w, f_height / target_h)
    resized_h = f_height / ratio
    resized_w = f_width / ratio
    top = max(0, math.floor((target_h - resized_h) / _F32(2)))
    left = max(0, math.floor((target_w - resized_w) / _F32(2)))
    return top, left, max(1, math.floor(resized_h)), max(1, math.floor(resized_w))


@functools.lru_cache(maxsize=64)
def _plan(method: str, in_size: int, out_size: int, channels: int) -> Taps:
    """Taps along an axis interleaved with `channels` lanes: (taps, out * channels) each."""
    indices, weights = taps(method, in_size, out_size)
    lanes = np.ascontiguousarray(_lanes(indices, channels).T)
    weights = np.ascontiguousarray(np.repeat(weights, channels, axis=0).T)
    lanes.setflags(write=False)  # cached and shared by all threads
    weights.setflags(write=False)
    return lanes, weights


def _lanes(indices: np.ndarray, channels: int) -> np.ndarray:
    """Indices of pixels -> indices of their channel values in a (rows, width * channels) view.

    For a 2-D array of taps (out, k) the result is (out * channels, k).
    """
    lanes = np.arange(channels)
    if indices.ndim == 1:
        return (indices[:, None] * channels + lanes).reshape(-1)
    expanded = indices[:, None, :] * channels + lanes[None, :, None]
    return expanded.reshape(-1, indices.shape[1])


def _weighted_sum(flat: np.ndarray, plan: Taps, *, rows: bool) -> np.ndarray:
    """Sum over taps of weight * gathered rows (or columns) of a 2-D array, in float32.

    Works in this thread's scratch buffers (see `_scratch`) and returns a view of one: large
    temporaries allocated afresh per image cost more in page faults than the arithmetic.
    """
    indices, weights = plan
    axis = 0 if rows else 1
    shape = (indices.shape[1], flat.shape[1]) if rows else (flat.shape[0], indices.shape[1])
    role = "rows" if rows else "columns"
    gathered = _scratch(f"{role} gathered", shape, flat.dtype)
    picked = _scratch(f"{role} picked", shape, np.dtype(_F32))
    result = _scratch(f"{role} sum", shape, np.dtype(_F32))
    for k in range(indices.shape[0]):
        np.take(flat, indices[k], axis=axis, out=gathered, mode="clip")
        tap_weights = weights[k][:, None] if rows else weights[k]
        np.multiply(gathered, tap_weights, out=result if k == 0 else picked)
        if k:
            result += picked
    return result


@functools.lru_cache(maxsize=256)
def _pillow_nearest_agrees(axis: int, start: int, span: int, out_size: int) -> bool:
    """Whether Pillow's nearest resize of [start, start + span) along `axis` (0: rows) to
    `out_size` picks the pixels resize_nearest_neighbor picks.

    Pillow steps through the source in float64, TensorFlow computes each position in float32:
    where a position falls on a pixel boundary (640 -> 224 at the 18th column) they can pick
    neighbours. Asked of Pillow itself, on a one-pixel-wide image of pixel numbers.
    """
    numbers = np.arange(1, start + span + 1, dtype=np.int32)  # 0 would be a pixel not written
    shape = (start + span, 1) if axis == 0 else (1, start + span)
    probe = Image.fromarray(numbers.reshape(shape))
    target = (1, out_size) if axis == 0 else (out_size, 1)
    box = (0, start, 1, start + span) if axis == 0 else (start, 0, start + span, 1)
    picked = np.asarray(probe.resize(target, Image.Resampling.NEAREST, box=box)).reshape(-1)
    return bool(np.array_equal(picked - 1, nearest_indices(span, out_size) + start))


def _bilinear(
    pixels: np.ndarray, size: tuple[int, int], box: tuple[int, int, int, int]
) -> np.ndarray:
    """resize_bilinear of the `box` (top, left, height, width) of a C-contiguous HxWxC uint8
    array, in float32 with TensorFlow's lerp; see `resize_image`."""
    top, left, height, width = box
    channels = pixels.shape[2]
    out_h, out_w = size
    rows = pixels.reshape(pixels.shape[0], -1)[top : top + height]  # a view: whole rows
    if out_h <= height:
        lanes = rows[:, left * channels : (left + width) * channels]
        across = _lerp_along(lanes, _lerp_plan(height, out_h, 1, 0), axis=0, step=1)
        result = _lerp_along(across, _lerp_plan(width, out_w, channels, 0), axis=1, step=2)
    else:
        across = _lerp_along(rows, _lerp_plan(width, out_w, channels, left), axis=1, step=1)
        result = _lerp_along(across, _lerp_plan(height, out_h, 1, 0), axis=0, step=2)
    np.rint(result, out=result)  # a convex combination of uint8 values: no clipping needed
    return result.astype(np.uint8).reshape(out_h, out_w, channels)  # a copy: scratch is reused


def _lerp_along(
    source: np.ndarray, plan: tuple[np.ndarray, np.ndarray, np.ndarray], *, axis: int, step: int
) -> np.ndarray:
    """TensorFlow's lerp between the plan's lower and upper lanes of `source` along `axis` (0:
    rows), in float32 per-thread scratch of this `step` (so step 2 never overwrites step 1's
    result, its input). A uint8 source is gathered as uint8, then widened."""
    lower_lanes, upper_lanes, weight = plan
    shape = (
        (len(lower_lanes), source.shape[1]) if axis == 0 else (source.shape[0], len(lower_lanes))
    )
    low = _scratch(f"bilinear low {step}", shape, np.dtype(_F32))
    high = _scratch(f"bilinear high {step}", shape, np.dtype(_F32))
    if source.dtype == np.uint8:
        picked = _scratch(f"bilinear picked {step}", shape, np.dtype(np.uint8))
        np.take(source, lower_lanes, axis=axis, out=picked, mode="clip")
        np.copyto(low, picked)
        np.take(source, upper_lanes, axis=axis, out=picked, mode="clip")
        np.copyto(high, picked)
    else:
        np.take(source, lower_lanes, axis=axis, out=low, mode="clip")
        np.take(source, upper_lanes, axis=axis, out=high, mode="clip")
    return _lerp(low, high, weight[:, None] if axis == 0 else weight)


@functools.lru_cache(maxsize=256)
def _lerp_plan(
    in_size: int, out_size: int, channels: int, offset: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """resize_bilinear's lower and upper source lanes (pixels shifted by `offset`, each as
    `channels` lanes) and the upper one's weight per lane, float32."""
    indices, weights = bilinear_taps(in_size, out_size)
    lower = _lanes(indices[:, 0] + offset, channels)
    upper = _lanes(indices[:, 1] + offset, channels)
    lerp = np.repeat(weights[:, 1], channels)
    for array in (lower, upper, lerp):
        array.setflags(write=False)  # cached and shared by all threads
    return lower, upper, lerp


def _lerp(low: np.ndarray, high: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """TensorFlow's `low + (high - low) * weight`, in place in `high`, which it returns."""
    np.subtract(high, low, out=high)
    np.multiply(high, weight, out=high)
    np.add(low, high, out=high)
    return high


_THREAD_SCRATCH = threading.local()


def _scratch(role: str, shape: tuple[int, int], dtype: np.dtype[Any]) -> np.ndarray:
    """A per-thread buffer for `role`, reused across images and grown as needed."""
    size = shape[0] * shape[1]
    buffers: dict[str, np.ndarray] = _THREAD_SCRATCH.__dict__
    buffer = buffers.get(role)
    if buffer is None or buffer.size < size or buffer.dtype != dtype:
        buffer = buffers[role] = np.empty(size, dtype)
    return buffer[:size].reshape(shape)
