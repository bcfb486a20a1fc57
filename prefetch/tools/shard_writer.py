"""Write an image folder into shards: WebDataset tar files or TFRecord files, and their manifest.

`write_shards(folder, out, ...)` lists `folder` with `ImageFolder` (Keras's rules), shuffles the
samples once, cuts them into shards of `shard_size` samples and writes each shard, copying the
image bytes as stored (re-encoded only with `fit_crop`). Each image's header is read first
(Pillow): an empty file or one that is not an image is skipped and reported (`on_skip`), or
refused with `strict=True`. It runs in the calling thread and owns only the files it writes
in `out`.

Safe against a neighbour and a crash (docs/shards.md, "Writing safely"): `out` is opened once
as a folder descriptor, every file is created under a fresh unpredictable name, never through
a link (`out_folder`); all shards are written first, committed together with a journal, and
the manifest (names, sizes, sample counts, SHA-256, class names) last (`shard_set`): an
interrupted or failed write leaves the old complete set or the new one, never a mixed set.
The shards depend only on the files, the order (`seed`, `shuffle`) and the options (tar
headers carry mtime 0): the same input gives the same bytes.

Layouts (the names the readers expect):

- tar (WebDataset): `<prefix>-000000.tar`, ...; sample number k (counted across shards, in the
  shuffled order, skipped files keeping their number) is the members `<k:09d>.<ext>` (the
  image, `ext` its lower-cased extension) and `<k:09d>.cls` (its label as ASCII decimal),
  then the tar end-of-archive blocks.
- tfrecord: `<prefix>-00000-of-00003.tfrecord`, ...; one `tf.train.Example` per sample with
  `image/encoded` (the bytes), `image/class/label` (int64, 0-based, the folder's label),
  `image/format` (`b"jpeg"`, `b"png"`, ...) and `image/filename` (the path relative to
  `folder`, `/`-separated).
- `<prefix>-<format>.manifest.json`: the set (`prefetch.sources.shards._manifest`).
- `classes.txt`: one class name per line, line i naming label i, for other tools; written only
  when no name holds a line break (the manifest always names the classes exactly).
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator

import numpy as np
from PIL import Image

from prefetch.io import frame_record, read_location
from prefetch.sources import ImageFolder
from prefetch.sources.shards import (
    TAR_END,
    Manifest,
    ShardEntry,
    encode_example,
    index_shard,
    manifest_name,
    parse_class_names,
    tar_header,
    tar_padding,
)
from prefetch.tools import fit_crop as fitting
from prefetch.tools import shard_set
from prefetch.tools.out_folder import OutFolder

# The shard formats `write_shards` writes, by `format` name.
FORMATS = ("tar", "tfrecord")
# The shard file names start with this unless a `prefix` is given.
DEFAULT_PREFIX = "shard"
# The class names, one per line, written next to the shards (the readers' `class_names`).
CLASSES_FILE = shard_set.CLASSES_FILE
# The most bytes read of a `classes.txt` already in the output folder.
MAX_CLASSES_BYTES = 16 << 20
# `image/format` of a TFRecord example, by lower-cased file extension (TF's conventions).
IMAGE_FORMATS = {"jpg": b"jpeg", "jpeg": b"jpeg", "png": b"png", "bmp": b"bmp", "gif": b"gif"}

# What `write_shards` calls after each shard is written, `(path, samples, size in bytes)`, and
# for each file it skips, `(path, reason)`.
ShardCallback = Callable[[str, int, int], None]
SkipCallback = Callable[[str, str], None]


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
    strict: bool = False,
    fit_crop: int | None = None,
    fit_crop_quality: int = fitting.DEFAULT_QUALITY,
    on_shard: ShardCallback | None = None,
    on_skip: SkipCallback | None = None,
) -> list[str]:
    """Write the images of `folder` into shards in `out`; return the shard paths, in order.

    Parameters:

    - `folder`: an image folder with one subfolder per class, listed by `ImageFolder` (Keras's
      order and rules; a path or an fsspec URL).
    - `out`: the folder the shards, their manifest and `classes.txt` go into; created (with
      its parents) if missing; not a symbolic link.
    - `format`: `"tar"` (WebDataset layout) or `"tfrecord"` (`tf.train.Example` records); the
      module docstring gives both layouts.
    - `shard_size`: samples per shard, >= 1; the last shard holds the rest (a shard holds
      fewer when files of its part were skipped).
    - `seed`: the seed of the one shuffle, `np.random.default_rng(seed).permutation`.
    - `shuffle`: shuffle the samples before cutting them into shards. A streaming reader's
      shuffle buffer only mixes samples that are near each other in the stream, so shards in
      the folder's class order would give batches of one class; `False` keeps the listing
      order (for evaluation data, or when the order is meant).
    - `prefix`: the start of the shard file names (default `"shard"`); no path separator.
    - `overwrite`: replace the set of an earlier run. Without it, `out` must hold no file
      that matches this prefix's shard names in this format, no manifest of them, nor a
      `classes.txt` with other classes (`FileExistsError`, naming them). With it, the old
      set is replaced as a whole: its shards that this run does not write are removed.
    - `strict`: refuse (ValueError naming the file and why) a file that is empty or not an
      image Pillow can read, instead of skipping it.
    - `fit_crop`: re-encode each image larger than needed at the smallest size at which every
      window of the default `RandomResizedCrop` is still at least `fit_crop` pixels on each
      side (`prefetch.tools.fit_crop`; lossy: JPEGs are compressed again); smaller images
      are kept byte for byte. None (default): every image's bytes are copied as stored.
    - `fit_crop_quality`: the JPEG quality (1-100) of the images `fit_crop` re-encodes;
      default 90 (`prefetch.tools.fit_crop.DEFAULT_QUALITY`): smaller and faster to read
      than 95, a little further from the original pixels. Recorded in the manifest
      (`options["fit_crop"]["jpeg_quality"]`); another value needs `fit_crop`.
    - `on_shard`: called as `on_shard(path, samples, size)` after each shard is written (under
      a temporary name; all are put at their `path` together at the end).
    - `on_skip`: called as `on_skip(path, reason)` for each file skipped.

    An interrupted or failed write (Ctrl-C, a full disk) leaves the earlier complete set, or
    none, and no temporary file; a crash while the set is put in place is finished by the
    next write (the module docstring). After the set is in place each shard's offset index
    is written beside it (`prefetch.sources.shards._index.index_shard`). Raises `FileNotFoundError`
    for a missing `folder`, `ValueError` for a folder without images or a bad option, and
    `FileExistsError` as said; a read error names the file, a write error the shard, the
    byte offset and the temporary file.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be an int >= 1 (samples per shard), got {shard_size!r}")
    fitting.check_options(fit_crop, fit_crop_quality)
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    _check_prefix(prefix)
    source = ImageFolder(folder)
    top = os.fspath(folder)
    order = (
        np.random.default_rng(seed).permutation(len(source)) if shuffle else np.arange(len(source))
    )
    count = math.ceil(len(order) / shard_size)
    names = [shard_name(format, prefix, index, count) for index in range(count)]
    class_names = tuple(source.class_names)
    with OutFolder(os.fspath(out)) as place:
        abandoned = _earlier_write(place, format, prefix, overwrite)
        existing = matching_shards(place.names(), format, prefix)
        if not overwrite:
            _refuse_existing(place, format, prefix, existing, class_names)
        moves: list[tuple[str, str]] = []
        entries = []
        skipped: list[tuple[str, str]] = []
        resized = [0]  # images that fit_crop encoded again

        def skip(path: str, reason: str) -> None:
            if strict:
                raise ValueError(
                    f"{path!r}: {reason}; remove it, or write without --strict to skip such files"
                )
            skipped.append((_relative(path, top), reason))
            if on_skip is not None:
                on_skip(path, reason)

        try:
            for index, name in enumerate(names):
                numbers = range(index * shard_size, min((index + 1) * shard_size, len(order)))
                samples = [
                    _Sample(
                        number, source.paths[int(order[number])], int(source.labels[order[number]])
                    )
                    for number in numbers
                ]
                kept = _Kept(samples, skip, fit_crop, fit_crop_quality, resized)
                written = place.write_temporary(name, _shard_chunks(format, kept, top), "shard")
                moves.append((written.temporary, name))
                entries.append(ShardEntry(name, written.size, kept.count, written.sha256))
                if on_shard is not None:
                    on_shard(place.where(name), kept.count, written.size)
            manifest = Manifest(
                format=format,
                prefix=prefix,
                shards=tuple(entries),
                class_names=class_names,
                image_extensions=tuple(sorted({_extension(p) for p in source.paths})),
                options={
                    "shard_size": shard_size,
                    "seed": seed,
                    "shuffle": shuffle,
                    "strict": strict,
                    **fitting.recorded(fit_crop, fit_crop_quality, resized[0]),
                },
                skipped=tuple(skipped),
            )
        except BaseException:
            for temporary, _ in moves:
                place.remove(temporary)
            raise
        for temporary in abandoned:
            place.remove(temporary)
        shard_set.commit(place, manifest, moves, sorted(set(existing) - set(names)))
        paths = [place.where(name) for name in names]
    for path in paths:
        index_shard(path)
    return paths


