"""A manifest is the set: which shards a folder's manifest makes of it, and the checks of a
set against its manifest (`prefetch.sources.shards._manifest`).

Where the folder a source reads (or the folder of its pattern) holds a manifest of its format,
`choose_set` makes the source read exactly the manifest's shards (those the pattern selects);
other files are named in one log line and left alone; two manifests of the format, or a
journal (an unfinished write), are an error naming them. Readers (`check_shards`,
`check_sizes`, `check_indexes`, `check_class_names`) then refuse a set whose files disagree
with it (a shard missing, an extra shard of its own names, another size or sample count, a
`classes.txt` naming other classes) naming the difference. `verify` (`prefetch shards verify
OUT`) makes every one of these checks, sizes before anything is hashed, then every shard's
SHA-256. Pure functions of what they read; nothing is kept between calls.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import logging
import os
import stat
from collections.abc import Sequence

from prefetch.io import beside, is_url, open_regular
from prefetch.sources.shards._index import IndexSpec, load_or_build
from prefetch.sources.shards._manifest import (
    CLASSES_FILE,
    Manifest,
    basename,
    class_names_beside,
    manifest_name,
    manifests_of,
    read_manifest_bytes,
    shard_prefix,
    shown,
)

log = logging.getLogger("prefetch.loader")

# Bytes hashed at a time by `verify`.
_HASH_CHUNK = 4 << 20


@dataclasses.dataclass(frozen=True)
class ChosenSet:
    """The set a folder's manifest makes of it: the `manifest`, `where` it is, and the `names`
    of its shards to read (those the folder or pattern selects), in the manifest's order."""

    manifest: Manifest
    where: str
    names: list[str]


def choose_set(
    folder: str, names: Sequence[str], selected: Sequence[str], selects: str, format: str
) -> ChosenSet | None:
    """The set the manifest in `folder` (a path or a URL without its trailing "/") makes of
    it, or None when it holds no manifest of `format` that applies. `names` are every file of
    the folder, `selected` those the folder (`selects` "*") or a pattern (`selects`) picks.

    A folder read whole is its manifest's set; a pattern is, when it picks a shard of a
    manifest's prefix. More than one such manifest, a journal (an unfinished write), a shard
    of the manifest that the pattern selects but that is missing, or a file of the set's own
    names that the manifest does not list are errors naming them. Other files the folder or
    pattern picks are named in one line of the log and not read."""
    manifests = manifests_of(names, format)
    if selects != "*":
        prefixes = {shard_prefix(name, format) for name in selected} - {None}
        manifests = [name for name in manifests if _prefix_of(name, format) in prefixes]
    if not manifests:
        return None
    if len(manifests) > 1:
        raise ValueError(
            f"{folder!r} holds {len(manifests)} manifests of {format} shards "
            f"({shown(manifests)}): one folder holds one set of a format. Read one set by "
            f"a pattern of its names (such as '{_prefix_of(manifests[0], format)}-*'), or move "
            "each set to a folder of its own"
        )
    where = _join(folder, manifests[0])
    manifest = Manifest.from_bytes(read_manifest_bytes(where), where)
    if manifest.format != format or manifest_name(format, manifest.prefix) != manifests[0]:
        raise ValueError(
            f"{where!r} describes {manifest.format} shards named {manifest.prefix!r}-..., not "
            "the set its name says: write the shards again"
        )
    listed = [entry.name for entry in manifest.shards]
    in_set = set(listed)
    check_shards(manifest, where, [n for n in selected if n in in_set], None)
    extra = [n for n in selected if n not in in_set]
    own = [n for n in extra if shard_prefix(n, format) == manifest.prefix]
    if own:
        check_shards(manifest, where, own, None)  # raises, naming them
    present = set(names)
    chosen = [name for name in listed if fnmatch.fnmatchcase(name, selects)]
    missing = [name for name in chosen if name not in present]
    if missing:
        raise ValueError(
            f"the set of {where!r} is missing {shown(missing)}: copy "
            f"{'it' if len(missing) == 1 else 'them'} back, or write the shards again"
        )
    if extra:
        log.warning(
            "prefetch: reading the %d shards that %r lists; left alone (not in it): %s",
            len(chosen),
            where,
            shown(extra),
        )
    return ChosenSet(manifest, where, chosen)


def _prefix_of(manifest: str, format: str) -> str:
    return manifest[: -len(f"-{format}.manifest.json")]


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if is_url(folder) else os.path.join(folder, name)


def check_shards(
    manifest: Manifest, where: str, shards: Sequence[str], selects: str | None
) -> None:
    """Refuse (ValueError naming the difference and `where`) an incomplete manifest, or found
    `shards` that are not the manifest's: an extra shard of its names, or (when the shards
    were found by a folder or pattern, `selects` the pattern of names it selects) a shard of
    the manifest that the pattern selects but that is missing."""
    if not manifest.complete:
        raise ValueError(
            f"{where!r} says a `prefetch shards write` of these shards did not finish (it was "
            "interrupted, or is running now): the set is not complete. Run the same `prefetch "
            "shards write` again to complete it (with --overwrite to start over)"
        )
    names = [basename(shard) for shard in shards]
    listed = {entry.name for entry in manifest.shards}
    extra = [name for name in names if name not in listed]
    if extra:
        raise ValueError(
            f"{shown(extra)} beside {where!r} {'is' if len(extra) == 1 else 'are'} not in the "
            "manifest of the set: left from another write? Remove "
            f"{'it' if len(extra) == 1 else 'them'}, or write the shards again"
        )
    if selects is not None:
        found = set(names)
        missing = [n for n in sorted(listed) if fnmatch.fnmatch(n, selects) and n not in found]
        if missing:
            raise ValueError(
                f"the set of {where!r} is missing {shown(missing)}: copy "
                f"{'it' if len(missing) == 1 else 'them'} back, or write the shards again"
            )


