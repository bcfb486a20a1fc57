"""What a file is, told by its first bytes: a tar, a TFRecord, a gzip stream (and what it
holds), a zip, an HTML page. `refuse_other_format(head, name, format)` turns a shard that is
plainly something else than `format` into an error that says what it is and what reads it,
before a parser calls it damaged. Pure functions of the bytes given; thread-safe.
"""

from __future__ import annotations

import os
import struct
import zlib

from prefetch.errors import CorruptShardError
from prefetch.io import masked_crc32c

# Bytes of a file's start read to tell what it is (a tar header; a gzip stream's start).
HEAD_BYTES = 4096
# Bytes of a gzip stream inflated to tell what it holds (at most this much output).
_GZIP_PEEK_BYTES = 512
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_UTF8_BOM = b"\xef\xbb\xbf"
_HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<title", b"<pre", b"<h1")
# What reads each kind of file, for the message.
_READER = {"tar": "prefetch.TarSource", "tfrecord": "prefetch.TFRecordSource"}
_NAMES = {"tar": "a tar archive", "tfrecord": "a TFRecord file"}
_GZIPPED = {"tar": "a gzip-compressed tar (a .tar.gz)", "tfrecord": "a gzip-compressed TFRecord"}


def what_file(head: bytes) -> str | None:
    """What the file starting with `head` (up to its first `HEAD_BYTES`) is: "tar", "tfrecord",
    "gzip", "zip" or "html"; None when it is none of them for sure (an empty file too)."""
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZIP_MAGIC):
        return "zip"
    if len(head) >= 12:
        length_crc = struct.unpack_from("<I", head, 8)[0]
        if masked_crc32c(head[:8]) == length_crc:
            return "tfrecord"
    if len(head) >= 512 and _is_tar_header(head[:512]):
        return "tar"
    text = head.removeprefix(_UTF8_BOM).lstrip().lower()
    if text.startswith(_HTML_STARTS):
        return "html"
    return None


def gzip_holds(head: bytes) -> str | None:
    """What the gzip stream starting with `head` holds (as `what_file`), when its first
    bytes inflate; None otherwise."""
    try:
        inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _GZIP_PEEK_BYTES)
    except zlib.error:
        return None
    return what_file(inner) if inner else None


def refuse_other_format(head: bytes, name: str, format: str) -> None:
    """Raise `CorruptShardError` (a ValueError) naming `name` when its first bytes `head`
    show it is not a `format` shard (the other format, a compressed one, a zip, an HTML
    page), saying what it is and what reads it; return when it may be one (damage is the
    parser's to name)."""
    kind = what_file(head)
    if kind is None or kind == format:
        return
    base = os.path.basename(name.rstrip("/")) or name
    if kind in _READER:
        raise _refused(
            name, f"{name!r} is {_NAMES[kind]}, not {_NAMES[format]}: read it with {_READER[kind]}"
        )
    if kind == "gzip":
        inner = gzip_holds(head)
        what = _GZIPPED.get(inner or "", "gzip-compressed")
        how = f" and read it with {_READER[inner]}" if inner in _READER and inner != format else ""
        raise _refused(
            name,
            f"{name!r} is {what}: random access needs uncompressed shards; decompress it first "
            f"(gunzip -c {base} > uncompressed-shard){how}, or write new shards with `prefetch "
            "shards write`",
        )
    if kind == "zip":
        raise _refused(
            name,
            f"{name!r} is a zip archive, not {_NAMES[format]}: unzip it and read the images "
            "with prefetch.ImageFolder, or pack them with `prefetch shards write`",
        )
    pattern = f"{name.rpartition('/')[0]}/*.{format}"
    raise _refused(
        name,
        f"{name!r} is an HTML page (a web server's folder listing, or an error page), not "
        f"{_NAMES[format]}: for the shards of a folder URL pass the folder's URL (with or "
        f"without its trailing '/') or a pattern such as {pattern!r}",
    )


def _refused(name: str, message: str) -> CorruptShardError:
    """The error for a file that is not a shard of the format: a `CorruptShardError` (a
    ValueError) at offset 0, whose message says what the file is instead."""
    return CorruptShardError(message, name, 0)


def _is_tar_header(block: bytes) -> bool:
    """Whether `block` is a tar header: the ustar magic, or a valid checksum (old tars)."""
    if block[257:262] == b"ustar":
        return True
    field = block[148:156].split(b"\0", 1)[0].strip()
    try:
        checksum = int(field, 8)
    except ValueError:
        return False
    return checksum == 256 + sum(block) - sum(block[148:156]) and any(block[:100])
