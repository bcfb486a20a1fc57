"""The offset index of a shard: where each sample's bytes lie, and its label; built once, kept.

`index_shard(path, spec)` lists a local TFRecord or tar shard by seeking from header to header
(`prefetch.sources.shards._tfrecord`, `prefetch.sources.shards._tar`): a TFRecord's record headers
and one walk over
the field headers of each `tf.train.Example` (`prefetch.sources.shards._examples`: the image bytes
are
skipped by their length, never read), a tar's 512-byte headers and its small label members.
Building a TFRecord's index keeps 40 bytes per sample in flat arrays, no Python object per
sample; a tar's keeps each sample's key in a dictionary too (to pair images with labels and
refuse duplicates: docs/shards.md gives the bytes). The result, a `ShardIndex`
(`prefetch.sources.shards._index_file`), is kept:

- next to the shard, as `<shard>.prefetch-index.npz`, when its folder is writable (the writer,
  `prefetch shards write`, leaves one beside each shard it writes); else
- in the index folder (`index_folder()`: `$PREFETCH_CACHE_DIR/shard-index`, else
  `~/.cache/prefetch/shard-index`, mode 0700), under a hash of the shard's absolute path or URL.

A kept index is used only when it passes `decode_index`'s checks, was built with the same
reading options (`IndexSpec`), and for a local shard has the shard's identity now (size,
modification and change times, inode, and a digest of its first and last 64 KiB): a changed or
replaced shard is re-indexed. An index beside the shard is trusted only when it is a regular
file (opened without following a link, and without blocking) owned by us or by the shard's
owner; anything else there (a link, a directory, a FIFO) is passed over for the index folder.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import logging
import os
import tempfile
from typing import Any

import numpy as np

from prefetch.errors import CorruptShardError
from prefetch.io import (
    PathArray,
    corrupt_shard,
    is_url,
    local_path,
    open_regular,
    read_capped,
    user_cache_folder,
)
from prefetch.sources.shards._examples import IMAGE_KEYS as IMAGE_KEYS
from prefetch.sources.shards._examples import LABEL_KEYS as LABEL_KEYS
from prefetch.sources.shards._examples import tfrecord_columns
from prefetch.sources.shards._index_file import INDEX_SUFFIX as INDEX_SUFFIX
from prefetch.sources.shards._index_file import INDEX_VERSION as INDEX_VERSION
from prefetch.sources.shards._index_file import (
    IndexRefused,
    decode_index,
    local_identity,
    max_index_bytes,
    write_index,
)
from prefetch.sources.shards._index_file import IndexSpec as IndexSpec
from prefetch.sources.shards._index_file import ShardIdentity as ShardIdentity
from prefetch.sources.shards._index_file import ShardIndex as ShardIndex
from prefetch.sources.shards._sniff import HEAD_BYTES, refuse_other_format
from prefetch.sources.shards._tar import held_name, iter_tar_members, sample_key

log = logging.getLogger("prefetch.loader")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def index_folder() -> str:
    """Where indexes of shards in read-only folders and of URLs are kept."""
    return user_cache_folder("shard-index")


def open_shard(path: str) -> int:
    """A descriptor of the local shard at `path` (not blocking on a FIFO); OSError naming it
    when it is not a regular file. The caller closes it."""
    return open_regular(path, "shard ")


def load_or_build(path: str, spec: IndexSpec) -> ShardIndex:
    """The index of the local shard at `path`: a kept one that passes its checks and has the
    shard's identity now, else built now (`build_index`) and kept (beside the shard when its
    folder is writable, else in `index_folder()`). Errors of a damaged shard name it and the
    byte offset."""
    handle = open_shard(path)
    try:
        info = os.fstat(handle)
        identity = local_identity(handle)
    finally:
        os.close(handle)
    cap = max_index_bytes(identity.size, spec.format)
    for candidate in _places(path):
        beside = candidate.endswith(INDEX_SUFFIX)  # the shard's owner may have written it
        data = _read_trusted(
            candidate, {os.geteuid(), info.st_uid} if beside else {os.geteuid()}, cap
        )
        if data is None:
            continue
        try:
            index = decode_index(data, spec)
        except IndexRefused as error:
            log.info(
                "prefetch: index %r of %r not used (%s): indexing the shard again",
                candidate,
                path,
                error,
            )
            continue
        if index.identity == identity:
            return index
    index = build_index(path, spec)
    keep(path, index, spec)
    return index


def keep(shard: str, index: ShardIndex, spec: IndexSpec) -> None:
    """Write `index` beside the local `shard` when its folder is writable, else (and for a
    URL) into `index_folder()`; atomically (a reader never sees half an index), and never
    through a link someone left at the index's name (a directory there: the index folder)."""
    for candidate in _places(shard):
        folder = os.path.dirname(candidate)
        private = not candidate.endswith(INDEX_SUFFIX)
        with contextlib.suppress(OSError):
            if private:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            if not os.access(folder, os.W_OK):
                continue
            handle, partial = tempfile.mkstemp(dir=folder, prefix=".partial-index-")
            try:
                with os.fdopen(handle, "wb") as file:
                    write_index(index, spec, file)  # array by array: no copy in memory
                os.chmod(partial, 0o600 if private else 0o644)
                os.replace(partial, candidate)  # replaces a link itself, never its target
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise
            return


