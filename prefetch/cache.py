"""A local folder of remote objects: `Loader(url, cache_dir=...)` reads each object once.

`ObjectCache.open(folder)` checks (or creates) the folder; `local_copy(url)` returns the path
of a local copy of the object at `url`, reading it with `storage.read_bytes` (retried, errors
naming the URL) the first time. A copy is written to a private temporary file in the folder
and renamed into place, so no reader ever sees half a copy, and two workers copying the same
object at once both succeed. An `ObjectCache` is a small picklable value (the folder's path):
worker processes share the folder, and it outlives the loader, so later epochs and later runs
read from local disk. Objects are assumed not to change, as a training set's do not: delete
the folder to read them afresh. Nothing is evicted: the folder grows to the data set's size.

The folder is the user's own: created with mode 0700 when missing, and refused when another
user owns it or others may write to it (a neighbour could plant or swap copies); copies are
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
import stat
import tempfile
import time
import urllib.parse
from dataclasses import dataclass

from prefetch.storage import read_bytes, source_scheme

log = logging.getLogger("prefetch.cache")

# Characters of the URL's SHA-256 that name its copy: collisions are out of reach at any
# data set size, and the names stay short.
KEY_CHARS = 40
# The longest extension a copy keeps from its URL (".jpeg", ".webp"); decoders may read it.
MAX_SUFFIX = 5
# Copies being written are named with this prefix until they are renamed into place; one older
# than PARTIAL_MAX_AGE_S was left by a worker killed mid-write, and `open` removes it.
PARTIAL_PREFIX = ".partial-"
PARTIAL_MAX_AGE_S = 3600.0

_warned_write = False  # one warning per process for copies that could not be written


@dataclass(frozen=True)
class ObjectCache:
    """Local copies of remote objects in `folder`; see the module docstring."""

    folder: str

    @classmethod
    def open(cls, folder: str | os.PathLike[str]) -> ObjectCache:
        """The cache in `folder`, created (mode 0700) when missing.

        Raises ValueError naming the folder and the fix when it is not a folder, another user
        owns it, or its group or other users may write to it.
        """
        path = os.path.abspath(os.fspath(folder))
        with contextlib.suppress(FileExistsError):  # a file there is refused below
            os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise ValueError(f"cache_dir {path!r} is not a folder: give a folder of your own")
        if info.st_uid != os.geteuid():
            raise ValueError(
                f"cache_dir {path!r} belongs to user {info.st_uid}, not to you "
                f"({os.geteuid()}): its copies could be swapped; give a folder of your own"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                f"cache_dir {path!r} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): "
                f"its copies could be swapped; chmod 700 {path!r}, or give another folder"
            )
        cache = cls(path)
        cache._remove_abandoned_partials()
        return cache

    def _remove_abandoned_partials(self) -> None:
        now = time.time()
        with os.scandir(self.folder) as entries:
            for entry in entries:
                if not entry.name.startswith(PARTIAL_PREFIX):
                    continue
                with contextlib.suppress(OSError):  # another loader's sweep got there first
                    if now - entry.stat(follow_symlinks=False).st_mtime > PARTIAL_MAX_AGE_S:
                        os.unlink(entry.path)

    def path_for(self, url: str) -> str:
        """Where the copy of `url` is kept (whether or not it is there yet)."""
        key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:KEY_CHARS]
        suffix = os.path.splitext(urllib.parse.urlsplit(url).path)[1].lower()
        return os.path.join(self.folder, key + (suffix if len(suffix) <= MAX_SUFFIX else ""))

    def local_copy(self, url: str) -> tuple[str, bool]:
        """`(path, kept)`: a local path with the bytes of `url`, and whether the copy was kept
        already (False: it was read from storage just now). When a new copy cannot be written,
        the path is `url` itself (the caller reads it from storage)."""
        path = self.path_for(url)
        if os.path.exists(path):
            return path, True
        data = read_bytes(url)
        try:
            self._write(path, data)
        except OSError as error:
            _warn_once(self.folder, error)
            return url, False
        return path, False

    def _write(self, path: str, data: bytes) -> None:
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=PARTIAL_PREFIX)  # mode 0600
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise


def cache_for(source: object, cache_dir: str | os.PathLike[str] | None) -> ObjectCache | None:
    """The `ObjectCache` a loader of `source` keeps in `cache_dir` (None without one).

    Raises ValueError when `source` holds no URLs: its files are local already, or it is not
    a file source (it reads its samples itself).
    """
    if cache_dir is None:
        return None
    if not source_scheme(source):
        raise ValueError(
            f"cache_dir keeps local copies of remote objects, but {type(source).__name__} "
            "reads no URLs (local files, or samples it makes itself): leave cache_dir out"
        )
    return ObjectCache.open(cache_dir)


def _warn_once(folder: str, error: OSError) -> None:
    global _warned_write
    if not _warned_write:
        _warned_write = True
        log.warning(
            "prefetch: cannot write to cache_dir %r (%s): reading from storage instead, as "
            "without a cache (said once per process)",
            folder,
            error,
        )
