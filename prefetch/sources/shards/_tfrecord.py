"""TFRecord files, tf.train.Example and tar shards, read and written without TensorFlow.

Worker processes index and read shards with these functions, so the module imports only the
standard library, numpy and the record framing (`prefetch.io._records`: one record's header,
CRCs and data, which reading a sample needs too). Every function is pure (no state of its own)
and thread-safe; the readers take an open binary file and seek in it, so one file object
belongs to one reader at a time. Readers touch only framing: TFRecord headers, tar headers and
protobuf tags and lengths; the payload (an encoded image) is never scanned nor copied, only
located, so an index can point at the image bytes inside a shard. Damaged framing raises
`CorruptShardError` naming the file and the byte offset. Formats, as TensorFlow and WebDataset
write them:

- TFRecord: records one after the other (`prefetch.io._records`); `iter_records` walks them.
- tf.train.Example: protobuf `Example{features: Features{feature: map<string, Feature>}}`.

Tar shards (POSIX ustar, GNU and pax; WebDataset's samples) are read by
`prefetch.sources.shards._tar`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import numpy as np

from prefetch.io import RECORD_OVERHEAD, corrupt_shard, record_length

# ---------------------------------------------------------------- TFRecord


def file_size(file: BinaryIO) -> int:
    """The size of `file` in bytes, from fstat when it has a descriptor, else by seeking."""
    try:
        return os.fstat(file.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return file.seek(0, os.SEEK_END)


def iter_records(file: BinaryIO, path: str) -> Iterator[tuple[int, int]]:
    """(record offset, data length) of each record of a TFRecord file, from its start.

    Reads the 12 header bytes of each record and seeks past its data (data CRCs are checked
    later, by `prefetch.io._records.record_data`). Raises `CorruptShardError` at the first bad
    length CRC, or a record that would run past the end of the file ("truncated"), naming the
    record's offset.
    """
    size = file_size(file)
    offset = 0
    while offset < size:
        file.seek(offset)
        length = record_length(file.read(12), path, offset)
        end = offset + RECORD_OVERHEAD + length
        if end > size:
            what = f"{length} data bytes but the file ends at {size}"
            raise corrupt_shard(path, offset, f"truncated record: {what}")
        yield offset, length
        offset = end


# ---------------------------------------------------------------- tf.train.Example

_Features = Mapping[str, bytes | int | float | Sequence[int] | Sequence[float] | Sequence[bytes]]
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_KINDS = ("bytes", "float", "int64")  # a Feature's list kinds, by field number - 1


def _varint(value: int) -> bytes:
    """`value` (>= 0, or a negative int64 as 10-byte two's complement) as a protobuf varint."""
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(key: str, value: Any) -> bytes:
    """The serialized `Feature` for one value of `encode_example`'s mapping."""
    if isinstance(value, np.ndarray):
        kind = {"S": "bytes", "O": "bytes", "f": "float", "i": "int", "u": "int", "b": "int"}
        kind_name = kind.get(value.dtype.kind, "")
        values = value.reshape(-1).tolist()
    else:
        scalar = isinstance(value, (bytes, str)) or not isinstance(value, Sequence)
        values = [value] if scalar else list(value)
        first = values[0] if values else None
        kinds = ((bytes, "bytes"), ((float, np.floating), "float"), ((int, np.integer), "int"))
        kind_name = next((name for types, name in kinds if isinstance(first, types)), "")
    if kind_name == "bytes" and all(isinstance(v, bytes) for v in values):
        return length_field(1, b"".join(length_field(1, v) for v in values))  # bytes_list
    if kind_name == "float" and all(isinstance(v, (int, float, np.number)) for v in values):
        packed = np.asarray(values, dtype="<f4").tobytes()
        return length_field(2, length_field(1, packed) if packed else b"")  # float_list
    if kind_name == "int" and all(
        isinstance(v, (int, np.integer)) and _INT64_MIN <= v <= _INT64_MAX for v in values
    ):
        packed = b"".join(_varint(int(v)) for v in values)
        return length_field(3, length_field(1, packed) if packed else b"")  # int64_list
    raise ValueError(
        f"feature {key!r}: cannot encode {value!r}; give bytes, an int64, a float, a non-empty "
        "list of one type of them, or a numpy array of bytes, integers or floats"
    )


def encode_example(features: _Features) -> bytes:
    """Serialize a tf.train.Example holding `features`, keys sorted (deterministic bytes).

    bytes become a bytes_list, int (and bool) an int64_list, float a float_list (float32);
    sequences take the type of their first element, numpy arrays of their dtype. The output
    equals protobuf's `SerializeToString(deterministic=True)` (keys in UTF-8 byte order, as C++
    protobuf sorts them; upb puts a key before its own prefixes, e.g. "ab" before "a").
    """
    entries = (
        length_field(
            1, length_field(1, key.encode()) + length_field(2, _feature(key, features[key]))
        )
        for key in sorted(features)
    )
    return length_field(1, b"".join(entries))


def read_varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` (at most 10 bytes, before `end`) and the position after it."""
    if pos + 2 < end:  # unrolled up to 3 bytes: lengths of values up to 2 MiB
        low, middle, high = view[pos], view[pos + 1], view[pos + 2]
        if low < 0x80:
            return low, pos + 1
        if middle < 0x80:
            return (low & 0x7F) | middle << 7, pos + 2
        if high < 0x80:
            return (low & 0x7F) | (middle & 0x7F) << 7 | high << 14, pos + 3
    result, shift = 0, 0
    while pos < end and shift < 70:
        byte = view[pos]
        pos += 1
        if byte < 0x80:
            return (result | byte << shift) & 0xFFFFFFFFFFFFFFFF, pos
        result |= (byte & 0x7F) << shift
        shift += 7
    raise ValueError(f"bad varint ending at byte {pos}")


def _span(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """(start, end) of the length-delimited value whose length varint is at `pos`."""
    length = view[pos] if pos < end else 0x80
    if length < 0x80:
        start = pos + 1
    else:
        length, start = read_varint(view, pos, end)
    if start + length > end:
        raise ValueError(f"a value of {length} bytes at byte {start} runs past its message")
    return start, start + length


def next_field(view: memoryview, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, value start, value end) of the field at `pos` (before `end`).

    A length-delimited value is only located, by its length, never read.
    """
    tag = view[pos]
    if tag < 0x80:
        pos += 1
    else:
        tag, pos = read_varint(view, pos, end)
    wire, start = tag & 7, pos
    if wire == 2:
        start, pos = _span(view, pos, end)
    elif wire == 0:
        pos = read_varint(view, pos, end)[1]
    elif wire == 1 or wire == 5:
        pos += 8 if wire == 1 else 4
    else:
        raise ValueError(f"unsupported wire type {wire} at byte {start}")
    if tag < 8 or pos > end:
        raise ValueError(f"field {tag >> 3} runs past its message at byte {start}")
    return tag >> 3, wire, start, pos


class TooManyFields(ValueError):
    """A record whose features hold more than `MAX_RECORD_FIELDS` fields: refused (damage, or
    an attack), not walked to its end."""


# The most protobuf fields walked in one record's features (map entries, unknown fields, the
# lists of a feature): a real tf.train.Example has tens, and each costs about a microsecond to
# walk in Python, so a record of 30 million empty entries (60 MB) would take 30 s to index.
# Past this it is refused, after about 0.2 s.
MAX_RECORD_FIELDS = 200_000


def map_entries(view: Any) -> Iterator[tuple[int, int, int, int]]:
    """(key start, key end, entry start, entry end) of each map entry of a serialized Example
    (a byte memoryview), in stored order; ValueError (or struct.error) on malformed bytes.

    Flat loops with a fast path for what writers emit (one-byte tags, the key first): this walk
    is the cost of reading a record's features, and it keeps nothing (the index walks records
    of millions of entries with it: `prefetch.sources.shards._examples`). `_find` reads the value
    of the
    entry it wants. More than `MAX_RECORD_FIELDS` fields raise `TooManyFields`.
    """
    pos, end = 0, len(view)
    walked = 0
    while pos < end:
        number, wire, start, pos = next_field(view, pos, end)
        while number == 1 and wire == 2 and start < pos:  # Example.features: a Features
            walked += 1
            if walked > MAX_RECORD_FIELDS:
                raise TooManyFields(f"more than {MAX_RECORD_FIELDS:,} feature entries")
            if view[start] != 0x0A:  # not Features.feature (a map entry): an unknown field
                start = next_field(view, start, pos)[3]
                continue
            entry, start = _span(view, start + 1, pos)
            if entry + 1 < start and view[entry] == 0x0A and view[entry + 1] < 0x80:
                key_start = entry + 2  # the key first, under 128 bytes: the usual layout
                key_end = key_start + view[entry + 1]
                if key_end > start:
                    raise ValueError(f"a key at byte {key_start} runs past its map entry")
            else:
                key_start = key_end = part_end = entry
                while part_end < start:
                    walked += 1
                    if walked > MAX_RECORD_FIELDS:
                        raise TooManyFields(f"more than {MAX_RECORD_FIELDS:,} feature entries")
                    part, part_wire, value, part_end = next_field(view, part_end, start)
                    if part == 1 and part_wire == 2:
                        key_start, key_end = value, part_end
            yield key_start, key_end, entry, start


def feature_lists(view: Any, pos: int, end: int) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) of each list in the map entry at `pos`..`end` of a serialized
    Example, in stored order: "bytes", "float" or "int64" and the span of the BytesList,
    FloatList or Int64List. Protobuf semantics are the caller's: the map entry's values
    (Features) merge, so a list of another kind than the one before replaces it, and a list
    of the same kind adds to it. More than `MAX_RECORD_FIELDS` fields raise `TooManyFields`."""
    walked = 0
    while pos < end:
        part, wire, start, pos = next_field(view, pos, end)
        while part == 2 and wire == 2 and start < pos:  # a Feature: one list of a kind
            walked += 1
            if walked > MAX_RECORD_FIELDS:
                raise TooManyFields(f"more than {MAX_RECORD_FIELDS:,} lists in a feature")
            number, list_wire, list_start, start = next_field(view, start, pos)
            if number in (1, 2, 3) and list_wire == 2:
                yield _KINDS[number - 1], list_start, start


def _list_values(view: memoryview, kind: str, wire: int, start: int, stop: int) -> list[Any]:
    """The values of one `value` field of a BytesList, FloatList or Int64List (packed or not).

    Values of an unexpected wire type are unknown fields to protobuf, so they are skipped.
    """
    if kind == "bytes":
        return [(start, stop)] if wire == 2 else []
    if kind == "float":
        if wire == 2 and (stop - start) % 4:
            raise ValueError(f"packed floats of {stop - start} bytes at byte {start}")
        count = (stop - start) // 4 if wire in (2, 5) else 0
        return list(struct.unpack_from(f"<{count}f", view, start))
    ints = []
    while wire in (0, 2) and start < stop:
        value, start = read_varint(view, start, stop)
        ints.append(value - (1 << 64) if value >> 63 else value)
    return ints


def _find(
    data: bytes | memoryview, key: str, path: str, offset: int
) -> tuple[memoryview, str, list[Any]]:
    """`data` as a byte view, and the kind and values of its feature `key` ("", [] if absent).

    bytes values are (start, end) spans. Protobuf semantics: the last map entry of a key wins;
    within a Feature the last kind set wins, and repeated occurrences of one list merge.
    Malformed bytes raise `CorruptShardError` naming `path` and `offset`.
    """
    view = memoryview(data)
    view = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    wanted, kind = key.encode(), ""
    values: list[Any] = []
    try:
        pos = end = 0
        for key_start, key_end, entry_start, entry_end in map_entries(view):
            if key_end - key_start == len(wanted) and view[key_start:key_end] == wanted:
                pos, end = entry_start, entry_end
        for list_kind, start, stop in feature_lists(view, pos, end):
            kind, values = list_kind, values if list_kind == kind else []
            while start < stop:  # a BytesList, FloatList or Int64List
                field, value_wire, value, start = next_field(view, start, stop)
                if field == 1:
                    values += _list_values(view, kind, value_wire, value, start)
    except (ValueError, struct.error) as error:
        raise corrupt_shard(path, offset, f"malformed tf.train.Example ({error})") from None
    return view, kind, values


def example_feature(
    data: bytes | memoryview, key: str, *, path: str = "", offset: int = 0
) -> tuple[str, Any] | None:
    """Feature `key` of the serialized tf.train.Example `data`, or None when it is absent.

    Returns ("bytes", list of memoryviews into `data`), ("int64", list of int) or
    ("float", list of float). Packed and unpacked lists are both read, unknown fields skipped;
    other features are walked over by their lengths, never copied. Malformed bytes raise
    `CorruptShardError` naming `path` and `offset` (the record's, given by the caller).
    """
    view, kind, values = _find(data, key, path, offset)
    if kind == "bytes":
        return kind, [view[start:stop] for start, stop in values]
    return (kind, values) if kind else None


def example_keys(data: bytes | memoryview, *, path: str = "", offset: int = 0) -> list[str]:
    """The feature names in the serialized tf.train.Example `data`, in stored order, unique.

    Raises `CorruptShardError` naming `path` and `offset` when `data` is malformed.
    """
    view = memoryview(data).cast("B")
    try:
        keys = [bytes(view[a:b]).decode(errors="replace") for a, b, _, _ in map_entries(view)]
    except ValueError as error:
        raise corrupt_shard(path, offset, f"malformed tf.train.Example ({error})") from None
    return list(dict.fromkeys(keys))


def example_bytes_span(
    data: bytes | memoryview, key: str, *, path: str = "", offset: int = 0
) -> tuple[int, int] | None:
    """(start, length) in `data` of the first bytes value of feature `key`.

    None when the feature is absent, not a bytes list, or empty. Raises `CorruptShardError`
    naming `path` and `offset` when `data` is malformed.
    """
    _, kind, values = _find(data, key, path, offset)
    if kind != "bytes" or not values:
        return None
    return values[0][0], values[0][1] - values[0][0]
