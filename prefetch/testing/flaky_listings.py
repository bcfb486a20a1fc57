"""Folders whose listing fails, for tests of listings that must be complete or an error (issue 45).

- `FailingFolders(folders, error=errno.EIO, times=1)`: while the block runs, opening one of the
  local `folders` with `os.scandir` (what `os.walk` and prefetch's folder walk read folders
  with) raises `OSError(error)` the first `times` times (None: every time), in this process:
  a flaky network mount (EIO, ESTALE), a low open-file limit (EMFILE). A folder is matched by
  its identity (device and inode), whatever the path it is opened by. `tries[folder]` counts
  the opens of each.
- `FailingListings(urls, error=ConnectionError, times=1)`: while the block runs, the `ls` of
  each folder URL in `urls` (`flaky://...`) raises `error(message)` the first `times` times
  (None: every time). `flaky://` is fsspec's in-memory filesystem (the store `memory://`
  writes: `memory://bucket/x.jpg` is `flaky://bucket/x.jpg`) listed with fsspec's generic
  `find`, a walk of one `ls` per folder, as the sftp, ftp, smb and webdav filesystems are.
  `tries[url]` counts the `ls` of each. Needs fsspec (the `remote` extra).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

# The scheme of `FlakyFileSystem`.
FLAKY_SCHEME = "flaky"


def _identity(path: Any) -> tuple[int, int] | None:
    """(device, inode) of the folder `path` (a path or a descriptor), None when it has none."""
    try:
        info = os.fstat(path) if isinstance(path, int) else os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    return info.st_dev, info.st_ino


class FailingFolders:
    """Opening chosen local folders fails while the block runs (see the module docstring)."""

    def __init__(
        self,
        folders: Iterable[str | os.PathLike[str]],
        error: int = errno.EIO,
        times: int | None = 1,
    ) -> None:
        self.error = error
        self.times = times
        self.tries: dict[str, int] = {}
        self._targets: dict[tuple[int, int], str] = {}
        for folder in folders:
            identity = _identity(os.fspath(folder))
            if identity is None:
                raise FileNotFoundError(f"FailingFolders: no folder at {os.fspath(folder)!r}")
            self._targets[identity] = os.fspath(folder)
            self.tries[os.fspath(folder)] = 0
        self._lock = threading.Lock()
        self._real: Callable[..., Any] = os.scandir

    def __enter__(self) -> FailingFolders:
        self._real = os.scandir
        os.scandir = self._scandir
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.scandir = self._real

    def _scandir(self, path: Any = ".") -> Any:
        target = self._targets.get(_identity(path) or (-1, -1))
        if target is not None:
            with self._lock:
                self.tries[target] += 1
                fail = self.times is None or self.tries[target] <= self.times
            if fail:
                raise OSError(self.error, os.strerror(self.error), path)
        return self._real(path)


def _memory_path(url: str) -> str:
    """The path in the in-memory store of a `flaky://` (or `memory://`) URL or path."""
    for scheme in (FLAKY_SCHEME, "memory"):
        url = url.removeprefix(f"{scheme}://")
    stripped = url.strip("/")
    return "/" + stripped if stripped else ""


def _flaky_filesystem() -> type[Any]:
    """The class of `flaky://`, made when first needed (fsspec is imported then)."""
    from fsspec.implementations.memory import (  # type: ignore[import-untyped]  # remote extra
        MemoryFileSystem,
    )
    from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

    class FlakyFileSystem(MemoryFileSystem):  # type: ignore[misc]  # fsspec is untyped
        protocol = FLAKY_SCHEME
        find = AbstractFileSystem.find  # the generic walk: one ls per folder
        failing: ClassVar[FailingListings | None] = None

        @classmethod
        def _strip_protocol(cls, path: Any) -> str:
            return _memory_path(str(path))

        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
            failing = FlakyFileSystem.failing
            if failing is not None:
                failing.listed(_memory_path(path))
            return super().ls(path, detail=detail, **kwargs)

    return FlakyFileSystem


class FailingListings:
    """Listing chosen folders of `flaky://` fails while the block runs (see the module
    docstring)."""

    _filesystem: ClassVar[type[Any] | None] = None

    def __init__(
        self,
        urls: Iterable[str],
        error: Callable[[str], BaseException] = ConnectionError,
        times: int | None = 1,
    ) -> None:
        self.error = error
        self.times = times
        self.tries: dict[str, int] = {url: 0 for url in urls}
        self._paths = {_memory_path(url): url for url in self.tries}
        self._lock = threading.Lock()

    def __enter__(self) -> FailingListings:
        import fsspec  # type: ignore[import-untyped]  # the remote extra

        if FailingListings._filesystem is None:
            FailingListings._filesystem = _flaky_filesystem()
            fsspec.register_implementation(FLAKY_SCHEME, FailingListings._filesystem, True)
        FailingListings._filesystem.failing = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        if FailingListings._filesystem is not None:
            FailingListings._filesystem.failing = None

    def listed(self, path: str) -> None:
        """Count an `ls` of `path`; raise `error` when it is to fail."""
        url = self._paths.get(path)
        if url is None:
            return
        with self._lock:
            self.tries[url] += 1
            fail = self.times is None or self.tries[url] <= self.times
        if fail:
            raise self.error(f"listing {url!r} failed (injected by FailingListings)")