def kept_index(url: str, spec: IndexSpec) -> ShardIndex | None:
    """The index kept in `index_folder()` for the shard at `url` when it passes its checks
    (its identity is checked by the caller), or None."""
    data = _read_trusted(_places(url)[-1], {os.geteuid()}, _MAX_KEPT_BYTES)
    if data is None:
        return None
    try:
        return decode_index(data, spec)
    except IndexRefused:
        return None


def _places(shard: str) -> list[str]:
    """Where the index of `shard` may be kept, in the order they are tried: beside a local
    shard, then in the index folder (under a hash of its absolute path, or of its URL)."""
    key = shard if is_url(shard) else os.path.abspath(local_path(shard))
    in_folder = os.path.join(index_folder(), hashlib.sha256(key.encode()).hexdigest()[:32] + ".npz")
    return [in_folder] if is_url(shard) else [key + INDEX_SUFFIX, in_folder]


def _read_trusted(path: str, owners: set[int], cap: int) -> bytes | None:
    """The bytes of the regular file at `path` (opened without following a link or blocking)
    when one of `owners` owns it and it holds at most `cap` bytes; None when it is missing,
    not a regular file (a directory, a FIFO, a link) or not to be trusted. The descriptor is
    closed on every path."""
    try:
        handle = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if os.fstat(handle).st_uid not in owners:
            return None
        return read_capped(handle, path, cap)  # a regular file of at most `cap` bytes
    except OSError:
        return None
    finally:
        os.close(handle)


# The most bytes of a URL shard's kept index read before its shard's size is known (an index
# holds ~40 bytes per sample: 25 million samples).
_MAX_KEPT_BYTES = 1 << 30


def build_index(path: str, spec: IndexSpec, name: str | None = None) -> ShardIndex:
    """Index the local shard at `path` now (see the module docstring); its errors name it
    `name` (default: `path`; a URL for a private copy of a URL's shard). A file whose first
    bytes show it is not a shard of the format (the other format, gzip, zip, an HTML page)
    is refused saying what it is and what reads it (ValueError naming it)."""
    name = path if name is None else name
    handle = open_shard(path)
    with os.fdopen(handle, "rb") as file:
        identity = local_identity(handle)  # before reading: a change during it is seen later
        refuse_other_format(os.pread(handle, HEAD_BYTES, 0), name, spec.format)
        if hasattr(os, "posix_fadvise"):  # headers only: no readahead of the images
            os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_RANDOM)
        if spec.format == "tfrecord":
            columns, labels = tfrecord_columns(file, name, spec, identity.size)
            keys = None
        else:
            columns, labels, keys = _tar_columns(file, name, spec)
    offsets, lengths, starts, sizes = (np.frombuffer(column, np.int64) for column in columns)
    return ShardIndex(
        offsets=offsets,
        lengths=lengths,
        starts=starts,
        sizes=sizes,
        labels=None if labels is None else np.frombuffer(labels, np.int64).astype(np.int32),
        identity=identity,
        keys=keys,
    )


