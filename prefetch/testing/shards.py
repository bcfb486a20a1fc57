"""Hostile and odd shards for tests: what a crashed writer, a hostile neighbour or server could
leave, built in a few milliseconds and a few megabytes each.

- `write_tar` and `write_tfrecord`: small real shards of given samples (labels chosen, so a
  replaced shard of the same size tells itself apart by its labels).
- `bomb_index`: an index file whose `offsets` member inflates to gigabytes from about 2 MB.
- `long_name_tar`: a sparse tar whose first header is a GNU long name declaring gigabytes.
- `named_tar`: a tar of many samples whose member names take a given number of bytes.
- `empty_values_record`: a TFRecord whose one record holds millions of empty BytesList values.
- `run_limited`: run Python code in a subprocess under an address-space limit, so that a test
  of a memory bound cannot take the machine down.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Sequence

import numpy as np

from prefetch.io import frame_record
from prefetch.sources.shards import TAR_END, encode_example, length_field, tar_header, tar_padding


def write_tar(
    path: str | os.PathLike[str], samples: Sequence[tuple[str, bytes, int | None]]
) -> None:
    """A tar shard at `path` of `(key, image bytes, label)` samples: `key.jpg`, and `key.cls`
    unless the label is None (members in that order, as WebDataset writes them)."""
    with open(path, "wb") as file:
        for key, image, label in samples:
            members = [(f"{key}.jpg", image)]
            if label is not None:
                members.append((f"{key}.cls", str(label).encode()))
            for name, data in members:
                file.write(tar_header(name, len(data)) + data + tar_padding(len(data)))
        file.write(TAR_END)


def write_tfrecord(path: str | os.PathLike[str], samples: Sequence[tuple[bytes, int]]) -> None:
    """A TFRecord shard at `path` of `(image bytes, label)` samples (TensorFlow's keys)."""
    with open(path, "wb") as file:
        for image, label in samples:
            example = encode_example({"image/encoded": image, "image/class/label": label})
            file.write(frame_record(example))


def _zip(entries: Sequence[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip archive of `(name, stored bytes, method, crc, uncompressed size)` entries,
    written as is: a declared size may be anything."""
    out, central = io.BytesIO(), []
    for name, data, method, crc, size in entries:
        offset = out.tell()
        encoded = name.encode()
        fields = (20, 0, method, 0, 0, crc, len(data), size, len(encoded), 0)
        out.write(b"PK\x03\x04" + struct.pack("<HHHHHIIIHH", *fields) + encoded + data)
        central.append(
            b"PK\x01\x02"
            + struct.pack(
                "<HHHHHHIIIHHHHHII",
                20,
                20,
                0,
                method,
                0,
                0,
                crc,
                len(data),
                size,
                len(encoded),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + encoded
        )
    start = out.tell()
    for record in central:
        out.write(record)
    size = out.tell() - start
    out.write(
        b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, len(central), len(central), size, start, 0)
    )
    return out.getvalue()


def bomb_index(index_file: bytes, member: str = "offsets.npy", gib: int = 2) -> bytes:
    """The index file `index_file` (an .npz's bytes) with `member` replaced by a deflated
    array of `gib` GiB of zeros (about 1 MB of deflate per GiB): its declared size is true,
    so only a reader that checks it before inflating stays small."""
    header = io.BytesIO()
    count = (gib << 30) // 8
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i8", "fortran_order": False, "shape": (count,)}
    )
    zeros = bytes(1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = deflate.compress(header.getvalue() + zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    again = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert block == again  # each MiB of zeros after a full flush deflates alike
    megabytes = (count * 8) >> 20
    stream = first + block * (megabytes - 1) + deflate.flush()
    entries = []
    with zipfile.ZipFile(io.BytesIO(index_file)) as archive:
        for info in archive.infolist():
            if info.filename == member:
                size = len(header.getvalue()) + count * 8
                entries.append((member, stream, zipfile.ZIP_DEFLATED, 0, size))
            else:
                data = archive.read(info)
                entries.append(
                    (info.filename, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data))
                )
    return _zip(entries)


def long_name_tar(path: str | os.PathLike[str], declared: int = 2 << 30) -> None:
    """A tar at `path` whose first header is a GNU long name ('L') declaring `declared` bytes,
    the file extended (sparse: a few KB on disk) so that the declared data lies inside it."""
    header = bytearray(tar_header("././@LongLink", 0))
    header[124:136] = b"\x80" + declared.to_bytes(11, "big")  # base-256 size
    header[156:157] = b"L"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    with open(path, "wb") as file:
        file.write(bytes(header) + bytes(8192 - 512))
        file.truncate(512 + declared + 1024)


def named_tar(path: str | os.PathLike[str], samples: int, name_bytes: int, image: bytes) -> None:
    """A tar at `path` of `samples` members holding `image`, named `<9 digits>xxx...x.jpg` in
    `name_bytes` bytes (unlabelled): a ustar name (up to 255 bytes, 1 KiB of tar a sample for
    a small image: the densest names), else a GNU long name. Written as it is made."""
    with open(path, "wb") as file:
        for number in range(samples):
            stem = f"{number:09d}"
            name = stem + "x" * (name_bytes - len(stem) - 4) + ".jpg"
            if len(name) <= 100:
                member = tar_header(name, len(image))
            elif len(name) <= 255:  # a prefix of up to 155 bytes, a slash, the rest
                member = tar_header(name[:154] + "/" + name[155:], len(image))
            else:
                member = _long_name(name.encode()) + tar_header(stem + ".jpg", len(image))
            file.write(member + image + tar_padding(len(image)))
        file.write(TAR_END)


def _long_name(name: bytes) -> bytes:
    """The GNU 'L' header and data that give the next member the name `name`."""
    header = bytearray(tar_header("././@LongLink", len(name) + 1))
    header[156:157] = b"L"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + name + b"\0" + tar_padding(len(name) + 1)


def empty_values_record(path: str | os.PathLike[str], values: int = 10_000_000) -> None:
    """A TFRecord at `path` of one record whose "image/encoded" BytesList holds the image
    bytes, then `values` empty bytes values (2 bytes each: a 20 MB record for 10 million),
    and whose "image/class/label" is 1."""
    image = b"\xff\xd8 not decoded"
    listed = length_field(1, image) + b"\x0a\x00" * values  # BytesList.value, repeated
    # the key, then a Feature whose bytes_list is `listed`
    entry = length_field(1, b"image/encoded") + length_field(2, length_field(1, listed))
    example = encode_example({"image/class/label": 1})
    # a second Features message merges into the first
    example += length_field(1, length_field(1, entry))
    with open(path, "wb") as file:
        file.write(frame_record(example))


def run_limited(code: str, limit_bytes: int = 3 << 29, timeout_s: float = 50.0) -> str:
    """Run `code` (Python source) in a fresh interpreter under an address-space limit of
    `limit_bytes` (default 1.5 GiB), with this interpreter's import path; its stdout, or
    AssertionError with its stderr when it fails."""
    prelude = (
        f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"the limited run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout
