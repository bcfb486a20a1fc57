"""The manifest of a set of shards: what a complete set written by `prefetch shards write` is.

`prefetch shards write` leaves `<prefix>-<format>.manifest.json` beside the shards, written
last and atomically (`prefetch.tools.shard_writer`). It is JSON: the format version, the
shards' names, sizes in bytes, sample counts and SHA-256 digests, the class names as a JSON
list (any name, line breaks included, round-trips exactly), the image extensions written and
the writer's options. While a write is being committed the same file says `"complete": false`
and lists the renames still to do, so that an interrupted write is never read as a set.

A manifest is the set. Where the folder a source reads (or the folder of its pattern) holds a
manifest of its format, `choose_set` makes the source read exactly the manifest's shards (those
the pattern selects); other files are named in one log line and left alone; two manifests of
the format, or a journal (an unfinished write), are an error naming them. Readers
(`check_shards`, `check_sizes`, `check_indexes`, `check_class_names`) then refuse a set whose
files disagree with it (a shard missing, an extra shard of its own names, another size or
sample count, a `classes.txt` naming other classes) naming the difference. `verify` (`prefetch
shards verify OUT`) makes every one of these checks, sizes before anything is hashed, then
every shard's SHA-256. Everything here is a pure function of the bytes read; nothing is kept
between calls.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Sequence
from typing import Any

from prefetch.io import beside, is_url, open_regular, read_small
from prefetch.sources.shards._index import IndexSpec, load_or_build

log = logging.getLogger("prefetch.loader")

# The version of the manifest's layout, its first key; a reader refuses a later one.
MANIFEST_VERSION = 1
# The key that holds the version (it also tells a manifest from any other JSON).
VERSION_KEY = "prefetch_shards_manifest"
# The most bytes read of a manifest: about 150 bytes a shard, so 100,000 shards. Parsed, JSON
# costs up to about 20 bytes of memory per byte (`[{},{},...]`): at most about 350 MB.
MAX_MANIFEST_BYTES = 16 << 20
# The file beside the shards that names the classes, one per line (the writer leaves one).
CLASSES_FILE = "classes.txt"
# The most bytes read of a class list.
MAX_CLASSES_BYTES = 16 << 20
# Bytes hashed at a time by `verify`.
_HASH_CHUNK = 4 << 20
# The shard names the writer gives, by format: (prefix, the rest).
_NAMES = {
    "tar": re.compile(r"(?P<prefix>.+)-\d{6,}\.tar"),
    "tfrecord": re.compile(r"(?P<prefix>.+)-\d{5,}-of-\d{5,}\.tfrecord"),
}


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One shard of a manifest: its file `name`, `size` in bytes, `samples`, `sha256` (hex)."""

    name: str
    size: int
    samples: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A set of shards (see the module docstring): its `format`, `prefix`, `shards`,
    `class_names`, the `image_extensions` written, the writer's `options`, the files it
    `skipped` (relative path, reason). While a write is committed (`complete` False) `moves`
    (temporary, final) and `remove` list what is still to do."""

    format: str
    prefix: str
    shards: tuple[ShardEntry, ...]
    class_names: tuple[str, ...]
    image_extensions: tuple[str, ...] = ()
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    skipped: tuple[tuple[str, str], ...] = ()
    complete: bool = True
    moves: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()

    def to_bytes(self) -> bytes:
        """The manifest as UTF-8 JSON (class names as a list: exact, whatever they hold)."""
        data: dict[str, Any] = {
            VERSION_KEY: MANIFEST_VERSION,
            "complete": self.complete,
            "format": self.format,
            "prefix": self.prefix,
            "samples": sum(entry.samples for entry in self.shards),
            "shards": [dataclasses.asdict(entry) for entry in self.shards],
            "class_names": list(self.class_names),
            "image_extensions": list(self.image_extensions),
            "options": self.options,
            "skipped": [{"file": file, "reason": reason} for file, reason in self.skipped],
        }
        if not self.complete:
            data["pending"] = {
                "moves": [list(move) for move in self.moves],
                "remove": list(self.remove),
            }
        return (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """The manifest in `data`; ValueError naming `where` when it is not one we can read."""
        try:
            raw = json.loads(data.decode("utf-8"))
            version = raw[VERSION_KEY]
            if version != MANIFEST_VERSION:
                raise ValueError(
                    f"{where!r} is a shard manifest of version {version!r}; this prefetch reads "
                    f"version {MANIFEST_VERSION}: upgrade prefetch, or write the shards again"
                )
            pending = raw.get("pending") or {}
            manifest = cls(
                format=_text(raw["format"]),
                prefix=_text(raw["prefix"]),
                shards=tuple(_entry(entry) for entry in raw["shards"]),
                class_names=tuple(_text(name) for name in raw["class_names"]),
                image_extensions=tuple(_text(ext) for ext in raw.get("image_extensions", [])),
                options=dict(raw.get("options", {})),
                skipped=tuple(
                    (_text(item["file"]), _text(item["reason"])) for item in raw.get("skipped", [])
                ),
                complete=_bool(raw["complete"]),
                moves=tuple((_name(a), _name(b)) for a, b in pending.get("moves", [])),
                remove=tuple(_name(name) for name in pending.get("remove", [])),
            )
        except ValueError as error:
            if where in str(error):
                raise
            raise ValueError(f"{where!r} is not a readable shard manifest: {error}") from None
        except (KeyError, TypeError, AttributeError, RecursionError) as error:
            raise ValueError(
                f"{where!r} is not a readable shard manifest ({type(error).__name__}: {error}): "
                "write the shards again, or delete it to read the shards without one"
            ) from None
        if manifest.format not in _NAMES or any(
            shard_prefix(entry.name, manifest.format) != manifest.prefix
            for entry in manifest.shards
        ):
            raise ValueError(f"{where!r} lists shards that are not of its format and prefix")
        return manifest


def manifest_name(format: str, prefix: str) -> str:
    """The file name of the manifest of the `format` shards named `prefix-...`."""
    return f"{prefix}-{format}.manifest.json"


def is_manifest_name(name: str) -> bool:
    """Whether the file name `name` is a manifest's (never a shard)."""
    return name.endswith(".manifest.json")


