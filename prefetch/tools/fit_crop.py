"""Shrink an image to the smallest size its training crops still need (`shards write --fit-crop`).

A `RandomResizedCrop` window covers a fraction of the image's area drawn from `scale` with an
aspect ratio drawn from `ratio`, and is resized to the target; the window's smallest possible
width is `sqrt(scale_low * area * ratio_low)` and its smallest height `sqrt(scale_low * area /
ratio_high)`. `fitted_size` is the smallest size, in the image's own proportions, at which
both are still at least the target's: any window drawn from the smaller image is then at
least the target on each side, so the loader still scales it down (never up). The windows
are fractions of the image, so the same draws give the same windows, in proportion.

`fit_image(data, target)` returns the bytes to store: the image's own bytes, unchanged, when
it is already no larger than that (or is not a JPEG or PNG), else the image resized (Pillow,
Lanczos, after a DCT-scaled JPEG decode that keeps at least the size) and encoded again in its
own format: JPEG at `JPEG_QUALITY` (lossy: a second compression), PNG losslessly. EXIF and ICC
profile data are kept. Pure functions; thread-safe.
"""

from __future__ import annotations

import io
import math

from PIL import Image

# The RandomResizedCrop recipe the sizes are fitted to (torchvision's and prefetch's defaults).
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3 / 4, 4 / 3)
# The quality of a JPEG encoded again (Pillow's 0-100 scale).
JPEG_QUALITY = 95
# Formats encoded again; others are kept as they are.
_FORMATS = ("JPEG", "PNG")


def fitted_size(
    width: int,
    height: int,
    target: int,
    scale: tuple[float, float] = DEFAULT_SCALE,
    ratio: tuple[float, float] = DEFAULT_RATIO,
) -> tuple[int, int] | None:
    """The smallest `(width, height)` in the proportions of a `width` x `height` image at which
    every crop window of the recipe (`scale`, `ratio`) is at least `target` pixels wide and
    high; None when the image is not larger than that (keep it as it is)."""
    needed_area = max(target**2 / ratio[0], target**2 * ratio[1]) / scale[0]
    factor = math.sqrt(needed_area / (width * height))
    if factor >= 1:
        return None
    fitted = (math.ceil(width * factor), math.ceil(height * factor))
    return None if fitted[0] >= width or fitted[1] >= height else fitted


def fit_image(data: bytes, target: int) -> tuple[bytes, bool]:
    """`(bytes to store, whether they were resized)` for the image `data` (module docstring)."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format not in _FORMATS:
            return data, False
        size = fitted_size(image.width, image.height, target)
        if size is None:
            return data, False
        kind = image.format
        info = {key: image.info[key] for key in ("exif", "icc_profile") if image.info.get(key)}
        if kind == "JPEG":
            image.draft(image.mode, size)  # decode at a DCT scale that keeps at least `size`
        loaded = image if image.mode in ("L", "RGB", "RGBA", "CMYK", "LA") else _plain(image)
        resized = loaded.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    if kind == "JPEG":
        resized.save(out, "JPEG", quality=JPEG_QUALITY, **info)
    else:
        resized.save(out, "PNG", **info)
    return out.getvalue(), True


def _plain(image: Image.Image) -> Image.Image:
    """A palette, bilevel or 16-bit image as RGB(A), which resizes with any filter."""
    transparent = image.mode in ("P", "PA") and "transparency" in image.info
    return image.convert("RGBA" if transparent or image.mode == "PA" else "RGB")
