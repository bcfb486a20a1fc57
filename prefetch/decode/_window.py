"""Decode one window of an image file at the target size: the crop path of the loader.

`decode_window(path, crop, rng, options, engine)` reads the file once, takes the image's size
from its header, asks `crop` for the window (prefetch.plan._crops), and decodes as little as gives
that window at no less than the target size:

- JPEG, engine "turbo" with the compiled `prefetch.decode._jpegwindow` (libjpeg-turbo, built
  by the install from prefetch/decode/_c/ where a C compiler and libjpeg's headers exist): the
  largest DCT scale 1/N (N = 1, 2, 4, 8) that keeps the window at least the target on both
  axes, and only the window's rows and columns (`jpeg_crop_scanline` / `jpeg_skip_scanlines`).
- JPEG, engine "turbo" without it, but with the `fast` extra (simplejpeg): the same DCT scale,
  the whole image decoded, the window cut (a view).
- Everything else, and engine "pillow": Pillow decodes (JPEGs at the same DCT scale, by
  `draft`), the window is cut.

The window is rounded to the decoded scale's pixel grid (at most N/2 original pixels on each
edge), then resized to `options.image_size` with the loader's interpolation: OpenCV's bilinear
when the `fast` extra is installed (antialiased like `decode_turbo` with `antialias=True`),
else `prefetch.decode._decoders.to_target_size`. A JPEG that libjpeg-turbo refuses, a CMYK one, one
over
Pillow's pixel limit, and gray/RGBA outputs the compiled path does not make go to the Pillow
path with the same window, so a bad file raises what `decode_image` raises. Stateless and
thread-safe; the compiled decode and OpenCV release the GIL.

`decode_chunk` does the same for a worker's rows at once (issue 34: a thread worker holds the
GIL for almost nothing): one call of the compiled decoder reads the local files, draws each
sample's box and flip (numpy's generator, transcribed in C) and decodes every window without
the GIL, then each window is resized and flipped into its slot row; what it cannot take is
left to the caller's per-sample path. The C code is a second implementation of this module's
`dct_scale` and `scaled_box`, of prefetch.plan's crop boxes and generator, and of the local
read: each C function names its Python twin and each twin names it (prefetch/decode/_c/).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import io
import os
from types import ModuleType

import numpy as np
from PIL import Image

from prefetch.decode._cv_resize import resize_antialiased, resize_no_antialias, write_into
from prefetch.decode._decoders import DecodeOptions, convert_mode, to_target_size
from prefetch.decode._turbo import turbo_modules
from prefetch.io import MAX_HEADER_SEGMENTS, Location, active_options, open_bytes, read_image
from prefetch.plan import AUGMENT_STREAM, Box, CenterCrop, Crop, RandomResizedCrop


def _compiled() -> ModuleType | None:
    """`prefetch.decode._jpegwindow`, or None where the install could not build it (no C compiler or
    no libjpeg headers)."""
    try:
        return importlib.import_module("prefetch.decode._jpegwindow")
    except ImportError:
        return None


_jpegwindow = _compiled()

# The names `decode_window` takes: "turbo" is the fastest of the compiled window decoder,
# simplejpeg and Pillow that this machine has; "pillow" is Pillow alone.
ENGINES = ("turbo", "pillow")

# libjpeg-turbo's fast scaled inverse DCTs: 1/1, 1/2, 1/4, 1/8 (other M/8 scales are slower).
DCT_SCALES = (8, 4, 2, 1)

_JPEG_MAGIC = b"\xff\xd8\xff"
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def compiled_available() -> bool:
    """True when the compiled libjpeg-turbo window decoder (`prefetch.decode._jpegwindow`) is
    built."""
    return _jpegwindow is not None


def entropy_decode_rows(data: bytes, last_row: int) -> int:
    """Entropy-decode the JPEG `data` down to pixel row `last_row`: the floor of any decode.

    libjpeg-turbo's Huffman decoding of the MCU rows that cover rows 0..`last_row` of the
    full-size image, with no inverse DCT, upsampling, colour conversion or resize: the work no
    DCT scale or window avoids, since every row down to a window's last must be entropy-decoded.
    Timing it on a sample's window (its last row is `box.top + box.height - 1`) measures the
    floor of that sample's decode. A progressive or multi-scan file is decoded whole (each scan
    spans the whole image, so every window pays for all of them). Returns the pixel rows
    covered (whole MCU rows, at most the image's height). Releases the GIL.

    Raises ValueError for data libjpeg-turbo refuses (not a JPEG, corrupt or truncated) or a
    `last_row` outside the image, and RuntimeError where the compiled window decoder is not
    built (`compiled_available()`).
    """
    if _jpegwindow is None:
        raise RuntimeError(
            "entropy_decode_rows needs the compiled window decoder (prefetch.decode._jpegwindow): "
            "reinstall prefetch where a C compiler and libjpeg-turbo's headers exist"
        )
    if last_row < 0:
        raise ValueError(f"last_row must be >= 0, got {last_row}")
    rows: int = _jpegwindow.entropy_decode_rows(data, last_row)
    return rows


def chunk_available(crop: Crop | None, options: DecodeOptions, engine: str) -> bool:
    """Whether `decode_chunk` can decode this crop's windows: the compiled window decoder with
    its chunk entry point, engine "turbo", a crop, and RGB or gray output."""
    return (
        _jpegwindow is not None
        and hasattr(_jpegwindow, "decode_chunk")
        and engine == "turbo"
        and isinstance(crop, (RandomResizedCrop, CenterCrop))
        and options.channels in (1, 3)
    )


# What `decode_chunk` gives each sample (its table's columns: T_STATUS... in _c/chunk.h).
_STATUS, _OFFSET, _HEIGHT, _WIDTH, _FLIPPED, _NANOS = range(6)
_DONE = 0


def decode_chunk(
    paths: list[str],
    indices: list[int],
    positions: list[int],
    seed: int,
    epoch: int,
    crop: Crop,
    flip: bool,
    options: DecodeOptions,
    images: np.ndarray,
    started: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode a chunk of samples' windows into their rows of `images` (a slot's uint8 array):
    sample i is the local file `paths[i]` (a path, never a URL: the caller reads those), the
    source's sample `indices[i]`, written to row `positions[i]`, cropped and flipped as
    `decode_window` and `Augment.flipped` do with the generator
    `Augment.rng(seed, epoch, indices[i])`, to the same pixels.

    One call of the compiled decoder reads every file, draws every box and flip and decodes
    every window without the GIL (`decode_chunk` in prefetch/decode/_c/binding.c, the loop in
    _c/chunk.c); then each window is resized (and flipped) into its row.
    Returns (done, seconds): a bool per sample, False for a sample left to the caller (not a
    readable regular file, not a baseline JPEG, over a limit, damaged: the caller reads it the
    usual way, which names what is wrong), and the seconds spent on each. `started` (the
    slot's float64 column) holds each sample's `time.monotonic()` while it is read. Needs
    `chunk_available(crop, options, "turbo")`."""
    assert _jpegwindow is not None
    count = len(paths)
    local = [os.fsencode(p) if "\x00" not in p else b"" for p in paths]  # C strings end at NUL
    if isinstance(crop, RandomResizedCrop):
        kind, params = 1, (*crop.scale, *crop.ratio)
    else:
        kind, params = 2, (crop.fraction, 0.0, 0.0, 0.0)
    limit = Image.MAX_IMAGE_PIXELS
    windows, raw = _jpegwindow.decode_chunk(
        local,
        indices,
        positions,
        seed,
        epoch,
        AUGMENT_STREAM,
        kind,
        params,
        bool(flip),
        *options.image_size,
        options.channels,
        -1 if options.max_pixels is None else options.max_pixels,
        -1 if limit is None else int(limit),
        active_options().max_object_bytes,
        MAX_HEADER_SEGMENTS,
        started,
    )
    table = np.frombuffer(raw, np.int64).reshape(count, 6)
    done = table[:, _STATUS] == _DONE
    seconds = table[:, _NANOS] * 1e-9
    channels, target = options.channels, options.image_size
    # resize_window's own path for these options (OpenCV's bilinear, no antialiasing), called
    # directly: the least Python a sample.
    plain = options.interpolation == "bilinear" and not options.antialias
    cv2 = _cv2() if plain else None
    size, linear = (target[1], target[0]), cv2.INTER_LINEAR if cv2 is not None else 0
    chosen = np.flatnonzero(done)
    samples = table[chosen, _OFFSET:_NANOS].tolist()
    for i, (offset, height, width, flipped) in zip(chosen.tolist(), samples, strict=True):
        pixels = np.frombuffer(windows, np.uint8, height * width * channels, offset)
        pixels, row = pixels.reshape(height, width, channels), images[positions[i]]
        if cv2 is not None and (height, width) != target:
            cv2.resize(pixels, size, dst=row, interpolation=linear)  # written into `row`
        else:
            resize_window(pixels, options, row)
        if flipped:
            flip_left_right(row, row)
    return done, seconds


def window_engine_name(engine: str) -> str:
    """What `engine` decodes JPEG windows with on this machine, for stats and reports."""
    if engine == "pillow":
        return "pillow"
    if compiled_available():
        return "libjpeg-turbo window"
    return "simplejpeg + cut" if _simplejpeg() is not None else "pillow"


def decode_window(
    path: Location,
    crop: Crop,
    rng: np.random.Generator,
    options: DecodeOptions,
    engine: str,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The window `crop` draws (from `rng`) of the image at `path`, resized to `options.shape`.

    `path` is a local path, a `file://` path or an fsspec URL (read whole, with retries), or a
    shard's `Member`. With `out` (a uint8 array of `options.shape`, such as a row of a batch
    slot) the image is resized straight into it and `out` returned; after an error its
    contents are undefined.
    Raises what `decode_image` raises for a bad file.
    """
    data = read_image(path, options.max_pixels)  # checked: empty, too many pixels or scans
    if engine == "turbo" and data.startswith(_JPEG_MAGIC) and options.channels != 4:
        header = _jpeg_header(data)
        if header is not None:
            height, width = header
            box = crop.box(height, width, options.image_size, rng)
            pixels = _turbo_window(data, (height, width), box, options)
            if pixels is not None:
                return resize_window(pixels, options, out)
            return _pillow_window(data, box, options, out=out)
    with open_bytes(data, str(path)) as image:  # its errors name the file
        box = crop.box(image.height, image.width, options.image_size, rng)
        return _pillow_window(data, box, options, out, image)


def crop_image(
    image: Image.Image | np.ndarray, crop: Crop, rng: np.random.Generator, options: DecodeOptions
) -> np.ndarray:
    """The window `crop` draws of an already decoded image (a source's `__getitem__`),
    resized to `options.shape`."""
    if isinstance(image, Image.Image):
        image = np.asarray(convert_mode(image, _PIL_MODES[options.channels]))
    if image.ndim == 2:
        image = image[:, :, None]
    height, width = image.shape[:2]
    top, left, box_h, box_w = crop.box(height, width, options.image_size, rng)
    return resize_window(image[top : top + box_h, left : left + box_w], options)


def dct_scale(box: Box, target: tuple[int, int]) -> int:
    """The largest N in (1, 2, 4, 8) that keeps the window at least `target` at 1/N.

    C twin: `dct_scale` in prefetch/decode/_c/boxes.c (the chunk path); change both."""
    return next(
        n
        for n in DCT_SCALES
        if n == 1 or (box.height // n >= target[0] and box.width // n >= target[1])
    )


def scaled_box(box: Box, full: tuple[int, int], scale: int) -> Box:
    """`box` on the grid of the image decoded at 1/scale (whose size is ceil(full / scale)),
    rounded to whole pixels and never empty.

    C twin: `scaled_box` in prefetch/decode/_c/boxes.c (the chunk path); change both."""
    rows, columns = -(-full[0] // scale), -(-full[1] // scale)
    top = min(round(box.top / scale), rows - 1)
    left = min(round(box.left / scale), columns - 1)
    bottom = min(max(round((box.top + box.height) / scale), top + 1), rows)
    right = min(max(round((box.left + box.width) / scale), left + 1), columns)
    return Box(top, left, bottom - top, right - left)


def resize_window(
    pixels: np.ndarray, options: DecodeOptions, out: np.ndarray | None = None
) -> np.ndarray:
    """An HxWxC window resized to `options.shape` with the loader's interpolation; with `out`
    (a uint8 array of that shape) resized straight into it, and `out` returned."""
    cv2 = _cv2()
    if cv2 is not None and options.interpolation == "bilinear":
        resize = resize_antialiased if options.antialias else resize_no_antialias
        return resize(pixels, options.image_size, "bilinear", cv2=cv2, out=out)
    return write_into(to_target_size(np.ascontiguousarray(pixels), _whole(options)), out)


def flip_left_right(image: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`image` mirrored left-right, as a new contiguous array, or written into `out` (which
    may be `image` itself: flipped in place) and `out` returned. OpenCV's flip when the
    `fast` extra is installed (about 8 us for 224x224x3, where numpy's copy of a reversed
    view takes about 330 us), else numpy."""
    cv2 = _cv2()
    if cv2 is None:
        if out is None:
            return np.ascontiguousarray(image[:, ::-1])
        out[...] = image[:, ::-1]  # numpy copies first where the two overlap
        return out
    flipped: np.ndarray = cv2.flip(np.ascontiguousarray(image), 1, dst=out)
    return write_into(flipped.reshape(image.shape), out)


def _turbo_window(
    data: bytes, full: tuple[int, int], box: Box, options: DecodeOptions
) -> np.ndarray | None:
    """The window decoded by libjpeg-turbo at its DCT scale, or None when it refuses."""
    scale = dct_scale(box, options.image_size)
    window = scaled_box(box, full, scale)
    channels = options.channels
    try:
        if _jpegwindow is not None:
            raw = _jpegwindow.decode(data, *window, scale, channels, True)
            return np.frombuffer(raw, np.uint8).reshape(window.height, window.width, channels)
        simplejpeg = _simplejpeg()
        if simplejpeg is None:
            return None
        pixels: np.ndarray = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if channels == 1 else "RGB",
            fastdct=True,
            min_height=-(-full[0] // scale),
            min_width=-(-full[1] // scale),
        )
    except ValueError:  # damaged or unsupported: the Pillow path decides
        return None
    pixels = pixels.reshape(pixels.shape[0], pixels.shape[1], channels)
    top, left, height, width = window
    return pixels[top : top + height, left : left + width]


def _pillow_window(
    data: bytes,
    box: Box,
    options: DecodeOptions,
    out: np.ndarray | None = None,
    image: Image.Image | None = None,
) -> np.ndarray:
    """Pillow decodes (a JPEG at the window's DCT scale), the window is cut and resized."""
    with image if image is not None else Image.open(io.BytesIO(data)) as opened:
        full = (opened.height, opened.width)
        scale = dct_scale(box, options.image_size) if opened.format == "JPEG" else 1
        if scale > 1:
            # Pillow picks min(full // requested) as its scale: ask for full // scale.
            opened.draft(None, (full[1] // scale, full[0] // scale))
            # Pillow scales by what it decided; derive the factor from the size it gives.
            scale = max(1, round(full[0] / opened.height))
        opened.load()
        pixels = np.asarray(convert_mode(opened, _PIL_MODES[options.channels]))
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    top, left, height, width = scaled_box(box, full, scale)
    return resize_window(pixels[top : top + height, left : left + width], options, out)


def _jpeg_header(data: bytes) -> tuple[int, int] | None:
    """(height, width) of a JPEG libjpeg-turbo decodes to RGB and gray as Pillow does, or None
    (CMYK/YCCK, over Pillow's pixel limit, or a header it cannot read)."""
    try:
        if _jpegwindow is not None:
            width, height, _, space = _jpegwindow.header(data)
        else:
            simplejpeg = _simplejpeg()
            if simplejpeg is None:
                return None
            height, width, space, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if space not in ("YCbCr", "Gray", "RGB") or (limit is not None and height * width > limit):
        return None
    return int(height), int(width)


def _whole(options: DecodeOptions) -> DecodeOptions:
    """`options` without Keras's crop or padding: the window is resized whole."""
    return dataclasses.replace(options, crop_to_aspect_ratio=False, pad_to_aspect_ratio=False)


# simplejpeg and OpenCV, imported once per process by the fast decoder's own import (None
# without the `fast` extra); looked up per sample, so kept here once found.
@functools.lru_cache(maxsize=1)
def _simplejpeg() -> ModuleType | None:
    modules = turbo_modules()
    return modules[0] if modules is not None else None


@functools.lru_cache(maxsize=1)
def _cv2() -> ModuleType | None:
    modules = turbo_modules()
    return modules[1] if modules is not None else None
