"""A seeded corpus of mutated JPEGs for differential tests of the decoders: `write_jpeg_corpus`.

Holds the compiled chunk path (`prefetch.decode.decode_chunk`) to the per-sample path
(`prefetch.decode.decode_window`), and both to what the bytes deserve (tests/test_differential.py,
`make sanitize`; docs/decoders.md, "Two paths, one result"). The corpus starts from real encodes
(`prefetch.testing._jpeg_seeds`: every sampling factor, table, coding and colour space this
machine's encoders make) and writes, in this order:

1. every seed as it is;
2. the structured cases, for every seed: a copy without its DHT segments right after a file
   with optimized tables (legal where the seed used the standard tables: it must decode to the
   seed's pixels, whatever file came before), a copy without DQT (must be refused), and runs
   of hundreds of COM segments or 0xFF fill bytes before its frame (the seed's pixels, or its
   refusal: a run never hides a frame over the pixel bound);
3. random mutations (`MUTATIONS`) of random seeds until `count` files: truncations, bit flips
   in the header and in the entropy-coded data, bogus lengths, a duplicated or resized frame,
   sizes just over the pixel bound, dropped segments, damaged restart markers, trailing bytes.

Each file is a `CorpusFile` that says what it is and what any decoder owes it (`expect`).
The same `seed`, `count` and `max_pixels` give the same files on a machine with the same
encoders (OpenCV and cjpeg add seeds where installed). 300 files take 1-3 s to write on 2 busy
cores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prefetch.testing import _jpeg_segments as jpeg
from prefetch.testing._jpeg_seeds import (
    ANY,
    DECODED,
    REFUSED,
    SAME,
    TOO_LARGE,
    Seed,
    encode_seeds,
)

__all__ = [
    "ANY",
    "CORPUS_MAX_PIXELS",
    "DECODED",
    "DEFAULT_CORPUS_COUNT",
    "EXPECTATIONS",
    "MUTATIONS",
    "REFUSED",
    "SAME",
    "TOO_LARGE",
    "CorpusFile",
    "write_jpeg_corpus",
]

DEFAULT_CORPUS_COUNT = 300
"""Files `write_jpeg_corpus` writes by default: every seed and structured case (about 220 where
cjpeg is installed, 130 without) and random mutations for the rest; the differential test reads
`PREFETCH_CORPUS_COUNT` to run more (`make sanitize` runs 3000)."""

CORPUS_MAX_PIXELS = 192 * 256
"""The pixel bound the corpus is made for (pass it as `max_pixels`): seeds are under it, one
seed is exactly at it and one just over it, and some mutations claim sizes just over it."""

EXPECTATIONS = (DECODED, SAME, REFUSED, TOO_LARGE, ANY)
"""What a decoder owes a `CorpusFile` (its `expect`): DECODED, pixels; SAME, the pixels of its
`origin` (the unmutated seed); REFUSED, an error; TOO_LARGE, PIL's DecompressionBombError (its
frame is over the pixel bound); ANY, only that every path gives the same pixels or error."""


@dataclass(frozen=True)
class CorpusFile:
    """One file of the corpus: its `path`, the `seed` encode it was made from (its name, such
    as "pillow-4:2:0-optimized" or "cjpeg-4x1,1x1,1x1"), the `mutation` made (such as "none",
    "no-DHT", "truncate@812", "com-run-300"), what a decoder owes it (`expect`, one of
    `EXPECTATIONS`) and, for SAME, the `origin` whose pixels it must decode to."""

    path: Path
    seed: str
    mutation: str
    expect: str
    origin: Path | None = None

    def describe(self) -> str:
        """`name (seed, mutation; expect ...)`, for reports."""
        return f"{self.path.name} ({self.seed}, {self.mutation}; expect {self.expect})"


Mutation = Callable[[Seed, np.random.Generator, int], tuple[str, bytes, str]]


def _kept(seed: Seed) -> str:
    """What an edit that changes no pixel leaves a decoder owing."""
    return SAME if seed.expect == DECODED else seed.expect


def _truncate(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    header = jpeg.header_end(seed.data)
    at = int(rng.integers(2, len(seed.data) - 1))
    return f"truncate@{at}", seed.data[:at], REFUSED if at < header else ANY


def _no_eoi(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    return "no-EOI", seed.data[:-2], ANY


def _flip_header(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    bit = int(rng.integers(16, jpeg.header_end(seed.data) * 8))
    return f"flip-header@{bit // 8}.{bit % 8}", jpeg.flip_bits(seed.data, [bit]), ANY


def _flip_data(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    start, end = jpeg.entropy_ranges(seed.data)[0]
    bits = sorted(int(b) for b in rng.integers(start * 8, end * 8, int(rng.integers(1, 4))))
    name = "flip-data@" + ",".join(f"{b // 8}.{b % 8}" for b in bits)
    return name, jpeg.flip_bits(seed.data, bits), ANY


def _zero_data(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    start, end = jpeg.entropy_ranges(seed.data)[0]
    at = int(rng.integers(start, end))
    stop = min(end, at + int(rng.integers(1, 64)))
    data = seed.data[:at] + bytes(stop - at) + seed.data[stop:]
    return f"zeros@{at}-{stop}", data, ANY


def _bogus_length(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    parts = [p for p in jpeg.segments(seed.data) if p.body > p.start + 2]
    part = parts[int(rng.integers(len(parts)))]
    length = int.from_bytes(seed.data[part.start + 2 : part.start + 4], "big")
    choices = [0, 1, 2, length - 1, length + 1, 0xFFFF, int(rng.integers(0, 0x10000))]
    value = max(0, min(0xFFFF, choices[int(rng.integers(len(choices)))]))
    name = f"length-{part.marker:02X}@{part.start}={value}"
    return name, jpeg.with_length(seed.data, part, value), ANY


def _drop_segment(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    parts = jpeg.segments(seed.data)[1:-1]
    part = parts[int(rng.integers(len(parts)))]
    data = seed.data[: part.start] + seed.data[part.end :]
    return f"drop-{part.marker:02X}@{part.start}", data, REFUSED if part.marker == jpeg.DQT else ANY


def _duplicate_frame(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    frame = jpeg.frame(seed.data)
    copy = seed.data[frame.start : frame.end]
    if rng.random() < 0.5:
        return "duplicate-SOF", jpeg.insert_before(seed.data, frame, copy), REFUSED
    big = jpeg.claim_size(copy, *_over(bound))  # a second frame over the bound, after the first
    data = seed.data[: frame.end] + big + seed.data[frame.end :]
    return "second-SOF-over-bound", data, REFUSED


def _claim_size(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    width, height = jpeg.frame_size(seed.data)
    choices = {
        "over-bound": _over(bound),
        "65535x65535": (0xFFFF, 0xFFFF),
        "smaller": (max(1, width // 2), max(1, height - 3)),
        "larger": (width + 8, height + 1),
        "zero-height": (width, 0),
    }
    name = list(choices)[int(rng.integers(len(choices)))]
    new_width, new_height = choices[name]
    # The claimed size is checked before any decoder runs; below the bound, a refused seed
    # (12-bit) stays refused, and any other may decode or not.
    if new_width * new_height > bound:
        expect = TOO_LARGE
    else:
        expect = REFUSED if seed.expect == REFUSED else ANY
    data = jpeg.claim_size(seed.data, new_width, new_height)
    return f"claim-{name}-{new_width}x{new_height}", data, expect


def _marker_run(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    parts = [p for p in jpeg.segments(seed.data)[1:] if p.marker not in range(0xD0, 0xD8)]
    part = parts[int(rng.integers(len(parts)))]
    count = int(rng.choice([1, 2, 255, 256, 257, 300, 1000]))
    if rng.random() < 0.5:
        name, blob = f"com-run-{count}@{part.marker:02X}", jpeg.comments(count, b"x")
    else:
        name, blob = f"fill-{count}@{part.marker:02X}", b"\xff" * count
    return name, jpeg.insert_before(seed.data, part, blob), _kept(seed)


def _trailing(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    if rng.random() < 0.5:  # a second image after the first, as in MPO files
        return "second-image", seed.data + seed.data, _kept(seed)
    tail = rng.integers(0, 256, int(rng.integers(1, 300)), np.uint8).tobytes()
    return f"trailing-{len(tail)}", seed.data + tail, _kept(seed)


def _restart_damage(seed: Seed, rng: np.random.Generator, bound: int) -> tuple[str, bytes, str]:
    start, end = jpeg.entropy_ranges(seed.data)[0]
    body = seed.data[start:end]
    places = [i for i in range(len(body) - 1) if body[i] == 0xFF and 0xD0 <= body[i + 1] <= 0xD7]
    if not places:
        return _flip_data(seed, rng, bound)
    at = start + places[int(rng.integers(len(places)))]
    if rng.random() < 0.5:
        return f"drop-RST@{at}", seed.data[:at] + seed.data[at + 2 :], ANY
    out = bytearray(seed.data)
    out[at + 1] = 0xD0 + (out[at + 1] - 0xD0 + 3) % 8
    return f"renumber-RST@{at}", bytes(out), ANY


MUTATIONS: dict[str, Mutation] = {
    "truncate": _truncate,
    "no-EOI": _no_eoi,
    "flip-header": _flip_header,
    "flip-data": _flip_data,
    "zeros": _zero_data,
    "bogus-length": _bogus_length,
    "drop-segment": _drop_segment,
    "duplicate-frame": _duplicate_frame,
    "claim-size": _claim_size,
    "marker-run": _marker_run,
    "trailing": _trailing,
    "restart-damage": _restart_damage,
}
"""The random mutations by family name; each makes (its name with its place, the bytes, what a
decoder owes the result) from a seed."""


def _over(bound: int) -> tuple[int, int]:
    """A (width, height) just over `bound` pixels."""
    side = int(bound**0.5) + 1
    return side, bound // side + 1


def write_jpeg_corpus(
    folder: str | os.PathLike[str],
    count: int = DEFAULT_CORPUS_COUNT,
    *,
    seed: int = 0,
    max_pixels: int = CORPUS_MAX_PIXELS,
) -> list[CorpusFile]:
    """Write `count` JPEG files (seeds, structured cases, then random mutations; see the
    module's docstring) into `folder` (created if missing; files are named
    `NNNNN-<seed>-<mutation>.jpg` and written exclusively), drawn from `seed`, for decoders
    bounded at `max_pixels`. Returns the files in the order written: an order that puts each
    no-DHT file right after a file with optimized tables. A `count` below the seeds and
    structured cases keeps only the first `count` files."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 40])
    seeds = encode_seeds(rng, max_pixels)
    files: list[CorpusFile] = []
    origins: dict[str, Path] = {}

    def write(base: Seed, mutation: str, data: bytes, expect: str) -> None:
        if len(files) >= count:
            return
        safe = mutation.replace(":", "").replace(",", "_").replace("@", "-at-")
        path = root / f"{len(files):05d}-{base.name.replace(':', '')}-{safe}.jpg"
        with open(path, "xb") as out:
            out.write(data)
        origin = origins.get(base.name) if expect == SAME else None
        files.append(CorpusFile(path, base.name, mutation, expect, origin))
        origins.setdefault(base.name, path)

    for each in seeds:
        write(each, "none", each.data, each.expect)
    optimized = [each for each in seeds if each.name.endswith("-optimized")]
    for number, each in enumerate(seeds):
        before = optimized[number % len(optimized)]
        write(before, "none", before.data, before.expect)
        legal = each.standard_tables and each.expect == DECODED
        unknown = TOO_LARGE if each.expect == TOO_LARGE else ANY  # the size is checked first
        write(each, "no-DHT", jpeg.strip(each.data, jpeg.DHT), SAME if legal else unknown)
        write(each, "no-DQT", jpeg.strip(each.data, jpeg.DQT), REFUSED)
        frame = jpeg.frame(each.data)
        runs = {"com-run-300": jpeg.comments(300), "fill-300": b"\xff" * 300}
        for name, blob in runs.items():
            write(each, name, jpeg.insert_before(each.data, frame, blob), _kept(each))
    at_bound = next(each for each in seeds if each.name == "pillow-at-bound")
    claimed = jpeg.claim_size(at_bound.data, *_over(max_pixels))
    lie = jpeg.insert_before(claimed, jpeg.frame(claimed), jpeg.comments(300))
    write(at_bound, "claim-over-bound+com-run-300", lie, TOO_LARGE)
    families = list(MUTATIONS.values())
    while len(files) < count:
        base = seeds[int(rng.integers(len(seeds)))]
        mutation, data, expect = families[int(rng.integers(len(families)))](base, rng, max_pixels)
        write(base, mutation, data, expect)
    return files
