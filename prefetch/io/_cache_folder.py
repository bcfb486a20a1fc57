"""A cache folder held by each process that uses it: checked, swept, counted, shared.

`CacheFolder.open(folder, limit)` checks (or creates) the folder (`prefetch.io._private`)
and holds it by a descriptor, in each process that uses it (a pickled `CacheFolder` opens it
again, and refuses another folder found at its path); every file in it is reached through that
descriptor. Processes share the folder by the rules of `prefetch.io._cache_ledger` (a ledger of
its bytes, a lock per object, pins, eviction of the least recently read copies): each holds a
shared flock on the folder's `.users` file while it uses it, so `open` can tell when it is
alone, and then recounts the folder's bytes from its files. `open` removes what killed
processes left (partial copies and lock files whose object's lock is free). `pinned_copy`
keeps a named copy (a shard of the spool); `ObjectCache` (`prefetch.io._cache`) keeps copies
of URLs. Thread-safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

from prefetch.io._cache_files import (
    EPOCH_PREFIX,
    LOCK_PREFIX,
    PARTIAL_PREFIX,
    USERS,
    is_key,
    key_of,
    odd_entry,
    open_own,
    pin,
    unlock_object,
)
from prefetch.io._cache_ledger import LEDGER_WAIT_S, Ledger
from prefetch.io._counts import CacheCounts
from prefetch.io._private import flock_within, open_private_folder
from prefetch.io._remote_options import active_options
from prefetch.io._retries import READ_RETRIES

# A partial copy with a name of an older prefetch (not a key) older than this was left by a
# killed worker, and `open` removes it; one with a key is removed once its lock is free.
PARTIAL_MAX_AGE_S = 3600.0
# Where a process reaches a file through a descriptor of its folder (Linux); elsewhere files
# are handed to decoders by the folder's path.
PROC_FD = "/proc/self/fd"

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
C = TypeVar("C", bound="CacheFolder")


class CacheFolder:
    """A cache folder `folder` of at most `limit` bytes of copies (None: no bound), held in
    this process; see the module docstring.

    Make one with `open(folder, limit)`. `device` and `inode` identify the folder that was
    checked; a copy in another process (pickled) refuses any other.
    """

    def __init__(self, folder: str, device: int, inode: int, limit: int | None = None) -> None:
        self.folder = folder
        self.device = device
        self.inode = inode
        self.limit = limit
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._ledger: Ledger | None = None
        self._pid = 0
        self._fetched_bytes = 0
        self._taken = (0, 0)  # the ledger's (evictions, evicted_bytes) last taken

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.folder, self.device, self.inode, self.limit)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheFolder):
            return NotImplemented
        return self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash((self.folder, self.device, self.inode, self.limit))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.folder!r}, limit={self.limit})"

    @classmethod
    def open(cls: type[C], folder: str | os.PathLike[str], limit: int | None = None) -> C:
        """The cache in `folder`, created (mode 0700) when missing, held by a descriptor, with
        at most `limit` bytes of copies (None: no bound). What killed processes left there is
        removed; a process that opens the folder alone recounts its bytes.

        Raises ValueError naming the folder and the fix when it is a symbolic link or not a
        folder, another user owns it, its group or other users may write to it, or a folder
        above it lets another user swap it.
        """
        path = os.path.abspath(os.fspath(folder))
        with contextlib.suppress(FileExistsError):  # a file there is refused below
            os.makedirs(path, mode=0o700, exist_ok=True)
        handle = open_private_folder(path, "cache_dir")
        info = os.fstat(handle)
        cache = cls(path, info.st_dev, info.st_ino, limit)
        users = _users_of(handle)
        alone = flock_within(users, fcntl.LOCK_EX, 0)  # no other process uses the folder
        cache._adopt(handle, users, alone)
        cache._sweep(alone)
        if alone:
            fcntl.flock(users, fcntl.LOCK_SH)  # others may use it now
        return cache

    def _adopt(self, handle: int, users: int, alone: bool = False) -> None:
        """Use the folder by `handle` in this process: its ledger, and a shared flock on its
        `.users` file (`users`), held while the process uses the folder (`open` takes it
        exclusive when no other process holds it: `alone`, it sweeps and recounts before
        others may use the folder)."""
        try:
            if not alone:
                flock_within(users, fcntl.LOCK_SH, LEDGER_WAIT_S)  # after another's sweep
            ledger = Ledger(handle, self.limit)
        except BaseException:
            os.close(users)
            os.close(handle)
            raise
        self._fd, self._ledger, self._pid = handle, ledger, os.getpid()
        weakref.finalize(self, _close, handle, users, ledger)

    def _dir(self) -> int:
        """The descriptor of the folder in this process (opened and checked on first use in a
        worker process; ValueError if the folder at the path is no longer the one checked)."""
        with self._lock:
            if self._fd is None or self._pid != os.getpid():
                handle = open_private_folder(self.folder, "cache_dir")
                info = os.fstat(handle)
                if (info.st_dev, info.st_ino) != (self.device, self.inode):
                    os.close(handle)
                    raise ValueError(
                        f"cache_dir {self.folder!r} was replaced by another folder after the "
                        "loader checked it: its copies could be anyone's; give the folder again"
                    )
                self._adopt(handle, _users_of(handle))
            assert self._fd is not None
            return self._fd

    def _books(self) -> Ledger:
        self._dir()
        assert self._ledger is not None
        return self._ledger

    def _sweep(self, alone: bool) -> None:
        """Remove what killed processes left (those whose object's lock is free): partial
        copies and lock files, returning the bytes they had reserved (`Ledger.lock`); alone,
        also the loaders' epoch marks, and recount the folder's bytes from its files."""
        handle, ledger = self._dir(), self._books()
        now = time.time()
        prefixes = (PARTIAL_PREFIX, LOCK_PREFIX) + ((EPOCH_PREFIX,) if alone else ())
        with os.scandir(handle) as entries:
            left = [e.name for e in entries if e.name.startswith(prefixes)]
        for name in left:
            partial = name.startswith(PARTIAL_PREFIX)
            key = key_of(name) if partial else name[len(LOCK_PREFIX) :]
            with contextlib.suppress(OSError):  # another process's sweep got there first
                if name.startswith(EPOCH_PREFIX):  # alone: no loader reads the folder
                    os.unlink(name, dir_fd=handle)
                    continue
                if not is_key(key):  # an older prefetch's partial copy: by its age
                    info = os.stat(name, dir_fd=handle, follow_symlinks=False)
                    if partial and now - info.st_mtime > PARTIAL_MAX_AGE_S:
                        os.unlink(name, dir_fd=handle)
                    continue
                lock = ledger.lock(key, 0)
                if lock is not None:  # its fetch is over: what it left goes (a lock file too)
                    try:
                        if partial:
                            self._drop_partial(handle, name[len(PARTIAL_PREFIX) :], ledger)
                    finally:
                        unlock_object(handle, key, lock)
        if alone:
            ledger.recount()

    @staticmethod
    def _remove(handle: int, name: str, ledger: Ledger) -> None:
        """Unlink the copy `name` and count its bytes out of the ledger."""
        size = os.stat(name, dir_fd=handle, follow_symlinks=False).st_size
        os.unlink(name, dir_fd=handle)
        ledger.release(size)

    @classmethod
    def _drop_partial(cls, handle: int, name: str, ledger: Ledger) -> None:
        """Under the object's lock (`Ledger.lock`: a reservation recorded there is returned
        already): remove a partial copy of `name` that a killed process left without a
        record, settled (whole, about to be renamed), so counted as its size."""
        with contextlib.suppress(FileNotFoundError):
            cls._remove(handle, PARTIAL_PREFIX + name, ledger)

    def _through(self, handle: int, name: str) -> str:
        """A path to `name` in the folder that resolves through `handle`, not the folder's
        path (on Linux; elsewhere the folder's path)."""
        if os.path.isdir(PROC_FD):
            return f"{PROC_FD}/{handle}/{name}"
        return os.path.join(self.folder, name)

    def used_bytes(self) -> int:
        """The bytes of the folder's copies (and copies being written), as its ledger counts
        them, for every process that uses it."""
        return self._books().used()

    def take_counts(self) -> CacheCounts:
        """What this process's cache did since the last call (`CacheCounts`)."""
        ledger = self._books()
        with self._lock:
            evictions, evicted = ledger.evictions, ledger.evicted_bytes
            counts = CacheCounts(
                fetched_bytes=self._fetched_bytes,
                evictions=evictions - self._taken[0],
                evicted_bytes=evicted - self._taken[1],
            )
            self._fetched_bytes, self._taken = 0, (evictions, evicted)
        return counts

    def _count_fetched(self, size: int) -> None:
        with self._lock:
            self._fetched_bytes += size

    def pinned_copy(
        self,
        name: str,
        size: int,
        fetch: Callable[[BinaryIO], None],
        good: Callable[[int], bool],
        needed: str = "",
    ) -> tuple[int, bool]:
        """`(descriptor, fetched)`: a pinned descriptor (never evicted while open; the caller
        closes it) of the copy `name` in the folder (a shard of `size` bytes), and whether it
        was fetched now: the kept one when `good(descriptor)`, else one written now by
        `fetch(file)` (which raises when what it wrote is not the object), under the object's
        lock (another process's fetch of it is waited for). Raises OSError when the limit
        leaves no room for it beside the copies in use (saying what the caller reads at once:
        `needed`), or when something that is no copy is at its name."""
        handle, ledger = self._dir(), self._books()
        pinned = pin(handle, name)
        if pinned is not None and good(pinned):
            return pinned, False
        if pinned is not None:
            os.close(pinned)
        key = key_of(name)
        lock = ledger.lock(key, wait_s())
        if lock is None:
            raise TimeoutError(
                f"another process fetched {name!r} into cache_dir {self.folder!r} for longer "
                "than its requests may take"
            )
        try:
            pinned = pin(handle, name)
            if pinned is not None and good(pinned):
                return pinned, False
            if pinned is not None:
                os.close(pinned)
                with contextlib.suppress(FileNotFoundError):
                    self._remove(handle, name, ledger)  # not the object indexed: replaced
            odd = odd_entry(handle, name)
            if odd is not None:
                raise OSError(
                    f"{os.path.join(self.folder, name)!r} is {odd}, not a copy: cache_dir "
                    f"keeps the shard {name!r} there; remove it, or give another cache_dir"
                )
            self._drop_partial(handle, name, ledger)
            if not ledger.reserve(size, None, lock, name):
                raise OSError(
                    f"{name!r} ({size} bytes) does not fit cache_limit={self.limit} of "
                    f"cache_dir {self.folder!r} beside the copies in use and being fetched: "
                    "raise cache_limit to hold the shards a loader reads at once "
                    f"({needed or 'those of the batches in flight and a few fetched ahead'})"
                )
            partial, kept = PARTIAL_PREFIX + name, False
            try:
                flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
                with os.fdopen(os.open(partial, flags, 0o600, dir_fd=handle), "w+b") as file:
                    fetch(file)
                    file.flush()
                    os.fsync(file.fileno())
                ledger.settle(lock)  # whole: counted as a copy from here on
                os.replace(partial, name, src_dir_fd=handle, dst_dir_fd=handle)
                kept = True
                self._count_fetched(size)
            finally:
                if not kept:
                    with contextlib.suppress(OSError):
                        os.unlink(partial, dir_fd=handle)
                    ledger.unreserve(size, lock)
            pinned = pin(handle, name)
            if pinned is None:
                raise OSError(f"the copy {name!r} in {self.folder!r} vanished once written")
            return pinned, True
        finally:
            unlock_object(handle, key, lock)


def wait_s() -> float:
    """How long to wait for another process's fetch of an object: its every attempt's request
    deadline, and a minute more to write and decode it."""
    return (active_options().request_timeout_s + 1.0) * (READ_RETRIES + 1) + 60.0


def _users_of(handle: int) -> int:
    """A descriptor of the folder's `.users` file (`open_own`); the folder is closed when
    there is none."""
    try:
        return open_own(handle, USERS)
    except BaseException:
        os.close(handle)
        raise


def _close(handle: int, users: int, ledger: Ledger) -> None:
    ledger.close()
    for fd in (users, handle):
        with contextlib.suppress(OSError):
            os.close(fd)
