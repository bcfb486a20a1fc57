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

from prefetch.io import RemoteTree, beside, is_url, local_path, read_small
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.sources.shards._manifest import is_manifest_name

# The file beside the shards that names the classes, one per line (the writer leaves one).
CLASSES_FILE = "classes.txt"
# The most bytes read of a class list.
MAX_CLASSES_BYTES = 16 << 20
# The most names one brace expression may expand to (`{0..999999999}` is refused, not built).
MAX_BRACE_NAMES = 1_000_000
_PATTERN_CHARS = frozenset("*?[")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?")


@dataclasses.dataclass(frozen=True)
class ShardFiles:
    """The shards `files` names, in order, and `selects`: the pattern of file names a folder
    or pattern selects in its folder ("*" for a folder), None for files named one by one."""

    shards: list[str]
    selects: str | None


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
    selects: str | None = None
    if is_url(name):
        if name.endswith("/"):
            found, selects = _remote_matches(name + "*", format), "*"
        else:
            found = _remote_matches(name, format)
            selects = name.rpartition("/")[2] if _PATTERN_CHARS & set(name) else None
    elif os.path.isdir(local_path(name)):
        folder = local_path(name)
        found = sorted(
            os.path.join(folder, entry)
            for entry in os.listdir(folder)
            if _is_shard_name(entry, format) and os.path.isfile(os.path.join(folder, entry))
        )
        selects = "*"
    elif _PATTERN_CHARS & set(name):
        found = sorted(path for path in glob.glob(local_path(name)) if _not_index(path))
        selects = os.path.basename(name)
    else:
        found = [name] if os.path.exists(local_path(name)) else []
    if not found:
        raise FileNotFoundError(
            f"no {format} shards at {name!r}: pass a shard file, a folder of them, a pattern "
            f"such as 'shards/*{'.tfrecord' if format == 'tfrecord' else '.tar'}', or a list"
        )
    return ShardFiles(found, selects)


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


def _remote_matches(url: str, format: str) -> list[str]:
    """The URLs a URL pattern names, from one listing of its folder (bounded as any
    listing: `RemoteTree`); a URL without a pattern is taken as is. The pattern
    `*` of a folder URL (`.../shards/`) takes the files that are shards of `format`."""
    folder, _, pattern = url.rpartition("/")
    if not _PATTERN_CHARS & set(pattern):
        return [url]
    if _PATTERN_CHARS & set(folder):
        raise ValueError(f"{url!r}: a URL pattern may have wildcards in its last part only")
    tree = RemoteTree(folder)
    names = [name for name in tree.listdir(folder) if not tree.isdir(f"{folder}/{name}")]
    if pattern == "*":
        names = [name for name in names if _is_shard_name(name, format)]
    return sorted(
        f"{folder}/{name}" for name in names if fnmatch.fnmatch(name, pattern) and _not_index(name)
    )


def class_names_beside(shard: str) -> list[str] | None:
    """The class names in `classes.txt` beside `shard` (`parse_class_names`), or None when
    there is none (or none readable)."""
    place = beside(shard, CLASSES_FILE)
    try:
        data = read_small(place, MAX_CLASSES_BYTES)
    except OSError:  # none (or none readable): the labels' numbers name the classes
        return None
    return parse_class_names(data, place) or None


def parse_class_names(data: bytes, where: str) -> list[str]:
    """The class names of a `classes.txt`'s bytes: strict UTF-8, one name per line, split on
    `\\n` only (a name may hold any other character; a `\\r` before the `\\n` is dropped);
    blank lines at the end are not names. ValueError naming `where` when it is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where!r} is not UTF-8 text (byte {error.start} is not): write it as UTF-8, one "
            "class name per line, or pass class_names="
        ) from None
    names = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    while names and not names[-1]:
        names.pop()
    return names
