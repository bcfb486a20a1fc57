"""The manifest of a set of shards: what a complete set written by `prefetch shards write` is.

`prefetch shards write` leaves `<prefix>-<format>.manifest.json` beside the shards, written
last and atomically (`prefetch.tools.shards.write_shards`). It is JSON: the format version, the
shards' names, sizes in bytes, sample counts and SHA-256 digests, the class names as a JSON
list (any name, line breaks included, round-trips exactly), the image extensions written and
the writer's options. While a write is being committed the same file says `"complete": false`
and lists the renames still to do, so that an interrupted write is never read as a set.

Here: the manifest's layout (`Manifest`, read and written), its names, finding the manifest
beside a list of shards (`read_manifest`; `read_manifests` for shards of several folders or
prefixes: each group's own), and `classes.txt` (`class_names_beside`). What a
manifest makes of a folder, and the checks of a set against it, are in
`prefetch.sources.shards._set`. Everything here is a pure function of the bytes read; nothing
is kept between calls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from prefetch.io import beside, is_url, read_small

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
            "skipped": [
                {"file": file, "reason": reproducible(reason)} for file, reason in self.skipped
            ],
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


# What differs from run to run in an error's text: an object's memory address, as Pillow's
# "cannot identify image file <_io.BytesIO object at 0x7f93fad8d530>" holds.
_ADDRESS = re.compile(r" ?<[^<>]* at 0x[0-9a-fA-F]+>")


def reproducible(reason: str) -> str:
    """`reason` (a skipped file's, for the manifest) without what differs from run to run:
    an object's memory address (`<_io.BytesIO object at 0x...>`), so that the same files and
    options give the same manifest, byte for byte."""
    return _ADDRESS.sub("", reason)


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


def read_manifest_bytes(place: str) -> bytes:
    """The bytes of the manifest at `place` (a path or URL), at most `MAX_MANIFEST_BYTES`: a
    larger one is refused before it is read (ValueError naming it and the bound). OSError
    (FileNotFoundError when there is none) as `read_small`."""
    if not is_url(place):
        try:
            size = os.stat(place).st_size
        except FileNotFoundError:
            size = 0  # read_small says so
        if size > MAX_MANIFEST_BYTES:
            raise ValueError(
                f"{place!r} is {size:,} bytes, more than MAX_MANIFEST_BYTES="
                f"{MAX_MANIFEST_BYTES:,} (a manifest of about 100,000 shards): not a manifest "
                "`prefetch shards write` leaves. Write the shards again, or delete it to read "
                "the shards without one"
            )
    return read_small(place, MAX_MANIFEST_BYTES)


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
        data = read_manifest_bytes(place)
    except (FileNotFoundError, PermissionError):  # none (a store may answer 403 for none)
        return None
    return Manifest.from_bytes(data, place), place


def read_manifests(shards: Sequence[str], format: str) -> list[tuple[Manifest, str, list[str]]]:
    """For shards of several folders or prefixes: each group's manifest (the shards of one
    folder and one prefix of the writer's names, beside the manifest of that prefix), where
    it is, and the group's shards in their order; groups without a manifest are left out, as
    are shards without the writer's names. A manifest that cannot be read is an error naming
    it (`read_manifest`)."""
    groups: dict[str, list[str]] = {}
    for shard in shards:
        place = _beside(shard, format)
        if place is not None:
            groups.setdefault(place, []).append(shard)
    found = []
    for members in groups.values():
        manifest = read_manifest(members, format)
        if manifest is not None:
            found.append((*manifest, members))
    return found


def manifests_of(names: Sequence[str], format: str) -> list[str]:
    """The names among `names` that are manifests of `format` shards, sorted."""
    suffix = f"-{format}.manifest.json"
    return sorted(name for name in names if name.endswith(suffix) and len(name) > len(suffix))


def _beside(shard: str, format: str) -> str | None:
    prefix = shard_prefix(basename(shard), format)
    return None if prefix is None else beside(shard, manifest_name(format, prefix))


def basename(shard: str) -> str:
    """The file name of the shard at `shard` (a path or URL)."""
    return shard.rpartition("/")[2] if is_url(shard) else os.path.basename(shard)


def shown(names: Sequence[str]) -> str:
    """The first three of `names`, quoted, and how many more."""
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