def _tar_columns(
    file: Any, path: str, spec: IndexSpec
) -> tuple[list[array.array[int]], array.array[int] | None, PathArray]:
    """offsets, lengths, starts, sizes; labels (or None); and the image members' names of a
    tar shard's samples (as held: `held_name`), in flat arrays and one dictionary of keys
    (about 150 bytes a sample with WebDataset's keys). A key with two images of one
    extension, or two labels, is refused; a label met before its image waits in a small
    dictionary of its own."""
    numbers: dict[str | bytes, int] = {}  # key (a long one by its digest) -> sample number
    early: dict[str | bytes, tuple[int, int, str]] = {}  # a label member before its image
    offsets, lengths, labels = array.array("q"), array.array("q"), array.array("q")
    kinds, labelled = bytearray(), bytearray()  # image extension number; whether labelled
    names, name_ends = bytearray(), array.array("q", [0])
    for member in iter_tar_members(file, path):
        name_key, ext = sample_key(member.name)
        key = _held(name_key)
        ext = ext.lower()
        number = numbers.get(key)
        if ext in spec.image_ext:
            kind = spec.image_ext.index(ext)
            if number is not None:
                if kinds[number] == kind:
                    raise _duplicate(path, name_key, member.name, member.offset)
                continue  # the sample's first image is its image
            number = numbers[key] = len(offsets)
            offsets.append(member.offset)
            lengths.append(member.size)
            kinds.append(kind)
            names += held_name(member.name) + b"\0"  # a long one shortened
            name_ends.append(len(names))
            labels.append(-1)
            labelled.append(0)
            waiting = early.pop(key, None) if spec.label_ext else None
            if waiting is not None:
                labels[number], labelled[number] = _label(file, path, *waiting), 1
        elif spec.label_ext and ext == spec.label_ext:
            if (number is not None and labelled[number]) or key in early:
                raise _duplicate(path, name_key, member.name, member.offset)
            if number is None:
                early[key] = (member.offset, member.size, member.name)
            else:
                labels[number] = _label(file, path, member.offset, member.size, member.name)
                labelled[number] = 1
    del numbers, early  # before the names' table is checked: the peak is the names, once
    zeros = array.array("q", bytes(8 * len(offsets)))
    keys = PathArray.from_parts(  # views of the buffers: the names are not copied again
        np.frombuffer(names, np.uint8), np.frombuffer(name_ends, np.int64)
    )
    if not spec.label_ext:
        return [offsets, lengths, zeros, zeros], None, keys
    missing = labelled.find(0)
    if missing >= 0:
        key = sample_key(str(keys[missing]))[0]
        raise ValueError(
            f"{path!r}: sample {key!r} has an image but no .{spec.label_ext} label member: "
            f"add one, or pass label_ext='' to read the shards without labels"
        )
    return [offsets, lengths, zeros, zeros], labels, keys


# Keys longer than this are held by their digest while pairing members (a name may be up to
# `MAX_MEMBER_NAME_BYTES`; the member table keeps it once, not twice).
_KEY_HELD_BYTES = 64


def _held(key: str) -> str | bytes:
    """`key` as the pairing dictionaries hold it: itself, or when long its 16-byte digest."""
    if len(key) <= _KEY_HELD_BYTES:
        return key
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _label(file: Any, path: str, offset: int, size: int, name: str) -> int:
    """The class index in the label member `name` (its data at `offset`): ASCII decimal."""
    text = os.pread(file.fileno(), min(size, 64), offset).strip()
    try:
        label = int(text)
    except ValueError:
        label = -1
    if not 0 <= label <= np.iinfo(np.int32).max:
        raise CorruptShardError(
            f"{path!r}: label member {name!r} (byte {offset}) holds {text[:20]!r}, not a "
            "class index: write the label as ASCII decimal, e.g. b'3'",
            path,
            offset,
        )
    return label


def _duplicate(path: str, key: str, name: str, offset: int) -> CorruptShardError:
    return corrupt_shard(
        path,
        offset,
        f"sample {key!r} has a second member {name!r} of one kind (data at byte {offset}); "
        "WebDataset reads such a shard ambiguously, so it is refused",
    )


def index_shard(path: str) -> ShardIndex:
    """Index the local shard at `path` with the default reading options of its format (told by
    its name: ".tfrecord" in it, else tar) and keep the index beside it, as a source made
    with the defaults looks for it (`prefetch shards write` calls this for each shard)."""
    spec = IndexSpec("tfrecord" if ".tfrecord" in os.path.basename(path) else "tar")
    return load_or_build(path, spec)