def shard_prefix(name: str, format: str) -> str | None:
    """The prefix of a shard file name as the writer gives them (`shard-000003.tar`,
    `train-00001-of-00004.tfrecord`), or None for another name."""
    match = _NAMES[format].fullmatch(name) if format in _NAMES else None
    return match.group("prefix") if match else None


def read_manifest(shards: Sequence[str], format: str) -> tuple[Manifest, str] | None:
    """The manifest beside `shards` (paths or URLs) and where it is, or None when there is
    none. Shards of several folders or prefixes, or names the writer does not give, have
    none. A manifest that cannot be read (not a regular file, too large, not a manifest) is
    an error naming it."""
    places = {_beside(shard, format) for shard in shards}
    if len(places) != 1 or None in places:
        return None
    (place,) = places
    assert place is not None
    try:
        data = read_small(place, MAX_MANIFEST_BYTES)
    except (FileNotFoundError, PermissionError):  # none (a store may answer 403 for none)
        return None
    return Manifest.from_bytes(data, place), place


@dataclasses.dataclass(frozen=True)
class ChosenSet:
    """The set a folder's manifest makes of it: the `manifest`, `where` it is, and the `names`
    of its shards to read (those the folder or pattern selects), in the manifest's order."""

    manifest: Manifest
    where: str
    names: list[str]


def manifests_of(names: Sequence[str], format: str) -> list[str]:
    """The names among `names` that are manifests of `format` shards, sorted."""
    suffix = f"-{format}.manifest.json"
    return sorted(name for name in names if name.endswith(suffix) and len(name) > len(suffix))


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
            f"({_shown(manifests)}): one folder holds one set of a format. Move each set to a "
            "folder of its own, or pass the shards of one as a list"
        )
    where = _join(folder, manifests[0])
    manifest = Manifest.from_bytes(read_small(where, MAX_MANIFEST_BYTES), where)
    if manifest.format != format or manifest_name(format, manifest.prefix) != manifests[0]:
        raise ValueError(
            f"{where!r} describes {manifest.format} shards named {manifest.prefix!r}-..., not "
            "the set its name says: write the shards again"
        )
    listed = [entry.name for entry in manifest.shards]
    check_shards(manifest, where, [n for n in selected if n in set(listed)], None)
    extra = [n for n in selected if n not in set(listed)]
    own = [n for n in extra if shard_prefix(n, format) == manifest.prefix]
    if own:
        check_shards(manifest, where, own, None)  # raises, naming them
    present = set(names)
    chosen = [name for name in listed if fnmatch.fnmatchcase(name, selects)]
    missing = [name for name in chosen if name not in present]
    if missing:
        raise ValueError(
            f"the set of {where!r} is missing {_shown(missing)}: copy "
            f"{'it' if len(missing) == 1 else 'them'} back, or write the shards again"
        )
    if extra:
        log.warning(
            "prefetch: reading the %d shards that %r lists; left alone (not in it): %s",
            len(chosen),
            where,
            _shown(extra),
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
    names = [_basename(shard) for shard in shards]
    listed = {entry.name for entry in manifest.shards}
    extra = [name for name in names if name not in listed]
    if extra:
        raise ValueError(
            f"{_shown(extra)} beside {where!r} {'is' if len(extra) == 1 else 'are'} not in the "
            "manifest of the set: left from another write? Remove "
            f"{'it' if len(extra) == 1 else 'them'}, or write the shards again"
        )
    if selects is not None:
        found = set(names)
        missing = [n for n in sorted(listed) if fnmatch.fnmatch(n, selects) and n not in found]
        if missing:
            raise ValueError(
                f"the set of {where!r} is missing {_shown(missing)}: copy "
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
            f"{beside_it!r} names {len(names)} classes ({_shown(names)}) and {where!r} "
            f"names {len(manifest.class_names)} ({_shown(list(manifest.class_names))}): one "
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
        entry = entries[_basename(shard)]
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


def _beside(shard: str, format: str) -> str | None:
    prefix = shard_prefix(_basename(shard), format)
    return None if prefix is None else beside(shard, manifest_name(format, prefix))


def _basename(shard: str) -> str:
    return shard.rpartition("/")[2] if is_url(shard) else os.path.basename(shard)


def _shown(names: Sequence[str]) -> str:
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return ", ".join(repr(name) for name in names[:3]) + more


def _entry(raw: Any) -> ShardEntry:
    entry = ShardEntry(
        name=_name(raw["name"]),
        size=_count(raw["size"]),
        samples=_count(raw["samples"]),
        sha256=_text(raw["sha256"]),
    )
    return entry


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r:.60}")
    return value


def _name(value: Any) -> str:
    """A plain file name of the shard folder: never a path, never '.' or '..'."""
    name = _text(value)
    if not name or name in (".", "..") or "/" in name or "\0" in name or os.sep in name:
        raise ValueError(f"{name!r:.80} is not a plain file name")
    return name


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a count >= 0, got {value!r:.60}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r:.60}")
    return value


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
