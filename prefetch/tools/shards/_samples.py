"""What one sample of `prefetch shards write` becomes: its bytes to store, or why it is skipped.

`prepare(samples, options)` reads each sample's file, checks it as the loader's readers would
(`image_problem`: empty, not an image, over the readers' limits: pixels, scans) and, with
`fit_crop`, re-encodes it (`_fit_crop.fit_image`, the loader's colour rules); the
answer for each sample is `Prepared(data, resized)` or `Skip(reason)`. A file that cannot be
read raises (the write stops, naming it); a file that cannot be decoded is a `Skip` naming why.
A pure function of the files and the options: the same answers in any process, so the shards
do not depend on the number of workers (`_work` runs it in them).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import NamedTuple

from PIL import Image

from prefetch.io import check_image_bytes, read_location
from prefetch.tools.shards import _fit_crop as fitting
from prefetch.tools.shards._layout import Sample


class Options(NamedTuple):
    """What `prepare` does to each image: `fit_crop` (None: keep the bytes) at `quality`."""

    fit_crop: int | None
    quality: int


class Prepared(NamedTuple):
    """A sample's bytes to store, and whether `fit_crop` re-encoded them."""

    data: bytes
    resized: bool


class Skip(NamedTuple):
    """A sample that is not written, and why."""

    reason: str


Answer = Prepared | Skip


def prepare(samples: Iterable[Sample], options: Options) -> list[Answer]:
    """The answer for each of `samples`, in order (module docstring)."""
    answers: list[Answer] = []
    for sample in samples:
        data = read_location(sample.path)
        reason = image_problem(data, sample.path)
        if reason is not None:
            answers.append(Skip(reason))
            continue
        if options.fit_crop is None:
            answers.append(Prepared(data, False))
            continue
        try:
            fitted, resized = fitting.fit_image(data, options.fit_crop, options.quality)
        except MemoryError:
            raise
        except Exception as error:  # Pillow raises many kinds for a file it cannot decode
            answers.append(Skip(f"cannot be decoded ({type(error).__name__}: {error})"))
            continue
        answers.append(Prepared(fitted, resized))
    return answers


def image_problem(data: bytes, name: str = "<image>") -> str | None:
    """Why `data` (the file `name`) cannot be a sample's image, or None: empty, not an image
    Pillow can open, no pixels, or over the readers' limits (a decompression bomb of pixels,
    Pillow's; a JPEG of more scans than `prefetch.io.MAX_JPEG_SCANS`). Reads the header only."""
    if not data:
        return "empty file (0 bytes)"
    try:
        check_image_bytes(data, name)
    except Image.DecompressionBombError as error:
        return f"over the readers' limits ({error})"
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as error:
        return f"decompression bomb ({error})"
    except Exception as error:  # Pillow raises many kinds for a file that is not an image
        return f"not an image ({type(error).__name__}: {_named(str(error), name)})"
    if width < 1 or height < 1:
        return f"an image of {width}x{height} pixels"
    return None


def _named(text: str, name: str) -> str:
    """`text` with Pillow's `<_io.BytesIO object at 0x...>` (it was given bytes, not the file)
    said as the file's name, `'cat_001.jpg'`: its base name, the same wherever the folder is,
    so the same files give the same manifest."""
    start = text.find("<_io.BytesIO object at 0x")
    if start < 0:
        return text
    end = text.find(">", start)
    shown = repr(os.path.basename(name.rstrip("/")))
    return text[:start] + shown + (text[end + 1 :] if end >= 0 else "")
