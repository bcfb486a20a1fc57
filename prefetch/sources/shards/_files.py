"""Which files a shard source reads, and the class names beside them.

`find_shards(files, format)` turns what a user passes to `TFRecordSource` / `TarSource` into the
shard files in order: a file, a folder (local or a URL ending in `/`, listed once with the
bounded listing of `RemoteTree`), a pattern (wildcards in the last part), WebDataset's
brace notation (`shard-{000000..000009}.tar`, `{a,b}`, expanded here as `braceexpand` does,
locally and for URLs), or a list. A path that exists is taken as it is, braces and all.
`class_names_beside(shard)` reads `classes.txt` beside a shard: UTF-8, one name per line,
split on `\\n` only. Pure functions of what they read; nothing is kept.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import os
import re
from collections.abc import Sequence

from prefetch.io import RemoteTree, is_url, local_path
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.sources.shards._manifest import CLASSES_FILE as CLASSES_FILE
from prefetch.sources.shards._manifest import class_names_beside as class_names_beside
from prefetch.sources.shards._manifest import is_manifest_name
from prefetch.sources.shards._manifest import parse_class_names as parse_class_names
from prefetch.sources.shards._set import ChosenSet, choose_set

# The most names one brace expression may expand to (`{0..999999999}` is refused, not built).
MAX_BRACE_NAMES = 1_000_000
_PATTERN_CHARS = frozenset("*?[")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?")


@dataclasses.dataclass(frozen=True)
class ShardFiles:
    """The shards `files` names, in order, and `selects`: the pattern of file names a folder
    or pattern selects in its folder ("*" for a folder), None for files named one by one;
    `chosen`: the set the folder's manifest made of them (`choose_set`), None without one."""

    shards: list[str]
    selects: str | None
    chosen: ChosenSet | None = None


def find_shards(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], format: str
) -> list[str]:
    """The shard files `files` names (see `TFRecordSource`), in order; FileNotFoundError
    naming what matched nothing. Index files and manifests are never shards."""
    return resolve(files, format).shards


def resolve(
    files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], format: str
) -> ShardFiles:
    """`find_shards`, with how the shards were selected (for the manifest's checks)."""
    if not isinstance(files, (str, os.PathLike)):
        found = [os.fspath(path) for path in files]
        if not found:
            raise ValueError("files is an empty list: pass the shard files, or a pattern")
        return ShardFiles(found, None)
    name = os.fspath(files)
    if "{" in name and not (not is_url(name) and os.path.exists(local_path(name))):
        names = expand_braces(name)
        if len(names) > 1:
            return ShardFiles(_expanded(names, format), None)
    return _one(name, format)


def _one(name: str, format: str) -> ShardFiles:
    found: ShardFiles | None = None
    if is_url(name):
        folder, _, last = name.rpartition("/")
        if not last:
            found = _in_folder(folder, "*", format)
        elif _PATTERN_CHARS & set(last):
            if _PATTERN_CHARS & set(folder):
                raise ValueError(
                    f"{name!r}: a URL pattern may have wildcards in its last part only"
                )
            found = _in_folder(folder, last, format)
        else:
            listed = None if _is_shard_name(last, format) else _remote_folder(name)
            if listed is not None:  # a folder named without its trailing "/"
                found = _in_folder(name, "*", format, listed)
            else:
                found = ShardFiles([name], None)
    elif os.path.isdir(local_path(name)):
        found = _in_folder(local_path(name), "*", format)
    elif _PATTERN_CHARS & set(name):
        folder, last = os.path.split(local_path(name))
        if _PATTERN_CHARS & set(folder):  # wildcards across folders: no one folder's set
            paths = glob.glob(local_path(name))
            found = ShardFiles(
                sorted(p for p in paths if _not_index(p) and os.path.isfile(p)), last
            )
        else:
            found = _in_folder(folder, last, format)
    elif os.path.exists(local_path(name)):
        found = ShardFiles([name], None)
    if found is None or not found.shards:
        raise FileNotFoundError(
            f"no {format} shards at {name!r}: pass a shard file, a folder of them, a pattern "
            f"such as 'shards/*{'.tfrecord' if format == 'tfrecord' else '.tar'}', or a list"
        )
    return found


def _in_folder(
    folder: str, selects: str, format: str, listed: RemoteTree | None = None
) -> ShardFiles:
    """The shards of `folder` (a local path, or a URL without its trailing "/", listed once,
    or `listed` already) that `selects` picks ("*": the files that are shards of `format`):
    its manifest's set when it has one (`choose_set`), else those files sorted by name."""
    if is_url(folder):
        tree = listed if listed is not None else RemoteTree(folder)
        entries = tree.listdir(folder)
        subfolders = [n for n in entries if tree.isdir(f"{folder}/{n}")]
        folders = frozenset(subfolders)
        files = [n for n in entries if n not in folders]
    else:
        here = folder or "."
        entries = os.listdir(here)
        subfolders = [n for n in entries if os.path.isdir(os.path.join(here, n))]
        files = [n for n in entries if os.path.isfile(os.path.join(here, n))]
    if selects == "*":
        selected = [n for n in files if _is_shard_name(n, format)]
        if not selected:
            _refuse_other_contents(folder, files, sorted(subfolders), format)
    else:
        hidden = selects.startswith(".")  # as glob: a wildcard never matches a leading dot
        selected = [
            n
            for n in files
            if fnmatch.fnmatchcase(n, selects) and _not_index(n) and (hidden or n[:1] != ".")
        ]
    selected.sort()
    chosen = choose_set(folder, files, selected, selects, format)
    names = selected if chosen is None else chosen.names
    if is_url(folder):
        return ShardFiles([f"{folder}/{n}" for n in names], selects, chosen)
    return ShardFiles([os.path.join(folder, n) for n in names], selects, chosen)


