"""Where `tf.image.resize` samples and how it weighs, per axis: its kernels' taps, in float32.

For an axis resized from `in_size` to `out_size`, `taps(method, ...)` gives (indices, weights),
each (out_size, taps per output): the source rows (or columns) each output reads, and their
weights. Tap positions and weights follow TensorFlow's kernels (resize_bilinear,
resize_nearest_neighbor, resize_bicubic with Keys a=-0.5, resize_area, and scale_and_translate
for lanczos3/lanczos5/gaussian/mitchellcubic) at half-pixel centres. `prefetch.decode._resize`
applies
them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# tf.image.resize methods that `resize` reproduces.
METHODS = (
    "bilinear",
    "nearest",
    "bicubic",
    "area",
    "lanczos3",
    "lanczos5",
    "gaussian",
    "mitchellcubic",
)

# TensorFlow's resize_bicubic looks its Keys-cubic weights up in a table of this many steps.
_CUBIC_TABLE_SIZE = 1024
# Keys's cubic coefficient that resize_bicubic uses with half-pixel centres.
_KEYS_A = -0.5
_F32 = np.float32

Taps = tuple[np.ndarray, np.ndarray]  # (indices, weights), each (out_size, taps per output)


def _scale(in_size: int, out_size: int) -> np.float32:
    return _F32(in_size) / _F32(out_size)


def _half_pixel(in_size: int, out_size: int) -> np.ndarray:
    """Source coordinate of each output centre: (x + 0.5) * scale - 0.5, in float32."""
    out = np.arange(out_size, dtype=_F32)
    result: np.ndarray = (out + _F32(0.5)) * _scale(in_size, out_size) - _F32(0.5)
    return result


def nearest_indices(in_size: int, out_size: int) -> np.ndarray:
    """resize_nearest_neighbor with half-pixel centres: floor((x + 0.5) * scale), clamped."""
    out = np.arange(out_size, dtype=_F32)
    position = np.floor((out + _F32(0.5)) * _scale(in_size, out_size)).astype(np.intp)
    result: np.ndarray = np.clip(position, 0, in_size - 1)
    return result


def taps(method: str, in_size: int, out_size: int) -> Taps:
    if method == "bilinear":
        return bilinear_taps(in_size, out_size)
    if method == "bicubic":
        return _bicubic_taps(in_size, out_size)
    if method == "area":
        return _area_taps(in_size, out_size)
    if method in _KERNELS:
        radius, kernel = _KERNELS[method]
        return _scale_and_translate_taps(in_size, out_size, radius, kernel)
    raise ValueError(f"resize method must be one of {METHODS}, got {method!r}")


def bilinear_taps(in_size: int, out_size: int) -> Taps:
    position = _half_pixel(in_size, out_size)
    floor = np.floor(position)
    lerp = position - floor
    lower = np.clip(floor.astype(np.intp), 0, in_size - 1)
    upper = np.clip(np.ceil(position).astype(np.intp), 0, in_size - 1)
    indices = np.stack([lower, upper], axis=1)
    weights = np.stack([_F32(1) - lerp, lerp], axis=1).astype(_F32)
    return indices, weights


def _cubic_table() -> np.ndarray:
    """TensorFlow's table of Keys-cubic weights: row i is (w(i/N), w(1 + i/N)), N the size."""
    x = np.arange(_CUBIC_TABLE_SIZE + 1, dtype=np.float64) / _CUBIC_TABLE_SIZE
    a = _KEYS_A
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far_x = x + 1.0
    far = ((a * far_x - 5 * a) * far_x + 8 * a) * far_x - 4 * a
    return np.stack([near, far], axis=1).astype(_F32)


_CUBIC_TABLE = _cubic_table()


def _bicubic_taps(in_size: int, out_size: int) -> Taps:
    """resize_bicubic (half-pixel centres): 4 taps; taps outside the image get weight 0 and
    the rest are renormalised to sum to 1."""
    position = _half_pixel(in_size, out_size)
    floor = np.floor(position)
    offset = np.rint((position - floor) * _F32(_CUBIC_TABLE_SIZE)).astype(np.intp)
    table = _CUBIC_TABLE
    weights = np.stack(
        [
            table[offset, 1],
            table[offset, 0],
            table[_CUBIC_TABLE_SIZE - offset, 0],
            table[_CUBIC_TABLE_SIZE - offset, 1],
        ],
        axis=1,
    )
    wanted = floor.astype(np.intp)[:, None] + np.arange(-1, 3)[None, :]
    indices = np.clip(wanted, 0, in_size - 1)
    weights = np.where(indices == wanted, weights, _F32(0))
    return indices, _normalised(weights)


