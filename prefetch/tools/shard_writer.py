"""Write an image folder into shards: WebDataset tar files or TFRecord files.

`write_shards(folder, out, ...)` lists `folder` with `ImageFolder` (Keras's rules), shuffles the
samples once, cuts them into shards of `shard_size` samples and writes each shard, copying the
image bytes as stored (nothing is decoded or re-encoded), plus `classes.txt`. It runs in the
calling thread, starts no thread or process, and owns only the files it writes in `out`.

Each shard is written to a hidden temporary name in `out` (`.<name>.partial`), fsynced and then
renamed into place with `os.replace`, so a shard under its final name is always complete; an
interrupted run leaves at most the temporary file, which no reader's pattern matches and the
next run overwrites. The output depends only on the folder's files, the order (`seed`,
`shuffle`) and the options: tar headers carry mtime 0, so the same input gives the same bytes.

Layouts (the names the readers expect):

- tar (WebDataset): `<prefix>-000000.tar`, ...; sample number k (counted across shards) is the
  members `<k:09d>.<ext>` (the image, `ext` its lower-cased extension) and `<k:09d>.cls` (its
  label as ASCII decimal), then the tar end-of-archive blocks.
- tfrecord: `<prefix>-00000-of-00003.tfrecord`, ...; one `tf.train.Example` per sample with
  `image/encoded` (the bytes), `image/class/label` (int64, 0-based, the folder's label),
  `image/format` (`b"jpeg"`, `b"png"`, ...) and `image/filename` (the path relative to
  `folder`, `/`-separated).
- `classes.txt`: one class name per line, line i naming label i.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterable
from typing import BinaryIO

import numpy as np

from prefetch import storage
from prefetch.shard_formats import encode_example, frame_record
from prefetch.shard_index import index_shard
from prefetch.sources import ImageFolder
from prefetch.tar_format import TAR_END, tar_header, tar_padding

# The shard formats `write_shards` writes, by `format` name.
FORMATS = ("tar", "tfrecord")
# The shard file names start with this unless a `prefix` is given.
DEFAULT_PREFIX = "shard"
# The class names, one per line, written next to the shards (the readers' `class_names`).
CLASSES_FILE = "classes.txt"
# A shard is written under `.<final name><PARTIAL_SUFFIX>` until it is complete.
PARTIAL_SUFFIX = ".partial"
# `image/format` of a TFRecord example, by lower-cased file extension (TF's conventions).
IMAGE_FORMATS = {"jpg": b"jpeg", "jpeg": b"jpeg", "png": b"png", "bmp": b"bmp", "gif": b"gif"}

# What `write_shards` calls after each shard is in place: `(path, samples)`.
ShardCallback = Callable[[str, int], None]


def write_shards(
    folder: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str,
    shard_size: int,
    seed: int = 0,
    shuffle: bool = True,
    prefix: str | None = None,
    overwrite: bool = False,
    on_shard: ShardCallback | None = None,
) -> list[str]:
    """Write the images of `folder` into shards in `out`; return the shard paths, in order.

    Parameters:

    - `folder`: an image folder with one subfolder per class, listed by `ImageFolder` (Keras's
      order and rules; a path or an fsspec URL).
    - `out`: the folder the shards and `classes.txt` go into; created (with its parents) if
      missing.
    - `format`: `"tar"` (WebDataset layout) or `"tfrecord"` (`tf.train.Example` records); the
      module docstring gives both layouts.
    - `shard_size`: samples per shard, >= 1; the last shard holds the rest.
    - `seed`: the seed of the one shuffle, `np.random.default_rng(seed).permutation`.
    - `shuffle`: shuffle the samples before cutting them into shards. A streaming reader's
      shuffle buffer only mixes samples that are near each other in the stream, so shards in
      the folder's class order would give batches of one class; `False` keeps the listing
      order (for evaluation data, or when the order is meant).
    - `prefix`: the start of the shard file names (default `"shard"`); no path separator.
    - `overwrite`: replace the shards of an earlier run. Without it, `out` must hold no file
      that matches this prefix's shard names in this format, nor a `classes.txt` with other
      classes (`FileExistsError`, naming them). With it, matching shards that this run does
      not write (an earlier run had more) are removed once the new ones are in place, so a
      reader's pattern sees only this run's shards.
    - `on_shard`: called as `on_shard(path, samples)` after each shard is in place.

    After each shard is in place, its offset index is written beside it
    (`prefetch.shard_index.index_shard`), so that readers do not index it again. Raises
    `FileNotFoundError` for a missing `folder`, `ValueError` for a folder without images or a
    bad option, and `FileExistsError` as said; a read error names the file. The bytes written
    depend only on the files, `format`, `shard_size`, `seed`, `shuffle` and `prefix`.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be an int >= 1 (samples per shard), got {shard_size!r}")
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    _check_prefix(prefix)
    source = ImageFolder(folder)
    top = os.fspath(folder)
    order = (
        np.random.default_rng(seed).permutation(len(source)) if shuffle else np.arange(len(source))
    )
    count = math.ceil(len(order) / shard_size)
    names = [shard_name(format, prefix, index, count) for index in range(count)]
    out_dir = os.fspath(out)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise NotADirectoryError(f"output {out_dir!r} is a file: give a folder for the shards")
    os.makedirs(out_dir, exist_ok=True)
    existing = matching_shards(out_dir, format, prefix)
    classes_text = "".join(f"{name}\n" for name in source.class_names)
    if not overwrite:
        _refuse_existing(out_dir, existing, classes_text)
    _write_atomically(os.path.join(out_dir, CLASSES_FILE), [classes_text.encode()])
    written = []
    for index, name in enumerate(names):
        numbers = range(index * shard_size, min((index + 1) * shard_size, len(order)))
        samples = (
            _Sample(number, source.paths[int(order[number])], int(source.labels[order[number]]))
            for number in numbers
        )
        path = os.path.join(out_dir, name)
        _write_atomically(path, _shard_chunks(format, samples, top))
        written.append(path)
        index_shard(path)
        if on_shard is not None:
            on_shard(path, len(numbers))
    for stale in sorted(set(existing) - set(names)):
        os.remove(os.path.join(out_dir, stale))
    return written


