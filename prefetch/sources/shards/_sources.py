"""Datasets stored in shards: `TFRecordSource` (`tf.train.Example` records) and `TarSource`
(WebDataset tar shards), local paths or fsspec URLs.

A shard source is a `FileList` whose samples are located by `Member` values
(`prefetch.io._locations`: the shard, the byte offset and length, the tar member's key) held
in a `MemberTable` and handed to the decoders by `location(i)`, so a `Loader` reads it as it
reads a folder: both backends, the crops, `on_error`, `num_shards`, `state_dict`, the tf.data
stage. Its `paths` only name the samples for people (`describe(i)`). Every shard is indexed
once (`prefetch.sources.shards._index`, `prefetch.sources.shards._remote_index`) when the source is
made; its
samples are the shards' samples in the shards' order (shards sorted by name when found by a
pattern).

How the loader reads it depends on `streaming`: local shards are read at random, one `pread`
per sample, so each epoch is an exact permutation as with a folder; remote shards (URLs) are
streamed by default: each shard is fetched whole, in large sequential reads, and a bounded
shuffle buffer mixes their samples (`prefetch.runtime._spool`). Sources are immutable after
construction and safe to share between threads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefetch._messages import counted, suggest_keywords
from prefetch.io import (
    Member,
    MemberTable,
    PathArray,
    RemoteOptions,
    active_options,
    is_url,
    local_path,
    using,
)
from prefetch.sources._folders import FileList
from prefetch.sources.shards import _manifest as shard_manifest
from prefetch.sources.shards import _set as shard_set
from prefetch.sources.shards._files import CLASSES_FILE as CLASSES_FILE
from prefetch.sources.shards._files import class_names_beside, resolve
from prefetch.sources.shards._files import find_shards as find_shards
from prefetch.sources.shards._index import IndexSpec, ShardIndex, load_or_build
from prefetch.sources.shards._remote_index import remote_index

# Samples the shuffle buffer of a streamed source holds by default (`shuffle_buffer`).
SHUFFLE_BUFFER = 4096
# Shards indexed at once when a source is made (local files: the disk's queue; URLs: requests).
INDEX_THREADS = 8


class ShardSource(FileList):
    """Samples stored in shard files: a file source; see the module docstring.

    `shards` lists the shard files (paths or URLs) in order, `shard_starts` (int64, one more
    than the shards) where each shard's samples begin among the source's samples, `streaming`
    and `shuffle_buffer` how a Loader reads it. Made by `TFRecordSource` and `TarSource`.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        spec: IndexSpec,
        *,
        class_names: Sequence[str] | None,
        streaming: bool | None,
        shuffle_buffer: int,
        remote: RemoteOptions | None,
    ) -> None:
        if (
            isinstance(shuffle_buffer, bool)
            or not isinstance(shuffle_buffer, int)
            or shuffle_buffer < 1
        ):
            raise ValueError(f"shuffle_buffer must be an int >= 1, got {shuffle_buffer!r}")
        self.spec = spec
        self.remote = remote
        with using(remote):
            found = resolve(files, spec.format)
            self.shards = found.shards
            at_url = is_url(self.shards[0])
            self.streaming = at_url if streaming is None else bool(streaming)
            self.shuffle_buffer = shuffle_buffer
            if found.chosen is not None:
                sets = [(found.chosen.manifest, found.chosen.where, self.shards)]
            else:  # a list, braces, a pattern across folders: each set's shards, its manifest
                sets = shard_manifest.read_manifests(self.shards, spec.format)
                for manifest, where, members in sets:
                    shard_set.check_shards(manifest, where, members, found.selects)
            for manifest, where, members in sets:
                shard_set.check_sizes(manifest, where, members)  # before any is read
                shard_set.check_class_names(manifest, where)
            indexes = _index_all(self.shards, spec, check_urls=not self.streaming)
            by_shard = dict(zip(self.shards, indexes, strict=True))
            for manifest, where, members in sets:
                listed = [by_shard[shard] for shard in members]
                _check_against((manifest, where), members, listed, spec)
            if class_names is None and sets:
                class_names = _class_names_of(sets)
            if class_names is None:
                class_names = class_names_beside(self.shards[0])
        counts = np.array([len(index) for index in indexes], np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.shard_starts[-1] == 0:
            raise ValueError(
                f"the shards {self.shards[:3]}{' ...' if len(self.shards) > 3 else ''} hold no "
                f"samples{_what_counts(spec)}"
            )
        self.members = _member_table(self.shards, indexes, spec.format)
        indexes = _sharing_keys(indexes, self.members)
        self.indexes = indexes
        paths = self.members.display_paths()
        labelled = [index.labels is not None for index in indexes]
        if any(labelled) and not all(labelled):
            raise ValueError(
                "some shards have labels and some do not: write every shard with its labels, "
                "or read them without (label_key='' or label_ext='')"
            )
        labels = (
            np.concatenate([index.labels for index in indexes if index.labels is not None])
            if all(labelled)
            else None
        )
        super().__init__(paths, labels, class_names)

    def member(self, index: int) -> Member:
        """Where sample `index` lies."""
        member: Member = self.members[index]
        return member

    def location(self, index: int) -> Member:
        """Where sample `index` is read from: its `Member` (never a path to parse)."""
        return self.member(index)

    def __reduce__(self) -> tuple[Any, ...]:
        # Worker processes need the file-source part only: members, labels, class names.
        state = dict(self.__dict__)
        state["indexes"] = None
        return _restore, (type(self), state)

    def subset(self, indices: Sequence[int] | np.ndarray) -> FileList:
        """The samples at `indices` (read at random, each where it lies: not streamed)."""
        indices = np.asarray(indices, dtype=np.int64)
        state = dict(self.__dict__)
        state.update(
            indexes=None,
            streaming=False,
            members=self.members[indices],
            paths=self.paths[indices],
            labels=self.labels[indices],
            shard_starts=np.zeros(1, np.int64),
        )
        return _restore(type(self), state)

    def __repr__(self) -> str:
        how = f"streamed, shuffle_buffer={self.shuffle_buffer}" if self.streaming else "indexed"
        return (
            f"{type(self).__name__}({counted(len(self.shards), 'shard')}, "
            f"{counted(len(self), 'sample')}, {counted(len(self.class_names), 'class')}, {how})"
        )


def _restore(kind: type[ShardSource], state: dict[str, Any]) -> ShardSource:
    source: ShardSource = kind.__new__(kind)
    source.__dict__.update(state)
    return source


@suggest_keywords
class TFRecordSource(ShardSource):
    """Samples in TFRecord files of `tf.train.Example` records, as TensorFlow Datasets and
    TensorFlow's ImageNet scripts write them. TensorFlow is not needed to read them.

    Parameters:

    - `files`: the shards: a path or URL, a pattern (`"data/train-*.tfrecord"`; for a URL,
      only in the last part), a folder (its files whose names contain ".tfrecord"; a URL
      ending in "/" is listed, as is one without it that is not named like a shard and lists
      as a folder), WebDataset's braces (`"train-{00000..00127}-of-00128.tfrecord"`),
      or a list of paths or URLs.
    - `image_key`: the bytes feature holding the encoded image; `None`: "image/encoded", else
      "image" (the first one the first record has).
    - `label_key`: the int64 feature holding the class index; `None`: "image/class/label",
      else "label", else no labels; `""` for no labels.
    - `class_names`: the names of the classes, label `i` being `class_names[i]`; `None`: the
      manifest's beside the shards (as `prefetch shards write` leaves), else the lines of a
      `classes.txt` beside them, else "0", "1", ... up to the largest label.
    - `streaming`: read whole shards in sequence, mixing their samples in a shuffle buffer
      (`True`), or each sample where it lies (`False`); `None`: streaming for URLs only.
    - `shuffle_buffer`: samples the shuffle buffer of a streamed source holds (the memory and
      the randomness this costs: docs/shards.md).
    - `remote`: the `RemoteOptions` that bound reading URL shards (`None`: the defaults).

    A manifest is the set: where the folder (or the pattern's folder) holds a manifest of
    TFRecord shards (as `prefetch shards write` leaves), exactly its shards are read, other
    files are named in one log line and left alone, and a set that disagrees with it (an
    unfinished write, two manifests, a missing shard or an extra one of its names, another
    size or sample count, a `classes.txt` naming other classes) is refused naming the
    difference. Every record's CRCs are checked when it is read: a damaged
    record raises `CorruptShardError` naming the shard and the record's byte offset (or is
    skipped with `on_error="skip"`).
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        image_key: str | None = None,
        label_key: str | None = None,
        class_names: Sequence[str] | None = None,
        streaming: bool | None = None,
        shuffle_buffer: int = SHUFFLE_BUFFER,
        remote: RemoteOptions | None = None,
    ) -> None:
        spec = IndexSpec("tfrecord", image_key=image_key, label_key=label_key)
        super().__init__(
            files,
            spec,
            class_names=class_names,
            streaming=streaming,
            shuffle_buffer=shuffle_buffer,
            remote=remote,
        )


@suggest_keywords
class TarSource(ShardSource):
    """Samples in tar shards of the WebDataset layout: the members of a sample share a key
    (`000123.jpg` and `000123.cls`), a few thousand samples per shard.

    Parameters:

    - `files`: the shards: a path or URL, a pattern (`"data/shard-*.tar"`; for a URL, only in
      the last part), a folder (its `.tar` files; a URL ending in "/" is listed, or without
      it when it is not named like a shard and lists as a folder), WebDataset's
      braces (`"data/shard-{000000..000099}.tar"`), or a list of paths or URLs.
    - `image_ext`: the extensions of a sample's image member (compared lower-cased; the first
      member of a sample with one of them is its image). Samples without one are left out.
    - `label_ext`: the extension of the member holding the class index as ASCII decimal;
      `""` for no labels.
    - `class_names`: the names of the classes; `None`: the manifest's beside the shards, else
      `classes.txt` beside them, else "0", "1", ... up to the largest label.
    - `streaming`: read whole shards in sequence through a shuffle buffer (`True`) or each
      sample where it lies (`False`); `None`: streaming for URLs only.
    - `shuffle_buffer`: samples the shuffle buffer of a streamed source holds.
    - `remote`: the `RemoteOptions` that bound reading URL shards (`None`: the defaults).

    A manifest beside the shards is checked as for `TFRecordSource`.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        image_ext: Sequence[str] = ("jpg", "jpeg", "png"),
        label_ext: str = "cls",
        class_names: Sequence[str] | None = None,
        streaming: bool | None = None,
        shuffle_buffer: int = SHUFFLE_BUFFER,
        remote: RemoteOptions | None = None,
    ) -> None:
        extensions = (image_ext,) if isinstance(image_ext, str) else tuple(image_ext)
        spec = IndexSpec(
            "tar",
            image_ext=tuple(ext.lower().lstrip(".") for ext in extensions),
            label_ext=label_ext.lower().lstrip("."),
        )
        super().__init__(
            files,
            spec,
            class_names=class_names,
            streaming=streaming,
            shuffle_buffer=shuffle_buffer,
            remote=remote,
        )


def _index_all(shards: list[str], spec: IndexSpec, check_urls: bool) -> list[ShardIndex]:
    """The index of every shard, several at once (local: built or loaded; URLs: see
    `remote_index`, which checks a kept index's edges with `check_urls`), within the calling
    thread's remote options."""
    options = active_options()

    def one(shard: str) -> ShardIndex:
        with using(options):
            if is_url(shard):
                return remote_index(shard, spec, check_urls)
            return load_or_build(local_path(shard), spec)

    if len(shards) == 1:
        return [one(shards[0])]
    with concurrent.futures.ThreadPoolExecutor(min(INDEX_THREADS, len(shards))) as pool:
        return list(pool.map(one, shards))


def _check_against(
    manifest: tuple[shard_manifest.Manifest, str],
    shards: list[str],
    indexes: list[ShardIndex],
    spec: IndexSpec,
) -> None:
    """Refuse shards whose sizes or sample counts are not their manifest's; counts are
    compared when this source counts samples as the writer did (its keys or extensions)."""
    written, _ = manifest
    if spec.format == "tar":
        same_counting = set(written.image_extensions) <= set(spec.image_ext)
    else:
        same_counting = spec.image_key in (None, "image/encoded")
    counts = [len(index) for index in indexes] if same_counting else None
    sizes = [index.size for index in indexes]
    shard_set.check_indexes(*manifest, shards, sizes, counts)


