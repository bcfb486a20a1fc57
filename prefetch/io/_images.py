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

Every image's size is read from its header by the header walk (`prefetch.io._headers`: every
frame of a JPEG before its first scan, every IHDR of a PNG before its first IDAT, with no count
after which it stops looking; Pillow's lazy `open` for other formats) and an image of more
pixels than the `max_pixels` given (the `Loader`'s `ErrorPolicy(max_pixels=...)`, default
`DEFAULT_MAX_PIXELS`) is refused before any decoder allocates its pixels: a flat 13,000 x
13,000 PNG is 189 KB on disk and 3.5 GB in memory once decoded. So is a file whose size
decoders disagree on (two frames, two IHDRs) and one whose header is longer than any image's
(`MAX_HEADER_SEGMENTS`). The compiled chunk path applies the same rules with the walk's C twin
(`plan_window` in prefetch/decode/_c/chunk.c, with header_walk.c): a change to these rules is a
change there. Pure functions of the bytes, thread-safe.
"""

from __future__ import annotations

import io
import re
import warnings

from PIL import Image, UnidentifiedImageError

from prefetch.io._headers import MAX_HEADER_SEGMENTS, JpegHeader, walk_jpeg, walk_png
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


def check_image_bytes(data: bytes, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> None:
    """Refuse what no decoder should be given, naming the file `name`: an empty file
    (`PIL.UnidentifiedImageError`, "empty file"), and as `PIL.Image.DecompressionBombError`:
    an image of more than `max_pixels` pixels by its header (None: no limit), a JPEG of two
    frames or a PNG of two IHDRs before their data (decoders disagree on their size), a header
    of more than `MAX_HEADER_SEGMENTS` segments or chunks, and a progressive or
    arithmetic-coded JPEG of more than `MAX_JPEG_SCANS` scans or `MAX_JPEG_SCAN_PIXELS` scans
    times pixels. Costs a few microseconds for a baseline JPEG or a PNG, a pass over the
    bytes (about 1 ms a MB) for the others."""
    if not data:
        raise UnidentifiedImageError(f"empty file (0 bytes): {name!r}")
    jpeg = data.startswith(_JPEG_SOI)
    header = walk_jpeg(data) if jpeg else None
    size = _checked_size(data, header, name)
    pixels = size[0] * size[1] if size is not None else 0
    if max_pixels is not None and pixels > max_pixels:
        width, height = size or (0, 0)
        raise Image.DecompressionBombError(
            f"{width} x {height} = {pixels:,} pixels, over max_pixels={max_pixels:,}: {name!r} "
            f"is not decoded (it would take about {_gigabytes(pixels)} GB of memory). Pass "
            "on_error=ErrorPolicy(max_pixels=...) to raise the limit, or resize the file"
        )
    if header is None or header.frame in _SIZE_BOUNDED_FRAMES:
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
    decoded: a JPEG's frame, a PNG's IHDR (the largest, where there are several: the header
    walk, `prefetch.io._headers`), else Pillow's lazy `open` (header only); None when no size
    can be read (the decoder then names what is wrong)."""
    if data.startswith(_JPEG_SOI):
        header = walk_jpeg(data)
        return (header.width, header.height) if header.frames else None
    if data.startswith(_PNG_MAGIC):
        png = walk_png(data)
        return (png.width, png.height) if png.headers else None
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


def _checked_size(data: bytes, jpeg: JpegHeader | None, name: str) -> tuple[int, int] | None:
    """The (width, height) decoders will allocate for `data` (`jpeg`: its walk, for a JPEG),
    or None when its header says none; `DecompressionBombError` naming `name` for a header
    that decoders read differently (two frames, two IHDRs) or that is longer than any image's."""
    if jpeg is not None:
        walked, found, size = jpeg.segments, jpeg.frames, (jpeg.width, jpeg.height)
        segments, headers = "marker segments before its first scan", "frame headers (SOF)"
        disagree = "libjpeg refuses a second frame, Pillow allocates for the last"
    elif data.startswith(_PNG_MAGIC):
        png = walk_png(data)
        walked, found, size = png.chunks, png.headers, (png.width, png.height)
        segments, headers = "chunks before its first IDAT", "IHDR chunks"
        disagree = "libpng refuses a second, Pillow allocates for the last"
    else:
        return image_pixels(data)
    if walked > MAX_HEADER_SEGMENTS:
        raise Image.DecompressionBombError(
            f"more than MAX_HEADER_SEGMENTS={MAX_HEADER_SEGMENTS:,} {segments}: {name!r} is "
            "not decoded (an image's header has about 10; each costs its decoders a step). "
            "Re-save it without them"
        )
    if found > 1:
        raise Image.DecompressionBombError(
            f"{found} {headers}, the largest {size[0]} x {size[1]}: {name!r} is not decoded "
            f"(decoders disagree on its size: {disagree}). Re-save it with one"
        )
    return size if found else None


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
