"""What indexing needs of a serialized `tf.train.Example`, in one walk and constant memory.

`find_entries` walks a record's map entries once and keeps, for each wanted key, where its last
entry lies (protobuf: the last entry of a key wins); `first_value` reads one entry's feature:
its kind, whether it holds no, one or several values, and the first (a bytes value's span, an
int64). Values are located by their lengths, never copied, and no Python object is kept per
value or per map entry (the entries come from `prefetch.sources.shards._tfrecord.map_entries`'
one walk): a record of millions of empty values costs what its bytes cost to walk. Protobuf
semantics as `prefetch.sources.shards._tfrecord.example_feature` reads them (a Feature's lists
of one kind merge; another kind replaces them). Malformed bytes raise `CorruptShardError`
naming the shard and the record's offset. `tfrecord_columns` indexes a whole TFRecord shard
with them. Pure functions, thread-safe.
"""

from __future__ import annotations

import array
import mmap
import struct
import traceback
from typing import Any

import numpy as np

from prefetch.io import corrupt_shard
from prefetch.sources.shards._index_file import IndexSpec
from prefetch.sources.shards._tfrecord import (
    MAX_RECORD_FIELDS,
    TooManyFields,
    feature_lists,
    iter_records,
    map_entries,
    next_field,
    read_varint,
)

# The keys tried, in order, when an `IndexSpec` names none (TensorFlow's ImageNet layout, then
# TensorFlow Datasets').
IMAGE_KEYS = ("image/encoded", "image")
LABEL_KEYS = ("image/class/label", "label")
# The feature names listed at most in an error about a record's features.
SHOWN_KEYS = 20
# The bytes of each feature name shown at most (a hostile name may be megabytes long).
SHOWN_KEY_BYTES = 200


def find_entries(
    data: Any, keys: tuple[bytes, ...], path: str, offset: int
) -> list[tuple[int, int] | None]:
    """For each of `keys`, (start, end) of the last map entry with that key in the Example
    `data` (a byte memoryview), or None."""
    found: list[tuple[int, int] | None] = [None] * len(keys)
    try:
        _walk(data, keys, found, None)
    except TooManyFields as error:
        raise corrupt_shard(path, offset, f"a tf.train.Example of {error}") from None
    except (ValueError, IndexError, struct.error) as error:
        raise corrupt_shard(path, offset, f"malformed tf.train.Example ({error})") from None
    return found


def feature_names(data: Any, path: str, offset: int) -> list[str]:
    """The first `SHOWN_KEYS` distinct feature names of the Example `data`, for messages."""
    names: list[str] = []
    try:
        _walk(data, (), [], names)
    except TooManyFields:
        pass  # the names found so far
    except (ValueError, IndexError, struct.error) as error:
        raise corrupt_shard(path, offset, f"malformed tf.train.Example ({error})") from None
    return names


def _walk(
    view: Any, keys: tuple[bytes, ...], found: list[tuple[int, int] | None], names: list[str] | None
) -> None:
    lengths = [len(key) for key in keys]
    for key_start, key_end, entry, entry_end in map_entries(view):
        size = key_end - key_start
        for number_of_key, key in enumerate(keys):
            if size == lengths[number_of_key] and view[key_start:key_end] == key:
                found[number_of_key] = (entry, entry_end)
        if names is not None and len(names) < SHOWN_KEYS:
            shown = min(key_end, key_start + SHOWN_KEY_BYTES)
            name = bytes(view[key_start:shown]).decode(errors="replace")
            if name not in names:
                names.append(name)


def first_value(
    data: Any, entry: tuple[int, int] | None, path: str, offset: int
) -> tuple[str, int, Any]:
    """(kind, count, first) of the feature in map entry `entry` of the Example `data`: kind
    "bytes", "float", "int64" or "" (absent), count 0, 1 or 2 (two or more), first the first
    value ((start, length) of a bytes value, an int64, a float; None when count is 0)."""
    if entry is None:
        return "", 0, None
    kind, count, first = "", 0, None
    try:
        walked = 0
        for list_kind, start, stop in feature_lists(data, *entry):
            if list_kind != kind:
                kind, count, first = list_kind, 0, None
            while start < stop and count < 2:  # its values, up to the second
                walked += 1
                if walked > MAX_RECORD_FIELDS:
                    raise TooManyFields(f"more than {MAX_RECORD_FIELDS:,} fields in a feature")
                field, value_wire, value, start = next_field(data, start, stop)
                if field == 1:
                    count, first = _values(data, kind, value_wire, value, start, count, first)
    except TooManyFields as error:
        raise corrupt_shard(path, offset, f"a tf.train.Example with {error}") from None
    except (ValueError, IndexError, struct.error) as error:
        raise corrupt_shard(path, offset, f"malformed tf.train.Example ({error})") from None
    return kind, count, first


