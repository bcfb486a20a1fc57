"""A well-formed JPEG's segments, and the byte edits the corpus (`prefetch.testing.corpus`)
makes to them: strip, insert before, set a length, claim a size, flip bits.

`segments(data)` walks a file an encoder wrote (the corpus's seeds) from SOI to EOI: every
marker segment with its extent, a scan (SOS) with the entropy-coded data after its header
(restart markers included). It is the corpus's own walk over known-good files, not a decoder's:
damaged files are never walked (each mutation starts from a seed).
"""

from __future__ import annotations

from dataclasses import dataclass

# Frame markers (SOF0-SOF15 but DHT, JPG and DAC), as libjpeg reads them.
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
SOI, EOI, SOS, DHT, DQT, COM = 0xD8, 0xD9, 0xDA, 0xC4, 0xDB, 0xFE
_STANDALONE = frozenset({SOI, EOI, 0x01, *range(0xD0, 0xD8)})  # markers without a length


@dataclass(frozen=True)
class Segment:
    """A marker and its extent in the file: `start` (its 0xFF), `body` (after its length
    field: its payload, for a scan the entropy-coded data after its header), `end`."""

    marker: int
    start: int
    body: int
    end: int


def segments(data: bytes) -> list[Segment]:
    """The segments of the JPEG `data`, SOI first, in file order, up to EOI (or the end).
    Raises ValueError where a marker is expected and none is found (a damaged file)."""
    found: list[Segment] = []
    position, size = 0, len(data)
    while position + 1 < size:
        if data[position] != 0xFF:
            raise ValueError(f"no marker at offset {position}")
        marker = data[position + 1]
        if marker == 0xFF:  # a fill byte
            position += 1
            continue
        if marker in _STANDALONE:
            found.append(Segment(marker, position, position + 2, position + 2))
            position += 2
            if marker == EOI:
                break
            continue
        header = position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
        end = _entropy_end(data, header) if marker == SOS else header
        body = position + 4 if marker != SOS else header
        found.append(Segment(marker, position, body, end))
        position = end
    return found


def _entropy_end(data: bytes, position: int) -> int:
    """Where the entropy-coded data from `position` ends: the next marker that is neither a
    stuffed 0xFF00 nor a restart marker."""
    while True:
        position = data.find(b"\xff", position)
        if position < 0 or position + 1 >= len(data):
            return len(data)
        following = data[position + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            position += 2
        elif following == 0xFF:
            position += 1
        else:
            return position


def header_end(data: bytes) -> int:
    """The offset just after the first scan's header: every byte before it is header."""
    return next(part.body for part in segments(data) if part.marker == SOS)


def entropy_ranges(data: bytes) -> list[tuple[int, int]]:
    """[start, end) of each scan's entropy-coded data (non-empty ones)."""
    return [(p.body, p.end) for p in segments(data) if p.marker == SOS and p.end > p.body]


def frame(data: bytes) -> Segment:
    """The first frame (SOF) segment."""
    return next(part for part in segments(data) if part.marker in SOF_MARKERS)


def strip(data: bytes, marker: int) -> bytes:
    """`data` without any segment of `marker`."""
    out = bytearray(data)
    for part in reversed([p for p in segments(data) if p.marker == marker]):
        del out[part.start : part.end]
    return bytes(out)


def insert_before(data: bytes, segment: Segment, blob: bytes) -> bytes:
    """`data` with `blob` inserted just before `segment`."""
    return data[: segment.start] + blob + data[segment.start :]


def comments(count: int, text: bytes = b"") -> bytes:
    """`count` COM segments, each holding `text`."""
    return (b"\xff\xfe" + (2 + len(text)).to_bytes(2, "big") + text) * count


def with_length(data: bytes, segment: Segment, length: int) -> bytes:
    """`data` with `segment`'s length field set to `length` (0 to 65535)."""
    out = bytearray(data)
    out[segment.start + 2 : segment.start + 4] = length.to_bytes(2, "big")
    return bytes(out)


def claim_size(data: bytes, width: int, height: int) -> bytes:
    """`data` with its first frame claiming `width` x `height` (each 0 to 65535)."""
    start = frame(data).start
    out = bytearray(data)
    out[start + 5 : start + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(out)


def frame_size(data: bytes) -> tuple[int, int]:
    """(width, height) of the first frame."""
    start = frame(data).start
    return int.from_bytes(data[start + 7 : start + 9], "big"), int.from_bytes(
        data[start + 5 : start + 7], "big"
    )


def flip_bits(data: bytes, bits: list[int]) -> bytes:
    """`data` with each bit in `bits` (offset * 8 + bit) inverted."""
    out = bytearray(data)
    for bit in bits:
        out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)