def check_sizes(manifest: Manifest, where: str, shards: Sequence[str]) -> None:
    """Refuse (ValueError naming the shard and `where`) a local shard of `shards` whose size
    on disk is not the manifest's: a `stat`, before anything of it is read or indexed (URLs
    are compared when indexed)."""
    local = [shard for shard in shards if not is_url(shard)]
    sizes = []
    for shard in local:
        try:
            sizes.append(os.stat(shard).st_size)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{shard!r} of the set of {where!r} is missing: copy it back, or write the "
                "shards again"
            ) from None
    check_indexes(manifest, where, local, sizes, None)


def check_class_names(manifest: Manifest, where: str) -> None:
    """Refuse (ValueError naming both) a `classes.txt` beside the manifest at `where` that
    names other classes than the manifest (the writer leaves the two in agreement, or no
    `classes.txt` when a name holds a line break)."""
    beside_it = beside(where, CLASSES_FILE)
    names = class_names_beside(where)
    if names is not None and names != list(manifest.class_names):
        raise ValueError(
            f"{beside_it!r} names {len(names)} classes ({shown(names)}) and {where!r} "
            f"names {len(manifest.class_names)} ({shown(list(manifest.class_names))}): one "
            f"of them was edited after the set was written. Write the shards again, or put "
            f"the right names in both"
        )


def check_indexes(
    manifest: Manifest,
    where: str,
    shards: Sequence[str],
    sizes: Sequence[int],
    counts: Sequence[int] | None,
) -> None:
    """Refuse (ValueError naming the shard and `where`) a shard whose size in bytes or sample
    count (`counts`: None when the reader counts samples otherwise than the writer, with
    other keys or extensions) is not the manifest's."""
    entries = {entry.name: entry for entry in manifest.shards}
    for position, (shard, size) in enumerate(zip(shards, sizes, strict=True)):
        entry = entries[basename(shard)]
        if size != entry.size:
            raise ValueError(
                f"{shard!r} is {size} bytes but {where!r} says {entry.size}: the shard changed "
                "after the set was written (copy it again, or write the shards again)"
            )
        if counts is not None and counts[position] != entry.samples:
            raise ValueError(
                f"{shard!r} holds {counts[position]} samples but {where!r} says "
                f"{entry.samples}: the shard changed after the set was written"
            )


def verify(folder: str, manifest: Manifest, names: Sequence[str] | None = None) -> list[str]:
    """The problems of the local set in `folder` against `manifest`, one line each (empty:
    the set is whole). Everything a reader checks, cheapest first: each shard's presence and
    size (one `stat`: a shard of another size is never read), files of the set's names that
    it does not list (`names`: the folder's files; None: listed here), `classes.txt` against
    the manifest's class names, each shard's sample count (its index, as a reader with the
    default options builds it), then the SHA-256 of each shard of the right size, read whole."""
    problems = []
    where = os.path.join(folder, manifest_name(manifest.format, manifest.prefix))
    if names is None:
        names = os.listdir(folder)
    listed = {entry.name for entry in manifest.shards}
    for name in sorted(names):
        if name not in listed and shard_prefix(name, manifest.format) == manifest.prefix:
            problems.append(f"{name}: not in the manifest (left from another write?)")
    try:
        check_class_names(manifest, where)
    except ValueError as error:
        problems.append(f"{CLASSES_FILE}: {error}")
    sized = []
    for entry in manifest.shards:
        path = os.path.join(folder, entry.name)
        try:
            info = os.stat(path)
        except OSError as error:
            problems.append(f"{entry.name}: cannot be read ({error})")
            continue
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{entry.name}: not a regular file")
        elif info.st_size != entry.size:
            problems.append(f"{entry.name}: {info.st_size} bytes, the manifest says {entry.size}")
        else:
            sized.append(entry)
    spec = _writers_spec(manifest)
    for entry in list(sized):
        path = os.path.join(folder, entry.name)
        try:
            count = len(load_or_build(path, spec))
        except (OSError, ValueError) as error:
            problems.append(f"{entry.name}: cannot be indexed ({error})")
            sized.remove(entry)
            continue
        if count != entry.samples:
            problems.append(f"{entry.name}: {count} samples, the manifest says {entry.samples}")
    for entry in sized:
        path = os.path.join(folder, entry.name)
        try:
            digest, size = _sha256(path)
        except OSError as error:
            problems.append(f"{entry.name}: cannot be read ({error})")
            continue
        if size != entry.size:
            problems.append(f"{entry.name}: {size} bytes, the manifest says {entry.size}")
        elif digest != entry.sha256:
            problems.append(f"{entry.name}: SHA-256 {digest}, the manifest says {entry.sha256}")
    return problems


def _writers_spec(manifest: Manifest) -> IndexSpec:
    """How a reader with the default options counts the samples of `manifest`'s shards."""
    if manifest.format == "tar" and manifest.image_extensions:
        extensions = tuple(ext.lower().lstrip(".") for ext in manifest.image_extensions)
        return IndexSpec("tar", image_ext=tuple(dict.fromkeys(("jpg", "jpeg", "png", *extensions))))
    return IndexSpec(manifest.format)


def _sha256(path: str) -> tuple[str, int]:
    with os.fdopen(open_regular(path), "rb", buffering=0) as file:
        digest = hashlib.sha256()
        size = 0
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
