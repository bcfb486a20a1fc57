"""Surgery on well-formed JPEG files for tests: their header's segments listed, removed, added.

`header_segments` lists the marker segments before a JPEG's first scan; `strip_segments` removes
those of one marker (a JPEG without DHT, which decoders must decode with the standard Huffman
tables, or without DQT, which they must refuse); `insert_before_frame` puts bytes (COM
segments, 0xFF fill bytes, a second frame) just before the frame header. `com_segments` and
`frame_segment` make such bytes. Meant for files an encoder wrote (Pillow's) and these tests'
changes to them: the walk trusts each segment's length and steps over fill bytes one at a time.
Pure functions of bytes.
"""

from __future__ import annotations

import struct

SOF0 = 0xC0  # baseline frame
DHT = 0xC4  # Huffman tables
DQT = 0xDB  # quantization tables
COM = 0xFE  # comment
SOS = 0xDA  # start of scan
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def header_segments(data: bytes) -> list[tuple[int, int, int]]:
    """(marker, start, end) of each segment of the JPEG `data` from after SOI to its first scan
    (SOS, which is listed with the end of its header), in order."""
    segments, position = [], 2
    while True:
        if data[position] != 0xFF:
            raise ValueError(f"no marker at byte {position}: not a JPEG an encoder wrote")
        while data[position + 1] == 0xFF:  # fill bytes (a test's, a few hundred at most)
            position += 1
        marker = data[position + 1]
        end = position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
        segments.append((marker, position, end))
        if marker == SOS:
            return segments
        position = end


def strip_segments(data: bytes, marker: int) -> bytes:
    """The JPEG `data` without its header's segments of `marker` (e.g. `DHT`, `DQT`)."""
    kept, last = [], 0
    for found, start, end in header_segments(data):
        if found == marker:
            kept.append(data[last:start])
            last = end
    return b"".join(kept) + data[last:]


def insert_before_frame(data: bytes, blob: bytes) -> bytes:
    """The JPEG `data` with `blob` just before its frame (SOF) header."""
    start = next(start for marker, start, _ in header_segments(data) if marker in _FRAMES)
    return data[:start] + blob + data[start:]


def com_segments(count: int, text: bytes = b"x") -> bytes:
    """`count` comment (COM) segments of `text`."""
    return (b"\xff\xfe" + struct.pack(">H", 2 + len(text)) + text) * count


def frame_segment(data: bytes, size: tuple[int, int]) -> bytes:
    """A copy of the JPEG `data`'s frame header claiming `size` (width, height, each under
    65,536): with `insert_before_frame`, a file of two frames."""
    _, start, end = next(s for s in header_segments(data) if s[0] in _FRAMES)
    width, height = size
    return data[start : start + 5] + struct.pack(">HH", height, width) + data[start + 9 : end]