def _class_names_of(sets: list[tuple[shard_manifest.Manifest, str, list[str]]]) -> list[str]:
    """The class names the manifests of `sets` agree on; ValueError naming two that do not
    (a label would name one class in one set and another in the other)."""
    first, where = sets[0][0], sets[0][1]
    for manifest, other, _ in sets[1:]:
        if manifest.class_names != first.class_names:
            these, those = list(first.class_names), list(manifest.class_names)
            raise ValueError(
                f"{where!r} and {other!r} name other classes ({shard_manifest.shown(these)} "
                f"and {shard_manifest.shown(those)}): a label would mean one class in one set "
                "and another in the other. Read the sets apart, or pass class_names= to read "
                "them as one"
            )
    return list(first.class_names)


def _member_table(shards: list[str], indexes: list[ShardIndex], format: str) -> MemberTable:
    """The locations of every sample of `indexes` (one per shard), as one table."""
    counts = [len(index) for index in indexes]
    columns = {
        "shard": np.repeat(np.arange(len(shards), dtype=np.int32), counts),
        "offset": np.concatenate([np.zeros(0, np.int64), *(i.offsets for i in indexes)]),
        "length": np.concatenate([np.zeros(0, np.int64), *(i.lengths for i in indexes)]),
        "start": np.concatenate([np.zeros(0, np.int64), *(i.starts for i in indexes)]),
        "size": np.concatenate([np.zeros(0, np.int64), *(i.sizes for i in indexes)]),
    }
    if format != "tar":
        return MemberTable(shards, format, columns, None)
    if len(indexes) == 1 and indexes[0].keys is not None:
        return MemberTable(shards, format, columns, indexes[0].keys)  # one shard: not copied
    parts = [(index.keys or PathArray()).parts() for index in indexes]
    shifts = np.cumsum([0] + [len(data) for data, _ in parts])
    starts = [starts[:-1] + shift for (_, starts), shift in zip(parts, shifts, strict=False)]
    keys = PathArray.from_parts(
        np.concatenate([np.zeros(0, np.uint8), *(data for data, _ in parts)]),
        np.concatenate([*starts, shifts[-1:]]).astype(np.int64),
    )
    return MemberTable(shards, format, columns, keys)


def _sharing_keys(indexes: list[ShardIndex], members: MemberTable) -> list[ShardIndex]:
    """`indexes` whose tar member names are views of the table's (one copy of the names, not
    two: they may be a third of a shard's bytes)."""
    if members.keys is None or len(indexes) == 1:
        return indexes  # TFRecord; or one shard, whose table holds the index's own names
    data, starts = members.keys.parts()
    shared, first = [], 0
    for index in indexes:
        last = first + len(index)
        begin, end = int(starts[first]), int(starts[last])
        keys = PathArray.from_parts(data[begin:end], starts[first : last + 1] - begin)
        shared.append(dataclasses.replace(index, keys=keys))
        first = last
    return shared


def _what_counts(spec: IndexSpec) -> str:
    if spec.format == "tar":
        return f" (a sample is a member with an extension in {list(spec.image_ext)})"
    return ""
