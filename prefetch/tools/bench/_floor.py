"""The entropy-decode floor: the physical limit of any libjpeg-turbo loader on this machine.

Every JPEG loader built on libjpeg-turbo (prefetch, tf.data, Pillow, OpenCV) entropy-decodes
(Huffman) every row of a JPEG down to the last row it needs; no DCT scale and no window avoids
that. `floor_sample(paths, crop, options)` reads a sample of files into memory and, for each
JPEG, the last pixel row its sample needs (the whole image without a crop; with a crop, the
bottom of the window the bench's rows draw for that file, `CroppingDecoder`'s generator);
`floor_rate(sample)` times entropy decoding alone of those rows, one file after another on
one core (`entropy_decoder()`: no inverse DCT, colour conversion, resize or read). The floor is
that rate x usable cores; every loader can be reported as a fraction of it.
"""

from __future__ import annotations

import io
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PIL import Image

from prefetch.decode import DecodeOptions, compiled_available, entropy_decode_rows
from prefetch.io import read_location
from prefetch.plan import Augment, Crop

EntropyDecoder = Callable[[bytes, int], int]
JPEG_MAGIC = b"\xff\xd8\xff"
NO_ENTROPY_DECODER = (
    "this build has no entropy-only decoder (prefetch.decode.entropy_decode_rows, "
    "from the C extension)"
)


def entropy_decoder() -> EntropyDecoder | None:
    """`prefetch.decode.entropy_decode_rows(data, last_row)` when this build has it
    (the compiled extension's entropy decoding of the MCU rows down to pixel row `last_row`),
    else None."""
    return entropy_decode_rows if compiled_available() else None


@dataclass(frozen=True)
class FloorSample:
    """The JPEGs of a sample in memory and the last pixel row (from 0) each one's sample needs;
    `left_out`: files of the sample that are not JPEG (not part of the floor);
    `rows_fraction`: the mean share of an image's rows that its sample needs (1.0 without a
    crop)."""

    data: tuple[bytes, ...]
    last_rows: tuple[int, ...]
    left_out: int
    rows_fraction: float = 1.0


def floor_sample(paths: Sequence[str], crop: Crop | None, options: DecodeOptions) -> FloorSample:
    """The JPEGs among `paths`, read into memory, and the rows each needs (see module)."""
    data, last_rows, fractions = [], [], []
    left_out = 0
    for path in paths:
        contents = read_location(path)
        if not contents.startswith(JPEG_MAGIC):
            left_out += 1
            continue
        with Image.open(io.BytesIO(contents)) as image:  # the header only
            height, width = image.height, image.width
        bottom = height
        if crop is not None:
            rng = Augment.rng(0, 0, zlib.crc32(path.encode()))  # as CroppingDecoder draws
            box = crop.box(height, width, options.image_size, rng)
            bottom = box.top + box.height
        data.append(contents)
        last_rows.append(bottom - 1)  # entropy_decode_rows takes the last row, inclusive
        fractions.append(bottom / height)
    fraction = sum(fractions) / len(fractions) if fractions else 1.0
    return FloorSample(tuple(data), tuple(last_rows), left_out, fraction)


def floor_rate(sample: FloorSample, decode: EntropyDecoder) -> float:
    """Images/s of entropy decoding alone of `sample`'s rows, in this thread (one core)."""
    if not sample.data:
        raise ValueError("the floor needs at least one JPEG")
    began = time.perf_counter()
    for contents, last in zip(sample.data, sample.last_rows, strict=True):
        decode(contents, last)
    return len(sample.data) / (time.perf_counter() - began)