def shard_name(format: str, prefix: str, index: int, count: int) -> str:
    """The file name of shard `index` of `count` in `format` (`write_shards`'s layouts)."""
    if format == "tar":
        return f"{prefix}-{index:06d}.tar"
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord"


def shard_pattern(format: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A glob pattern that matches the shard names of `format` and `prefix` (for readers)."""
    return f"{prefix}-*.tar" if format == "tar" else f"{prefix}-*-of-*.tfrecord"


def matching_shards(out: str | os.PathLike[str], format: str, prefix: str) -> list[str]:
    """The names of the files in `out` that are shards of `format` and `prefix`, sorted."""
    if format == "tar":
        pattern = re.compile(rf"{re.escape(prefix)}-\d{{6,}}\.tar")
    else:
        pattern = re.compile(rf"{re.escape(prefix)}-\d{{5,}}-of-\d{{5,}}\.tfrecord")
    try:
        names = os.listdir(out)
    except FileNotFoundError:
        return []
    return sorted(name for name in names if pattern.fullmatch(name))


class _Sample:
    """One sample to write: its number across shards, its file and its label."""

    __slots__ = ("label", "number", "path")

    def __init__(self, number: int, path: str, label: int) -> None:
        self.number = number
        self.path = path
        self.label = label


def _check_prefix(prefix: str) -> None:
    """Raise ValueError unless `prefix` can start a file name in the output folder."""
    separators = {"/", os.sep, *([os.altsep] if os.altsep else [])}
    if not prefix or prefix.startswith(".") or any(sep in prefix for sep in separators):
        raise ValueError(
            f"prefix must be a non-empty file name start without a path separator and not "
            f"starting with '.', like {DEFAULT_PREFIX!r}; got {prefix!r}"
        )


def _refuse_existing(out: str, existing: list[str], classes_text: str) -> None:
    """Raise FileExistsError if `out` holds shards of these names or other classes."""
    if existing:
        shown = ", ".join(existing[:3]) + (
            f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        )
        raise FileExistsError(
            f"{out!r} already holds shards with these names ({shown}): choose an empty "
            "folder or another prefix, or pass overwrite=True (--overwrite) to replace them"
        )
    classes_path = os.path.join(out, CLASSES_FILE)
    if os.path.exists(classes_path):
        with open(classes_path, encoding="utf-8", errors="replace") as file:
            if file.read() != classes_text:
                raise FileExistsError(
                    f"{classes_path!r} already lists other classes: choose an empty folder, or "
                    "pass overwrite=True (--overwrite) to replace it"
                )


def _shard_chunks(format: str, samples: Iterable[_Sample], top: str) -> Iterable[bytes]:
    """The bytes of one shard of `samples`, in pieces (a sample's image is read when reached)."""
    if format == "tar":
        for sample in samples:
            key = f"{sample.number:09d}"
            image = storage.read_whole(sample.path)
            label = str(sample.label).encode("ascii")
            for name, data in ((f"{key}.{_extension(sample.path)}", image), (f"{key}.cls", label)):
                yield tar_header(name, len(data), mtime=0)
                yield data
                yield tar_padding(len(data))
        yield TAR_END
    else:
        for sample in samples:
            extension = _extension(sample.path)
            example = encode_example(
                {
                    "image/encoded": storage.read_whole(sample.path),
                    "image/class/label": sample.label,
                    "image/format": IMAGE_FORMATS.get(extension, extension.encode()),
                    "image/filename": _relative(sample.path, top).encode(
                        "utf-8", "surrogateescape"
                    ),
                }
            )
            yield frame_record(example)


def _extension(path: str) -> str:
    """The lower-cased extension of `path`, without its dot (`"jpg"`, `"jpeg"`, `"png"`)."""
    return os.path.splitext(path)[1][1:].lower()


def _relative(path: str, top: str) -> str:
    """`path` relative to the listed folder `top`, with `/` separators."""
    if path.startswith(top):
        relative = path[len(top) :].lstrip("/" + os.sep)
    else:
        relative = os.path.relpath(path, top)
    return relative.replace(os.sep, "/")


def _write_atomically(path: str, chunks: Iterable[bytes]) -> None:
    """Write `chunks` to `path` through a hidden temporary file: fsync, then `os.replace`.

    On any error (Ctrl-C included) the temporary file is removed and `path` is untouched.
    """
    folder, name = os.path.split(path)
    partial = os.path.join(folder, f".{name}{PARTIAL_SUFFIX}")
    try:
        with open(partial, "wb") as file:
            _write_all(file, chunks)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    _fsync_folder(folder)


def _write_all(file: BinaryIO, chunks: Iterable[bytes]) -> None:
    """Write every chunk to `file`."""
    for chunk in chunks:
        file.write(chunk)


def _fsync_folder(folder: str) -> None:
    """Make a rename in `folder` durable (where the system can open folders; POSIX)."""
    try:
        handle = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
