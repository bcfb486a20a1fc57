"""Where a sample is, as data, and the one read of it: `Location` and `read_location`.

A sample's `Location` is a path or URL (a `str`, never parsed for anything but `is_url`), or
for a sample inside a shard a `Member` value. A shard source (`prefetch.sources.shards`) holds
its samples' members in a `MemberTable` (numpy columns: shard number, offset, length, start,
size, and the tar members' names in one buffer, with the table of shard paths), built once from
the shards' indexes and pickled to the workers as a few arrays. `MemberTable[i]` is the
`Member` of sample `i`; the loader hands it to the decoders in place of a path, so no path
string a user gives is ever read as a member, whatever its characters.

`read_location` is the one read of a location, within the active `RemoteOptions`: a path with
`read_local`, a URL with `read_bytes` (`prefetch.io._storage`), a member with `read_member`:

- tar: the image is the `length` bytes at `offset` (a tar member's data).
- tfrecord: the TFRecord record at `offset` holds `length` bytes of data (a
  `tf.train.Example`); the image is the `size` bytes at `start` within that data. The whole
  record is read and both of its CRCs are checked (`prefetch.io._records`) before the image
  is handed on.

A member of a local shard is read with one `pread` (the file opened for that read only), of a
URL with one ranged read; never more than `RemoteOptions.max_object_bytes`, whatever the index
says. Its errors name the shard by its real path or URL (`origin`, never a spooled copy), the
member's key (a tar member's name) and the byte offset. Pure functions; thread-safe.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from prefetch.io import _storage as storage
from prefetch.io._local_files import open_regular, read_local
from prefetch.io._paths import PATHS_PER_STEP, PathArray, pack_chunks
from prefetch.io._records import RECORD_OVERHEAD, record_data
from prefetch.io._remote_options import active_options

FORMATS = ("tar", "tfrecord")
# The ending of a whole shard's local copy in a spool folder (`prefetch.runtime._spool`).
SPOOL_SUFFIX = ".shard"
_COLUMNS = ("shard", "offset", "length", "start", "size")


class Member(NamedTuple):
    """Where a sample's bytes lie: `shard` (a path or URL: where it is read), its `format`
    ("tar" or "tfrecord"), the byte `offset` and `length` of what is read (a tar member's
    data; a TFRecord record's data, the framing excluded), for TFRecord the image's `start`
    and `size` within the record's data, the member's `key` (a tar member's name, a long one
    shortened around "…": `MAX_HELD_NAME_BYTES`; "" for a record) and `origin` (the shard's
    own path or URL, named in errors; "": `shard`)."""

    shard: str
    format: str
    offset: int
    length: int
    start: int = 0
    size: int = 0
    key: str = ""
    origin: str = ""

    def describe(self) -> str:
        """The sample, for messages: its shard, its key and its byte offset."""
        return _describe(self.origin or self.shard, self.key, self.offset)

    def moved_to(self, shard: str) -> Member:
        """The same sample in a copy of the shard at `shard` (a spooled or cached copy); its
        errors still name the original."""
        return self._replace(shard=shard, origin=self.origin or self.shard)

    def __str__(self) -> str:
        return self.describe()


# Where a file source's sample is read from: a path or URL, or a sample of a shard.
Location = str | Member


def read_location(location: Location) -> bytes:
    """The bytes of `location`, within the active `RemoteOptions`: a local or `file://` path
    through `read_local` (a regular file, at most `max_object_bytes`), an fsspec URL through
    `read_bytes` (retried, capped), a sample of a shard (a `Member`) through `read_member`. A
    string is always a path or URL, whatever its characters."""
    if not isinstance(location, str):
        return read_member(location)
    if "://" not in location:  # the local fast path: one substring test
        return read_local(location)
    if storage.is_url(location):
        return storage.read_bytes(location)
    return read_local(storage.local_path(location))


def place_of(location: Location) -> str:
    """The path or URL whose bytes `location` is read from: the string itself, or the shard
    of a `Member`."""
    return location if isinstance(location, str) else location.shard


class MemberTable:
    """The `Member`s of a shard source's samples, as columns: `shards` (the shard paths or
    URLs), `format`, and per sample int32 `shard` numbers and int64 `offset`, `length`,
    `start`, `size`, and `keys` (a `PathArray` of tar members' names; None for TFRecord).
    About 36 bytes per sample plus the names; indexable by an int (a `Member`) or an index
    array (a table of those samples)."""

    def __init__(
        self, shards: list[str], format: str, columns: dict[str, np.ndarray], keys: PathArray | None
    ) -> None:
        self.shards, self.format, self.keys = shards, format, keys
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["offset"])

    def __getitem__(self, index: Any) -> Any:
        """The `Member` of sample `index` (an int), or a table of the samples `index` names."""
        if isinstance(index, (int, np.integer)):
            shard, offset, length, start, size = (int(self.columns[n][index]) for n in _COLUMNS)
            key = str(self.keys[index]) if self.keys is not None else ""
            return Member(self.shards[shard], self.format, offset, length, start, size, key)
        indices = np.asarray(index, np.int64)
        columns = {name: column[indices] for name, column in self.columns.items()}
        keys = self.keys[indices] if self.keys is not None else None
        return MemberTable(self.shards, self.format, columns, keys)

    def display_paths(self) -> PathArray:
        """Each sample's `Member.describe()` (its shard, key and byte offset), for messages
        and a source's `paths`: text only, never read as a location."""
        return pack_chunks(self._descriptions())

    def _descriptions(self) -> Iterator[list[str]]:
        for begin in range(0, len(self), PATHS_PER_STEP):
            end = min(begin + PATHS_PER_STEP, len(self))
            shards = [self.shards[n] for n in self.columns["shard"][begin:end].tolist()]
            offsets = self.columns["offset"][begin:end].tolist()
            keys = self.keys[begin:end].tolist() if self.keys is not None else [""] * len(shards)
            yield [_describe(*sample) for sample in zip(shards, keys, offsets, strict=True)]


def _describe(shard: str, key: str, offset: int) -> str:
    what = f"member {key!r}" if key else "record"
    return f"{shard} ({what} at byte {offset})"


def read_member(member: Member) -> bytes:
    """The image bytes of `member`: from a local shard (`pread`, refusing anything that is not
    a regular file) or a URL (one ranged read, through `prefetch.io._storage`). At most the active
    options' `max_object_bytes` are read, whatever the index says (OSError naming the shard,
    key and offset). For TFRecord both CRCs of the record are checked first
    (`CorruptShardError` naming the shard and offset); a shard shorter than its index says
    raises OSError naming it (it changed since it was indexed)."""
    framing = RECORD_OVERHEAD if member.format == "tfrecord" else 0
    cap = active_options().max_object_bytes
    if member.length + framing > cap:
        raise OSError(
            f"{member.describe()}: its index says {member.length + framing} bytes, more than "
            f"max_object_bytes={cap}: raise RemoteOptions(max_object_bytes=...) if samples are "
            "meant to be that large, else re-write the shard"
        )
    if member.format == "tar":
        return _read_range(member, member.offset, member.length)
    framed = _read_range(member, member.offset, member.length + framing)
    data = record_data(framed, member.origin or member.shard, member.offset)  # not a copy's name
    if member.start + member.size > len(data):
        raise ValueError(
            f"{member.describe()}: the record is {len(data)} bytes, too short for the image "
            "its index names: the shard changed after it was indexed; delete its "
            ".prefetch-index file to re-index it"
        )
    return bytes(data[member.start : member.start + member.size])


def _read_range(member: Member, offset: int, length: int) -> bytes:
    shard = member.shard
    if storage.is_url(shard):
        data = storage.read_range(shard, offset, length)
    else:
        handle = open_regular(storage.local_path(shard), "shard ")
        try:
            data = os.pread(handle, length, offset)
        finally:
            os.close(handle)
    if len(data) != length:
        raise OSError(
            f"{member.describe()}: the shard ends before byte {offset + length} (read "
            f"{len(data)} of {length} bytes): it was truncated or changed after it was "
            "indexed; re-write or re-download it, or delete its .prefetch-index file"
        )
    return data


def spooled_name(url: str) -> str:
    """The file name of the local copy of the shard at `url` in a spool folder."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:32] + SPOOL_SUFFIX


def spooled(folder: str, member: Member) -> Member:
    """`member` (a sample of a URL shard) moved to its shard's copy in `folder`; a sample of
    a local shard is returned as it is."""
    if not storage.is_url(member.shard):
        return member
    return member.moved_to(os.path.join(folder, spooled_name(member.shard)))