def _area_taps(in_size: int, out_size: int) -> Taps:
    """resize_area: each output averages the source span [x * scale, (x + 1) * scale)."""
    scale = _scale(in_size, out_size)
    out = np.arange(out_size, dtype=_F32)
    start = out * scale
    stop = (out + _F32(1)) * scale
    first = np.floor(start).astype(np.intp)
    count = int((np.ceil(stop).astype(np.intp) - first).max())
    source = first[:, None] + np.arange(count)[None, :]
    lo = np.maximum(source.astype(_F32), start[:, None])
    hi = np.minimum(source.astype(_F32) + _F32(1), stop[:, None])
    weights = np.clip(hi - lo, 0, None).astype(_F32) / scale
    return np.clip(source, 0, in_size - 1), weights.astype(_F32)


def _lanczos(radius: float) -> Callable[[np.ndarray], np.ndarray]:
    def kernel(x: np.ndarray) -> np.ndarray:
        x = np.abs(x).astype(np.float64)
        safe = np.where(x <= 1e-3, 1.0, x)
        value = radius * np.sin(np.pi * safe) * np.sin(np.pi * safe / radius)
        value = value / (np.pi * np.pi * safe * safe)
        value = np.where(x <= 1e-3, 1.0, value)
        return np.where(x > radius, 0.0, value)

    return kernel


def _gaussian(x: np.ndarray) -> np.ndarray:
    radius = 1.5
    sigma = radius / 3.0
    x = np.abs(x).astype(np.float64)
    return np.where(x >= radius, 0.0, np.exp(-x * x / (2.0 * sigma * sigma)))


def _mitchell_cubic(x: np.ndarray) -> np.ndarray:
    x = np.abs(x).astype(np.float64)
    far = (((-7.0 / 18.0) * x + 2.0) * x - 10.0 / 3.0) * x + 16.0 / 9.0
    near = ((7.0 / 6.0) * x - 2.0) * x * x + 8.0 / 9.0
    return np.where(x >= 2.0, 0.0, np.where(x >= 1.0, far, near))


# scale_and_translate kernels by tf.image.resize method name: (radius, kernel).
_KERNELS: dict[str, tuple[float, Callable[[np.ndarray], np.ndarray]]] = {
    "lanczos3": (3.0, _lanczos(3.0)),
    "lanczos5": (5.0, _lanczos(5.0)),
    "gaussian": (1.5, _gaussian),
    "mitchellcubic": (2.0, _mitchell_cubic),
}


def _scale_and_translate_taps(
    in_size: int, out_size: int, radius: float, kernel: Callable[[np.ndarray], np.ndarray]
) -> Taps:
    """scale_and_translate without antialiasing: the kernel at its own width, sampled around
    each output centre, clipped to the image and renormalised."""
    scale = _F32(out_size) / _F32(in_size)
    inv_scale = _F32(1) / scale
    sample = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * inv_scale
    start = np.ceil(sample - _F32(radius) - _F32(0.5)).astype(np.intp)
    stop = np.floor(sample + _F32(radius) - _F32(0.5)).astype(np.intp)
    start = np.clip(start, 0, in_size - 1)
    stop = np.clip(stop, 0, in_size - 1) + 1
    count = int((stop - start).max())
    source = start[:, None] + np.arange(count)[None, :]
    inside = source < stop[:, None]
    position = source.astype(_F32) + _F32(0.5) - sample[:, None]
    weights = np.where(inside, kernel(position).astype(_F32), _F32(0))
    return np.clip(source, 0, in_size - 1), _normalised(weights)


def _normalised(weights: np.ndarray) -> np.ndarray:
    total = weights.sum(axis=1, dtype=_F32, keepdims=True)
    usable = np.abs(total) >= 1000 * np.finfo(_F32).tiny
    result: np.ndarray = np.where(usable, weights / np.where(usable, total, 1), weights)
    return result.astype(_F32)
