"""A kept folder listing as data and as a file: what it holds, what it is valid for, the checks
it passes before it is trusted (`prefetch.sources._kept_listing` decides when to read or write).

A `Listing` is the lister's result (`prefetch.sources._listing`: paths, int32 labels, class
names) with what it is valid for: the folders walked, each with its `stamp` (device, inode,
modification and change times, taken before the folder was read: adding, removing or renaming
an entry changes them) and when the listing began. `Listing.changed` and `Listing.racy` say
whether it still describes the folder.

The file: a magic, a JSON header (the key, when the listing began, each array's length), the
arrays (the folders walked and their stamps, the class names, the paths, the labels), and the
CRC-32 of the rest (against damage: no one else can write the file). `write_listing` writes it
to `.partial-<name>-<random>` (exclusively, 0600, never through a link), fsyncs it and renames
it into place: a reader never sees half a file. `read_listing` opens it without following a
link or blocking, refuses (`Refused`, with the reason) a file that is not a regular file of
yours or that group or others may write, then reads it whole into memory (never mapped: a file
truncated while a process used its mapping would kill that process with SIGBUS) and checks the
checksum, the version, the key, the arrays and that every name is UTF-8 (as `PathArray` holds
it); a file it cannot read or decode is refused, never raised. Pure functions; thread-safe.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import secrets
import stat
import time
import zlib
from dataclasses import dataclass

import numpy as np

from prefetch.io import PathArray

# Bumped whenever what a kept listing holds changes: older files are listed again.
LISTING_VERSION = 1
MAGIC = b"PFLIST\x00\x01"
SUFFIX = ".listing"
PARTIAL_PREFIX = ".partial-"
# A folder changed less than this before its listing began may have changed again within the
# same timestamp (2 s: FAT's granularity; ext4's is a clock tick): such a listing is trusted
# only by callers that began before it.
RACY_NS = 2_000_000_000
# The longest header read (a key naming a thousand long class names fits many times over).
MAX_HEADER_BYTES = 16 << 20
# The file ends with the CRC-32 of the rest (5x faster than BLAKE2b: 8 ranks check it at once).
CHECKSUM_BYTES = 4
_ALIGN = 64
# A reader that uses a kept listing sets its modification time to now when it is older than
# this: the time says when it was last used (`prefetch.sources._kept_listing` prunes by it).
USED_EVERY_NS = 24 * 3600 * 10**9
# Bytes of names checked as UTF-8 at a time (a kept listing's paths may be hundreds of MB).
_UTF8_STEP = 1 << 20
# The arrays of a file, in order, with their dtypes.
_ARRAYS = (
    ("folder_bytes", "u1"),
    ("folder_starts", "<i8"),
    ("stamps", "<i8"),
    ("class_bytes", "u1"),
    ("class_starts", "<i8"),
    ("path_bytes", "u1"),
    ("path_starts", "<i8"),
    ("labels", "<i4"),
)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_MISSING = (-1, -1, -1, -1)


class Refused(ValueError):
    """A kept listing that is damaged, someone else's, or made for another folder or state."""


@dataclass(frozen=True, eq=False)
class Listing:
    """A folder's listing: the `paths` and their int32 `labels`, the `class_names`, and what it
    is valid for: the `folders` walked, their `stamps` (int64, one row of `stamp` each), and
    `listed_ns` (the wall clock when the listing began)."""

    paths: PathArray
    labels: np.ndarray
    class_names: list[str]
    folders: PathArray
    stamps: np.ndarray
    listed_ns: int

    def changed(self) -> str | None:
        """The first folder whose stamp is not the one recorded (named), else None."""
        for folder, then in zip(self.folders, self.stamps.tolist(), strict=True):
            if stamp(folder) != tuple(then):
                return f"{folder!r} changed since it was listed"
        return None

    def racy(self) -> bool:
        """Whether a folder's modification and change times both lie within `RACY_NS` before
        the listing began (or after): a change in that tick would leave both as stamped."""
        if not len(self.stamps):
            return False
        newest = int(self.stamps[:, 2:].min(axis=1).max())
        return newest >= self.listed_ns - RACY_NS


