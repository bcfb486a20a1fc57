"""Files rewritten in place while they are read, for tests of torn reads (issue 40.5).

A reader that reads a file while another process rewrites it in place (opens it for writing,
writes new bytes over the old, truncates) may get the start of one version and the end of the
other: rows of a batch that no decoder notices are wrong. prefetch's local reads compare the
file's `fstat` before and after (`prefetch.io.read_capped`, and its C twin in the compiled
chunk path) and refuse such a read.

- `rewrite_in_place(path, data)` rewrites a file the way such a writer does (same inode).
- `RewrittenAfterFirstRead(path, data)` stands in for the `os` module of
  `prefetch.io._local_files` (`monkeypatch.setattr(prefetch.io._local_files, "os", ...)`):
  the file is rewritten right after the first `os.pread` of it, so a read of it always spans a
  rewrite. Deterministic, for the Python read.
- `rewriting(path, versions)` rewrites a file in a thread, cycling through `versions`, until
  the block exits: for readers that cannot be intercepted (the compiled chunk path). Whether a
  given read spans a rewrite is chance; a test reads until one does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


def rewrite_in_place(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` over the file at `path` (the same inode: not a new file renamed into
    place), then cut it to `len(data)`."""
    handle = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(handle, data, 0)
        os.ftruncate(handle, len(data))
    finally:
        os.close(handle)


class RewrittenAfterFirstRead:
    """The `os` module, but the first `pread` of the file at `path` rewrites it in place with
    `data` just after it reads (and sets a modification time of its own, so that even a clock
    coarser than the rewrite sees a change). Every other name is `os`'s."""

    def __init__(self, path: str | os.PathLike[str], data: bytes) -> None:
        self._path = os.fspath(path)
        self._data = data
        self._inode = os.stat(path).st_ino
        self.rewritten = False

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pread(self, handle: int, count: int, offset: int) -> bytes:
        data = os.pread(handle, min(count, 4096), offset)  # a first part only
        if not self.rewritten and os.fstat(handle).st_ino == self._inode:
            self.rewritten = True
            rewrite_in_place(self._path, self._data)
            os.utime(self._path, ns=(1, 1))
        return data


@contextmanager
def rewriting(
    path: str | os.PathLike[str], versions: Sequence[bytes], pause_s: float = 0.02
) -> Iterator[threading.Event]:
    """Rewrite the file at `path` in place in a thread, with each of `versions` in turn, every
    `pause_s` seconds (longer than a coarse file clock's tick, so that two rewrites never share
    a modification time), until the block exits. Yields an event set after the first rewrite."""
    stop, started = threading.Event(), threading.Event()

    def run() -> None:
        number = 0
        while not stop.is_set():
            rewrite_in_place(path, versions[number % len(versions)])
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
