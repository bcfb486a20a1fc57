"""Files changed while they are read, for tests of torn reads (issues 40.5 and 45).

A reader that reads a file while another process rewrites it in place (opens it for writing,
writes new bytes over the old, truncates) may get the start of one version and the end of the
other: rows of a batch that no decoder notices are wrong. prefetch's local reads compare the
file's size and modification time before and after (`prefetch.io.read_capped`, and its C twin
in the compiled chunk path) and refuse a read when they moved; a rewrite that moves neither
while the file is read (the read falls between two writes of it, or within one tick of a coarse
file clock) is not seen. A file replaced by rename (a new file written, then renamed over the
old) is read whole, the old version or the new: that is how files should be rewritten.

- `rewrite_in_place(path, data)` rewrites a file the way an in-place writer does (same inode);
  `replace_by_rename(path, data)` the safe way (a new file renamed over it); `change(path,
  data, how)` either way (`How`).
- `ChangedWhileRead(path, data, ...)` stands in for the `os` module of
  `prefetch.io._local_files` (`monkeypatch.setattr(prefetch.io._local_files, "os", ...)`):
  the file is changed right after the `at_read`-th `os.pread` of it, in place or by rename, so
  a read of it always spans the change. Deterministic, for the Python read.
- `rewriting(path, versions)` changes a file in a thread, cycling through `versions`, until the
  block exits: for readers that cannot be intercepted (the compiled chunk path). Whether a given
  read spans a change is chance; a test reads until one does.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

How = Literal["in place", "rename"]
"""How a file is changed: "in place" (`rewrite_in_place`) or "rename" (`replace_by_rename`)."""


def rewrite_in_place(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` over the file at `path` (the same inode: not a new file renamed into
    place), then cut it to `len(data)`."""
    handle = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(handle, data, 0)
        os.ftruncate(handle, len(data))
    finally:
        os.close(handle)


def replace_by_rename(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a new file beside `path` (created exclusively, mode 0600) and rename it
    over `path`: a reader that opened the old file reads it whole."""
    folder, name = os.path.split(os.fspath(path))
    handle, partial = tempfile.mkstemp(prefix=f".{name}.", dir=folder or ".")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise


def change(path: str | os.PathLike[str], data: bytes, how: How) -> None:
    """Change the file at `path` to `data`, `how`: in place or by rename."""
    if how == "rename":
        replace_by_rename(path, data)
    elif how == "in place":
        rewrite_in_place(path, data)
    else:
        raise ValueError(f"how must be 'in place' or 'rename', got {how!r}")


class ChangedWhileRead:
    """The `os` module, but the `at_read`-th `pread` of the file at `path` changes it to `data`
    (`how`: in place or by rename) just after it reads. Each `pread` of the file returns at
    most 4096 bytes, so a file larger than `at_read` times that is changed in the middle of a
    read. A rewrite in place then sets a modification time of its own, so that even a clock
    coarser than the rewrite sees it, or with `same_tick` sets the one the file had (as a
    rewrite within one tick of a coarse clock does: only a new size can tell). Every other
    name is `os`'s. `changed` tells whether it has changed the file."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        data: bytes,
        *,
        how: How = "in place",
        at_read: int = 1,
        same_tick: bool = False,
    ) -> None:
        if at_read < 1:
            raise ValueError(f"at_read must be >= 1, got {at_read}")
        self._path = os.fspath(path)
        self._data = data
        self._how: How = how
        self._at_read = at_read
        self._same_tick = same_tick
        self._inode = os.stat(path).st_ino
        self._reads = 0
        self.changed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pread(self, handle: int, count: int, offset: int) -> bytes:
        data = os.pread(handle, min(count, 4096), offset)  # a part only
        if self.changed or os.fstat(handle).st_ino != self._inode:
            return data
        self._reads += 1
        if self._reads == self._at_read:
            self.changed = True
            before = os.stat(self._path)
            change(self._path, self._data, self._how)
            if self._how == "in place":
                times = (before.st_atime_ns, before.st_mtime_ns) if self._same_tick else (1, 1)
                os.utime(self._path, ns=times)
        return data


@contextmanager
def rewriting(
    path: str | os.PathLike[str],
    versions: Sequence[bytes],
    pause_s: float = 0.02,
    how: How = "in place",
) -> Iterator[threading.Event]:
    """Change the file at `path` in a thread (`how`: in place or by rename) to each of
    `versions` in turn, every `pause_s` seconds (longer than a coarse file clock's tick, so that
    two rewrites never share a modification time), until the block exits. Yields an event set
    after the first change."""
    stop, started = threading.Event(), threading.Event()

    def run() -> None:
        number = 0
        while not stop.is_set():
            change(path, versions[number % len(versions)], how)
            number += 1
            started.set()
            time.sleep(pause_s)

    thread = threading.Thread(target=run, name="prefetch-rewriter", daemon=True)
    thread.start()
    try:
        yield started
    finally:
        stop.set()
        thread.join()
