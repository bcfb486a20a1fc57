"""The files of a cache folder and their locks: names, bookkeeping files, object locks, pins.

The rules they follow are `prefetch.io._cache_ledger`'s (its module docstring): a copy is
`<key><ext>`, its partial file `.partial-<name>`, an object's lock `.lock-<key>` (an exclusive
`flock`, its file unlinked by its holder), and a reader pins the copy it decodes (a shared
`flock` on its descriptor), marking it used (its mtime) at most once in `TOUCH_AFTER_S`. Every
file is opened through the folder's descriptor, never through a link, 0600.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time

from prefetch.io._private import flock_within

LEDGER = ".ledger"
USERS = ".users"
LOCK_PREFIX = ".lock-"
PARTIAL_PREFIX = ".partial-"
# A copy read is marked used (its mtime set) only when it was not for this long: the least
# recently used order is this coarse, and a reader sees a copy's times change at most once in
# this span (longer than any decode), so one decode again always reads it unchanged.
TOUCH_AFTER_S = 1.0
_NAME_MAX = 48
# An object's key (32 or 40 hex digits of its URL's SHA-256: a shard, an object), and a copy's
# name: its key and its URL's extension.
_KEY = re.compile(r"[0-9a-f]{32}(?:[0-9a-f]{8})?")
_COPY = re.compile(_KEY.pattern + r"(?:\.[\x21-\x7e]*)?")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# How a copy is opened to be read or evicted: never through a link, never blocking.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
_LOCK = os.O_RDONLY | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC


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
    deadline = time.monotonic() + timeout_s
    while True:
        fd = os.open(name, _LOCK, 0o600, dir_fd=handle)
        try:
            taken = flock_within(fd, fcntl.LOCK_EX, max(0.0, deadline - time.monotonic()))
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
        if error.errno == errno.ELOOP:  # a symlink: not a copy (renaming a copy replaces it)
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