def shard_name(format: str, prefix: str, index: int, count: int) -> str:
    """The file name of shard `index` of `count` in `format` (`write_shards`'s layouts)."""
    if format == "tar":
        return f"{prefix}-{index:06d}.tar"
    return f"{prefix}-{index:05d}-of-{count:05d}.tfrecord"


def shard_pattern(format: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A glob pattern that matches the shard names of `format` and `prefix` (for readers)."""
    return f"{prefix}-*.tar" if format == "tar" else f"{prefix}-*-of-*.tfrecord"


def matching_shards(names: Iterable[str], format: str, prefix: str) -> list[str]:
    """The names among `names` (a folder's) that are shards of `format` and `prefix`, sorted."""
    if format == "tar":
        pattern = re.compile(rf"{re.escape(prefix)}-\d{{6,}}\.tar")
    else:
        pattern = re.compile(rf"{re.escape(prefix)}-\d{{5,}}-of-\d{{5,}}\.tfrecord")
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


def _refuse_existing(
    out: OutFolder, format: str, prefix: str, existing: list[str], class_names: tuple[str, ...]
) -> None:
    """Raise FileExistsError if `out` holds shards or a manifest of these names, or a
    `classes.txt` of other classes."""
    if existing:
        shown = ", ".join(existing[:3]) + (
            f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        )
        raise FileExistsError(
            f"{out.path!r} already holds shards with these names ({shown}): choose an empty "
            "folder or another prefix, or pass overwrite=True (--overwrite) to replace them"
        )
    manifest = manifest_name(format, prefix)
    if out.is_file(manifest):
        raise FileExistsError(
            f"{out.where(manifest)!r} already describes a set of these shards: choose an empty "
            "folder or another prefix, or pass overwrite=True (--overwrite) to replace it"
        )
    data = out.read_small(CLASSES_FILE, MAX_CLASSES_BYTES)
    if data is not None and parse_class_names(data, out.where(CLASSES_FILE)) != list(class_names):
        raise FileExistsError(
            f"{out.where(CLASSES_FILE)!r} already lists other classes: choose an empty folder, "
            "or pass overwrite=True (--overwrite) to replace it"
        )


def _earlier_write(out: OutFolder, format: str, prefix: str, overwrite: bool) -> list[str]:
    """Finish an earlier write of this set that was interrupted while it was put in place;
    return the temporary files of one that cannot be finished (abandoned: only with
    `overwrite`, else FileExistsError saying what to run)."""
    try:
        journal = shard_set.read_manifest(out, format, prefix)
    except ValueError:
        if overwrite:
            return []  # not a manifest we can read: the new one replaces it
        raise
    if journal is None or journal.complete:
        return []
    problem = shard_set.roll_forward(out, journal)
    if problem is None:
        return []
    if overwrite:
        return shard_set.temporaries(journal)
    where = out.where(manifest_name(format, prefix))
    raise FileExistsError(
        f"{where!r} records a write of these shards that was interrupted and cannot be "
        f"finished ({problem}): write them again with --overwrite (overwrite=True)"
    )


class _Kept:
    """The samples of one shard whose files are images (resized to `fit` when given, JPEGs at
    `quality`, counted in `resized[0]`); others go to `skip(path, reason)`."""

    def __init__(
        self,
        samples: list[_Sample],
        skip: SkipCallback,
        fit: int | None,
        quality: int,
        resized: list[int],
    ) -> None:
        self.samples = samples
        self.skip = skip
        self.fit = fit
        self.quality = quality
        self.resized = resized
        self.count = 0

    def __iter__(self) -> Iterator[tuple[_Sample, bytes]]:
        for sample in self.samples:
            data = read_location(sample.path)
            reason = image_problem(data)
            if reason is not None:
                self.skip(sample.path, reason)
                continue
            if self.fit is not None:
                data, changed = fitting.fit_image(data, self.fit, self.quality)
                self.resized[0] += changed
            self.count += 1
            yield sample, data


def image_problem(data: bytes) -> str | None:
    """Why `data` cannot be a sample's image (empty, not an image Pillow can open, no
    pixels), or None. Reads the header only (Pillow's `open`), not the pixels."""
    if not data:
        return "empty file (0 bytes)"
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as error:
        return f"decompression bomb ({error})"
    except Exception as error:  # Pillow raises many kinds for a file that is not an image
        return f"not an image ({type(error).__name__}: {error})"
    if width < 1 or height < 1:
        return f"an image of {width}x{height} pixels"
    return None


def _shard_chunks(format: str, samples: _Kept, top: str) -> Iterable[bytes]:
    """The bytes of one shard of `samples`, in pieces (a sample's image is read when reached)."""
    if format == "tar":
        for sample, image in samples:
            key = f"{sample.number:09d}"
            label = str(sample.label).encode("ascii")
            for name, data in ((f"{key}.{_extension(sample.path)}", image), (f"{key}.cls", label)):
                yield tar_header(name, len(data), mtime=0)
                yield data
                yield tar_padding(len(data))
        yield TAR_END
    else:
        for sample, image in samples:
            extension = _extension(sample.path)
            example = encode_example(
                {
                    "image/encoded": image,
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
    inside = path.startswith(top)
    relative = path[len(top) :].lstrip("/" + os.sep) if inside else os.path.relpath(path, top)
    return relative.replace(os.sep, "/")