def stamp(folder: str) -> tuple[int, int, int, int]:
    """(device, inode, modification time, change time) of `folder` (links followed), or -1s
    when it cannot be read."""
    try:
        return stamp_of(os.stat(folder))
    except OSError:
        return _MISSING


def stamp_of(info: os.stat_result) -> tuple[int, int, int, int]:
    """The `stamp` of a folder whose `os.stat` is `info`."""
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)


def private_file(info: os.stat_result) -> bool:
    """Whether `info` is a regular file of ours that no group or other user may write."""
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _parts(listing: Listing) -> list[tuple[str, np.ndarray]]:
    folder_bytes, folder_starts = listing.folders.parts()
    class_bytes, class_starts = PathArray(listing.class_names).parts()
    path_bytes, path_starts = listing.paths.parts()
    arrays = [
        folder_bytes,
        folder_starts,
        listing.stamps.reshape(-1),
        class_bytes,
        class_starts,
        path_bytes,
        path_starts,
        listing.labels,
    ]
    return [
        (name, np.ascontiguousarray(array, dtype=dtype))
        for (name, dtype), array in zip(_ARRAYS, arrays, strict=True)
    ]


def write_listing(folder: int, name: str, key: str, listing: Listing) -> None:
    """Write `listing` as the kept file of `name`: a partial file, fsynced, renamed into place."""
    arrays = _parts(listing)
    header = json.dumps(
        {"key": key, "listed_ns": listing.listed_ns, "counts": [len(a) for _, a in arrays]}
    ).encode()
    partial = f"{PARTIAL_PREFIX}{name}-{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    handle = os.open(partial, flags, 0o600, dir_fd=folder)
    try:
        checksum = 0
        with os.fdopen(handle, "wb") as file:
            written = 0
            pieces: list[bytes | memoryview] = [MAGIC, len(header).to_bytes(8, "little"), header]
            for piece in [*pieces, *(array.data for _, array in arrays)]:
                if isinstance(piece, memoryview):  # each array starts on an aligned offset
                    pad = bytes(-written % _ALIGN)
                    file.write(pad)
                    checksum = zlib.crc32(pad, checksum)
                    written += len(pad)
                data = memoryview(piece).cast("B")
                file.write(data)
                checksum = zlib.crc32(data, checksum)
                written += len(data)
            file.write(checksum.to_bytes(CHECKSUM_BYTES, "little"))
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, name + SUFFIX, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=folder)
        raise
    with contextlib.suppress(OSError):  # the rename's own durability: best effort
        os.fsync(folder)


def read_listing(folder: int, file_name: str, key: str) -> Listing | None:
    """The listing in `file_name` (in the folder `folder`) made for `key`, read into memory;
    None when there is none; `Refused` (with the reason) when it is not to be trusted, is
    damaged, or cannot be read. Its folders' stamps are not checked here (`Listing.changed`).
    A listing that passes is marked used (its modification time, at most once a day)."""
    try:
        flags = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
        handle = os.open(file_name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as error:  # a link (ELOOP), unreadable
        raise Refused(f"it cannot be opened as a file of yours: {error}") from None
    try:
        info = os.fstat(handle)
        if not private_file(info):
            raise Refused(
                f"not a regular file of yours that only you may write (owner {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o})"
            )
        if info.st_size < len(MAGIC) + 8 + CHECKSUM_BYTES:
            raise Refused(f"{info.st_size} bytes is too short")
        listing = _decode(_read_whole(handle, info.st_size), key)
        if time.time_ns() - info.st_mtime_ns > USED_EVERY_NS:
            with contextlib.suppress(OSError):
                os.utime(handle)
        return listing
    finally:
        os.close(handle)


def _read_whole(handle: int, size: int) -> np.ndarray:
    """The `size` bytes of the open file `handle`, in an array of their own; `Refused` when
    fewer are there (truncated meanwhile) or reading fails."""
    data = np.empty(size, dtype=np.uint8)
    view = data.data
    done = 0
    try:
        while done < size:
            count = os.readv(handle, [view[done:]])
            if count == 0:
                raise Refused(f"it ends at byte {done} of {size}: truncated while read")
            done += count
    except OSError as error:
        raise Refused(f"it cannot be read: {error}") from None
    return data


def _decode(data: np.ndarray, key: str) -> Listing:
    """The listing in the file's bytes `data`, checked; `Refused` otherwise."""
    view = data.data
    body = view[:-CHECKSUM_BYTES]
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise Refused("not a kept listing of this version")
    if zlib.crc32(body).to_bytes(CHECKSUM_BYTES, "little") != bytes(view[-CHECKSUM_BYTES:]):
        raise Refused("its checksum does not match: the file is damaged")
    length = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    if length > min(MAX_HEADER_BYTES, len(body) - start):
        raise Refused(f"a header of {length} bytes")
    try:
        header = json.loads(bytes(view[start : start + length]))
        same = header["key"] == key
        listed_ns, counts = int(header["listed_ns"]), [int(n) for n in header["counts"]]
    except (ValueError, KeyError, TypeError) as error:
        raise Refused(f"a damaged header ({error})") from None
    if not same:
        raise Refused("made for another folder, options or version")
    if len(counts) != len(_ARRAYS) or min(counts) < 0:
        raise Refused("a damaged header (the arrays' lengths)")
    arrays: dict[str, np.ndarray] = {}
    offset = start + length
    for (name, dtype), count in zip(_ARRAYS, counts, strict=True):
        offset += -offset % _ALIGN
        size = count * np.dtype(dtype).itemsize
        if offset + size > len(body):
            raise Refused("its arrays run past its end")
        arrays[name] = np.frombuffer(data, dtype, count, offset)
        offset += size
    if offset != len(body):
        raise Refused("bytes after its arrays")
    return _checked(arrays, listed_ns)


def _checked(arrays: dict[str, np.ndarray], listed_ns: int) -> Listing:
    """The listing of `arrays` when they are well formed; `Refused` otherwise."""
    try:
        folders = PathArray.from_parts(arrays["folder_bytes"], arrays["folder_starts"])
        classes = PathArray.from_parts(arrays["class_bytes"], arrays["class_starts"])
        paths = PathArray.from_parts(arrays["path_bytes"], arrays["path_starts"])
        for names in ("folder_bytes", "class_bytes", "path_bytes"):
            _check_utf8(arrays[names])
    except ValueError as error:  # UnicodeDecodeError is one
        raise Refused(f"damaged names ({error})") from None
    stamps, labels = arrays["stamps"], arrays["labels"]
    if len(stamps) != 4 * len(folders) or len(labels) != len(paths):
        raise Refused("its arrays have other lengths than its names")
    if len(labels) and (labels.min() < 0 or labels.max() >= max(len(classes), 1)):
        raise Refused("a label out of range")
    stamps = stamps.reshape(-1, 4)
    return Listing(paths, labels, classes.tolist(), folders, stamps, listed_ns)


def _check_utf8(data: np.ndarray) -> None:
    """UnicodeDecodeError unless `data` decodes as `PathArray` decodes its names (UTF-8 with
    "surrogatepass", the surrogates `os.fsdecode` makes of undecodable bytes); ASCII (the
    usual case) is told by one pass over the bytes."""
    if not len(data) or int(data.max()) < 0x80:
        return
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    for start in range(0, len(data), _UTF8_STEP):
        decoder.decode(data[start : start + _UTF8_STEP].tobytes())
    decoder.decode(b"", final=True)
