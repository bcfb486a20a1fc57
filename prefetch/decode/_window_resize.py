"""A decoded window to the target size: the last step of both crop paths.

`resize_window` resizes an HxWxC window to `options.shape` with the loader's interpolation
(OpenCV's bilinear when the `fast` extra is installed, else `to_target_size`), `flip_left_right`
mirrors it, `crop_image` cuts and resizes the window of an image a source already decoded. Used
by the per-sample crop path and the chunk path of `prefetch.decode._window`, so both give the
same pixels for the same window. Stateless and thread-safe; OpenCV releases the GIL.
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType

import numpy as np
from PIL import Image

from prefetch.decode._cv_resize import resize_antialiased, resize_no_antialias, write_into
from prefetch.decode._decoders import DecodeOptions, convert_mode, to_target_size
from prefetch.decode._turbo import turbo_modules
from prefetch.plan import Crop

# Pillow's mode for each number of output channels.
PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def resize_window(
    pixels: np.ndarray, options: DecodeOptions, out: np.ndarray | None = None
) -> np.ndarray:
    """An HxWxC window resized to `options.shape` with the loader's interpolation; with `out`
    (a uint8 array of that shape) resized straight into it, and `out` returned."""
    cv2 = cv2_module()
    if cv2 is not None and options.interpolation == "bilinear":
        resize = resize_antialiased if options.antialias else resize_no_antialias
        return resize(pixels, options.image_size, "bilinear", cv2=cv2, out=out)
    return write_into(to_target_size(np.ascontiguousarray(pixels), _whole(options)), out)


def flip_left_right(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`image` mirrored left-right, as a new contiguous array, or written into `out` (which
    may be `image` itself: flipped in place) and `out` returned. OpenCV's flip when the
    `fast` extra is installed (about 8 us for 224x224x3, where numpy's copy of a reversed
    view takes about 330 us), else numpy."""
    cv2 = cv2_module()
    if cv2 is None:
        if out is None:
            return np.ascontiguousarray(image[:, ::-1])
        out[...] = image[:, ::-1]  # numpy copies first where the two overlap
        return out
    flipped: np.ndarray = cv2.flip(np.ascontiguousarray(image), 1, dst=out)
    return write_into(flipped.reshape(image.shape), out)


def crop_image(
    image: Image.Image | np.ndarray, crop: Crop, rng: np.random.Generator, options: DecodeOptions
) -> np.ndarray:
    """The window `crop` draws of an already decoded image (a source's `__getitem__`),
    resized to `options.shape`."""
    if isinstance(image, Image.Image):
        image = np.asarray(convert_mode(image, PIL_MODES[options.channels]))
    if image.ndim == 2:
        image = image[:, :, None]
    height, width = image.shape[:2]
    top, left, box_h, box_w = crop.box(height, width, options.image_size, rng)
    return resize_window(image[top : top + box_h, left : left + box_w], options)


def _whole(options: DecodeOptions) -> DecodeOptions:
    """`options` without Keras's crop or padding: the window is resized whole."""
    return dataclasses.replace(options, crop_to_aspect_ratio=False, pad_to_aspect_ratio=False)


# OpenCV, imported once per process by the fast decoder's own import (None without the `fast`
# extra); looked up per sample, so kept here once found.
@functools.lru_cache(maxsize=1)
def cv2_module() -> ModuleType | None:
    """OpenCV (`cv2`) where the `fast` extra is installed, else None."""
    modules = turbo_modules()
    return modules[1] if modules is not None else None
