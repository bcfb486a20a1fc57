"""An offset index as data and as a file: what it holds, the bytes it is valid for, and the
checks it passes before it is trusted.

A `ShardIndex` is valid only for the bytes it indexed. Its identity (`ShardIdentity`) is the
shard's size and a digest of its first and last `EDGE_BYTES` bytes, and for a local shard its
modification and change times and inode: a shard replaced by another of the same size and
modification time (a new inode, or a new change time when rewritten in place) no longer matches
its index, and a URL shard whose edges differ from the ones indexed does not either.

`decode_index` reads an index file's bytes as an untrusted input: the zip directory's declared
sizes are checked before anything is inflated, each member is inflated to at most its declared
size, and the whole to at most what a shard of its size can need (`max_index_bytes`); then the
arrays are checked against the shard: no more samples than the shard can hold
(`MIN_SAMPLE_BYTES`), every byte range inside it, in order. Anything else is refused
(`IndexRefused`, with the reason). Pure functions, thread-safe.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from prefetch.io import RECORD_OVERHEAD, PathArray
from prefetch.sources.shards._tar import MAX_HELD_NAME_BYTES

# Bumped whenever what an index holds changes: older indexes are rebuilt (3: tar member names
# as held, at most `MAX_HELD_NAME_BYTES` each).
INDEX_VERSION = 3
INDEX_SUFFIX = ".prefetch-index.npz"
# Bytes at each end of a shard whose digest is part of its identity.
EDGE_BYTES = 64 << 10
# The fewest bytes a sample takes in a shard: a tar member's 512-byte header; a TFRecord
# record's 16 bytes of framing. An index may not claim more samples than its shard can hold.
MIN_SAMPLE_BYTES = {"tar": 512, "tfrecord": 16}
# What an index file may hold beyond its columns (the spec, the identity, npy headers).
_INDEX_OVERHEAD = 64 << 10
_COLUMNS = ("offsets", "lengths", "starts", "sizes", "labels", "key_bytes", "key_starts")
_MEMBERS = frozenset(f"{name}.npy" for name in ("spec", "identity", "digest", *_COLUMNS))


class IndexRefused(ValueError):
    """An index file that is damaged, hostile, or built for other bytes or options."""


@dataclass(frozen=True)
class IndexSpec:
    """How samples are found in a shard, part of an index's key.

    - `format`: "tfrecord" or "tar".
    - `image_key`, `label_key`: TFRecord feature names (None: the first of `IMAGE_KEYS` /
      `LABEL_KEYS` the first record has; no label feature means unlabelled). `label_key=""`
      reads no labels.
    - `image_ext`, `label_ext`: tar extensions (lower-cased) of a sample's image (the first
      member of the sample with one of them) and of its label (ASCII decimal); `label_ext=""`
      reads no labels.
    """

    format: str
    image_key: str | None = None
    label_key: str | None = None
    image_ext: tuple[str, ...] = ("jpg", "jpeg", "png")
    label_ext: str = "cls"

    def key(self) -> str:
        """The spec as a string, stored in the index and compared when it is loaded."""
        parts = [self.format, self.image_key, self.label_key, list(self.image_ext)]
        return json.dumps([INDEX_VERSION, *parts, self.label_ext])


@dataclass(frozen=True)
class ShardIdentity:
    """What an index was built from: the shard's `size`, the `digest` of its first and last
    `EDGE_BYTES` bytes, and for a local shard its `mtime_ns`, `ctime_ns` and `inode` (-1 for
    a URL's copy). `matches` compares what both sides know."""

    size: int
    digest: bytes
    mtime_ns: int = -1
    ctime_ns: int = -1
    inode: int = -1

    def matches(self, other: ShardIdentity) -> bool:
        """Whether `other` (the shard as it is now) is the shard this index was built from:
        equal sizes and digests, and equal local times and inodes where both know them."""
        if (self.size, self.digest) != (other.size, other.digest):
            return False
        local = (self.mtime_ns, self.ctime_ns, self.inode)
        now = (other.mtime_ns, other.ctime_ns, other.inode)
        return -1 in local or -1 in now or local == now


def edge_digest(read: Callable[[int, int], bytes], size: int) -> bytes:
    """The digest of the first and last `EDGE_BYTES` bytes of a `size`-byte shard, read with
    `read(offset, length)`; OSError when a read comes back short (the shard changed)."""
    digest = hashlib.blake2b(size.to_bytes(8, "little"), digest_size=16)
    spans = [(0, min(EDGE_BYTES, size))]
    if size > EDGE_BYTES:
        tail = max(EDGE_BYTES, size - EDGE_BYTES)
        spans.append((tail, size - tail))
    for offset, length in spans:
        data = read(offset, length)
        if len(data) != length:
            raise OSError(f"read {len(data)} of {length} bytes at {offset}: the shard changed")
        digest.update(data)
    return digest.digest()


def local_identity(handle: int) -> ShardIdentity:
    """The identity of the open regular file `handle` (two reads of its edges)."""
    info = os.fstat(handle)
    digest = edge_digest(lambda offset, length: os.pread(handle, length, offset), info.st_size)
    return ShardIdentity(info.st_size, digest, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """The samples of one shard, in the shard's order: `offsets`, `lengths` (int64: a tar
    member's data; a TFRecord record's start and data length), `starts`, `sizes` (int64, the
    image within a record's data; zeros for tar), `labels` (int32, or None without labels),
    `keys` (a tar sample's image member name as held, `held_name`, in one buffer; None for
    TFRecord, whose samples
    are named by their byte offset) and the `identity` of the bytes it was built from."""

    offsets: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray | None
    identity: ShardIdentity
    keys: PathArray | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def size(self) -> int:
        """The shard's size in bytes when it was indexed."""
        return self.identity.size

    @property
    def mtime_ns(self) -> int:
        """The shard's modification time when it was indexed (-1 for a URL's copy)."""
        return self.identity.mtime_ns

    def check_copy(self, shard: str, identity: ShardIdentity) -> None:
        """OSError naming `shard` when a copy of it (`identity`) is not the bytes indexed."""
        if not self.identity.matches(identity):
            raise OSError(
                f"{shard!r} has changed since it was indexed ({identity.size} bytes now, "
                f"{self.size} then, or other bytes at its start or end): delete its index "
                f"({INDEX_SUFFIX} beside it, or the one in the shard-index cache folder) to "
                "index it again"
            )

    def to_bytes(self, spec: IndexSpec) -> bytes:
        """The index as an .npz file's bytes."""
        return encode_index(self, spec)

    @classmethod
    def from_bytes(cls, data: bytes, spec: IndexSpec) -> ShardIndex | None:
        """The index in `data`, or None when it is refused (`decode_index`)."""
        try:
            return decode_index(data, spec)
        except IndexRefused:
            return None


def encode_index(index: ShardIndex, spec: IndexSpec) -> bytes:
    """`index` as an .npz file's bytes (uncompressed)."""
    buffer = io.BytesIO()
    write_index(index, spec, buffer)
    return buffer.getvalue()


def write_index(index: ShardIndex, spec: IndexSpec, file: BinaryIO) -> None:
    """Write `index` into `file` as an .npz file (uncompressed), array by array: never a
    second copy of it in memory (a tar's member names may be a third of its shard)."""
    ident = index.identity
    keys = index.keys if index.keys is not None else PathArray()
    key_bytes, key_starts = keys.parts()
    np.savez(
        file,
        spec=np.array(spec.key()),
        identity=np.array(
            [
                ident.size,
                ident.mtime_ns,
                ident.ctime_ns,
                ident.inode,
                int(index.labels is not None),
            ],
            np.int64,
        ),
        digest=np.frombuffer(ident.digest, np.uint8),
        offsets=index.offsets,
        lengths=index.lengths,
        starts=index.starts,
        sizes=index.sizes,
        labels=index.labels if index.labels is not None else np.zeros(0, np.int32),
        key_bytes=key_bytes,
        key_starts=key_starts if index.keys is not None else np.zeros(0, np.int64),
    )


def max_index_bytes(size: int, format: str) -> int:
    """The most bytes the index of a `size`-byte shard can take, inflated: 48 bytes per sample
    it can hold (five columns and a key's offset), plus its keys (no more bytes than the
    shard), plus a fixed overhead."""
    samples = size // MIN_SAMPLE_BYTES.get(format, 16) + 1
    return _INDEX_OVERHEAD + 48 * samples + size


def decode_index(data: bytes, spec: IndexSpec) -> ShardIndex:
    """The index in the .npz bytes `data` for shards read with `spec`, checked as the module
    docstring says; `IndexRefused` with the reason otherwise. Memory: at most about
    `max_index_bytes` of the size the index states, whatever the file declares."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = {info.filename: info for info in archive.infolist()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise IndexRefused(f"not an index file ({error})") from None
    if set(infos) != _MEMBERS or len(infos) != len(archive.infolist()):
        raise IndexRefused(f"not an index of version {INDEX_VERSION} (members {sorted(infos)})")
    try:
        if str(_member(archive, infos["spec.npy"], 1 << 16)) != spec.key():
            raise IndexRefused("built with other reading options or an older version")
        identity = _member(archive, infos["identity.npy"], 1 << 10)
        digest = _member(archive, infos["digest.npy"], 1 << 10)
        if identity.shape != (5,) or identity.dtype != np.int64 or digest.dtype != np.uint8:
            raise IndexRefused("a damaged identity")
        size, mtime_ns, ctime_ns, inode, labelled = (int(x) for x in identity)
        if size < 0:
            raise IndexRefused(f"a negative shard size ({size})")
        budget = min(max_index_bytes(size, spec.format), len(data))  # stored, never deflated
        declared = sum(infos[f"{name}.npy"].file_size for name in _COLUMNS)
        if declared > budget:
            raise IndexRefused(
                f"it declares {declared} bytes of arrays, more than a {size}-byte shard's "
                f"index can hold ({budget})"
            )
        columns = {name: _member(archive, infos[f"{name}.npy"], budget) for name in _COLUMNS}
    except IndexRefused:
        raise
    except Exception as error:  # a damaged member: not an index of ours
        raise IndexRefused(f"a damaged member ({type(error).__name__}: {error})") from None
    ident = ShardIdentity(size, digest.tobytes(), mtime_ns, ctime_ns, inode)
    return _checked(columns, ident, bool(labelled), spec.format)


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> np.ndarray:
    """The array in `info`, inflated to at most its declared size and `cap` (never more), a
    0-d or 1-d array of plain numbers or text whose header's shape is what the bytes hold."""
    if info.file_size > cap:
        raise IndexRefused(f"{info.filename} declares {info.file_size} bytes, over {cap}")
    with archive.open(info) as member:
        raw = member.read(info.file_size + 1)  # inflates at most this much
    if len(raw) != info.file_size:
        raise IndexRefused(f"{info.filename} holds other than the {info.file_size} bytes declared")
    stream = io.BytesIO(raw)
    version = np.lib.format.read_magic(stream)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read_header(stream)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(shape) > 1 or dtype.hasobject or count * dtype.itemsize != len(raw) - stream.tell():
        raise IndexRefused(f"{info.filename} is not a flat array of the size its header says")
    return np.frombuffer(raw, dtype, count, offset=stream.tell()).reshape(shape)


def _checked(
    columns: dict[str, np.ndarray], identity: ShardIdentity, labelled: bool, format: str
) -> ShardIndex:
    """The index of `columns`, when every byte range lies inside the shard, in order."""
    kinds = {"labels": "i", "key_bytes": "u"}
    for name, column in columns.items():
        if column.ndim != 1 or column.dtype.kind != kinds.get(name, "i"):
            raise IndexRefused(f"column {name} is not a 1-d integer array")
    count = len(columns["offsets"])
    size = identity.size
    if count > size // MIN_SAMPLE_BYTES.get(format, 16):
        raise IndexRefused(f"it claims {count} samples, more than a {size}-byte shard can hold")
    lengths = [len(columns[name]) for name in ("lengths", "starts", "sizes")]
    if labelled:
        lengths.append(len(columns["labels"]))
    keys = None
    if len(columns["key_starts"]):
        lengths.append(len(columns["key_starts"]) - 1)
        try:
            keys = PathArray.from_parts(columns["key_bytes"], columns["key_starts"])
        except ValueError as error:
            raise IndexRefused(f"its member names are damaged ({error})") from None
        if count and int(np.diff(columns["key_starts"]).max()) > MAX_HELD_NAME_BYTES + 1:
            raise IndexRefused(f"a member name is longer than the {MAX_HELD_NAME_BYTES} bytes held")
    if any(length != count for length in lengths):
        raise IndexRefused("its columns have different lengths")
    offsets, sample_lengths, starts, sizes = (
        columns[name].astype(np.int64) for name in ("offsets", "lengths", "starts", "sizes")
    )
    if count:
        ends = offsets + sample_lengths + (RECORD_OVERHEAD if format == "tfrecord" else 0)
        lowest = min(offsets.min(), sample_lengths.min(), starts.min(), sizes.min())
        if lowest < 0 or ends.max() > size or (starts + sizes > sample_lengths).any():
            raise IndexRefused("a sample's bytes lie outside its shard or record")
        if (offsets[1:] < ends[:-1]).any():
            raise IndexRefused("samples overlap or are out of order")
    labels = columns["labels"] if labelled else None
    if labels is not None and count and (labels.min() < 0 or labels.max() > np.iinfo(np.int32).max):
        raise IndexRefused("a label is negative or over int32")
    labels = labels.astype(np.int32) if labels is not None else None
    return ShardIndex(offsets, sample_lengths, starts, sizes, labels, identity, keys)
