"""Fast JPEG decoding with libjpeg-turbo (simplejpeg) and OpenCV resizing: the `fast` extra.

`decode_turbo` is a drop-in decoder (`Loader(decoder=decode_turbo)`) for the same contract as
`prefetch.decode_image`: a picklable, stateless callable `(path, options) -> uint8 array of
options.shape`, safe to call from many threads, that releases the GIL while it decodes and
resizes (so `backend="auto"` keeps threads for it). Pixels differ from `decode_image` by a
small, measured amount (docs/decoders.md):

- `antialias=True` (the default): libjpeg-turbo decodes at the smallest power-of-two DCT scale
  that keeps the region to resize at least the target size (Pillow's draft keeps twice the
  target), then `decode_image`'s own Pillow resize, crop and padding (`to_target_size`) finish.
  For "nearest" the scale is Pillow's, so the pixels are the same ones.
- `antialias=False` (Keras parity): a full-size decode with libjpeg-turbo's fast integer DCT,
  which is what `tf.io.decode_jpeg` uses by default, then `cv2.INTER_LINEAR` for "bilinear"
  (half-pixel centres, no antialiasing, like `tf.image.resize`) and `prefetch.decode._resize` for
  the
  other methods; Keras's crop box and padding layout.

Everything else goes to `decode_image` unchanged: files that are not JPEGs (PNG, BMP, GIF...),
CMYK/YCCK JPEGs, images over Pillow's `MAX_IMAGE_PIXELS`, JPEGs that libjpeg-turbo reports as
damaged, and options that set a `DecodeOptions` field added after this module (one it does not
implement) away from its default. So a bad file raises exactly what `decode_image` raises.

`available_decoders()` lists the decoders this machine has, by name; `best_decoder()` measures
once which of them is fastest here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing
import statistics
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from PIL import Image

from prefetch.decode import _resize as resize
from prefetch.decode._cv_resize import resize_antialiased, resize_no_antialias
from prefetch.decode._decoders import (
    DRAFT_REDUCING_GAP,
    DecodeOptions,
    Decoder,
    crop_size,
    decode_bytes,
    decode_image,
    resize_like_keras,
    to_target_size,
)
from prefetch.io import Location, read_image

# What `pip install` needs for this module's decoder.
INSTALL_HINT = 'pip install "prefetch[fast]" (or: pip install simplejpeg opencv-python-headless)'

# Largest JPEG DCT scale-down: libjpeg-turbo decodes at 1/1, 1/2, 1/4 or 1/8 of full size.
MAX_DCT_FACTOR = 8

# JPEG colour spaces (as simplejpeg's header reports them) that libjpeg-turbo converts to RGB
# and gray the same way Pillow does; others (CMYK, YCCK) go to `decode_image`.
_TURBO_COLORSPACES = frozenset({"YCbCr", "Gray", "RGB"})
# simplejpeg output colour space per channel count.
_OUTPUT_COLORSPACE = {1: "GRAY", 3: "RGB", 4: "RGBA"}

# Size of the synthetic JPEG that `best_decoder` times (a photo large enough for the DCT scale
# to matter), the target size it decodes to, and how many timed decodes each candidate gets.
_PROBE_SIZE = (800, 600)  # (width, height)
_PROBE_TARGET = (224, 224)
_PROBE_ROUNDS = 7

_JPEG_MAGIC = b"\xff\xd8\xff"


class _Unsupported(Exception):
    """This JPEG is decoded by `decode_image` instead (a colour space, a size, or damage)."""


_IMPORTING = threading.Lock()


def turbo_modules() -> tuple[ModuleType, ModuleType] | None:
    """(simplejpeg, cv2), imported and configured once per process, or None if missing.

    One thread imports them while the others wait: OpenCV's import replaces its own module
    while it runs, and reader threads importing it at once in a fresh worker process hung or
    crashed (SIGSEGV) there.
    """
    with _IMPORTING:
        return _import_modules()


@functools.lru_cache(maxsize=1)
def _import_modules() -> tuple[ModuleType, ModuleType] | None:
    """(simplejpeg, cv2), imported and configured once per process, or None if missing.

    In a child process (a worker of the process backend) OpenCV's own thread pool is switched
    off (`cv2.setNumThreads(1)`): each worker process would otherwise start a pool as large as
    the machine, so N workers would run N x cores threads. The main process keeps its setting,
    which is process-wide and may matter to your own OpenCV code: its worker threads share one
    pool, and on/off measured the same there (docs/decoders.md).
    """
    try:
        import cv2
        import simplejpeg
    except ImportError:
        return None
    if multiprocessing.parent_process() is not None:
        cv2.setNumThreads(1)
    return simplejpeg, cv2


def fast_available() -> bool:
    """True when simplejpeg and OpenCV import (the `fast` extra is installed)."""
    return turbo_modules() is not None


class TurboDecoder:
    """Decode JPEGs with libjpeg-turbo, at a DCT scale or (antialias=False) at full size with
    an OpenCV resize; hand everything else to `decode_image`. See the module docstring.

    Call it like `decode_image`: `decoder(path, options)`. Raises `ImportError` naming the
    `fast` extra when simplejpeg or OpenCV is missing. Holds no state: one instance serves
    any number of threads, and it pickles by reference to its class (for worker processes).
    """

    # The decode and the resize run without the GIL (read by backend="auto").
    releases_gil = True
    name = "turbo"

    def prepare(self) -> None:
        """Import libjpeg-turbo and OpenCV now (a worker process does, before its first task)."""
        turbo_modules()

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        modules = turbo_modules()
        if modules is None:
            raise ImportError(f"decode_turbo needs simplejpeg and OpenCV: {INSTALL_HINT}")
        if _uses_unknown_fields(options):
            return decode_image(path, options)
        # once, capped, checked (pixels by the header too); a local path must be a regular file
        data = read_image(path, options.max_pixels)
        if not data.startswith(_JPEG_MAGIC):
            return decode_bytes(data, options, str(path))  # what decode_image(path) does
        try:
            return _decode_jpeg(data, options, *modules)
        except _Unsupported:
            # Includes JPEGs that libjpeg-turbo refuses (damaged, truncated): the default
            # decoder decides, so a bad file fails with the same error as with decode_image,
            # and libjpeg-turbo's message stays attached as its __context__.
            return decode_bytes(data, options, str(path))

    def __repr__(self) -> str:
        return "decode_turbo"


decode_turbo = TurboDecoder()
"""The libjpeg-turbo decoder (a `TurboDecoder`); needs the `fast` extra."""


# The DecodeOptions fields this module implements. A field added later is honoured by handing
# any options that set it away from its default to `decode_image`.
_IMPLEMENTED_FIELDS = frozenset(
    {
        "image_size",
        "channels",
        "interpolation",
        "crop_to_aspect_ratio",
        "pad_to_aspect_ratio",
        "antialias",
        "max_pixels",  # checked by read_image, before either decoder runs
    }
)


# Fields outside _IMPLEMENTED_FIELDS, per options class (filled on first use; idempotent).
_UNKNOWN_FIELDS: dict[type, tuple[dataclasses.Field[Any], ...]] = {}


def _uses_unknown_fields(options: DecodeOptions) -> bool:
    """True if `options` sets a field this module does not implement to a non-default value."""
    unknown = _UNKNOWN_FIELDS.get(type(options))
    if unknown is None:
        unknown = tuple(
            field for field in dataclasses.fields(options) if field.name not in _IMPLEMENTED_FIELDS
        )
        _UNKNOWN_FIELDS[type(options)] = unknown
    return any(getattr(options, field.name) != field.default for field in unknown)


def _decode_jpeg(data: bytes, options: DecodeOptions, simplejpeg: Any, cv2: Any) -> np.ndarray:
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as error:
        raise _Unsupported(f"libjpeg-turbo cannot read the header: {error}") from error
    if colorspace not in _TURBO_COLORSPACES:
        raise _Unsupported(colorspace)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > limit:
        raise _Unsupported("over Pillow's pixel limit: decode_image warns or refuses")
    if options.antialias and options.interpolation == "bilinear":
        # The default: a DCT scale that keeps twice the target (Pillow's draft rule), then a
        # Gaussian as wide as the triangle filter Pillow would use, then OpenCV's bilinear.
        factor = _pillow_factor(height, width, options)
        colorspace = _OUTPUT_COLORSPACE[options.channels]
        pixels = _decode(simplejpeg, data, colorspace, height, width, factor, fast_dct=False)
        return resize_like_keras(pixels, options, functools.partial(resize_antialiased, cv2=cv2))
    if options.antialias:
        # Decode at a DCT scale, then resize exactly as decode_image does (Pillow's filters,
        # crop and padding; gray or RGB converted to the channels asked for the same way).
        factor = _dct_factor(height, width, options)
        colorspace = "GRAY" if colorspace == "Gray" else "RGB"
        pixels = _decode(simplejpeg, data, colorspace, height, width, factor, fast_dct=False)
        if options.pad_to_aspect_ratio:
            return _pad(pixels, (height, width), options)
        return to_target_size(pixels, options)
    # Keras parity: full size, TensorFlow's default DCT, libjpeg-turbo's own gray conversion.
    colorspace = _OUTPUT_COLORSPACE[options.channels]
    pixels = _decode(simplejpeg, data, colorspace, height, width, 1, fast_dct=True)
    return resize_like_keras(pixels, options, functools.partial(resize_no_antialias, cv2=cv2))


def _decode(
    simplejpeg: Any,
    data: bytes,
    colorspace: str,
    height: int,
    width: int,
    factor: int,
    *,
    fast_dct: bool,
) -> np.ndarray:
    """Decode at 1/factor of full size, as an HxWxC array."""
    try:
        pixels: np.ndarray = simplejpeg.decode_jpeg(
            data,
            colorspace=colorspace,
            fastdct=fast_dct,
            min_height=-(-height // factor),
            min_width=-(-width // factor),
        )
    except ValueError as error:  # strict: also warnings such as "premature end of data"
        raise _Unsupported(f"libjpeg-turbo refused the data: {error}") from error
    return pixels.reshape(pixels.shape[0], pixels.shape[1], -1)


def _pad(pixels: np.ndarray, full_size: tuple[int, int], options: DecodeOptions) -> np.ndarray:
    """Fit a DCT-scaled decode inside the target and pad with zeros, where `decode_image` puts
    the image: its layout comes from the size Pillow decodes at (which its DCT scale can move
    by a row), not from this decode's size."""
    factor = _pillow_factor(*full_size, options)
    pillow_size = (-(-full_size[0] // factor), -(-full_size[1] // factor))
    top, left, inner_h, inner_w = resize.pad_layout(*pillow_size, options.image_size)
    inner_options = dataclasses.replace(
        options, image_size=(inner_h, inner_w), pad_to_aspect_ratio=False
    )
    padded = np.zeros(options.shape, np.uint8)
    padded[top : top + inner_h, left : left + inner_w] = to_target_size(pixels, inner_options)
    return padded


def _pillow_factor(height: int, width: int, options: DecodeOptions) -> int:
    """The DCT scale-down `decode_image` decodes at (Pillow's `draft`, with a reducing gap)."""
    region_w, region_h = crop_size((width, height), options)
    target_h, target_w = options.image_size
    wanted_h = math.ceil(target_h * height / region_h * DRAFT_REDUCING_GAP)
    wanted_w = math.ceil(target_w * width / region_w * DRAFT_REDUCING_GAP)
    if wanted_h >= height and wanted_w >= width:
        return 1
    most = min(height // wanted_h, width // wanted_w)
    return next(factor for factor in (8, 4, 2, 1) if most >= factor or factor == 1)


def _dct_factor(height: int, width: int, options: DecodeOptions) -> int:
    """The JPEG DCT scale-down (1, 2, 4 or 8) to decode at.

    For "nearest", the factor `decode_image` drafts at (Pillow's rule, with its reducing gap
    of 2), so the pixels picked are the same ones. Otherwise the largest power of two that
    keeps the region to resize at least as large as the target on both axes (the region is
    the crop with crop_to_aspect_ratio, the part that is not padding with pad_to_aspect_ratio);
    Pillow's antialiased filter does the rest. Against Pillow's gap of 2 this costs a mean
    difference of about 0.4-0.7 per pixel value on large photos and saves 15-40% of the time
    (docs/decoders.md); on ImageNet-sized photos both scales are 1, so pixels are equal.
    """
    if options.interpolation == "nearest":
        return _pillow_factor(height, width, options)
    region_w, region_h = crop_size((width, height), options)
    if options.pad_to_aspect_ratio:
        _, _, need_h, need_w = resize.pad_layout(height, width, options.image_size)
    else:
        need_h, need_w = options.image_size
    factor = 1
    while factor < MAX_DCT_FACTOR:
        scale_h = math.ceil(height / (2 * factor)) / height
        scale_w = math.ceil(width / (2 * factor)) / width
        if region_h * scale_h < need_h or region_w * scale_w < need_w:
            break
        factor *= 2
    return factor


def available_decoders() -> dict[str, Decoder]:
    """The decoders this machine has, by name: "pillow" (`decode_image`, always) and "turbo"
    (`decode_turbo`, when the `fast` extra is installed). For `prefetch bench` and your own
    comparisons; every entry follows the `Decoder` contract."""
    decoders: dict[str, Decoder] = {"pillow": decode_image}
    if fast_available():
        decoders["turbo"] = decode_turbo
    return decoders


@functools.lru_cache(maxsize=1)
def best_decoder() -> Decoder:
    """The fastest of `available_decoders()` on this machine: `decode_turbo` or `decode_image`.

    Measured once per process (then cached): each candidate decodes a synthetic 800x600 JPEG
    to 224x224, with and without antialiasing, a few times on the calling thread (about
    0.2 s in all); the smallest median CPU time wins. Without the `fast` extra it returns
    `decode_image` at once. The pixels of the two differ slightly (docs/decoders.md), so pass
    a decoder by name where runs must match bit for bit across machines.
    """
    decoders = available_decoders()
    if len(decoders) == 1:
        return decode_image
    with tempfile.TemporaryDirectory(prefix="prefetch-probe-") as folder:
        path = str(Path(folder) / "probe.jpg")
        _write_probe_jpeg(path)
        probes = [DecodeOptions(_PROBE_TARGET, antialias=flag) for flag in (True, False)]
        times = {
            name: sum(_seconds_per_decode(decoder, path, options) for options in probes)
            for name, decoder in decoders.items()
        }
    return decoders[min(times, key=times.__getitem__)]


def _write_probe_jpeg(path: str) -> None:
    """A textured photo-sized JPEG: smooth gradients plus noise, quality 90."""
    rng = np.random.default_rng(0)
    width, height = _PROBE_SIZE
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    noisy = base + rng.normal(0, 12, size=base.shape)
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(path, "JPEG", quality=90)


def _seconds_per_decode(decoder: Decoder, path: str, options: DecodeOptions) -> float:
    """Median CPU seconds of this thread per decode (robust to other busy processes)."""
    decoder(path, options)  # warm up: imports, page cache, lazily built tables
    spent = []
    for _ in range(_PROBE_ROUNDS):
        began = time.thread_time()
        decoder(path, options)
        spent.append(time.thread_time() - began)
    return statistics.median(spent)
