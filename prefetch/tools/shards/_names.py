"""The names of a shard set's files, and what an output folder already holds of a set.

`shard_name`, `shard_pattern` and `matching_shards` are the layouts' file names (the readers'
patterns); `check_prefix` refuses a prefix that is not a file name's start. Before a write,
`refuse_existing` refuses a folder that holds these names (without `overwrite`),
`earlier_write` finishes an interrupted commit of this set, `already_written` tells that the
set in place is the one a run (finished, or interrupted after its shards) of the same plan
wrote, and `remove_strays` removes
the temporary files a killed run left of this set's names. Used by `_writer`,
under the output folder's lock.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable

from prefetch.sources.shards import (
    MAX_MANIFEST_BYTES,
    Manifest,
    manifest_name,
    parse_class_names,
)
from prefetch.tools.shards import _set as shard_set
from prefetch.tools.shards._out_folder import TEMPORARY_SUFFIX, TOKEN_BYTES, OutFolder
from prefetch.tools.shards._resume import Journal, Plan, progress_name, written_by

# The shard file names start with this unless a `prefix` is given.
DEFAULT_PREFIX = "shard"
# The class names, one per line, written next to the shards (the readers' `class_names`).
CLASSES_FILE = shard_set.CLASSES_FILE
# The most bytes read of a `classes.txt` already in the output folder.
MAX_CLASSES_BYTES = 16 << 20


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


def check_prefix(prefix: str) -> None:
    """Raise ValueError unless `prefix` can start a file name in the output folder."""
    separators = {"/", os.sep, *([os.altsep] if os.altsep else [])}
    if not prefix or prefix.startswith(".") or any(sep in prefix for sep in separators):
        raise ValueError(
            f"prefix must be a non-empty file name start without a path separator and not "
            f"starting with '.', like {DEFAULT_PREFIX!r}; got {prefix!r}"
        )


def refuse_existing(
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


def earlier_write(out: OutFolder, format: str, prefix: str, overwrite: bool) -> list[str]:
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


def already_written(out: OutFolder, plan: Plan, journal: Journal) -> str | None:
    """Whether the complete set in `out` is the one `plan` writes, by its journal (`_resume`):
    "complete" when a run of it finished (the journal, marked complete, names the manifest in
    place by its SHA-256), "finished" when an interrupted run of it was put in place (or
    finished by `earlier_write`) before its journal was marked (it is marked now), None when
    the set in place (if any) is not known to be it."""
    name = manifest_name(plan.options["format"], plan.options["prefix"])
    try:
        data = out.read_small(name, MAX_MANIFEST_BYTES)
        manifest = None if data is None else Manifest.from_bytes(data, out.where(name))
    except (ValueError, OSError):
        return None  # not a manifest we can read: `overwrite` replaces it
    if data is None or manifest is None or not manifest.complete:
        return None
    recorded = written_by(out, journal.name, plan)
    if recorded is None:
        return None
    shards, complete = recorded
    if complete is not None:
        return "complete" if complete == hashlib.sha256(data).hexdigest() else None
    entries = [(entry.name, entry.size, entry.samples, entry.sha256) for entry in manifest.shards]
    shards = sorted(shards, key=lambda shard: shard.index)  # workers finish in any order
    if [(d.name, d.size, d.samples, d.sha256) for d in shards] != entries:
        return None
    if list(plan.shards) != [entry.name for entry in manifest.shards]:
        return None
    journal.settle(plan, data)
    return "finished"


def remove_strays(
    out: OutFolder, names: list[str], prefix: str, format: str, keep: set[str]
) -> None:
    """Remove the temporary files in `out` of this set's names (its shards, or any shard name
    of this prefix and format, its manifest, class list and progress journal) that are not in
    `keep`: left by a run that was killed, or by one
    this write does not continue. Only under the folder's lock: no other writer is at work."""
    finals = {*names, manifest_name(format, prefix), CLASSES_FILE, progress_name(format, prefix)}
    pattern = re.compile(rf"\.(.+)\.[0-9a-f]{{{2 * TOKEN_BYTES}}}{re.escape(TEMPORARY_SUFFIX)}")
    for name in out.names():
        found = pattern.fullmatch(name)
        if not found or name in keep:
            continue
        final = found.group(1)
        if final in finals or matching_shards([final], format, prefix):  # of another plan too
            out.remove(name)
