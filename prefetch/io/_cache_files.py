"""The files of a cache folder and their locks: names, bookkeeping files, object locks, pins.

The rules they follow are `prefetch.io._cache_ledger`'s (its module docstring): a copy is
`<key><ext>`, its partial file `.partial-<name>`, an object's lock `.lock-<key>` (an exclusive
`flock`, its file unlinked by its holder, holding the record of the bytes its holder reserved
while it writes the copy), and a reader pins the copy it decodes (a shared `flock` on its
descriptor), marking it used (its mtime) at most once in `TOUCH_AFTER_S`. `EpochMarks` tells
the processes that read the folder which epochs they read (`.epoch-<n>`), for the "keep"
policy. Every file is opened through the folder's descriptor, never through a link, 0600.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import threading
import time
from collections.abc import Iterator

from prefetch.coordinator import Deadline
from prefetch.io._private import flock_within

LEDGER = ".ledger"
USERS = ".users"
LOCK_PREFIX = ".lock-"
PARTIAL_PREFIX = ".partial-"
EPOCH_PREFIX = ".epoch-"
# A copy read is marked used (its mtime set) only when it was not for this long: the least
# recently used order is this coarse, and a reader sees a copy's times change at most once in
# this span (longer than any decode), so one decode again always reads it unchanged.
TOUCH_AFTER_S = 1.0
_NAME_MAX = 48
# An object's key (32 or 40 hex digits of its URL's SHA-256: a shard, an object), and a copy's
# name: its key and its URL's extension (printable ASCII, never a "/": a name read back from a
# reservation's record is used within the folder only).
_KEY = re.compile(r"[0-9a-f]{32}(?:[0-9a-f]{8})?")
_COPY = re.compile(_KEY.pattern + r"(?:\.[\x21-\x2e\x30-\x7e]*)?")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# How a copy is opened to be read or evicted: never through a link, never blocking.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
# An object's lock file is written too: the record of a reservation (`Ledger.reserve`).
_LOCK = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC
# What opening an entry at a copy's name that is no copy gives: a symlink (ELOOP), a socket
# (ENXIO), a device (ENODEV), another user's file (EACCES, EPERM).
_NOT_A_COPY = (errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EACCES, errno.EPERM)


def open_own(handle: int, name: str) -> int:
    """A descriptor (read and write) of the bookkeeping file `name` (`LEDGER`, `USERS`) in the
    folder `handle`, created 0600 when missing, never through a link or blocking; OSError
    when it is not a regular file of yours. The caller closes it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=handle)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise OSError(errno.EPERM, "a file of the cache folder is not a file of yours", name)
    return fd


def key_of(name: str) -> str:
    """The object key of the copy (or partial copy) `name`: its name without the extension."""
    if name.startswith(PARTIAL_PREFIX):
        name = name[len(PARTIAL_PREFIX) :]
    return name.split(".", 1)[0]


def is_copy_name(name: str) -> bool:
    """Whether `name` is a copy's name (a key and an extension of printable ASCII, at most 48
    characters): the names the ledger counts from the files and evicts."""
    return len(name) <= _NAME_MAX and _COPY.fullmatch(name) is not None


def is_key(text: str) -> bool:
    """Whether `text` is an object's key (the name of its lock and copies, less extensions)."""
    return _KEY.fullmatch(text) is not None


def lock_object(handle: int, key: str, timeout_s: float) -> int | None:
    """A descriptor holding the lock of object `key` in the folder `handle`, waiting for it at
    most `timeout_s` seconds (0: one try); None when another holds it that long. Release it
    with `unlock_object`."""
    name = LOCK_PREFIX + key
    deadline = Deadline(timeout_s)
    while True:
        fd = os.open(name, _LOCK, 0o600, dir_fd=handle)
        try:
            taken = flock_within(fd, fcntl.LOCK_EX, deadline.remaining())
            if taken and os.fstat(fd).st_nlink > 0:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # not taken, or taken on a file its last holder unlinked: open anew
        if not taken:
            return None


def unlock_object(handle: int, key: str, fd: int) -> None:
    """Release the lock `lock_object` gave: its file is unlinked, then closed."""
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(LOCK_PREFIX + key, dir_fd=handle)
    finally:
        os.close(fd)


