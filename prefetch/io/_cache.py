"""A local folder of remote objects: `Loader(url, cache_dir=...)` reads each object once.

`ObjectCache.open(folder)` checks (or creates) the folder and holds it by a descriptor;
`decoded(url, decode)` decodes the local copy of the object at `url`, reading it with
`storage.fetch_object` (retried, bounded, errors naming the URL) the first time. A copy is kept
only when it is whole (its length checked: a Content-Length, or the store's client's own check)
and decodes: it is written to a private temporary file in the folder, fsynced, decoded from
there, and only then renamed into place, so no reader ever sees half a copy or a copy that
never decoded, and two workers copying the same object at once both succeed. A kept copy that
no longer decodes is removed and read again from the store, once. An `ObjectCache` pickles as
its folder's path and identity (device, inode): worker processes open the folder again and
refuse it if it is another one by then. It outlives the loader, so later epochs and runs read
from local disk. Objects are assumed not to change: delete the folder to read them afresh.
Nothing is evicted: the folder grows to the data set's size.

The folder is the user's own, and every check goes through the descriptor that is then used:
opened with O_NOFOLLOW (a symlink is refused), created with mode 0700 when missing, refused when
another user owns it or others may write to it, or when a folder above it lets another user
swap it (writable by others without the sticky bit, or owned by another user than you or
root). Copies are opened and renamed relative to that descriptor and handed to decoders through
it (/proc/self/fd on Linux), so a folder swapped after the check is never read. Copies are
0600. When a copy cannot be written (a full disk, a quota, a file-size limit), the sample is
read from storage as without a cache, and the first such failure in each process is logged;
the half-written file is removed (by `open`, an hour later, if its worker was killed).
See docs/remote.md, "Reading each object once".
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from prefetch.io._private import open_private_folder
from prefetch.io._storage import fetch_object

log = logging.getLogger("prefetch.cache")

T = TypeVar("T")

# Characters of the URL's SHA-256 that name its copy: collisions are out of reach at any
# data set size, and the names stay short.
KEY_CHARS = 40
# The longest extension a copy keeps from its URL (".jpeg", ".webp"); decoders may read it.
MAX_SUFFIX = 5
# Copies being written are named with this prefix until they are renamed into place; one older
# than PARTIAL_MAX_AGE_S was left by a worker killed mid-write, and `open` removes it.
PARTIAL_PREFIX = ".partial-"
PARTIAL_MAX_AGE_S = 3600.0
# Where a process reaches a file through a descriptor of its folder (Linux); elsewhere copies
# are handed to decoders by the folder's path.
PROC_FD = "/proc/self/fd"

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_warned: set[str] = set()  # the warnings given in this process (each once)


class ObjectCache:
    """Local copies of remote objects in `folder`; see the module docstring.

    Make one with `ObjectCache.open(folder)`. `device` and `inode` identify the folder that was
    checked; a copy of the cache in another process (pickled) refuses any other.
    """

    def __init__(self, folder: str, device: int, inode: int) -> None:
        self.folder = folder
        self.device = device
        self.inode = inode
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return ObjectCache, (self.folder, self.device, self.inode)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObjectCache):
            return NotImplemented
        return (self.folder, self.device, self.inode) == (other.folder, other.device, other.inode)

    def __hash__(self) -> int:
        return hash((self.folder, self.device, self.inode))

    def __repr__(self) -> str:
        return f"ObjectCache({self.folder!r})"

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> ObjectCache:
        """The cache in `folder`, created (mode 0700) when missing, held by a descriptor.

        Raises ValueError naming the folder and the fix when it is a symbolic link or not a
        folder, another user owns it, its group or other users may write to it, or a folder
        above it lets another user swap it.
        """
        path = os.path.abspath(os.fspath(folder))
        with contextlib.suppress(FileExistsError):  # a file there is refused below
            os.makedirs(path, mode=0o700, exist_ok=True)
        handle = open_private_folder(path, "cache_dir")
        info = os.fstat(handle)
        cache = cls(path, info.st_dev, info.st_ino)
        cache._adopt(handle)
        cache._remove_abandoned_partials()
        return cache

    def _adopt(self, handle: int) -> None:
        self._fd, self._pid = handle, os.getpid()
        weakref.finalize(self, _close, handle)

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
                self._adopt(handle)
            assert self._fd is not None
            return self._fd

    def _remove_abandoned_partials(self) -> None:
        now = time.time()
        handle = self._dir()
        with os.scandir(handle) as entries:
            for entry in entries:
                if not entry.name.startswith(PARTIAL_PREFIX):
                    continue
                with contextlib.suppress(OSError):  # another loader's sweep got there first
                    if now - entry.stat(follow_symlinks=False).st_mtime > PARTIAL_MAX_AGE_S:
                        os.unlink(entry.name, dir_fd=handle)

    def name_for(self, url: str) -> str:
        """The file name of the copy of `url` in the folder."""
        key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:KEY_CHARS]
        return key + _suffix(url)

    def path_for(self, url: str) -> str:
        """Where the copy of `url` is kept (whether or not it is there yet), by the folder's
        path (decoders are handed it through the descriptor instead)."""
        return os.path.join(self.folder, self.name_for(url))

    def _through(self, handle: int, name: str) -> str:
        """A path to `name` in the folder that resolves through `handle`, not the folder's
        path (on Linux; elsewhere the folder's path)."""
        if os.path.isdir(PROC_FD):
            return f"{PROC_FD}/{handle}/{name}"
        return os.path.join(self.folder, name)

    def decoded(self, url: str, decode: Callable[[str], T]) -> tuple[T, bool]:
        """`(decode(path), kept)`: `decode` run on a local path holding the bytes of `url`, and
        whether that was a copy kept already (False: it was read from storage just now).

        A kept copy that `decode` fails on is removed and the object read again from storage,
        once; a new copy is kept only when it was read whole and `decode` succeeded on it (its
        error is raised, as without a cache). When no copy can be written, `decode(url)` reads
        the object from storage itself.
        """
        handle = self._dir()
        name = self.name_for(url)
        try:
            info: os.stat_result | None = os.stat(name, dir_fd=handle, follow_symlinks=False)
        except FileNotFoundError:
            info = None
        if info is not None:
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                try:
                    return decode(self._through(handle, name)), True
                except Exception as error:
                    _warn_once(
                        "stale",
                        "prefetch: a copy in cache_dir %r does not decode (%s: %s): removed and "
                        "read again from the store (said once per process)",
                        self.folder,
                        url,
                        error,
                    )
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=handle)
        return self._copy_and_decode(handle, url, name, decode), False

    def _copy_and_decode(self, handle: int, url: str, name: str, decode: Callable[[str], T]) -> T:
        data, whole = fetch_object(url)
        try:
            partial = self._write(handle, data, _suffix(url))
        except OSError as error:
            _warn_once(
                "write",
                "prefetch: cannot write to cache_dir %r (%s): reading from storage instead, as "
                "without a cache (said once per process)",
                self.folder,
                error,
            )
            return decode(url)
        try:
            value = decode(self._through(handle, partial))
            if not whole:
                _warn_once(
                    "length",
                    "prefetch: %r came without a Content-Length (its end could not be checked): "
                    "not kept in cache_dir %r; objects like it are read from the store every "
                    "time (said once per process)",
                    url,
                    self.folder,
                )
                return value
            os.replace(partial, name, src_dir_fd=handle, dst_dir_fd=handle)
            partial = ""
            with contextlib.suppress(OSError):  # the rename's own durability: best effort
                os.fsync(handle)
            return value
        finally:
            if partial:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=handle)

    def local_copy(self, url: str) -> tuple[str, bool]:
        """`(path, kept)`: a local path (by the folder's path) with the bytes of `url`, and
        whether the copy was kept already (False: it was read from storage just now). When no
        copy could be kept (not written, or not known to be whole), the path is `url` itself
        (the caller reads it from storage)."""
        _, kept = self.decoded(url, _accept)
        path = self.path_for(url)
        return (path if os.path.exists(path) else url), kept

    def _write(self, handle: int, data: bytes, suffix: str) -> str:
        """Write `data` to a new private file in the folder, fsynced; its name."""
        name = f"{PARTIAL_PREFIX}{secrets.token_hex(8)}{suffix}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        output = os.open(name, flags, 0o600, dir_fd=handle)
        try:
            with os.fdopen(output, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=handle)
            raise
        return name


def _accept(path: str) -> None:
    """A decode that accepts any bytes (`local_copy`: the caller decodes later)."""


def _suffix(url: str) -> str:
    suffix = os.path.splitext(urllib.parse.urlsplit(url).path)[1].lower()
    return suffix if len(suffix) <= MAX_SUFFIX else ""


def _close(handle: int) -> None:
    with contextlib.suppress(OSError):
        os.close(handle)


def _warn_once(kind: str, message: str, *args: object) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.warning(message, *args)
