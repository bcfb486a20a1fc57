"""A folder's listing kept as a file, so that the ranks on a host and later runs list it once.

`load_or_list(key, folder, place, started_ns, list_now)` returns the `Listing` kept for `key`
in the folder `place` when it passes every check below, else lists now (`list_now()`) and
keeps the result (`prefetch.sources._listing_file` has the file). The first process to take
the key's lock (`fcntl.flock` on `<name>.lock` in that folder: the kernel releases it when its
holder dies, however it dies) lists and writes the file; the others wait on the lock, polling
(`prefetch.io.flock_within`: Ctrl-C interrupts the wait, and none waits past `LOCK_WAIT_S`:
then it lists for itself), and then read the file. The holder removes partial files of its key (only
a holder writes them: any found were left by one that was killed). A lock is held only on the
file that bears the lock's name when it is taken (a lock file removed meanwhile is opened
again), so that removing a lock file never lets two processes hold the same key's lock.

A kept listing is used only when:
- the folder holding it is the user's own and no one else may write to it (checked by the
  caller, `prefetch.io.open_private_folder`), and the file is a regular file of the user's,
  not writable by group or others (`read_listing`);
- its checksum, magic, version and key (the folder as given and the working directory for a
  relative one, the host, the options, the extensions) match, and its arrays are well formed;
- every folder it walked has the stamp it had (`Listing.changed`);
- and no folder had changed within `RACY_NS` before the listing began (a change in the same
  clock tick as the stamp would leave it unchanged), unless the caller began before the
  listing did (its own listing would not have been newer).
Anything else is listed again and the file replaced. A listing of a URL is never kept, and
nor is a listing that failed (the lister raises before anything is written).

Kept listings are pruned (`prune`): after writing a listing, the writer looks at up to
`PRUNE_KEYS` other keys of the folder, at random, and removes the files of each (its listing,
its partial files, then its lock file) that was not used for `UNUSED_S` (30 days: a reader
that uses a listing marks it used once a day, a holder by writing its lock file), only while
holding that key's lock, taken without waiting: never a key another process holds locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prefetch.io import flock_within
from prefetch.sources._listing_file import (
    PARTIAL_PREFIX,
    SUFFIX,
    Listing,
    Refused,
    private_file,
    read_listing,
    write_listing,
)

log = logging.getLogger("prefetch.loader")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# Waiters say whom they wait for after LOCK_SAY_S, and list for themselves after LOCK_WAIT_S
# (a holder stopped with Ctrl-Z).
LOCK_SAY_S = 10.0
LOCK_WAIT_S = 600.0
# What taking the lock came to (`_locked`).
_NOT_HELD, _HELD, _WAITED = 0, 1, 2
# A lock file removed while it was waited on is opened again, at most this many times.
LOCK_TRIES = 5
# A key whose files nobody used for this long is removed by the next writer of the folder
# (`prune`), which looks at most at PRUNE_KEYS other keys per listing written.
UNUSED_S = 30 * 24 * 3600
PRUNE_KEYS = 32
# The files of a key: its listing, its lock file, its partial files.
_KEY_FILE = re.compile(r"\.partial-([0-9a-f]{32})-[0-9a-f]+|([0-9a-f]{32})\.(?:listing|lock)")


def key_name(key: str) -> str:
    """The file name (less its suffix) of the listing kept for `key`."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class Outcome:
    """How `load_or_list` got its listing: `read` from the kept `file` (else listed now; None:
    nothing kept), after `waited_s` seconds on another process's lock."""

    read: bool
    file: str | None
    waited_s: float