def pin(handle: int, name: str) -> int | None:
    """A descriptor of the copy `name`, pinned (flock shared: not evicted while open) and
    marked used now (its mtime, when older than `TOUCH_AFTER_S`); None when there is none, it
    is being evicted, or it is not a regular file of the current user. The caller closes it."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=handle)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as error:
        if error.errno in _NOT_A_COPY:  # not a copy: `odd_entry` names it
            return None
        raise
    try:
        if flock_within(fd, fcntl.LOCK_SH, 0):
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink:
                if time.time_ns() - info.st_mtime_ns > TOUCH_AFTER_S * 1e9:
                    with contextlib.suppress(OSError):  # a read-only folder keeps its order
                        os.utime(fd)
                return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def odd_entry(handle: int, name: str) -> str | None:
    """What is at the copy's name `name` in the folder when it is no copy (a folder, a
    symlink, another user's file: never replaced, never read), e.g. "a folder"; None when
    nothing is there or a regular file of yours."""
    try:
        info = os.stat(name, dir_fd=handle, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        kinds = {stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link"}
        return kinds.get(stat.S_IFMT(info.st_mode), "not a regular file")
    if info.st_uid != os.geteuid():
        return f"a file of another user (uid {info.st_uid})"
    return None


class EpochMarks:
    """The epochs read from the folder, as every process that reads it shares them (the
    worker processes of a loader, the ranks of a job: their epochs are numbered alike), for
    the "keep" policy. The first read of epoch n by any of them creates the mark `.epoch-<n>`
    (0600), whose mtime is then the first read of n on the host; each process holds a shared
    flock on it while it reads n: from its first read of n until it has begun a later epoch
    and no read of n is left in flight (a killed process's flock is released by the kernel).
    So whether any process still reads epoch n (a loader reads the next epoch ahead during its
    last batches; a rank may be behind another) is one try of an exclusive flock. Thread-safe;
    one per process and cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # epoch -> a descriptor of its mark, flock shared
        self._reading: dict[int, int] = {}  # epoch -> reads in flight in this process
        self._starts: dict[int, int] = {}  # epoch -> the host's first read of it (ns)
        self._newest = -1

    @staticmethod
    def name(epoch: int) -> str:
        return f"{EPOCH_PREFIX}{epoch}"

    @contextlib.contextmanager
    def reading(self, handle: int, epoch: int) -> Iterator[None]:
        """Count a read of `epoch` in flight in this process for the `with` block."""
        with self._lock:
            self._reading[epoch] = self._reading.get(epoch, 0) + 1
            if epoch not in self._held:
                self._hold(handle, epoch)
        try:
            yield
        finally:
            with self._lock:
                self._reading[epoch] -= 1
                if not self._reading[epoch]:
                    del self._reading[epoch]
                    if epoch < self._newest:
                        self._let_go(epoch)

    def keep_since(self, handle: int, epoch: int) -> int:
        """The time (ns) from which copies read are kept for a read of `epoch`: the first
        read of the epoch before, or of the one before that while a process still reads the
        epoch before (its copies not yet read again were read in the one before that); less
        `TOUCH_AFTER_S`, the precision of a copy's time of use. 0 (every copy) when no such
        epoch was read: the first."""
        since = self._start(handle, epoch - 1)
        if since is not None and self._being_read(handle, epoch - 1):
            since = self._start(handle, epoch - 2)
        return 0 if since is None else max(0, since - int(TOUCH_AFTER_S * 1e9))

    def close(self) -> None:
        """Let go of every mark this process holds (its cache is gone). Idempotent."""
        with self._lock:
            for epoch in list(self._held):
                self._let_go(epoch)

    def _hold(self, handle: int, epoch: int) -> None:
        """Hold the mark of `epoch` (created now by the first read of it); when it is the
        newest epoch this process reads, let go of those it no longer reads and remove a mark
        nobody asks about any more (unless it is held: a rank far behind). Without a mark (a
        quota of files) nothing is noted: then a read of the next epoch evicts no copy."""
        try:
            fd = open_own(handle, self.name(epoch))
        except OSError:
            return
        if not flock_within(fd, fcntl.LOCK_SH, 1.0):  # only held exclusive for a try
            os.close(fd)
            return
        self._held[epoch] = fd
        self._starts.setdefault(epoch, os.fstat(fd).st_mtime_ns)
        if epoch > self._newest:
            self._newest = epoch
            for older in [held for held in self._held if held < epoch]:
                if older not in self._reading:
                    self._let_go(older)
            for old in [start for start in self._starts if start < epoch - 3]:
                del self._starts[old]
            if epoch >= 4 and not self._being_read(handle, epoch - 4):
                with contextlib.suppress(OSError):  # reads ask about the two epochs before
                    os.unlink(self.name(epoch - 4), dir_fd=handle)

    def _let_go(self, epoch: int) -> None:
        fd = self._held.pop(epoch, None)
        if fd is not None:
            os.close(fd)

    def _start(self, handle: int, epoch: int) -> int | None:
        """The first read of `epoch` (its mark's mtime); None when there was none."""
        if epoch < 0:
            return None
        with self._lock:
            if epoch in self._starts:
                return self._starts[epoch]
        try:
            info = os.stat(self.name(epoch), dir_fd=handle, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        return info.st_mtime_ns

    def _being_read(self, handle: int, epoch: int) -> bool:
        """Whether a process (this one too) still reads `epoch`."""
        try:
            fd = os.open(self.name(epoch), READ_FLAGS, dir_fd=handle)
        except OSError:
            return False
        try:
            if flock_within(fd, fcntl.LOCK_EX, 0):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False
            return True
        finally:
            os.close(fd)
