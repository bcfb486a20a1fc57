"""The bytes of a shard, sample by sample: the layouts `_writer` writes.

`sample_bytes(format, sample, image, top)` is one sample's bytes in a shard of `format`
(`"tar"`: the image member `<number:09d>.<ext>` and the label member `<number:09d>.cls`, each a
header, the data and its padding, mtime 0; `"tfrecord"`: one framed `tf.train.Example` with
`image/encoded`, `image/class/label`, `image/format` and `image/filename`), and
`shard_end(format)` what follows the last sample (the tar end-of-archive blocks; nothing for a
TFRecord). Pure functions: the writer's own process and its worker processes give the same
bytes.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from prefetch.io import frame_record
from prefetch.sources.shards import TAR_END, encode_example, tar_header, tar_padding


class Sample(NamedTuple):
    """One sample to write: its number across shards, its file and its label."""

    number: int
    path: str
    label: int


# `image/format` of a TFRecord example, by lower-cased file extension (TF's conventions).
IMAGE_FORMATS = {"jpg": b"jpeg", "jpeg": b"jpeg", "png": b"png", "bmp": b"bmp", "gif": b"gif"}


def sample_bytes(format: str, sample: Sample, image: bytes, top: str) -> list[bytes]:
    """The pieces of one sample's bytes in a shard of `format` (module docstring); `top` is the
    listed folder (a TFRecord's `image/filename` is relative to it)."""
    extension = extension_of(sample.path)
    if format == "tar":
        key = f"{sample.number:09d}"
        label = str(sample.label).encode("ascii")
        pieces = []
        for name, data in ((f"{key}.{extension}", image), (f"{key}.cls", label)):
            pieces += [tar_header(name, len(data), mtime=0), data, tar_padding(len(data))]
        return joined(pieces)
    example = encode_example(
        {
            "image/encoded": image,
            "image/class/label": sample.label,
            "image/format": IMAGE_FORMATS.get(extension, extension.encode()),
            "image/filename": relative_to(sample.path, top).encode("utf-8", "surrogateescape"),
        }
    )
    return [frame_record(example)]


def joined(pieces: list[bytes]) -> list[bytes]:
    """`pieces` as one piece when they are small (one write instead of six for a small tar
    sample), else as they are (a large image is not copied to join it)."""
    return [b"".join(pieces)] if sum(map(len, pieces)) <= JOIN_BELOW_BYTES else pieces


# Pieces of a sample up to this many bytes in all are joined before they are written.
JOIN_BELOW_BYTES = 256 << 10


def shard_end(format: str) -> bytes:
    """What follows a shard's last sample: the tar end-of-archive blocks, or nothing."""
    return TAR_END if format == "tar" else b""


def extension_of(path: str) -> str:
    """The lower-cased extension of `path`, without its dot (`"jpg"`, `"jpeg"`, `"png"`)."""
    return os.path.splitext(path)[1][1:].lower()


def relative_to(path: str, top: str) -> str:
    """`path` relative to the listed folder `top`, with `/` separators."""
    inside = path.startswith(top)
    relative = path[len(top) :].lstrip("/" + os.sep) if inside else os.path.relpath(path, top)
    return relative.replace(os.sep, "/")
