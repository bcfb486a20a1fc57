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

import functools
import importlib
import io
import os
from types import ModuleType

import numpy as np
from PIL import Image

from prefetch.decode._decoders import DecodeOptions, convert_mode
from prefetch.decode._turbo import turbo_modules
from prefetch.decode._window_resize import (
    PIL_MODES,
    cv2_module,
    flip_left_right,
    resize_window,
)
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

CHUNK_BYTES = 64 << 20
"""The most bytes of files and windows one call of the compiled chunk decoder holds at once.

`decode_chunk` reads a chunk's files and plans their windows (holding the files), then decodes
the windows: it stops reading once the next file would pass this many bytes, decodes what it
holds, and goes on with the rest in a further call (issue 40.4: 32 files of 96 MB each made a
thread worker 1.6 GB, a process worker 3.1 GB). A file larger than this goes alone. So the
files and windows a worker holds are at most max(CHUNK_BYTES, the largest file) plus one
window; for the worst file the object cap allows (`RemoteOptions.max_object_bytes`, default
1 GiB) that is 1 GiB and its window, what the per-sample path holds for it too (the file's
bytes, then its pixels). 64 MiB is 400 ImageNet photos or about a dozen camera photos: a chunk
of 32 rows of either is one call or a few (each call costs some microseconds under the GIL).
"""


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
    `chunk_available(crop, options, "turbo")`. Holds at most `CHUNK_BYTES` of files and windows
    at once, plus one window (one file alone where it is larger): a chunk of larger files takes
    several calls."""
    assert _jpegwindow is not None
    local = [os.fsencode(p) if "\x00" not in p else b"" for p in paths]  # C strings end at NUL
    if isinstance(crop, RandomResizedCrop):
        kind, params = 1, (*crop.scale, *crop.ratio)
    else:
        kind, params = 2, (crop.fraction, 0.0, 0.0, 0.0)
    limit = Image.MAX_IMAGE_PIXELS
    bounds = (
        -1 if options.max_pixels is None else options.max_pixels,
        -1 if limit is None else int(limit),
        active_options().max_object_bytes,
        MAX_HEADER_SEGMENTS,
        CHUNK_BYTES,
    )
    tables, first = [], 0
    while first < len(paths):
        windows, raw, handled = _jpegwindow.decode_chunk(
            local[first:] if first else local,
            indices[first:] if first else indices,
            positions[first:] if first else positions,
            seed,
            epoch,
            AUGMENT_STREAM,
            kind,
            params,
            bool(flip),
            *options.image_size,
            options.channels,
            *bounds,
            started,
        )
        assert handled > 0, "decode_chunk handles at least one sample a call"
        table = np.frombuffer(raw, np.int64).reshape(-1, 6)[:handled]
        _write_windows(windows, table, positions[first : first + handled], options, images)
        tables.append(table)
        first += handled
    table = tables[0] if len(tables) == 1 else np.concatenate(tables)
    return table[:, _STATUS] == _DONE, table[:, _NANOS] * 1e-9


def _write_windows(
    windows: bytearray,
    table: np.ndarray,
    positions: list[int],
    options: DecodeOptions,
    images: np.ndarray,
) -> None:
    """Resize (and flip) each window that `decode_chunk`'s `table` says is decoded into its
    row `positions[i]` of `images`."""
    channels, target = options.channels, options.image_size
    # resize_window's own path for these options (OpenCV's bilinear, no antialiasing), called
    # directly: the least Python a sample.
    plain = options.interpolation == "bilinear" and not options.antialias
    cv2 = cv2_module() if plain else None
    size, linear = (target[1], target[0]), cv2.INTER_LINEAR if cv2 is not None else 0
    chosen = np.flatnonzero(table[:, _STATUS] == _DONE)
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
        pixels = np.asarray(convert_mode(opened, PIL_MODES[options.channels]))
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    top, left, height, width = scaled_box(box, full, scale)
    return resize_window(pixels[top : top + height, left : left + width], options, out)


def _jpeg_header(data: bytes) -> tuple[int, int] | None:
    """(height, width) of a JPEG libjpeg-turbo decodes to RGB and gray as Pillow does, or None
    (CMYK/YCCK, over Pillow's pixel limit, or a header it cannot read). C twin: the libjpeg
    header check of `plan_window` in prefetch/decode/_c/chunk.c; change both."""
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


# simplejpeg, imported once per process by the fast decoder's own import (None without the
# `fast` extra); looked up per sample, so kept here once found.
@functools.lru_cache(maxsize=1)
def _simplejpeg() -> ModuleType | None:
    modules = turbo_modules()
    return modules[0] if modules is not None else None
