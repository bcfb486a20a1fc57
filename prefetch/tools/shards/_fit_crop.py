"""Shrink an image to the smallest size its training crops still need (`shards write --fit-crop`).

A `RandomResizedCrop` window covers a fraction of the image's area drawn from `scale` with an
aspect ratio drawn from `ratio`, and is resized to the target; the window's smallest possible
width is `sqrt(scale_low * area * ratio_low)` and its smallest height `sqrt(scale_low * area /
ratio_high)`. `fitted_size` is the smallest size, in the image's own proportions, at which
both are still at least the target's: any window drawn from the smaller image is then at
least the target on each side, so the loader still scales it down (never up). The windows
are fractions of the image, so the same draws give the same windows, in proportion.

`fit_image(data, target, quality)` returns the bytes to store: the image's own bytes, unchanged,
when it is already no larger than that (or is not a JPEG or PNG), else the image converted
as the loader converts it (`as_the_loader_sees`: 16-bit, palette, CMYK), resized (Pillow,
Lanczos, after a DCT-scaled JPEG decode that keeps at least the size) and encoded again in its
own format: JPEG at `quality` (default `DEFAULT_QUALITY`; lossy: a second compression), PNG
losslessly. EXIF data (the orientation, not applied, as the loader does not) and, where the
colours are unchanged, the ICC profile are kept. `check_options` validates
the writer's two options and `recorded` is what the shard set's manifest says of them. Pure
functions; thread-safe.
"""

from __future__ import annotations

import io
import math

from PIL import Image

from prefetch.decode import convert_mode

# The RandomResizedCrop recipe the sizes are fitted to (torchvision's and prefetch's defaults).
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3 / 4, 4 / 3)
# The quality of a JPEG encoded again (Pillow's scale), unless the writer is given one
# (`--fit-crop-quality`). 90, the fast default: on 2 MP photos (docs/performance.md, "Recipe-
# resolution shards") it kept 0.31 of the original bytes against 0.48 at 95, and read 2.74x
# tf.data's recipe against 2.14x, for a mean crop difference of 1.09 levels of 255 against 0.89.
DEFAULT_QUALITY = 90
# The qualities accepted (Pillow's scale; above 95 files grow for little gain, but are allowed).
QUALITIES = range(1, 101)
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


def check_options(size: int | None, quality: int) -> None:
    """Raise ValueError, naming the bad value and the fix, unless `size` is None or an int >= 1
    and `quality` an int in 1..100 (and left at `DEFAULT_QUALITY` when `size` is None)."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ValueError(f"fit_crop must be None or an int >= 1 (pixels), got {size!r}")
    problem = quality_problem(quality)
    if problem is not None:
        raise ValueError(f"fit_crop_quality {problem}")
    if size is None and quality != DEFAULT_QUALITY:
        raise ValueError(
            f"fit_crop_quality={quality} without fit_crop does nothing (nothing is re-encoded): "
            "pass fit_crop=SIZE too (--fit-crop SIZE), or leave fit_crop_quality out"
        )


def quality_problem(quality: object) -> str | None:
    """Why `quality` is not a JPEG quality for `fit_image` (an int in 1..100), with the fix;
    None when it is one."""
    if not isinstance(quality, bool) and isinstance(quality, int) and quality in QUALITIES:
        return None
    return (
        f"must be an int from 1 to 100 (JPEG quality), got {quality!r}: pass {DEFAULT_QUALITY} "
        "(the default: smaller and faster) or 95 (closer to the original pixels)"
    )


def recorded(size: int | None, quality: int, resized: int) -> dict[str, object]:
    """The manifest's `options` entry for these options: `{"fit_crop": {...}}` with the target
    `size`, the recipe, the JPEG `quality` and how many images were `resized`; `{}` when `size`
    is None. Readers take none of it as required (an older writer's lacks `jpeg_quality`)."""
    if size is None:
        return {}
    fit = {"size": size, "scale": list(DEFAULT_SCALE), "ratio": list(DEFAULT_RATIO)}
    return {"fit_crop": {**fit, "jpeg_quality": quality, "resized": resized}}


def fit_image(data: bytes, target: int, quality: int = DEFAULT_QUALITY) -> tuple[bytes, bool]:
    """`(bytes to store, whether they were resized)` for the image `data`; a JPEG resized is
    encoded at `quality` (module docstring). Raises what Pillow raises for an image it cannot
    decode (a truncated file: OSError)."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format not in _FORMATS:
            return data, False
        size = fitted_size(image.width, image.height, target)
        if size is None:
            return data, False
        kind = image.format
        if kind == "JPEG":
            image.draft(image.mode, size)  # decode at a DCT scale that keeps at least `size`
        image.load()
        loaded = as_the_loader_sees(image)
        info = {"exif": image.info["exif"]} if image.info.get("exif") else {}
        if loaded.mode == image.mode and image.info.get("icc_profile"):
            info["icc_profile"] = image.info["icc_profile"]  # of these colours: still true
        resized = loaded.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    if kind == "JPEG":
        resized.save(out, "JPEG", quality=quality, **info)
    else:
        resized.save(out, "PNG", **info)
    return out.getvalue(), True


def as_the_loader_sees(image: Image.Image) -> Image.Image:
    """`image` in a mode that keeps what the loader reads from it (`prefetch.decode.convert_mode`,
    the rules of `tf.io.decode_image`): 16-bit gray as its top 8 bits (not clipped at 255), CMYK
    as the loader's RGB, palette images as RGB, or RGBA where they are transparent; 8-bit gray,
    RGB and RGBA (and gray with alpha) as they are. The EXIF orientation is kept, not applied:
    the loader does not apply it either."""
    if image.mode in ("L", "RGB", "RGBA", "LA"):
        return image
    if image.mode in ("P", "PA"):
        transparent = image.mode == "PA" or "transparency" in image.info
        return convert_mode(image, "RGBA" if transparent else "RGB")
    if image.mode in _GRAY_MODES:
        return convert_mode(image, "L")
    return convert_mode(image, "RGBA" if image.mode in ("RGBa", "La") else "RGB")


# Pillow modes the loader reads as 8-bit gray: bilevel and 16- or 32-bit integer gray.
_GRAY_MODES = ("1", "I", "I;16", "I;16B", "I;16L", "I;16N")