def _values(
    view: Any, kind: str, wire: int, start: int, stop: int, count: int, first: Any
) -> tuple[int, Any]:
    """`count` and `first` after one `value` field of a list (packed or not): at most two
    values are read. Values of an unexpected wire type are skipped, as protobuf does."""
    if kind == "bytes":
        if wire != 2:
            return count, first
        return count + 1, first if count else (start, stop - start)
    if kind == "float":
        if wire == 2 and (stop - start) % 4:
            raise ValueError(f"packed floats of {stop - start} bytes at byte {start}")
        many = (stop - start) // 4 if wire in (2, 5) else 0
        if many and not count:
            first = struct.unpack_from("<f", view, start)[0]
        return min(2, count + many), first
    while wire in (0, 2) and start < stop and count < 2:
        value, start = read_varint(view, start, stop)
        if not count:
            first = value - (1 << 64) if value >> 63 else value
        count += 1
    return count, first


def tfrecord_columns(
    file: Any, path: str, spec: IndexSpec, size: int
) -> tuple[list[array.array[int]], array.array[int] | None]:
    """offsets, lengths, starts, sizes, and labels (None without) of the TFRecord shard open
    as `file` (`size` bytes, named `path` in errors) read with `spec`: one walk over each
    record's features, 8 bytes per sample per column. The defaults of `spec`'s keys are
    filled in from the first record (`IMAGE_KEYS`, `LABEL_KEYS`)."""
    columns = [array.array("q") for _ in range(4)]
    labels = array.array("q")
    if size == 0:
        return columns, labels if spec.label_key != "" else None
    image_key, label_key = spec.image_key, spec.label_key
    with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)  # headers only: no readahead of the images
        view = memoryview(mapped)
        try:
            for offset, length in iter_records(file, path):
                with view[offset + 12 : offset + 12 + length] as data:  # released on errors
                    if image_key is None or label_key is None:
                        image_key, label_key = _keys_of_first(data, path, offset, spec)
                    keys = (image_key.encode(), label_key.encode())
                    image, label = find_entries(data, keys, path, offset)
                    kind, count, first = first_value(data, image, path, offset)
                    if kind != "bytes" or not count:
                        raise _missing(data, image_key, path, offset, "image_key")
                    columns[0].append(offset)
                    columns[1].append(length)
                    columns[2].append(first[0])
                    columns[3].append(first[1])
                    if label_key:
                        labels.append(_int_label(data, label, label_key, path, offset))
        except Exception as error:  # its frames hold views of the map: drop them to close it
            _drop_frames(error)
            raise
        finally:
            view.release()
    return columns, labels if label_key else None


def _keys_of_first(data: Any, path: str, offset: int, spec: IndexSpec) -> tuple[str, str]:
    """The image and label keys of `spec`, the defaults that the first record has filled in."""
    image_key, label_key = spec.image_key, spec.label_key
    names = (*IMAGE_KEYS, *LABEL_KEYS)
    entries = find_entries(data, tuple(name.encode() for name in names), path, offset)
    values = [first_value(data, entry, path, offset) for entry in entries]
    if image_key is None:
        found = (
            k
            for k, (kind, count, _) in zip(IMAGE_KEYS, values, strict=False)
            if kind == "bytes" and count
        )
        image_key = next(found, None)
        if image_key is None:
            raise _missing(data, IMAGE_KEYS[0], path, offset, "image_key")
    if label_key is None:
        label_values = values[len(IMAGE_KEYS) :]
        found = (k for k, (kind, _, _) in zip(LABEL_KEYS, label_values, strict=True) if kind)
        label_key = next(found, "")
    return image_key, label_key


def _drop_frames(error: BaseException | None) -> None:
    """Clear the local variables of the finished frames of `error` and of the errors it
    carries (its cause, its context), which may hold views of a memory map."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _missing(data: Any, key: str, path: str, offset: int, option: str) -> ValueError:
    return ValueError(
        f"{path!r}: the record at byte {offset} has no bytes feature {key!r} (it has "
        f"{feature_names(data, path, offset)}): pass {option}= naming the feature that holds "
        "the image"
    )


def _int_label(data: Any, entry: tuple[int, int] | None, key: str, path: str, offset: int) -> int:
    kind, count, first = first_value(data, entry, path, offset)
    if kind != "int64" or count != 1:
        raise ValueError(
            f"{path!r}: the record at byte {offset} has no single int64 feature {key!r} for "
            f"its label (it has {feature_names(data, path, offset)}): pass label_key= naming "
            "it, or label_key='' for no labels"
        )
    if not 0 <= first <= np.iinfo(np.int32).max:
        raise ValueError(
            f"{path!r}: the record at byte {offset} has label {first}, not a class index in "
            f"[0, 2**31): write labels as class indices"
        )
    return int(first)
