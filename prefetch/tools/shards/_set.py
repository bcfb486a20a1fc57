"""Committing a set of shards: all of the new set, or (after a crash) none of it yet.

The writer (`_writer`) first writes every shard of the new set under a
temporary name (`OutFolder.write_temporary`); readers see nothing of it. `commit` then:

1. puts a *journal* at the manifest's name: the new manifest with `"complete": false` and the
   renames and removals still to do. From here readers refuse the set, naming the reason;
2. renames each temporary shard to its final name, removes the old set's shards that the new
   one does not have (and their index files), writes (or removes) `classes.txt`;
3. replaces the journal with the complete manifest.

Ctrl-C is held back during these steps (a few renames) and delivered after. A crash or an
error (a full disk) between 1 and 3 leaves the journal: the next write into the folder with
the same prefix and format finishes it (`roll_forward`), or, when a temporary file is gone,
says what to run. Before step 1 the old set is untouched; after step 3 the new one is whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from prefetch.sources.shards import (
    INDEX_SUFFIX,
    MAX_MANIFEST_BYTES,
    Manifest,
    manifest_name,
    shard_prefix,
)
from prefetch.tools.shards._out_folder import TEMPORARY_SUFFIX, TOKEN_BYTES, OutFolder

# The class names, one per line, written beside the shards when no name holds a line break.
CLASSES_FILE = "classes.txt"


def read_manifest(out: OutFolder, format: str, prefix: str) -> Manifest | None:
    """The manifest (or journal) of the `format` shards named `prefix-...` in `out`, None when
    there is none; OSError or ValueError naming it when it cannot be read."""
    name = manifest_name(format, prefix)
    data = out.read_small(name, MAX_MANIFEST_BYTES)
    return None if data is None else Manifest.from_bytes(data, out.where(name))


def commit(
    out: OutFolder, manifest: Manifest, moves: list[tuple[str, str]], stale: list[str]
) -> None:
    """Put the new set in place (the module docstring's steps 1 to 3): `moves` are the
    (temporary, final) names of its shards, `stale` the old shards to remove. When the
    journal cannot be written the temporary shards are removed (the old set stays); after
    it, an error leaves them for the next write to finish."""
    journal = dataclasses.replace(manifest, complete=False, moves=tuple(moves), remove=tuple(stale))
    with _interrupt_held():
        try:
            out.write_file(
                manifest_name(manifest.format, manifest.prefix), journal.to_bytes(), "the journal"
            )
            out.sync()
        except BaseException:
            for temporary, _ in moves:
                out.remove(temporary)
            raise
        _finish(out, journal)


def roll_forward(out: OutFolder, journal: Manifest) -> str | None:
    """Finish the interrupted commit of `journal`; None when done, else why it cannot be
    (a temporary shard is gone, or the journal names files that are not its own)."""
    problem = _foreign_names(journal)
    if problem:
        return problem
    entries = {entry.name: entry for entry in journal.shards}
    for temporary, final in journal.moves:
        if out.is_file(temporary):
            continue
        try:
            size = out.size(final)
        except FileNotFoundError:
            return f"{final!r} and its temporary file {temporary!r} are both missing"
        if size != entries[final].size:
            return f"{final!r} is {size} bytes, the journal says {entries[final].size}"
    with _interrupt_held():
        _finish(out, journal)
    return None


def temporaries(journal: Manifest) -> list[str]:
    """The temporary files a journal names that are the writer's (to remove when it is
    abandoned)."""
    return [temporary for temporary, final in journal.moves if is_temporary(temporary, final)]


def classes_text(names: tuple[str, ...]) -> str | None:
    """`classes.txt`'s text for `names` (one per line), None when a name holds a line break
    (`\\n` or `\\r`) or is empty: then only the manifest can name the classes."""
    if any(not name or "\n" in name or "\r" in name for name in names):
        return None
    return "".join(f"{name}\n" for name in names)


def _finish(out: OutFolder, journal: Manifest) -> None:
    """Steps 2 and 3 of the module docstring, for `journal`."""
    for temporary, final in journal.moves:
        if out.is_file(temporary):
            out.replace(temporary, final)
    for name in journal.remove:
        out.remove(name)
        out.remove(name + INDEX_SUFFIX)
    text = classes_text(journal.class_names)
    if text is None:
        out.remove(CLASSES_FILE)
    else:
        out.write_file(CLASSES_FILE, text.encode("utf-8"), "the class list")
    out.sync()
    complete = dataclasses.replace(journal, complete=True, moves=(), remove=())
    out.write_file(
        manifest_name(journal.format, journal.prefix), complete.to_bytes(), "the manifest"
    )
    out.sync()


def _foreign_names(journal: Manifest) -> str | None:
    """Why a journal read from the folder names files that are not its set's, or None."""
    finals = {entry.name for entry in journal.shards}
    for temporary, final in journal.moves:
        if final not in finals or not is_temporary(temporary, final):
            return f"it names {temporary!r} -> {final!r}, not a shard of the set"
    for name in journal.remove:
        if shard_prefix(name, journal.format) != journal.prefix:
            return f"it names {name!r} to remove, not a shard of prefix {journal.prefix!r}"
    return None


def is_temporary(temporary: str, final: str) -> bool:
    """Whether `temporary` is a name `OutFolder.write_temporary` gives a file for `final`."""
    pattern = rf"\.{re.escape(final)}\.[0-9a-f]{{{2 * TOKEN_BYTES}}}{re.escape(TEMPORARY_SUFFIX)}"
    return re.fullmatch(pattern, temporary) is not None


@contextlib.contextmanager
def _interrupt_held() -> Iterator[None]:
    """Hold Ctrl-C (SIGINT) back while the block runs, then deliver it (main thread only:
    elsewhere a signal never interrupts the block)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append((number, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(*caught[0])
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt
