"""A read-only FUSE mount of a local folder that waits a fixed latency at every file open.

It stands in for a network filesystem mount (gcsfuse, s3fs, an NFS share) in
`benchmarks/remote_latency.py --mount`: the same folder the loopback HTTP server serves, read
through the kernel's FUSE layer with the same per-request latency. The latency is slept once
in `open()`, one wait per file read, as one GET per image costs on the HTTP server; listing
(`readdir`, `getattr`) and `read()` pass through at once (the kernel caches entries and
attributes for 1 s, so a listing stays cheap, as a mount's metadata cache makes it).

The filesystem runs in its own process (`mounted` starts this file as a script), so its
Python callbacks do not share the reader's GIL. libfuse 3 serves at most 10 requests at once
unless told otherwise, which would cap any reader at 10 files per latency; the mount is started
with `max_threads=MAX_THREADS` so that the latency, not the daemon, is what readers meet.

Needs Linux with /dev/fuse and the right to mount (root, or fusermount3), the `fusermount3`
program (Debian: `apt-get install fuse3`) and the `mfusepy` package (ctypes bindings for
libfuse 2 and 3; `pip install mfusepy`). Neither is a dependency of prefetch; `unavailable()`
says what is missing.

    .venv/bin/python benchmarks/latency_mount.py FOLDER MOUNTPOINT [--latency-ms 20]
        (stays in the foreground; `fusermount3 -u MOUNTPOINT` ends it)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Requests the daemon serves at once (libfuse 3's default is 10).
MAX_THREADS = 256
_STAT_FIELDS = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid")


def unavailable() -> str | None:
    """Why a mount cannot be tried here, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (apt-get install fuse3)"
    try:
        importlib.import_module("mfusepy")
    except (ImportError, OSError) as error:  # OSError: libfuse itself is missing
        return f"mfusepy does not load ({error}; pip install mfusepy)"
    return None


@contextlib.contextmanager
def mounted(folder: str | os.PathLike[str], mountpoint: str, latency_s: float) -> Iterator[str]:
    """`folder` mounted at `mountpoint` (an empty folder) with `latency_s` per file open."""
    with tempfile.TemporaryFile() as log:
        command = [sys.executable, os.path.abspath(__file__), os.path.abspath(folder)]
        command += [os.path.abspath(mountpoint), "--latency-ms", str(latency_s * 1000)]
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while not os.path.ismount(mountpoint):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    output = log.read().decode(errors="replace").strip()
                    raise RuntimeError(f"the FUSE mount at {mountpoint} did not come up: {output}")
                time.sleep(0.05)
            yield mountpoint
        finally:
            if os.path.ismount(mountpoint):
                subprocess.run(["fusermount3", "-u", mountpoint], check=False)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def serve(folder: str, mountpoint: str, latency_s: float) -> None:
    """Mount `folder` at `mountpoint` and serve it until unmounted (blocks)."""
    mfusepy: Any = importlib.import_module("mfusepy")
    operations: Any = mfusepy.Operations

    class LatencyPassthrough(operations):  # type: ignore[misc]
        use_ns = True

        def _path(self, path: str) -> str:
            return os.path.join(folder, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            try:
                st = os.lstat(self._path(path))
            except FileNotFoundError:
                raise mfusepy.FuseOSError(errno.ENOENT) from None
            attrs: dict[str, Any] = {name: getattr(st, name) for name in _STAT_FIELDS}
            for name in ("st_atime", "st_mtime", "st_ctime"):
                attrs[name] = getattr(st, name + "_ns")
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._path(path))]

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise mfusepy.FuseOSError(errno.EROFS)
            if latency_s > 0:
                time.sleep(latency_s)
            return os.open(self._path(path), os.O_RDONLY)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

    mfusepy.FUSE(
        LatencyPassthrough(),
        mountpoint,
        foreground=True,
        ro=True,
        max_threads=MAX_THREADS,
        fsname="latency_mount",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("mountpoint")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    serve(str(args.folder.resolve()), args.mountpoint, args.latency_ms / 1000)


if __name__ == "__main__":
    main()
