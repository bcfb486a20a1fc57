"""One sample inside a shard, named by a path string: `shard#tar@OFFSET+SIZE`, or
`shard#tfrecord@OFFSET+LENGTH/START+SIZE`.

A shard source (`prefetch.shard_sources`) is a `FileList` whose paths are *member paths*: the
shard's own path or URL, then `#`, the format, and where the sample's bytes lie, so that every
part of the loader that reads a file by its path (the decoders, the window decoder, the error
notes, `on_error`) reads a sample of a shard the same way, and an error names the shard and
the byte offset of the sample.

- `tar@OFFSET+SIZE`: the image is the `SIZE` bytes at `OFFSET` (a tar member's data).
- `tfrecord@OFFSET+LENGTH/START+SIZE`: the TFRecord record at `OFFSET` holds `LENGTH` bytes of
  data (a `tf.train.Example`); the image is the `SIZE` bytes at `START` within that data. The
  whole record is read and both of its CRCs are checked before the image is handed on, so a
  damaged record raises `CorruptShardError` naming the shard and `OFFSET`.

`read_member` reads one: a local shard with one `pread` (the file opened for that read only),
a URL with one ranged read. Pure functions; thread-safe.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import NamedTuple

from prefetch.shard_formats import RECORD_OVERHEAD, record_data

# The suffix that makes a path a member path (anchored at the end, so `#` elsewhere is kept).
_MEMBER = re.compile(r"#(tar|tfrecord)@(\d+)\+(\d+)(?:/(\d+)\+(\d+))?$")
FORMATS = ("tar", "tfrecord")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# The ending of a whole shard's local copy in a spool folder (`prefetch.shard_stream`).
SPOOL_SUFFIX = ".shard"


class Member(NamedTuple):
    """Where a sample's bytes lie: `shard` (a path or URL), its `format` ("tar" or
    "tfrecord"), the byte `offset` and `length` of what is read (a tar member's data; a
    TFRecord record's data, the framing excluded), and for TFRecord the image's `start` and
    `size` within the record's data."""

    shard: str
    format: str
    offset: int
    length: int
    start: int = 0
    size: int = 0

    def path(self) -> str:
        """The member path of this sample."""
        if self.format == "tar":
            return f"{self.shard}#tar@{self.offset}+{self.length}"
        return f"{self.shard}#tfrecord@{self.offset}+{self.length}/{self.start}+{self.size}"

    def moved_to(self, shard: str) -> Member:
        """The same sample in a copy of the shard at `shard` (a spooled or cached copy)."""
        return self._replace(shard=shard)


def split_member(path: str) -> Member | None:
    """The `Member` a member path names, or None for any other path (one regex search)."""
    match = _MEMBER.search(path) if "#" in path else None
    if match is None:
        return None
    fmt, offset, length, start, size = match.groups()
    return Member(
        path[: match.start()],
        fmt,
        int(offset),
        int(length),
        int(start or 0),
        int(size or 0),
    )


def read_member(member: Member) -> bytes:
    """The image bytes of `member`: from a local shard (`pread`, refusing anything that is not
    a regular file) or a URL (one ranged read, through `prefetch.storage`). For TFRecord both
    CRCs of the record are checked first (`CorruptShardError` naming the shard and offset);
    a shard shorter than the index says raises OSError naming it (re-index: the shard has
    changed since)."""
    if member.format == "tar":
        return _read_range(member.shard, member.offset, member.length)
    framed = _read_range(member.shard, member.offset, member.length + RECORD_OVERHEAD)
    data = record_data(framed, member.shard, member.offset)
    if member.start + member.size > len(data):
        raise ValueError(
            f"{member.shard!r}: the record at byte {member.offset} is {len(data)} bytes, too "
            "short for the image its index names: the shard changed after it was indexed; "
            "delete its .prefetch-index file to re-index it"
        )
    return bytes(data[member.start : member.start + member.size])


def _read_range(shard: str, offset: int, length: int) -> bytes:
    from prefetch import storage  # storage reads member paths through this module

    if storage.is_url(shard):
        data = storage.read_range(shard, offset, length)
    else:
        handle = os.open(storage.local_path(shard), os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                raise OSError(f"{shard!r} is not a regular file (a device, a FIFO): not read")
            data = os.pread(handle, length, offset)
        finally:
            os.close(handle)
    if len(data) != length:
        raise OSError(
            f"{shard!r} ends before byte {offset + length} of the sample its index names "
            f"(read {len(data)} of {length} bytes at {offset}): the shard was truncated or "
            "changed after it was indexed; re-write it, or delete its .prefetch-index file"
        )
    return data


def spooled_name(url: str) -> str:
    """The file name of the local copy of the shard at `url` in a spool folder."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:32] + SPOOL_SUFFIX


def spooled_path(folder: str, path: str) -> str:
    """The member path `path` (a sample of a URL shard) moved to its shard's copy in
    `folder`; any other path is returned as is."""
    member = split_member(path)
    from prefetch import storage  # storage reads member paths through this module

    if member is None or not storage.is_url(member.shard):
        return path
    return member.moved_to(os.path.join(folder, spooled_name(member.shard))).path()
