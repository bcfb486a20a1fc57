"""A folder's listing kept as a file, so that the ranks on a host and later runs list it once.

`load_or_list(key, folder, place, started_ns, list_now)` returns the `Listing` kept for `key`
in the folder `place` when it passes every check below, else lists now (`list_now()`) and
keeps the result (`prefetch.sources._listing_file` has the file). The first process to take
the key's lock (`fcntl.flock` on `<name>.lock` in that folder: the kernel releases it when its
holder dies, however it dies) lists and writes the file; the others wait on the lock, polling
(`prefetch.io.flock_within`: Ctrl-C interrupts the wait, and none waits past `LOCK_WAIT_S`:
then it lists for itself), and then read the file. The holder removes partial files of its key (only
a holder writes them: any found were left by one that was killed).

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
Anything else is listed again and the file replaced. A listing of a URL is never kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
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
    listing = list_now()
    if lock == _NOT_HELD:
        return listing, Outcome(False, None, waited)
    try:
        write_listing(folder, name, key, listing)
        # Its own arrays let go for the file's mapping: the lister shares the ranks' one copy.
        mapped = read_listing(folder, name + SUFFIX, key)
    except (OSError, Refused) as error:
        log.warning("prefetch: cannot keep the listing in %r (%s): not kept", path, error)
        return listing, Outcome(False, None, waited)
    return mapped or listing, Outcome(False, path, waited)


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
    try:
        flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
        handle = os.open(name + ".lock", flags, 0o600, dir_fd=folder)
    except OSError as error:
        log.warning("prefetch: cannot lock in %r (%s): listing without keeping", place, error)
        yield _NOT_HELD
        return
    try:
        lock = _NOT_HELD
        if private_file(os.fstat(handle)):
            lock = _wait_for(handle, place)
        else:
            log.warning("prefetch: lock file %r is not yours alone: not kept", name + ".lock")
        if lock != _NOT_HELD:
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
            with contextlib.suppress(OSError):
                for entry in os.listdir(folder):
                    if entry.startswith(f"{PARTIAL_PREFIX}{name}-"):
                        os.unlink(entry, dir_fd=folder)
        yield lock
    finally:
        os.close(handle)  # releases the lock


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
