"""An image's bytes, read and checked before any decoder sees them; Pillow's open of them.

`read_image(location)` is `read_location` (`prefetch.io._locations`: a path, a URL or a shard's
member, within the `RemoteOptions` bounds) followed by `check_image_bytes`; `open_image` is
Pillow's `Image.open` of those bytes, its errors naming the file. Every decoder of prefetch's
(`prefetch.decode`) and `FileList.__getitem__` read images through them.

`check_image_bytes(data, name)` refuses what no decoder is given: an empty file ("empty file",
where Pillow would say "cannot identify") and a JPEG whose scans could keep any decoder busy for
minutes: each scan of a progressive (or arithmetic-coded) JPEG is a pass over every block of the
image, and an end-of-band run lets a scan cover 32,767 blocks in a few bits, so a valid 1 MB
file of 8000x8000 with about 1,200 scans takes 40 s of CPU in Pillow and in libjpeg-turbo alike
(libjpeg-turbo's report LJT-01-003). Huffman-coded sequential and lossless JPEGs spend at least
two bits of the file per block and scan: their work is bounded by their size, so the common
baseline photo pays only a walk over its header's few segments. It is a bound like
`max_object_bytes`, on decode time instead of memory. Below the cap, the work of a scan is in
proportion to the pixels, so scans times pixels is bounded too (`MAX_JPEG_SCAN_PIXELS`).

Every image's size is read from its header (`image_pixels`: a JPEG's frame, a PNG's IHDR, a
few bytes; Pillow's lazy `open` for other formats) and an image of more pixels than the
`max_pixels` given (the `Loader`'s `ErrorPolicy(max_pixels=...)`, default
`DEFAULT_MAX_PIXELS`) is refused before any decoder allocates its pixels: a flat 13,000 x
13,000 PNG is 189 KB on disk and 3.5 GB in memory once decoded. Pure functions of the bytes,
thread-safe.
"""

from __future__ import annotations

import io
import re
import struct
import warnings

from PIL import Image, UnidentifiedImageError

from prefetch.io._locations import Location, read_location

MAX_JPEG_SCANS = 500
"""The most scans (SOS markers) a progressive or arithmetic-coded JPEG may hold.

Encoders write about 10 (libjpeg's progression; 18 for CMYK), an EXIF thumbnail or an appended
image (MPO, gain maps) a few more. 500 is TurboJPEG's limit (TJFLAG_LIMITSCANS) and DALI's
default. At the cap a decode costs at most about 17 s of CPU for 8000x8000 (issue 29.13's 41 s
for 1,200 scans, scaled), in proportion to the pixels. A module constant, read at each check:
set it in every process that decodes (worker processes import prefetch afresh).
"""

DEFAULT_MAX_PIXELS = 64_000_000
"""The most pixels (width x height) of an image a `Loader` decodes by default.

64 megapixels: every camera's photo up to 61 MP (9504 x 6336) passes; decoding one costs about
11 bytes a pixel at the peak (the pixels, Pillow's RGBX copy, the resize): about 0.7 GB. Pillow
itself warns from 89 MP and refuses from 179 MP. Raise it with `ErrorPolicy(max_pixels=...)`
(None: no limit of ours) for larger images.
"""

MAX_JPEG_SCAN_PIXELS = 4_000_000_000
"""The most scans times pixels a progressive or arithmetic-coded JPEG may cost.

Each scan is a pass over the image's blocks; measured, 13,000 x 13,000 with 498 scans (84
billion) takes 27 s. 4 billion (1-2 s of CPU) lets a 64 MP photo have 62 scans (encoders write
about 10, 18 for CMYK). A module constant, read at each check, like `MAX_JPEG_SCANS`.
"""

_JPEG_SOI = b"\xff\xd8"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# A scan's marker anywhere in the file: in entropy-coded data a 0xFF byte is always followed by
# 0x00 or a restart marker, so 0xFFDA there is always a scan (or one of an embedded thumbnail).
_SOS = re.compile(b"\xff\xda")
# Frame (SOF) markers whose scans cost at least two bits a block: Huffman-coded baseline,
# extended sequential and lossless. Every other frame's scans are counted.
_SIZE_BOUNDED_FRAMES = frozenset({0xC0, 0xC1, 0xC3})
# All frame markers: 0xC0-0xCF but DHT (0xC4), JPG (0xC8) and DAC (0xCC).
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# The most markers read looking for the frame: a photo has about 10 before it (APPn, DQT, DHT).
_MAX_HEADER_MARKERS = 256


