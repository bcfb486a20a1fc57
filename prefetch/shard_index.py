"""The offset index of a shard: where each sample's bytes lie, and its label; built once, kept.

`index_shard(path, spec)` lists a local TFRecord or tar shard by seeking from header to header
(`prefetch.shard_formats`): a TFRecord's record headers and the field headers of each
`tf.train.Example` (the image bytes are skipped by their length, never read), a tar's 512-byte
headers and its small label members. The result, a `ShardIndex`, is kept:

- next to the shard, as `<shard>.prefetch-index.npz`, when its folder is writable (the writer,
  `prefetch shards write`, leaves one beside each shard it writes); else
- in the index folder (`index_folder()`: `$PREFETCH_CACHE_DIR/shard-index`, else
  `~/.cache/prefetch/shard-index`, mode 0700), under a hash of the shard's absolute path or URL.

A kept index is used only while it matches: the same format version, the same reading options
(`IndexSpec`), and for a local shard the same size and modification time (a changed shard is
re-indexed); an index beside the shard is trusted only when it is a regular file owned by us or
by the shard's owner (a neighbour cannot plant one in a shared folder). A remote shard's index
records its size, which is checked when the shard is read (`ShardIndex.check_size`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import stat
import tempfile
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefetch.shard_formats import (
    CorruptShardError,
    example_bytes_span,
    example_feature,
    example_keys,
    iter_records,
)
from prefetch.tar_format import iter_tar_members, sample_key

# Bumped whenever what an index holds changes: older indexes are rebuilt.
INDEX_VERSION = 1
INDEX_SUFFIX = ".prefetch-index.npz"
# The keys tried, in order, when an `IndexSpec` names none (TensorFlow's ImageNet layout, then
# TensorFlow Datasets').
IMAGE_KEYS = ("image/encoded", "image")
LABEL_KEYS = ("image/class/label", "label")
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


@dataclass(frozen=True, eq=False)
class ShardIndex:
    """The samples of one shard, in the shard's order: `offsets`, `lengths` (int64: a tar
    member's data; a TFRecord record's start and data length), `starts`, `sizes` (int64, the
    image within a record's data; zeros for tar), `labels` (int32, or None without labels),
    and the shard's `size` in bytes and `mtime_ns` (-1 for a URL)."""

    offsets: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    labels: np.ndarray | None
    size: int
    mtime_ns: int

    def __len__(self) -> int:
        return len(self.offsets)

    def check_size(self, shard: str, size: int) -> None:
        """OSError naming `shard` when its copy has `size` bytes but the index was built for
        another size (the shard changed since it was indexed)."""
        if size != self.size:
            raise OSError(
                f"{shard!r} is {size} bytes but was {self.size} bytes when it was indexed: it "
                f"has changed; delete its index ({INDEX_SUFFIX} beside it, or the one in "
                f"{index_folder()}) to index it again"
            )

    def to_bytes(self, spec: IndexSpec) -> bytes:
        """The index as an .npz file's bytes."""
        buffer = io.BytesIO()
        labels = self.labels if self.labels is not None else np.zeros(0, np.int32)
        np.savez(
            buffer,
            spec=np.array(spec.key()),
            shape=np.array([self.size, self.mtime_ns, int(self.labels is not None)], np.int64),
            offsets=self.offsets,
            lengths=self.lengths,
            starts=self.starts,
            sizes=self.sizes,
            labels=labels,
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, spec: IndexSpec) -> ShardIndex | None:
        """The index in `data`, or None when it is damaged or was built for another spec."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
                if str(arrays["spec"]) != spec.key():
                    return None
                size, mtime_ns, labelled = (int(x) for x in arrays["shape"])
                index = cls(
                    offsets=arrays["offsets"].astype(np.int64),
                    lengths=arrays["lengths"].astype(np.int64),
                    starts=arrays["starts"].astype(np.int64),
                    sizes=arrays["sizes"].astype(np.int64),
                    labels=arrays["labels"].astype(np.int32) if labelled else None,
                    size=size,
                    mtime_ns=mtime_ns,
                )
        except Exception:  # not an index of ours (empty, truncated, not a zip, other arrays)
            return None
        count = len(index.offsets)
        fields = (index.lengths, index.starts, index.sizes)
        if any(len(x) != count for x in fields) or (
            index.labels is not None and len(index.labels) != count
        ):
            return None
        ends = index.offsets + index.lengths
        inside = index.starts + index.sizes
        if count and (
            min(index.offsets.min(), index.lengths.min(), index.starts.min(), index.sizes.min()) < 0
            or ends.max() > index.size
            or (inside > index.lengths).any()
        ):
            return None  # nothing a damaged or hostile index says is read past its shard
        return index


def index_folder() -> str:
    """Where indexes of shards in read-only folders and of URLs are kept."""
    root = os.environ.get("PREFETCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prefetch"
    )
    return os.path.join(root, "shard-index")


def load_or_build(path: str, spec: IndexSpec) -> ShardIndex:
    """The index of the local shard at `path`: a kept one that still matches, else built now
    (`build_index`) and kept (beside the shard when its folder is writable, else in
    `index_folder()`). Errors of a damaged shard name it and the byte offset."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"shard {path!r} is not a regular file (a device, a FIFO): not read")
    for candidate in _places(path):
        beside = candidate.endswith(INDEX_SUFFIX)  # the shard's owner may have written it
        data = _read_trusted(candidate, {os.geteuid(), info.st_uid} if beside else {os.geteuid()})
        index = ShardIndex.from_bytes(data, spec) if data is not None else None
        if index is not None and (index.size, index.mtime_ns) == (info.st_size, info.st_mtime_ns):
            return index
    index = build_index(path, spec)
    keep(path, index, spec)
    return index


def keep(shard: str, index: ShardIndex, spec: IndexSpec) -> None:
    """Write `index` beside the local `shard` when its folder is writable, else (and for a
    URL) into `index_folder()`; atomically (a reader never sees half an index), and never
    through a link someone left at the index's name."""
    data = index.to_bytes(spec)
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
                    file.write(data)
                os.chmod(partial, 0o600 if private else 0o644)
                os.replace(partial, candidate)  # replaces a link itself, never its target
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise
            return


def kept_index(url: str, spec: IndexSpec) -> ShardIndex | None:
    """The index kept in `index_folder()` for the shard at `url`, or None."""
    candidate = _places(url)[-1]
    data = _read_trusted(candidate, {os.geteuid()})
    return ShardIndex.from_bytes(data, spec) if data is not None else None


def _places(shard: str) -> list[str]:
    """Where the index of `shard` may be kept, in the order they are tried: beside a local
    shard, then in the index folder (under a hash of its absolute path, or of its URL)."""
    from prefetch.storage import is_url, local_path

    key = shard if is_url(shard) else os.path.abspath(local_path(shard))
    in_folder = os.path.join(index_folder(), hashlib.sha256(key.encode()).hexdigest()[:32] + ".npz")
    return [in_folder] if is_url(shard) else [key + INDEX_SUFFIX, in_folder]


def _read_trusted(path: str, owners: set[int]) -> bytes | None:
    """The bytes of the regular file at `path` (not followed through a link) when one of
    `owners` owns it; None when it is missing or not to be trusted."""
    try:
        handle = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in owners:
            return None
        if info.st_size > _MAX_INDEX_BYTES:
            return None
        return file.read()


# An index holds ~40 bytes per sample: this admits 25 million samples in one shard.
_MAX_INDEX_BYTES = 1 << 30


def build_index(path: str, spec: IndexSpec) -> ShardIndex:
    """Index the local shard at `path` now (see the module docstring)."""
    info = os.stat(path)
    with open(path, "rb") as file:
        if hasattr(os, "posix_fadvise"):  # headers only: no readahead of the images
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        if spec.format == "tfrecord":
            columns = _tfrecord_columns(file, path, spec, info.st_size)
        else:
            columns = _tar_columns(file, path, spec)
    offsets, lengths, starts, sizes, labels = columns
    return ShardIndex(
        offsets=np.asarray(offsets, np.int64),
        lengths=np.asarray(lengths, np.int64),
        starts=np.asarray(starts, np.int64),
        sizes=np.asarray(sizes, np.int64),
        labels=None if labels is None else np.asarray(labels, np.int32),
        size=info.st_size,
        mtime_ns=info.st_mtime_ns,
    )


Columns = tuple[list[int], list[int], list[int], list[int], list[int] | None]


def _tfrecord_columns(file: Any, path: str, spec: IndexSpec, size: int) -> Columns:
    offsets: list[int] = []
    lengths: list[int] = []
    starts: list[int] = []
    sizes: list[int] = []
    labels: list[int] | None = []
    if size == 0:
        return offsets, lengths, starts, sizes, labels if spec.label_key != "" else None
    image_key, label_key = spec.image_key, spec.label_key
    with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)  # headers only: no readahead of the images
        view = memoryview(mapped)
        try:
            for offset, length in iter_records(file, path):
                with view[offset + 12 : offset + 12 + length] as data:  # released on errors
                    if image_key is None:
                        image_key = _first_present(data, IMAGE_KEYS, path, offset, "image_key")
                    if label_key is None:
                        found = (
                            k
                            for k in LABEL_KEYS
                            if example_feature(data, k, path=path, offset=offset)
                        )
                        label_key = next(found, "")
                    span = example_bytes_span(data, image_key, path=path, offset=offset)
                    if span is None:
                        raise _missing(data, image_key, path, offset, "image_key")
                    offsets.append(offset)
                    lengths.append(length)
                    starts.append(span[0])
                    sizes.append(span[1])
                    if label_key:
                        assert labels is not None
                        labels.append(_int_label(data, label_key, path, offset))
        except Exception as error:  # its frames hold views of the map: drop them to close it
            _drop_frames(error)
            raise
        finally:
            view.release()
    return offsets, lengths, starts, sizes, labels if label_key else None


