"""The header walk: the size an image's decoders will allocate, read before any of them runs.

`walk_jpeg(data)` reads a JPEG's marker segments from its start to its first scan, as libjpeg
reads them (bytes between segments skipped, each segment skipped by its length, runs of 0xFF
fill bytes and markers without a length passed over), and reports every frame (SOF) header
it meets; `walk_png(data)` reads a PNG's chunks up to its first IDAT and reports every IHDR.
There is no count after which either stops looking and lets the file pass: a header of more
than `MAX_HEADER_SEGMENTS` segments or chunks is reported as such, and the caller
(`prefetch.io._images.check_image_bytes`) refuses it, as it refuses two frames or two IHDRs
(decoders disagree on their size: libjpeg refuses a second frame, Pillow allocates the last).

Both are linear in the bytes walked, and neither is a Python loop per byte: fill bytes,
stuffed zeros and markers without a length are skipped by one `re` search (C speed), so the
loop runs once per segment with a length (4 bytes of the file at least), at most
`MAX_HEADER_SEGMENTS` + 1 times. Pure functions of the bytes, thread-safe.

C twin of `walk_jpeg`: `walk_jpeg_header` in prefetch/decode/_c/header_walk.c, which the
compiled chunk path applies before it decodes (it runs without the GIL, so it cannot call
this). tests/test_header_walk.py compares the two on every trick and a mutated corpus; a
change to one is a change to the other.
"""

from __future__ import annotations

import re
from typing import NamedTuple

MAX_HEADER_SEGMENTS = 65_536
"""The most marker segments before a JPEG's first scan, or chunks before a PNG's first IDAT.

A photo's header has about 10 (APPn, DQT, SOF, DHT), one with large metadata (ICC profiles,
extended XMP in 64 KB pieces) a few hundred. Past the cap the file is refused rather than
walked further: the walk (and Pillow's own, in Python) costs about a microsecond a segment,
so the cap bounds a header's cost to tens of milliseconds whatever the file's size (a 1 GB
file of 4-byte comments is 268 million segments). The compiled chunk path is given this
value (prefetch.decode._window.decode_chunk), so both paths refuse the same files.
"""

# The frame (SOF) markers: 0xC0-0xCF but DHT (0xC4), JPG (0xC8) and DAC (0xCC).
JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_SOS, _EOI = 0xDA, 0xD9
# The next marker that has a length, or is SOS/EOI: an 0xFF followed by anything but 0xFF
# (a fill byte: the marker is further on), 0x00 (a stuffed zero), 0x01 (TEM) or 0xD0-0xD8
# (RSTn, SOI), which have no length and are passed over. One byte of lookahead: no
# backtracking, linear in the bytes searched.
_NEXT_MARKER = re.compile(b"\xff[^\x00\x01\xd0-\xd8\xff]")
_PASSED = frozenset({0x00, 0x01, 0xFF, *range(0xD0, 0xD9)})  # what _NEXT_MARKER passes over


class JpegHeader(NamedTuple):
    """What `walk_jpeg` found before a JPEG's first scan."""

    frame: int  # the first frame (SOF) marker, 0xC0-0xCF; 0 when there is none
    width: int  # of the largest frame (by pixels), 0 when there is none
    height: int
    frames: int  # frame headers seen: more than 1 is refused (libjpeg refuses it too)
    segments: int  # segments walked, at most MAX_HEADER_SEGMENTS + 1 (then refused)


def walk_jpeg(data: bytes, max_segments: int | None = None) -> JpegHeader:
    """Walk the JPEG `data` (which starts with SOI) from its start to its first scan (SOS),
    its end (EOI or the last byte) or `max_segments` + 1 segments (None:
    `MAX_HEADER_SEGMENTS`), whichever comes first. A frame header too short to hold its size
    is counted and its size read as 0."""
    cap = MAX_HEADER_SEGMENTS if max_segments is None else max_segments
    end, search = len(data), _NEXT_MARKER.search
    frame = width = height = frames = segments = 0
    position = 2
    while segments <= cap:
        if position + 1 < end and data[position] == 0xFF and data[position + 1] not in _PASSED:
            start = position  # where a well-formed file's next segment is: no search
        else:
            found = search(data, position)
            if found is None:
                break
            start = found.start()
        marker = data[start + 1]
        if marker in (_SOS, _EOI):
            break
        segments += 1
        if marker in JPEG_FRAMES:
            frames += 1
            frame = frame or marker
            if start + 9 <= end:
                rows = data[start + 5] << 8 | data[start + 6]
                columns = data[start + 7] << 8 | data[start + 8]
                if columns * rows > width * height:
                    width, height = columns, rows
        if start + 4 > end:  # its length is cut off: nothing follows
            break
        length = data[start + 2] << 8 | data[start + 3]
        position = start + 2 + (length if length > 2 else 2)  # as libjpeg skips a segment
    return JpegHeader(frame, width, height, frames, segments)


_IHDR, _IDAT, _IEND = b"IHDR", b"IDAT", b"IEND"


class PngHeader(NamedTuple):
    """What `walk_png` found before a PNG's first IDAT."""

    width: int  # of the largest IHDR (by pixels), 0 when there is none
    height: int
    headers: int  # IHDR chunks seen: more than 1 is refused (Pillow keeps the last)
    chunks: int  # chunks walked, at most MAX_HEADER_SEGMENTS + 1 (then refused)


def walk_png(data: bytes, max_chunks: int | None = None) -> PngHeader:
    """Walk the PNG `data` (which starts with its 8-byte signature) chunk by chunk to its
    first IDAT, its IEND, its end or `max_chunks` + 1 chunks (None: `MAX_HEADER_SEGMENTS`)."""
    cap = MAX_HEADER_SEGMENTS if max_chunks is None else max_chunks
    width = height = headers = chunks = 0
    position, end = 8, len(data)
    while chunks <= cap and position + 8 <= end:
        kind = data[position + 4 : position + 8]
        if kind in (_IDAT, _IEND):
            break
        chunks += 1
        length = int.from_bytes(data[position : position + 4], "big")
        if kind == _IHDR:
            headers += 1
            if position + 16 <= end:
                columns = int.from_bytes(data[position + 8 : position + 12], "big")
                rows = int.from_bytes(data[position + 12 : position + 16], "big")
                if columns * rows > width * height:
                    width, height = columns, rows
        position += 12 + length  # length, type, data, CRC
    return PngHeader(width, height, headers, chunks)
