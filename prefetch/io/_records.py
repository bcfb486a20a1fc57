"""TFRecord's record framing: what reading one record of a shard needs, at the byte level.

A record is its data length (uint64 LE), the masked CRC32C of those 8 bytes (uint32 LE), the
data, and the masked CRC32C of the data (uint32 LE), as TensorFlow writes it. `record_data`
checks both CRCs of one framed record and returns a view of its data; `record_length` reads and
checks a header; `frame_record` writes one. Damaged framing raises `CorruptShardError` naming the
file and the byte offset (`corrupt_shard`). Walking a whole file and reading the Examples inside
records belong to the shard formats (`prefetch.sources.shards._tfrecord`). Pure functions of
bytes; thread-safe; imports only the standard library and `google_crc32c`.
"""

from __future__ import annotations

import struct

import google_crc32c

from prefetch.errors import CorruptShardError

_MASK_DELTA = 0xA282EAD8  # TFRecord's CRC mask constant (from LevelDB's log format)
_HEADER = struct.Struct("<QI")  # data length, masked CRC32C of the length's 8 bytes
_FOOTER = struct.Struct("<I")  # masked CRC32C of the data
RECORD_OVERHEAD = 16  # bytes of framing per record: 12 header + 4 footer


def corrupt_shard(path: str, offset: int, what: str) -> CorruptShardError:
    """The error for damage `what` in the record or header at `offset` of `path`."""
    # No skip advice: none helps while a source is made, and a loader that reads the sample
    # adds it in its note only when on_error="skip" is not already on.
    fix = "Re-write or re-download the shard"
    where = f"{path or '<bytes>'} at offset {offset}"
    return CorruptShardError(f"corrupt shard {where}: {what}. {fix}", path, offset)


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C of `data`: CRC rotated right by 15 bits plus a constant, mod 2**32.

    A memoryview is copied once into bytes (the CRC extension accepts only bytes).
    """
    crc: int = google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """`data` framed as one TFRecord record (header, data, footer), as tf.io.TFRecordWriter does."""
    length = struct.pack("<Q", len(data))
    return b"".join(
        (length, _FOOTER.pack(masked_crc32c(length)), data, _FOOTER.pack(masked_crc32c(data)))
    )


def record_length(header: bytes, path: str, offset: int) -> int:
    """The data length in the 12 header bytes of the record at `offset` of `path`, CRC checked.

    Raises `CorruptShardError` when the header is short ("truncated") or its length CRC differs.
    """
    if len(header) < 12:
        raise corrupt_shard(path, offset, f"truncated record header ({len(header)} of 12 bytes)")
    length, crc = _HEADER.unpack_from(header)
    if masked_crc32c(header[:8]) != crc:
        raise corrupt_shard(path, offset, "record length CRC mismatch")
    return int(length)


def record_data(record: bytes | memoryview, path: str, offset: int) -> memoryview:
    """A memoryview of the data of the framed record `record` (read from `offset` of `path`).

    Both CRCs are checked; bytes after the footer are ignored. Raises `CorruptShardError` when
    the record is shorter than its header says ("truncated") or a CRC differs.
    """
    view = memoryview(record)
    length = record_length(bytes(view[:12]), path, offset)
    if len(view) < length + RECORD_OVERHEAD:
        what = f"{len(view)} bytes, the header says {length + RECORD_OVERHEAD}"
        raise corrupt_shard(path, offset, f"truncated record ({what})")
    data = view[12 : 12 + length]
    (crc,) = _FOOTER.unpack_from(view, 12 + length)
    if masked_crc32c(data) != crc:
        raise corrupt_shard(path, offset, "record data CRC mismatch")
    return data