def _refuse_other_contents(
    folder: str, files: list[str], subfolders: list[str], format: str
) -> None:
    """Raise FileNotFoundError saying what `folder`, which holds no `format` shards, holds
    instead, when it is shards of the other format or an image folder; return otherwise."""
    other = "tar" if format == "tfrecord" else "tfrecord"
    others = sorted(n for n in files if _is_shard_name(n, other))
    if others:
        source = "TarSource" if other == "tar" else "TFRecordSource"
        shown = ", ".join(map(repr, others[:3])) + (" ..." if len(others) > 3 else "")
        raise FileNotFoundError(
            f"no {_FORMATS[format]} shards in {folder!r}, but {len(others)} "
            f"{_FORMATS[other]} shards ({shown}): read them with prefetch.{source}"
        )
    if subfolders and not any(n.lower().endswith((".tar", ".tfrecord")) for n in files):
        shown = ", ".join(map(repr, subfolders[:3])) + (" ..." if len(subfolders) > 3 else "")
        raise FileNotFoundError(
            f"no {_FORMATS[format]} shards in {folder!r}, but folders ({shown}): "
            "an image folder (one folder per class)? Read it with prefetch.Loader(folder) or "
            "prefetch.ImageFolder, or pack it into shards with `prefetch shards write FOLDER OUT`"
        )


_FORMATS = {"tar": "tar", "tfrecord": "TFRecord"}


def _remote_folder(url: str) -> RemoteTree | None:
    """The listing of `url` (no trailing "/", not named like a shard) when it lists as a
    folder (a store's prefix, or an http(s) folder answered with an index page), else None."""
    try:
        tree = RemoteTree(url)
    except (OSError, ValueError):
        return None
    return tree if tree.isdir(url) and tree.listdir(url) else None


def _expanded(names: list[str], format: str) -> list[str]:
    """The shards of each name a brace expression gave, in order; local names that match
    nothing are named together."""
    found: list[str] = []
    missing = []
    for name in names:
        try:
            found.extend(_one(name, format).shards)
        except FileNotFoundError:
            missing.append(name)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise FileNotFoundError(
            f"no {format} shards at {', '.join(map(repr, missing[:3]))}{more} (of the "
            f"{len(names)} names the braces give): check the range"
        )
    return found


def expand_braces(text: str) -> list[str]:
    """The names a brace expression gives, as webdataset's `braceexpand` does: `{a,b,c}`
    lists, `{0000..0099}` ranges (zero-padded to the wider end when either end starts with a
    0), `{0..10..2}` steps, nested; a brace without a comma or range is kept as is. More
    than `MAX_BRACE_NAMES` names raise ValueError."""
    start = 0
    while (opening := text.find("{", start)) >= 0:
        closing = _matching(text, opening)
        if closing < 0:
            return [text]
        options = _alternatives(text[opening + 1 : closing])
        if options is None:
            start = opening + 1
            continue
        heads = [text[:opening] + part for option in options for part in expand_braces(option)]
        tails = expand_braces(text[closing + 1 :])
        if len(heads) * len(tails) > MAX_BRACE_NAMES:
            raise ValueError(
                f"{text!r} expands to {len(heads) * len(tails)} names, more than "
                f"{MAX_BRACE_NAMES}: pass a pattern or a folder instead"
            )
        return [head + tail for head in heads for tail in tails]
    return [text]


def _matching(text: str, opening: int) -> int:
    depth = 0
    for position in range(opening, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return position
    return -1


def _alternatives(body: str) -> list[str] | None:
    """The alternatives of one brace's body: a range, or its top-level comma parts; None
    for a body that is neither (kept literally)."""
    match = _RANGE.fullmatch(body)
    if match:
        first, last, step_text = match.groups()
        step = abs(int(step_text)) if step_text else 1
        step = step or 1
        low, high = int(first), int(last)
        count = abs(high - low) // step + 1
        if count > MAX_BRACE_NAMES:
            raise ValueError(
                f"{{{body}}} expands to {count} names, more than {MAX_BRACE_NAMES}: pass a "
                "pattern or a folder instead"
            )
        padded = any(
            len(end.lstrip("-")) > 1 and end.lstrip("-")[0] == "0" for end in (first, last)
        )
        width = max(len(first), len(last)) if padded else 0
        values = range(low, high + 1, step) if low <= high else range(low, high - 1, -step)
        return [f"{value:0{width}d}" for value in values]
    parts, depth, start = [], 0, 0
    for position, char in enumerate(body):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(body[start:position])
            start = position + 1
    if not parts:
        return None
    return [*parts, body[start:]]


def _is_shard_name(name: str, format: str) -> bool:
    if not _not_index(name) or name.startswith(".") or is_manifest_name(name):
        return False
    return ".tfrecord" in name if format == "tfrecord" else name.lower().endswith(".tar")


def _not_index(path: str) -> bool:
    return not path.endswith(INDEX_SUFFIX) and not is_manifest_name(path)
