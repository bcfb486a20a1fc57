"""A folder of the user's own, checked through the descriptor that is then used.

`open_private_folder(path, name)` opens `path` as a directory descriptor, never through a link
at its end (O_NOFOLLOW), and refuses it (ValueError naming the folder, what is wrong and the
fix) when another user owns it, its group or other users may write to it, or a folder above it
lets another user swap it (writable by group or others without the sticky bit, or owned by
another user than you or root). Files are then opened and renamed relative to that descriptor,
so a folder swapped after the check is never used. The object cache (`cache_dir`) and the kept
folder listings (`prefetch.sources._kept_listing`) keep their files in such folders.
`user_cache_folder(name)` is where prefetch keeps such a folder when none is given (the kept
listings, the indexes of shards in read-only folders and of URLs): never relative to the
working directory (a relative `XDG_CACHE_HOME` is ignored, a relative `PREFETCH_CACHE_DIR`
refused). `flock_within` takes a lock of such a file (a flock: the kernel lets it go when its
holder dies, however it dies), polling, so that a wait ends by a deadline and Ctrl-C
interrupts it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from prefetch.coordinator import Deadline

# A flock is polled (LOCK_NB) after POLL_FIRST_S, doubling up to POLL_MAX_S: a waiter (for
# another process's download, or listing) wakes within 20 ms of its release. MosaicML
# Streaming polls every 7 ms.
POLL_FIRST_S = 0.0005
POLL_MAX_S = 0.02
# The folder of prefetch's own files, when set (an absolute path); else XDG's cache folder.
CACHE_DIR_ENV = "PREFETCH_CACHE_DIR"
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def user_cache_folder(name: str) -> str:
    """The folder `name` of prefetch's files in your cache: `$PREFETCH_CACHE_DIR/<name>`,
    else `$XDG_CACHE_HOME/prefetch/<name>`, else `~/.cache/prefetch/<name>` (not created).

    An empty variable is unset. A relative `XDG_CACHE_HOME` is ignored, as the XDG Base
    Directory spec says; a relative `PREFETCH_CACHE_DIR` raises ValueError naming it and the
    fix (each working directory would get a cache of its own)."""
    own = os.environ.get(CACHE_DIR_ENV, "")
    if own:
        if not os.path.isabs(own):
            raise ValueError(
                f"{CACHE_DIR_ENV}={own!r} is a relative path, which would name another "
                "folder in each working directory: set it to an absolute path (such as "
                f"{os.path.abspath(own)!r}), or unset it for $XDG_CACHE_HOME/prefetch or "
                "~/.cache/prefetch"
            )
        return os.path.join(own, name)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")
    return os.path.join(base, "prefetch", name)


def flock_within(fd: int, operation: int, timeout_s: float) -> bool:
    """Take the flock `operation` (LOCK_SH or LOCK_EX) on `fd`, polling for at most
    `timeout_s` seconds (0: one try); whether it was taken."""
    deadline = Deadline(timeout_s)
    pause = POLL_FIRST_S
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if deadline.expired():
            return False
        time.sleep(min(pause, deadline.remaining()))
        pause = min(2 * pause, POLL_MAX_S)


def open_private_folder(path: str, name: str) -> int:
    """A descriptor of the folder `path` (not through a symlink at its end), after checking it
    and the folders above it through descriptors; ValueError naming it as `name` (the option
    that gave it: "cache_dir"), what is wrong and the fix. The caller closes it."""
    try:
        handle = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP or os.path.islink(path):
            raise ValueError(
                f"{name} {path!r} is a symbolic link: give the folder it points to, which "
                "must be your own"
            ) from error
        if error.errno == errno.ENOTDIR:
            raise ValueError(
                f"{name} {path!r} is not a folder: give a folder of your own"
            ) from error
        raise
    try:
        _check_folder(path, name, os.fstat(handle))
        _check_parents(path, name, handle)
    except BaseException:
        os.close(handle)
        raise
    return handle


def _check_folder(path: str, name: str, info: os.stat_result) -> None:
    me = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{name} {path!r} is not a folder: give a folder of your own")
    if info.st_uid != me:
        raise ValueError(
            f"{name} {path!r} belongs to user {info.st_uid}, not to you "
            f"({me}): its files could be swapped; give a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"{name} {path!r} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"its files could be swapped; chmod 700 {path!r}, or give another folder"
        )


def _check_parents(path: str, name: str, handle: int) -> None:
    """Refuse `path` when a folder above it (reached by ".." from `handle`, named by the real
    path) lets another user rename it: writable by group or others without the sticky bit
    (/tmp has it), or owned by another user than you or root."""
    me = os.geteuid()
    above = os.path.realpath(path)
    current = os.open("..", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, dir_fd=handle)
    try:
        below = os.fstat(handle)
        while True:
            above = os.path.dirname(above)
            info = os.fstat(current)
            if info.st_uid not in (me, 0):
                raise ValueError(
                    f"{name} {path!r} is inside {above!r}, which belongs to user "
                    f"{info.st_uid}: that user could swap it; give a folder whose parents are "
                    "yours or root's"
                )
            shared = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if shared and not info.st_mode & stat.S_ISVTX:
                raise ValueError(
                    f"{name} {path!r} is inside {above!r}, which others may write to (mode "
                    f"{stat.S_IMODE(info.st_mode):o}, no sticky bit): they could swap the "
                    f"folder; chmod o-w,g-w {above!r} (or +t), or give another folder"
                )
            if (info.st_dev, info.st_ino) == (below.st_dev, below.st_ino):
                return  # "/" is its own parent
            parent = os.open("..", os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC, dir_fd=current)
            os.close(current)
            current, below = parent, info
    finally:
        os.close(current)