def _drop_frames(error: BaseException | None) -> None:
    """Clear the local variables of the finished frames of `error` and of the errors it
    carries (its cause, its context), which may hold views of a memory map."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _first_present(data: Any, keys: tuple[str, ...], path: str, offset: int, option: str) -> str:
    for key in keys:
        if example_bytes_span(data, key, path=path, offset=offset) is not None:
            return key
    raise _missing(data, keys[0], path, offset, option)


def _missing(data: Any, key: str, path: str, offset: int, option: str) -> ValueError:
    return ValueError(
        f"{path!r}: the record at byte {offset} has no bytes feature {key!r} (it has "
        f"{example_keys(data, path=path, offset=offset)}): pass {option}= naming the feature "
        "that holds the image"
    )


def _int_label(data: Any, key: str, path: str, offset: int) -> int:
    found = example_feature(data, key, path=path, offset=offset)
    if found is None or found[0] != "int64" or len(found[1]) != 1:
        raise ValueError(
            f"{path!r}: the record at byte {offset} has no single int64 feature {key!r} for "
            f"its label (it has {example_keys(data, path=path, offset=offset)}): pass "
            "label_key= naming it, or label_key='' for no labels"
        )
    return int(found[1][0])


def _tar_columns(file: Any, path: str, spec: IndexSpec) -> Columns:
    images: dict[str, tuple[int, int]] = {}
    label_members: dict[str, tuple[int, int, str]] = {}
    order: list[str] = []
    for member in iter_tar_members(file, path):
        key, ext = sample_key(member.name)
        ext = ext.lower()
        if ext in spec.image_ext and key not in images:
            images[key] = (member.offset, member.size)
            order.append(key)
        elif spec.label_ext and ext == spec.label_ext:
            label_members[key] = (member.offset, member.size, member.name)
    offsets = [images[key][0] for key in order]
    lengths = [images[key][1] for key in order]
    zeros = [0] * len(order)
    if not spec.label_ext:
        return offsets, lengths, zeros, list(zeros), None
    labels = []
    for key in order:
        if key not in label_members:
            raise ValueError(
                f"{path!r}: sample {key!r} has an image but no .{spec.label_ext} label member: "
                f"add one, or pass label_ext='' to read the shards without labels"
            )
        offset, size, name = label_members[key]
        text = os.pread(file.fileno(), min(size, 64), offset).strip()
        try:
            labels.append(int(text))
        except ValueError:
            raise CorruptShardError(
                f"{path!r}: label member {name!r} (byte {offset}) holds {text[:20]!r}, not a "
                "class index: write the label as ASCII decimal, e.g. b'3'"
            ) from None
    return offsets, lengths, zeros, list(zeros), labels


def index_shard(path: str) -> ShardIndex:
    """Index the local shard at `path` with the default reading options of its format (told by
    its name: ".tfrecord" in it, else tar) and keep the index beside it, as a source made
    with the defaults looks for it (`prefetch shards write` calls this for each shard)."""
    spec = IndexSpec("tfrecord" if ".tfrecord" in os.path.basename(path) else "tar")
    return load_or_build(path, spec)
