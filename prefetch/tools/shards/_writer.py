"""Write an image folder into shards: WebDataset tar files or TFRecord files, and their manifest.

`write_shards(folder, out, ...)` lists `folder` with `ImageFolder` (Keras's rules), shuffles the
samples once, cuts them into shards of `shard_size` samples and writes each shard, copying the
image bytes as stored (re-encoded only with `fit_crop`). Each image's header is read first
(Pillow): an empty file, one that is not an image, one over the readers' limits or (with
`fit_crop`) one that cannot be decoded is skipped and reported (`on_skip`), or refused with
`strict=True`. That per-sample work runs in `workers` processes (`_work`; 1: in the calling
thread), the shards are written in order by the calling thread, and the bytes do not depend on
the number of workers. It owns the files it writes in `out`, holds
`out`'s lock while it runs (a second writer is refused at once), and reports its progress
(`on_progress`, a `Progress` after each chunk of samples).

Safe against a neighbour and a crash (docs/shards.md, "Writing safely"): `out` is opened once
as a folder descriptor, every file is created under a fresh unpredictable name, never through
a link (`_out_folder`); all shards are written first, committed together with a journal, and
the manifest (names, sizes, sample counts, SHA-256, class names) last (`_set`): an
interrupted or failed write leaves the old complete set or the new one, never a mixed set.
The shards it finished stay hidden, recorded in a progress journal (`_resume`), and the
same write again continues from them.
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

import math
import os
import time
from typing import Any

import numpy as np

from prefetch._messages import counted
from prefetch.io import is_url
from prefetch.sources import ImageFolder
from prefetch.sources.shards import index_shard
from prefetch.tools.shards import _fit_crop as fitting
from prefetch.tools.shards._job import Job, planner, silent, write_into
from prefetch.tools.shards._listing_digest import ListingDigest
from prefetch.tools.shards._names import DEFAULT_PREFIX, check_prefix, shard_name
from prefetch.tools.shards._out_folder import OutFolder, remove_created
from prefetch.tools.shards._pass import (
    NoteCallback,
    ProgressCallback,
    ShardCallback,
    SkipCallback,
)
from prefetch.tools.shards._samples import Options
from prefetch.tools.shards._work import Preparer

# The shard formats `write_shards` writes, by `format` name.
FORMATS = ("tar", "tfrecord")


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
    workers: int = 1,
    on_shard: ShardCallback | None = None,
    on_skip: SkipCallback | None = None,
    on_progress: ProgressCallback | None = None,
    on_note: NoteCallback | None = None,
    on_status: NoteCallback | None = None,
) -> list[str]:
    """Write the images of `folder` into shards in `out`; return the shard paths, in order.

    Parameters:

    - `folder`: an image folder with one subfolder per class, listed by `ImageFolder` (Keras's
      order and rules; a path or an fsspec URL).
    - `out`: the folder the shards, their manifest and `classes.txt` go into; created (with
      its parents) if missing; not a symbolic link. Locked while the write runs: a second
      writer into it is refused at once (`prefetch.tools.shards.FolderBusyError`).
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
    - `strict`: refuse (ValueError naming the file and why) a file that is empty, not an
      image Pillow can read, over the readers' limits, or (with `fit_crop`) that cannot be
      decoded, instead of skipping it.
    - `fit_crop`: re-encode each image larger than needed at the smallest size at which every
      window of the default `RandomResizedCrop` is still at least `fit_crop` pixels on each
      side, converted as the loader reads it (`fit_image`; lossy: JPEGs are
      compressed again); smaller images are kept byte for byte. None (default): every
      image's bytes are copied as stored.
    - `fit_crop_quality`: the JPEG quality (1-100) of the images `fit_crop` re-encodes;
      default 90 (`prefetch.tools.shards.DEFAULT_QUALITY`): smaller and faster to read
      than 95, a little further from the original pixels. Recorded in the manifest
      (`options["fit_crop"]["jpeg_quality"]`); another value needs `fit_crop`.
    - `workers`: how many read, check and re-encode images: 1 (default) in the calling
      thread, more in that many worker processes (`_work`). The shards
      are the same bytes for any number (`prefetch shards write` uses the usable cores).
    - `on_shard`: called as `on_shard(path, samples, size)` after each shard is written (under
      a temporary name; all are put at their `path` together at the end).
    - `on_skip`: called as `on_skip(path, reason)` for each file skipped.
    - `on_progress`: called with a `Progress` after each chunk of samples is written.
    - `on_note`: called with a line for a person: that the write resumes an interrupted one,
      or why it starts over, or that the set in place is already the one asked for (the line
      starts with `ALREADY_COMPLETE`).
    - `on_status`: called with a line for a person about the planning, as soon as it is
      known: how many files and shards, once the folder is listed; that the files are being
      checked against an earlier run's journal (the command prints these on stderr).

    The first images are written as soon as the folder is listed: the fingerprint of the
    listing that a rerun compares (`_listing_digest.ListingDigest`: a `stat` a file) is computed
    beside the writing, and waited for before a rerun compares it, and before the commit (the
    shards finished before it is ready are journaled once it is). An interrupted or failed
    write (Ctrl-C, a full disk) leaves the earlier complete set, or none; the shards it
    finished stay under hidden temporary names with a progress journal (`_resume`), and the
    same call again continues from them, checked against the plan (names, sample counts,
    SHA-256), giving the bytes an uninterrupted write gives; another input or other options
    start over. The same call after a complete write of the same files and options does
    nothing and says so (`on_note`; its journal stays, marked complete), unless `overwrite`.
    A crash while the set is put in place is finished by the next write (the module
    docstring), which then does what it was asked. After the set is in place each shard's
    offset index is written beside it (`prefetch.sources.shards._index.index_shard`). Raises
    `FileNotFoundError` for a missing `folder`, `ValueError` for a folder without images, one
    whose every file is skipped (nothing is written: a reader refuses a set without samples)
    or a bad option, and `FileExistsError` as said; a read error names the file, a write
    error the shard, the byte offset and the temporary file. A write that fails or is
    interrupted before it finished a shard leaves nothing: the folders it created for `out`
    are removed when empty.
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be an int >= 1 (samples per shard), got {shard_size!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1 (processes that re-encode), got {workers!r}")
    fitting.check_options(fit_crop, fit_crop_quality)
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    check_prefix(prefix)
    began = time.monotonic()
    status = on_status if on_status is not None else silent
    # Started first: the worker processes start up (import) while the folder is listed.
    preparer = Preparer(workers, Options(fit_crop, fit_crop_quality))
    digest: ListingDigest | None = None
    try:
        source = ImageFolder(folder)
        top = os.fspath(folder)
        order = np.random.default_rng(seed).permutation(len(source)) if shuffle else None
        count = math.ceil(len(source) / shard_size)
        names = [shard_name(format, prefix, index, count) for index in range(count)]
        rest = len(source) % shard_size  # files of the last shard, when it holds fewer
        cut = f" of {shard_size:,} files" + (f" (the last of {rest:,})" if rest else "")
        files = f"{len(source):,} file" + ("" if len(source) == 1 else "s")
        status(
            f"{files} in {counted(len(source.class_names), 'class')}: checking "
            f"each one's header and writing them into {counted(count, format + ' shard')}"
            f"{cut if count > 1 else ''} in {os.fspath(out)} ({counted(workers, 'worker')})"
        )
        # Its stat calls run beside the writing: waited for only when the plan is needed.
        digest = ListingDigest(source.paths, source.labels, local=not is_url(top))
        options: dict[str, Any] = {
            "format": format,
            "prefix": prefix,
            "shard_size": shard_size,
            "seed": seed,
            "shuffle": shuffle,
            "strict": strict,
            "fit_crop": fit_crop,
            "fit_crop_quality": fit_crop_quality if fit_crop is not None else None,
        }
        job = Job(
            source=source,
            top=top,
            order=order,
            names=names,
            options=options,
            plan=planner(options, len(source), digest, tuple(names)),
            plan_ready=digest.ready,
            overwrite=overwrite,
            began=began,
            on_shard=on_shard,
            on_skip=on_skip,
            on_progress=on_progress,
            note=on_note or silent,
            status=status,
        )
        made: list[str] = []  # the folders made for OUT, each recorded before it is made
        try:
            with OutFolder(os.fspath(out), made) as place:
                place.lock()
                paths = write_into(place, job, preparer)
        except BaseException:
            preparer.close()  # its workers remove the shards they were writing
            remove_created(made)  # when they are still empty
            raise
    finally:
        if digest is not None:
            digest.close()
        preparer.close()
    for path in paths:
        index_shard(path)
    return paths