def load_or_list(
    key: str, folder: int, place: str, started_ns: int, list_now: Callable[[], Listing]
) -> tuple[Listing, Outcome]:
    """The listing for `key` kept in the folder `folder` (a descriptor of `place`, checked by
    the caller), or `list_now()` kept there; see the module docstring. A process that had to
    wait for the lock lets it go at once and reads the kept listing without it, so that the
    waiters of a host read at the same time, not one after another."""
    name = key_name(key)
    path = os.path.join(place, name + SUFFIX)
    kept = _read_usable(folder, name, key, started_ns, path, say=False)
    if kept is not None:
        return kept, Outcome(True, path, 0.0)
    start = time.monotonic()
    with _locked(folder, name, place) as lock:
        if lock != _WAITED:  # nobody was listing: list here
            return _list_and_keep(folder, name, key, started_ns, path, lock, list_now, start)
    waited = time.monotonic() - start
    kept = _read_usable(folder, name, key, started_ns, path, say=True)
    if kept is not None:  # kept by the process waited for
        return kept, Outcome(True, path, waited)
    with _locked(folder, name, place) as lock:  # it kept none that serves: list here
        return _list_and_keep(folder, name, key, started_ns, path, lock, list_now, start)


def _list_and_keep(
    folder: int,
    name: str,
    key: str,
    started_ns: int,
    path: str,
    lock: int,
    list_now: Callable[[], Listing],
    start: float,
) -> tuple[Listing, Outcome]:
    """Holding the lock (unless `lock` is `_NOT_HELD`): the kept listing if one was just
    written, else `list_now()`, kept. `start`: when the wait for the lock began."""
    waited = time.monotonic() - start
    if lock != _NOT_HELD:
        kept = _read_usable(folder, name, key, started_ns, path, say=True)
        if kept is not None:
            return kept, Outcome(True, path, waited)
    listing = list_now()  # raises when the folder cannot be listed whole: nothing is kept
    if lock == _NOT_HELD:
        return listing, Outcome(False, None, waited)
    try:
        write_listing(folder, name, key, listing)
    except OSError as error:
        log.warning("prefetch: cannot keep the listing in %r (%s): not kept", path, error)
        return listing, Outcome(False, None, waited)
    removed = prune(folder, name)
    if removed:
        days = UNUSED_S / 86400
        place = os.path.dirname(path)
        log.info(
            "prefetch: removed %d kept listings unused for %g days from %r", removed, days, place
        )
    return listing, Outcome(False, path, waited)


def _read_usable(
    folder: int, name: str, key: str, started_ns: int, path: str, say: bool
) -> Listing | None:
    """The kept listing when it passes every check; None otherwise (the reason logged when
    `say`)."""
    try:
        listing = read_listing(folder, name + SUFFIX, key)
        if listing is None:
            return None
        reason = listing.changed()
        if reason is None and listing.racy() and started_ns > listing.listed_ns:
            reason = "a folder changed just before it was listed"
    except Refused as error:
        reason = str(error)
    if reason is None:
        return listing
    if say:
        log.info("prefetch: the kept listing %r is not used (%s): listing the folder", path, reason)
    return None


@contextlib.contextmanager
def _locked(folder: int, name: str, place: str) -> Iterator[int]:
    """Hold the lock of `name` for the block: `_HELD` when taken at once, `_WAITED` when taken
    after another process let it go, `_NOT_HELD` when it could not be taken (locks not
    supported there, or waited past `LOCK_WAIT_S`): then list without keeping. The holder
    writes its pid into the lock file and removes the partial files of `name` (only a holder
    writes them: any there were left by a holder that was killed)."""
    handle, lock = _take_lock(folder, name, place)
    try:
        if handle is not None and lock != _NOT_HELD:
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
            with contextlib.suppress(OSError):
                for entry in os.listdir(folder):
                    if entry.startswith(f"{PARTIAL_PREFIX}{name}-"):
                        os.unlink(entry, dir_fd=folder)
        yield lock
    finally:
        if handle is not None:
            os.close(handle)  # releases the lock


def _take_lock(folder: int, name: str, place: str) -> tuple[int | None, int]:
    """The open lock file of `name` and what taking its lock came to (`_locked`). A lock taken
    on a file that no longer bears the name (removed by `prune` while waited on) is let go,
    and the file bearing it now is locked instead."""
    flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
    for _ in range(LOCK_TRIES):
        try:
            handle = os.open(name + ".lock", flags, 0o600, dir_fd=folder)
        except OSError as error:
            log.warning("prefetch: cannot lock in %r (%s): listing without keeping", place, error)
            return None, _NOT_HELD
        info = os.fstat(handle)
        if not private_file(info):
            log.warning("prefetch: lock file %r is not yours alone: not kept", name + ".lock")
            return handle, _NOT_HELD
        lock = _wait_for(handle, place)
        if lock == _NOT_HELD or _names(folder, name + ".lock", info):
            return handle, lock
        os.close(handle)
    log.warning("prefetch: the lock file of %r in %r kept being removed: not kept", name, place)
    return None, _NOT_HELD


