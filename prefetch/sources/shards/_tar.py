"""Tar shards, read and written without the `tarfile` module: WebDataset's layout.

`iter_tar_members` lists a tar file's regular members from their 512-byte headers only (POSIX
ustar, GNU long names, pax `path` and `size` records; checksums checked), seeking past each
member's data, so an index can point at the bytes of every member without reading them;
`sample_key` groups members into samples as WebDataset does (`000123.jpg` and `000123.cls`).
`tar_header`, `tar_padding` and `TAR_END` write a tar that `tarfile` and GNU tar read. Damaged
headers raise `CorruptShardError` naming the file and the header's byte offset. Pure functions,
thread-safe; the readers take an open binary file and seek in it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from prefetch.io import corrupt_shard
from prefetch.sources.shards._tfrecord import file_size

_BLOCK = 512
_ZERO_BLOCK = b"\0" * _BLOCK
TAR_END = b"\0" * 1024  # the end-of-archive marker: two zero blocks
_GNU_MAGIC = b"ustar  \0"  # GNU headers keep other fields where ustar keeps its name prefix
_REGULAR = (b"0", b"\0", b"7")  # regular file, old regular file, contiguous file
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directory, fifo: size unused
_SIGNED = struct.Struct("148b8x356b")  # a header's bytes less its checksum field, signed
# The most bytes read of a GNU long name ('L', 'K') and of a pax header ('x', 'g'): a header
# declaring more is damage (or an attack), refused before anything is read.
MAX_LONG_NAME_BYTES = 64 << 10
MAX_PAX_BYTES = 1 << 20
# The most bytes (UTF-8) of a member's name, however it is stored (ustar, GNU long name, pax
# path): what a ustar header holds (155 + "/" + 100), room for any WebDataset key with its
# folders (the writer's are 13 bytes); it also bounds what pairing a sample's members holds
# while indexing. A longer name is refused as damage (60 KB names cost twice the shard's size
# when they were held whole).
MAX_MEMBER_NAME_BYTES = 256
# The most bytes (UTF-8) of a member's name that a source holds (in its member table, in its
# index file) and shows in messages: a longer name is held as its first and last bytes around
# "…" (`held_name`). Common names fit whole (WebDataset keys with a folder or two, the
# writer's 13 bytes); a message also gives the member's byte offset, which tells it exactly.
# So a sample's name costs at most this (plus its 9 bytes of framing) however long it is, and
# a shard of long names costs no more per sample than about twice a short-named one's.
MAX_HELD_NAME_BYTES = 64
_ELLIPSIS = "…".encode()
_EXTRA_CAPS = {
    b"L": MAX_LONG_NAME_BYTES,
    b"K": MAX_LONG_NAME_BYTES,
    b"x": MAX_PAX_BYTES,
    b"g": MAX_PAX_BYTES,
}


@dataclass(frozen=True)
class TarMember:
    """A regular file in a tar archive: its full name, where its data starts, and its size."""

    name: str  # the member's path in the archive (ustar prefix, GNU long name or pax applied)
    offset: int  # byte offset of the member's data in the archive file
    size: int  # bytes of data


def _number(field: bytes) -> int:
    """A numeric tar header field: octal (NUL/space terminated), or GNU base-256."""
    if field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0xFF else value
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _text(field: bytes) -> str:
    """A NUL-terminated name field, decoded like tarfile (UTF-8, undecodable bytes kept)."""
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict[str, bytes]:
    """The `length key=value\\n` records of a pax extended header."""
    records, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ValueError(f"bad pax record at byte {pos}")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value
        pos += length
    return records


def iter_tar_members(file: BinaryIO, path: str) -> Iterator[TarMember]:
    """The regular-file members of a tar archive, in archive order, reading only headers.

    Supports ustar (name prefix), GNU (long names, base-256 sizes) and pax ('x' headers' path
    and size; global 'g' headers ignored). Directories, links, devices and sparse files are
    skipped (old GNU sparse files with extension headers are refused). The archive ends at a
    zero block or at end of file. At most `MAX_LONG_NAME_BYTES` of a long name and
    `MAX_PAX_BYTES` of a pax header are read (more is refused). A bad header checksum, an
    unreadable header, a member running past the end of the file, or a long name or pax
    header over its cap, or a name over `MAX_MEMBER_NAME_BYTES`, raises `CorruptShardError`
    naming the header's offset.
    """
    size = file_size(file)
    offset = 0
    long_name: str | None = None
    pax: dict[str, bytes] = {}
    while True:
        file.seek(offset)
        header = file.read(_BLOCK)
        if not header or header == _ZERO_BLOCK:
            return
        if len(header) < _BLOCK:
            raise corrupt_shard(path, offset, f"truncated tar header ({len(header)} of 512 bytes)")
        try:
            checksum = _number(header[148:156])
            kind = header[156:157]
            member_size = _number(header[124:136])
            if "size" in pax and kind not in (b"L", b"K", b"x", b"g"):
                member_size = int(pax["size"])
        except ValueError as error:
            raise corrupt_shard(path, offset, f"unreadable tar header ({error})") from None
        unsigned = 256 + sum(header) - sum(header[148:156])
        if checksum != unsigned and checksum != 256 + sum(_SIGNED.unpack(header)):
            raise corrupt_shard(path, offset, "tar header checksum mismatch")
        data_offset = offset + _BLOCK
        if kind in _NO_DATA or (kind == b"\0" and header[:100].split(b"\0")[0].endswith(b"/")):
            member_size = 0
        cap = _EXTRA_CAPS.get(kind)
        if cap is not None and member_size > cap:
            what = "GNU long name" if kind in (b"L", b"K") else "pax header"
            raise corrupt_shard(path, offset, f"a {what} of {member_size} bytes (at most {cap})")
        if member_size < 0 or data_offset + member_size > size:
            what = f"{member_size} bytes from {data_offset}, the file ends at {size}"
            raise corrupt_shard(path, offset, f"truncated tar member: {what}")
        if kind in (b"L", b"x"):
            file.seek(data_offset)
            extra = file.read(member_size)
            try:
                if kind == b"L":
                    long_name = _text(extra)
                else:
                    pax = _pax_records(extra)
            except ValueError as error:
                raise corrupt_shard(path, offset, f"unreadable pax header ({error})") from None
        elif kind not in (b"K", b"g"):
            name = _text(header[0:100])
            prefix = _text(header[345:500]) if header[257:265] != _GNU_MAGIC else ""
            name = f"{prefix}/{name}" if prefix else name
            name = long_name if long_name is not None else name
            if "path" in pax:
                name = pax["path"].decode("utf-8", "surrogateescape")
            sparse = any(key.startswith("GNU.sparse.") for key in pax)  # data is not the file
            if kind in _REGULAR and not name.endswith("/") and not sparse:
                length = len(name.encode("utf-8", "surrogateescape"))
                if length > MAX_MEMBER_NAME_BYTES:
                    what = f"a member name of {length:,} bytes (at most {MAX_MEMBER_NAME_BYTES:,})"
                    raise corrupt_shard(path, offset, what)
                yield TarMember(name, data_offset, member_size)
            long_name, pax = None, {}
        offset = data_offset + member_size + -member_size % _BLOCK


def held_name(name: str) -> bytes:
    """`name` in UTF-8 as a source holds it: itself when it takes at most
    `MAX_HELD_NAME_BYTES`, else its first and last bytes (whole characters) around "…", in
    at most that many bytes."""
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_HELD_NAME_BYTES:
        return encoded
    keep = (MAX_HELD_NAME_BYTES - len(_ELLIPSIS)) // 2
    head, tail = keep, len(encoded) - keep
    while head and encoded[head] & 0xC0 == 0x80:  # a continuation byte: inside a character
        head -= 1
    while tail < len(encoded) and encoded[tail] & 0xC0 == 0x80:
        tail += 1
    return encoded[:head] + _ELLIPSIS + encoded[tail:]


# WebDataset's split of a member name: key up to the basename's first dot, extension after it.
_SAMPLE_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def sample_key(name: str) -> tuple[str, str]:
    """(key, extension) of a tar member name, split as WebDataset groups samples.

    The split is at the first dot of the basename: "dir/000123.jpg" -> ("dir/000123", "jpg"),
    "a/b.c.png" -> ("a/b", "c.png"), with WebDataset's very pattern (so "d/.x" -> ("d/", "x")).
    A name it cannot split (no dot in the basename) gives (name, ""): WebDataset skips such
    members, and so should callers. Callers compare the extension lower-cased.
    """
    match = _SAMPLE_KEY.match(name)
    return (match.group(1), match.group(2)) if match else (name, "")


def _octal(value: int, width: int, what: str) -> bytes:
    """`value` as a NUL-terminated octal field of `width` bytes, or ValueError if it cannot fit."""
    if not 0 <= value < 8 ** (width - 1):
        raise ValueError(f"tar {what} must be in [0, {8 ** (width - 1)}), got {value}")
    return b"%0*o\0" % (width - 1, value)


def tar_header(name: str, size: int, mtime: int = 0) -> bytes:
    """One 512-byte ustar header for a regular file `name` of `size` bytes (mode 0644, uid 0).

    Names over 100 bytes (UTF-8) are split at a slash into the ustar prefix (up to 155 bytes)
    and name; a name that cannot be split so raises ValueError naming it. Sizes and mtimes must
    fit 11 octal digits (sizes under 8 GiB).
    """
    encoded = name.encode()
    prefix = b""
    if not encoded or b"\0" in encoded:
        raise ValueError(f"tar member name must be non-empty and without NUL, got {name!r}")
    if len(encoded) > 100:
        parts = encoded.split(b"/")
        for i in range(1, len(parts)):
            head, tail = b"/".join(parts[:i]), b"/".join(parts[i:])
            if len(head) <= 155 and 0 < len(tail) <= 100:
                prefix, encoded = head, tail
                break
        else:
            raise ValueError(
                f"tar member name {name!r} does not fit a ustar header: it needs a slash with at "
                "most 155 bytes before it and 100 after it; use a shorter name"
            )
    numbers = _octal(size, 12, "member size") + _octal(mtime, 12, "mtime")
    # name, mode, uid, gid, size, mtime; checksum (spaces until summed), type, linkname, magic
    # and version, uname and gname, devmajor and devminor; prefix, and padding to 512 bytes
    header = bytearray(encoded.ljust(100, b"\0") + b"0000644\0" + b"0000000\0" * 2 + numbers)
    header += b" " * 8 + b"0" + b"\0" * 100 + b"ustar\x0000" + b"\0" * 64 + b"0000000\0" * 2
    header += prefix.ljust(167, b"\0")
    checksum = b"%06o\0 " % sum(header)
    return bytes(header[:148] + checksum + header[156:])


def tar_padding(size: int) -> bytes:
    """The zero bytes that pad a member of `size` bytes to the next 512-byte boundary."""
    return b"\0" * (-size % _BLOCK)
