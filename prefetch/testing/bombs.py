"""Small files that cost a decoder far more than their size: pixel bombs and a scan bomb.

`write_decompression_bomb` writes a PNG over Pillow's pixel limit (Pillow refuses it);
`write_flat_png` a valid flat PNG of any size (13,000 x 13,000 is 165 KB and 3.5 GB decoded:
under Pillow's refusal, over prefetch's `DEFAULT_MAX_PIXELS`); `claim_size` rewrites a JPEG's
frame header to claim another size (a decoder that trusts the header allocates for it);
`write_scan_bomb` a progressive JPEG of more scans than `prefetch.io.MAX_JPEG_SCANS`
(prefetch refuses it before any decoder runs). All are valid enough for a decoder to start.

Tricks that hide a file's size from a header walk that stops looking (issue 40.3), each of
which `prefetch.io.check_image_bytes` sees through: `hide_frame` puts comment segments or 0xFF
fill bytes before a JPEG's frame, `add_frame` a second frame header claiming another size (libjpeg
refuses it, Pillow allocates for the last), `write_two_header_png` a PNG with a 1x1 IHDR before
its real one (Pillow keeps the last).
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from prefetch.io import MAX_JPEG_SCANS
from prefetch.testing import _jpeg_segments as jpeg

# Pillow's default `Image.MAX_IMAGE_PIXELS`. `Image.open` raises DecompressionBombError above
# twice this. Spawned worker processes start with the default whatever the parent set.
PILLOW_DEFAULT_MAX_PIXELS = 1024 * 1024 * 1024 // 4 // 3

_SOS = b"\xff\xda"
_EOI = b"\xff\xd9"


def write_decompression_bomb(path: str | os.PathLike[str]) -> Path:
    """Write a valid 1-bit black PNG of over twice Pillow's default pixel limit; returns `path`.

    The file is about 22 KB and takes a fraction of a second to write; `Image.open` raises
    `PIL.Image.DecompressionBombError` for it in any process that keeps Pillow's default
    `MAX_IMAGE_PIXELS`, spawned workers included.
    """
    width = 1 << 14
    return _flat_gray_png(path, width, 2 * PILLOW_DEFAULT_MAX_PIXELS // width + 64, bits=1)


def _flat_gray_png(path: str | os.PathLike[str], width: int, height: int, bits: int) -> Path:
    """Write a valid black grayscale PNG of `bits` per pixel (1 or 8); returns `path`."""
    path = Path(path)
    row = b"\0" * (1 + -(-width * bits // 8))  # filter byte, then the row's pixels
    compressor = zlib.compressobj(9)
    pixels = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, bits, 0, 0, 0, 0)  # grayscale
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", pixels)
        + _png_chunk(b"IEND", b"")
    )
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def write_scan_bomb(
    path: str | os.PathLike[str],
    size: tuple[int, int] = (64, 64),
    scans: int = MAX_JPEG_SCANS + 100,
) -> Path:
    """Write a progressive JPEG of `size` (width, height) with `scans` scans; returns `path`.

    Pillow's progressive encoding (libjpeg's 10 scans) of a gradient, with its last scan (a
    refinement of the luma's AC coefficients) repeated until the file has `scans`. libjpeg
    decodes every repeat (with a warning), each a pass over all the image's blocks: about
    1 ms a scan at 2000x2000. The default, 600 scans of 64x64, is about 26 KB and over the cap
    of `prefetch.io._images.MAX_JPEG_SCANS` (500), which refuses it at once.
    """
    path = Path(path)
    width, height = size
    ramp = np.add.outer(
        np.arange(height) * 255 // max(height, 1), np.arange(width) * 255 // max(width, 1)
    )
    pixels = np.stack([ramp // 2, np.full_like(ramp, 128), 255 - ramp // 2], axis=-1)
    encoded = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(encoded, "JPEG", progressive=True, quality=90)
    data = encoded.getvalue()
    last, end = data.rindex(_SOS), data.rindex(_EOI)
    repeats = max(0, scans - data.count(_SOS))
    path.write_bytes(data[:end] + data[last:end] * repeats + data[end:])
    return path


def write_flat_png(path: str | os.PathLike[str], size: tuple[int, int] = (13_000, 13_000)) -> Path:
    """Write a valid black 8-bit grayscale PNG of `size` (width, height); returns `path`.

    Flat rows compress about 1,000 to 1: 13,000 x 13,000 is about 165 KB on disk, 169 MB of
    pixels once decoded (Pillow's RGB conversion and the resize take 3.5 GB at the peak); it
    takes about a second to write.
    """
    width, height = size
    return _flat_gray_png(path, width, height, bits=8)


def claim_size(data: bytes, size: tuple[int, int]) -> bytes:
    """The JPEG `data` with its frame (SOF) header rewritten to claim `size` (width, height,
    each under 65,536): what libjpeg allocates for is the claim, not the data."""
    return jpeg.claim_size(data, *size)


def hide_frame(data: bytes, count: int = 300, padding: str = "comments") -> bytes:
    """The JPEG `data` with `count` comment segments (`padding="comments"`) or 0xFF fill bytes
    (`"fill"`) before its frame header: libjpeg and Pillow still find the frame, a walk that
    gives up after fewer markers does not (and so passes a file of any size)."""
    if padding == "comments":
        blob = jpeg.comments(count, b"x")
    elif padding == "fill":
        blob = b"\xff" * count
    else:
        raise ValueError(f"padding must be 'comments' or 'fill', got {padding!r}")
    return jpeg.insert_before(data, jpeg.frame(data), blob)


def add_frame(data: bytes, size: tuple[int, int] = (13_000, 13_000), first: bool = False) -> bytes:
    """The JPEG `data` with a second frame header claiming `size` (width, height) after its
    own (`first=True`: before it), both before the first scan. libjpeg refuses a second frame;
    Pillow allocates for the last one."""
    own = jpeg.frame(data)
    extra = jpeg.claim_size(data[own.start : own.end], *size)
    at = own.start if first else own.end
    return data[:at] + extra + data[at:]


def write_two_header_png(
    path: str | os.PathLike[str], size: tuple[int, int] = (13_000, 13_000)
) -> Path:
    """Write `write_flat_png(path, size)` with an IHDR of 1x1 before its own: a walk that reads
    the first IHDR sees one pixel; Pillow keeps the last and decodes all of `size` (13,000 x
    13,000: 481 KB on disk, 1.7 GB decoded)."""
    path = write_flat_png(path, size)
    data = path.read_bytes()
    tiny = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
    path.write_bytes(data[:8] + tiny + data[8:])
    return path
