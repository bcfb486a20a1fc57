"""The progress journal of a shard write: what lets a rerun continue an interrupted one, and
know a complete one.

While `write_shards` writes a set, each shard it finishes stays under its temporary name
(`OutFolder.write_temporary`) and gets one line in the folder's hidden progress journal,
`.<prefix>-<format>.progress.jsonl` (`progress_name`): its index, final and temporary names,
size, samples, SHA-256, skipped files and re-encoded count, appended and fsynced as the shard
completes. The journal's first line is the plan: the write's options and a fingerprint of the
input listing (`_listing_digest.ListingDigest`: each file's path, label, size and modification time,
in the listing's order; the written order follows from it and the options).

A rerun with the same plan (`resumable`) keeps the recorded shards whose temporary file is
still there with the recorded size and SHA-256 (hashed again), and writes only the others
(shards written by several workers finish in any order, so the recorded ones need not be the
first); the set's bytes are then those of an uninterrupted run.
A rerun with another plan starts over and says why (`Plan.difference`). Once the set is
committed (`_set`, after the manifest) the journal is replaced by two lines, the plan and
`{"complete": true, "manifest": <SHA-256 of the manifest's bytes>}` (`Journal.settle`: the
same files and options give the same bytes), and stays: the same write again finds its plan
there and the manifest it wrote in place (`written_by`), and says the set is already complete
instead of refusing it; a journal so marked is never resumed from. Readers never see it (a
hidden name) nor the temporary shards. One writer at a time (the folder's lock); not
thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefetch.tools.shards._out_folder import OutFolder

# The most bytes read of a progress journal (a line is about 200 bytes plus its skipped files).
MAX_PROGRESS_BYTES = 1 << 30
# Bytes hashed at a time when a recorded shard is checked again.
_HASH_CHUNK_BYTES = 1 << 20
# The journal's format, in its first line (2: the listing hashed in its own order, in bulk,
# its files' sizes and times by chunks of `_listing_digest.STAT_CHUNK`).
_VERSION = 2
# The key of the journal's second and last line once its set is committed.
_COMPLETE = "complete"


def progress_name(format: str, prefix: str) -> str:
    """The hidden name of the progress journal of the `format` shards named `prefix-...`."""
    return f".{prefix}-{format}.progress.jsonl"


@dataclass(frozen=True)
class Plan:
    """What a write will produce: its options (format, shard size, seed, ...), its files
    (how many and a SHA-256 of their listing: path, label, size, mtime; `ListingDigest`) and
    its shard names."""

    options: dict[str, Any]
    files: int
    listing: str
    shards: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """The journal's first line."""
        return {
            "progress": _VERSION,
            "options": self.options,
            "files": self.files,
            "listing": self.listing,
            "shards": list(self.shards),
        }

    def difference(self, record: dict[str, Any]) -> str | None:
        """Why the recorded plan `record` is not this one (for the message), or None."""
        if record.get("progress") != _VERSION:
            return "its progress journal is of another version"
        recorded = record.get("options")
        if recorded != self.options:
            if not isinstance(recorded, dict):
                return "its progress journal is damaged"
            changed = sorted(
                key
                for key in set(recorded) | set(self.options)
                if recorded.get(key) != self.options.get(key)
            )
            shown = ", ".join(
                f"{key} {recorded.get(key)!r} -> {self.options.get(key)!r}" for key in changed
            )
            return f"the options changed ({shown})"
        if record.get("files") != self.files:
            then = record.get("files")
            then_text = f"{then:,}" if isinstance(then, int) else repr(then)
            return f"the input folder changed ({then_text} files then, {self.files:,} now)"
        if record.get("listing") != self.listing or record.get("shards") != list(self.shards):
            return (
                f"the input folder changed (the same {self.files:,} files in number, but a "
                "name, class, size or modification time differs)"
            )
        return None


@dataclass(frozen=True)
class Done:
    """A shard the journal records as finished, under its temporary name."""

    index: int
    name: str
    temporary: str
    size: int
    samples: int
    sha256: str
    skipped: tuple[tuple[str, str], ...]
    resized: int

    def record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "temporary": self.temporary,
            "size": self.size,
            "samples": self.samples,
            "sha256": self.sha256,
            "skipped": [list(pair) for pair in self.skipped],
            "resized": self.resized,
        }

    @staticmethod
    def parse(record: Any) -> Done:
        """The shard of a journal line; ValueError (or KeyError, TypeError) when damaged."""
        done = Done(
            int(record["index"]),
            str(record["name"]),
            str(record["temporary"]),
            int(record["size"]),
            int(record["samples"]),
            str(record["sha256"]),
            tuple((str(path), str(reason)) for path, reason in record["skipped"]),
            int(record["resized"]),
        )
        return done