def _names(folder: int, file_name: str, info: os.stat_result) -> bool:
    """Whether `file_name` in `folder` is the file of `info` (not a link, not removed)."""
    try:
        now = os.stat(file_name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def prune(folder: int, own: str) -> int:
    """Remove the kept listings of `folder` that nobody used for `UNUSED_S`, looking at up to
    `PRUNE_KEYS` keys other than `own` (at random), each only under its lock taken without
    waiting (see the module docstring); the number of keys removed. Best effort: an error
    leaves that key as it is."""
    keys: dict[str, list[str]] = {}
    try:
        for entry in os.listdir(folder):
            match = _KEY_FILE.fullmatch(entry)
            key = match and (match.group(1) or match.group(2))
            if key and key != own:
                keys.setdefault(key, []).append(entry)
    except OSError:
        return 0
    cutoff_ns = time.time_ns() - UNUSED_S * 10**9
    removed = 0
    for key in random.sample(sorted(keys), min(PRUNE_KEYS, len(keys))):
        with contextlib.suppress(OSError):
            removed += _prune_key(folder, key, keys[key], cutoff_ns)
    return removed


def _prune_key(folder: int, key: str, entries: list[str], cutoff_ns: int) -> bool:
    """Remove `entries` (the files of `key`) and its lock file when none was used after
    `cutoff_ns`, holding the key's lock; whether they were removed."""
    if _last_used_ns(folder, entries) > cutoff_ns:
        return False
    flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
    handle = os.open(key + ".lock", flags, 0o600, dir_fd=folder)
    try:
        info = os.fstat(handle)
        if not private_file(info) or not flock_within(handle, fcntl.LOCK_EX, 0):
            return False  # another process holds it: in use
        files = [entry for entry in entries if not entry.endswith(".lock")]
        if _last_used_ns(folder, files) > cutoff_ns or not _names(folder, key + ".lock", info):
            return False  # used, or its lock file replaced, since it was looked at
        for entry in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=folder)
        os.unlink(key + ".lock", dir_fd=folder)
        return True
    finally:
        os.close(handle)


def _last_used_ns(folder: int, entries: list[str]) -> int:
    """The latest modification time of `entries` in `folder` (0 when none is there)."""
    latest = 0
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            info = os.stat(entry, dir_fd=folder, follow_symlinks=False)
            latest = max(latest, info.st_mtime_ns)
    return latest


def _wait_for(handle: int, place: str) -> int:
    """Take the lock on `handle`, polling: `_HELD`, `_WAITED` or `_NOT_HELD` (`_locked`)."""
    try:
        if flock_within(handle, fcntl.LOCK_EX, 0):
            return _HELD
        if flock_within(handle, fcntl.LOCK_EX, LOCK_SAY_S):
            return _WAITED
        log.info("prefetch: waiting for process %s to list into %r", _holder(handle), place)
        if flock_within(handle, fcntl.LOCK_EX, LOCK_WAIT_S - LOCK_SAY_S):
            return _WAITED
    except OSError as error:  # ENOLCK, EOPNOTSUPP: no locks on this filesystem
        log.warning("prefetch: cannot lock in %r (%s): listing without keeping", place, error)
        return _NOT_HELD
    log.warning(
        "prefetch: waited %.0f s for process %s listing into %r: listing without it",
        LOCK_WAIT_S,
        _holder(handle),
        place,
    )
    return _NOT_HELD


def _holder(handle: int) -> str:
    """The pid the lock's holder wrote into the lock file, as text ("?" when unknown)."""
    with contextlib.suppress(OSError, ValueError):
        return str(int(os.pread(handle, 32, 0)))
    return "?"