def check_image_bytes(data: bytes, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
    """Refuse what no decoder should be given, naming the file `name`: an empty file
    (`PIL.UnidentifiedImageError`, "empty file"), an image of more than `max_pixels` pixels
    by its header (None: no limit), and a progressive or arithmetic-coded JPEG of more than
    `MAX_JPEG_SCANS` scans or `MAX_JPEG_SCAN_PIXELS` scans times pixels (both
    `PIL.Image.DecompressionBombError`). Costs a few microseconds for a baseline JPEG or a
    PNG, a pass over the bytes (about 1 ms a MB) for the others."""
    if not data:
        raise UnidentifiedImageError(f"empty file (0 bytes): {name!r}")
    jpeg = data.startswith(_JPEG_SOI)
    frame = _frame(data) if jpeg else None
    size = frame[1] if frame is not None else (None if jpeg else image_pixels(data))
    pixels = size[0] * size[1] if size is not None else 0
    if max_pixels is not None and pixels > max_pixels:
        width, height = size or (0, 0)
        raise Image.DecompressionBombError(
            f"{width} x {height} = {pixels:,} pixels, over max_pixels={max_pixels:,}: {name!r} "
            f"is not decoded (it would take about {_gigabytes(pixels)} GB of memory). Pass "
            "on_error=ErrorPolicy(max_pixels=...) to raise the limit, or resize the file"
        )
    if not jpeg or (frame is not None and frame[0] in _SIZE_BOUNDED_FRAMES):
        return
    scans = len(_SOS.findall(data))
    if scans > MAX_JPEG_SCANS:
        raise Image.DecompressionBombError(
            f"progressive JPEG with {scans} scans, over the cap of {MAX_JPEG_SCANS}: {name!r} "
            "is not decoded (each scan is a pass over the whole image, so it could take "
            "minutes). Re-encode it with fewer scans (jpegtran -copy all in.jpg > out.jpg "
            "writes one)"
        )
    if scans * pixels > MAX_JPEG_SCAN_PIXELS:
        raise Image.DecompressionBombError(
            f"progressive JPEG of {pixels:,} pixels with {scans} scans: {scans * pixels:,} "
            f"scan-pixels, over the cap of MAX_JPEG_SCAN_PIXELS={MAX_JPEG_SCAN_PIXELS:,}: "
            f"{name!r} is not decoded (each scan is a pass over the whole image, so it could "
            "take minutes). Re-encode it with fewer scans (jpegtran -copy all in.jpg > "
            "out.jpg writes one)"
        )


def image_pixels(data: bytes) -> tuple[int, int] | None:
    """(width, height) of the encoded image `data` from its header, before any pixel is
    decoded: a JPEG's frame, a PNG's IHDR, else Pillow's lazy `open` (header only); None
    when no size can be read (the decoder then names what is wrong)."""
    if data.startswith(_JPEG_SOI):
        frame = _frame(data)
        return None if frame is None else frame[1]
    if data.startswith(_PNG_MAGIC) and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack_from(">II", data, 16)
        return int(width), int(height)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Image.DecompressionBombError as error:  # over twice Pillow's limit: say the size
        found = re.search(r"(\d+) pixels", str(error))
        return (int(found.group(1)), 1) if found else None
    except Exception:  # not an image Pillow knows: the decoder names it
        return None


def _gigabytes(pixels: int) -> str:
    return f"{pixels * 11 / 1e9:.1f}"


def _frame(data: bytes) -> tuple[int, tuple[int, int]] | None:
    """The frame (SOF) marker of the JPEG `data` and its (width, height), found as libjpeg
    finds markers (bytes before one are skipped, each segment by its length), or None when
    there is none early on."""
    position, end = 2, len(data)
    for _ in range(_MAX_HEADER_MARKERS):
        position = data.find(b"\xff", position)
        if position < 0 or position + 1 >= end:
            return None
        marker = data[position + 1]
        if marker in _FRAMES:
            if position + 9 > end:
                return None
            height, width = struct.unpack_from(">HH", data, position + 5)
            return marker, (int(width), int(height))
        if marker in (0xD9, 0xDA):  # the end, or a scan before any frame
            return None
        if marker in (0x00, 0x01, 0xFF) or 0xD0 <= marker <= 0xD8:  # no length follows
            position += 1 if marker == 0xFF else 2
            continue
        if position + 4 > end:
            return None
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return None


def read_image(path: Location, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> bytes:
    """The bytes of the image at `path`, checked by `check_image_bytes` (with `max_pixels`)
    before any decoder sees them: a local or `file://` path (a regular file), an fsspec URL
    (retried), or a sample of a shard (a `Member` value), all through `read_location` (at
    most `max_object_bytes`). A string is always a path or URL, whatever its characters."""
    data = read_location(path)
    check_image_bytes(data, str(path), max_pixels)
    return data


def open_bytes(data: bytes, name: str) -> Image.Image:
    """`Image.open` of the encoded image `data`, read from the file `name`: a file Pillow cannot
    identify raises `PIL.UnidentifiedImageError` naming `name` (not a BytesIO object)."""
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise UnidentifiedImageError(f"cannot identify image file {name!r}") from None


def open_image(path: Location, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> Image.Image:
    """`Image.open` of the image at `path` (`read_image`, with `max_pixels`: a local path, a
    `file://` path, an fsspec URL or a `Member` of a shard), its errors naming `path`."""
    return open_bytes(read_image(path, max_pixels), str(path))