def resumable(
    out: OutFolder, name: str, plan: Plan, is_temporary: Callable[[str, str], bool]
) -> tuple[list[Done], str | None]:
    """The shards of an interrupted write of `plan` that are still good, by index, and why the
    journal `name` in `out` was not used (None when it was used, or there is none, or it is
    the journal of a complete set: nothing to resume). A shard is good when it is one of the
    plan's, and its temporary file (`is_temporary(temporary, final)` says it is the writer's)
    is there with the recorded size and SHA-256."""
    try:
        data = out.read_small(name, MAX_PROGRESS_BYTES)
    except OSError as error:
        return [], f"its progress journal cannot be read ({error})"
    if data is None:
        return [], None
    header, records, complete = _parse(data)
    if complete is not None:
        return [], None
    if header is None:
        return [], "its progress journal is damaged"
    why = plan.difference(header)
    if why is not None:
        return [], why
    done: dict[int, Done] = {}
    for shard in records:
        if not 0 <= shard.index < len(plan.shards) or shard.index in done:
            continue
        if shard.name != plan.shards[shard.index] or not is_temporary(shard.temporary, shard.name):
            continue
        if _holds(out, shard):
            done[shard.index] = shard
    return [done[index] for index in sorted(done)], None


def written_by(out: OutFolder, name: str, plan: Plan) -> tuple[list[Done], str | None] | None:
    """The shards the journal `name` records for `plan` (their files are not checked) and,
    when it is marked complete (`Journal.settle`), the SHA-256 of the manifest it wrote (else
    None); None when there is no such journal, it is damaged, or it is of another plan."""
    try:
        data = out.read_small(name, MAX_PROGRESS_BYTES)
    except OSError:
        return None
    if data is None:
        return None
    header, records, complete = _parse(data)
    if header is None or plan.difference(header) is not None:
        return None
    return records, complete


def _parse(data: bytes) -> tuple[dict[str, Any] | None, list[Done], str | None]:
    """A journal's plan record (None when damaged), its shards up to the first line cut short
    by an interruption, and the SHA-256 of the manifest its complete mark names (None: not
    marked complete)."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    header = header if isinstance(header, dict) else None
    records: list[Done] = []
    for line in lines[1:]:
        try:
            record = json.loads(line)
            if isinstance(record, dict) and record.get(_COMPLETE) is True:
                return header, records, str(record["manifest"])
            records.append(Done.parse(record))
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by the interruption
    return header, records, None


def _holds(out: OutFolder, shard: Done) -> bool:
    """Whether the temporary file of `shard` is there with its recorded size and SHA-256."""
    try:
        if out.size(shard.temporary) != shard.size:
            return False
        digest = hashlib.sha256()
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        handle = os.open(shard.temporary, flags, dir_fd=out.fd)
    except OSError:
        return False
    try:
        while chunk := os.read(handle, _HASH_CHUNK_BYTES):
            digest.update(chunk)
    finally:
        os.close(handle)
    return digest.hexdigest() == shard.sha256


class Journal:
    """The progress journal being written: `start(plan, done)` writes it afresh (the plan and
    the shards kept from an interrupted run), `append(shard)` adds a finished shard."""

    def __init__(self, out: OutFolder, name: str) -> None:
        self.out = out
        self.name = name

    def start(self, plan: Plan, done: list[Done]) -> None:
        lines = [plan.record(), *(shard.record() for shard in done)]
        text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)
        self.out.write_file(self.name, text.encode("utf-8", "surrogateescape"), "the progress")
        self.out.sync()

    def append(self, shard: Done) -> None:
        line = json.dumps(shard.record(), sort_keys=True) + "\n"
        self.out.append(self.name, line.encode("utf-8", "surrogateescape"), "the progress")

    def settle(self, plan: Plan, manifest: bytes) -> None:
        """Replace the journal by `plan` marked complete with the SHA-256 of `manifest`, the
        bytes of the manifest of its set, now committed (module docstring)."""
        mark = {_COMPLETE: True, "manifest": hashlib.sha256(manifest).hexdigest()}
        lines = [plan.record(), mark]
        text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in lines)
        self.out.write_file(self.name, text.encode("utf-8", "surrogateescape"), "the progress")

    def settled(self) -> bool:
        """Whether the folder's journal of this name is marked complete (`settle`)."""
        try:
            data = self.out.read_small(self.name, MAX_PROGRESS_BYTES)
        except OSError:
            return False
        return data is not None and _parse(data)[2] is not None

    def exists(self) -> bool:
        """Whether the folder holds a journal of this name (a regular file)."""
        return self.out.is_file(self.name)

    def remove(self) -> None:
        self.out.remove(self.name)
