"""Bounded reads of local files: nothing blocks on a FIFO, nothing is read past a cap.

`open_regular` opens a local file that must be a regular file (a shard, a file hashed);
`read_local` reads a whole one of at most a cap of bytes, `read_capped` an open one. Each reads
one open descriptor, so a file replaced by rename while it is read is read whole (the version
opened). A file rewritten in place while it is read is refused when its size or modification
time differs after the read from before it; a rewrite that moves neither during the read (the
read falls between two writes of it, or within one tick of a coarse file clock) cannot be told
from a whole file and goes unseen: write files to a new name and rename them into place
(docs/remote.md, "Files changed while they are read"). Errors are OSError naming the path.
Stateless and thread-safe; `prefetch.io._storage` reads local paths with these, and re-exports
`read_local`.

C twin of `read_capped` for the compiled chunk path: `open_file` and `read_file` in
prefetch/decode/_c/chunk.c (the same rules; a file they refuse is read here, which says why).
"""

from __future__ import annotations

import os
import stat

from prefetch.io._remote_options import active_options

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str, what: str = "") -> int:
    """A descriptor of the local regular file at `path`, opened for reading without blocking
    on a FIFO; OSError naming it (`what`, such as "shard ", before its name) when it is not a
    regular file, with the descriptor closed. The caller closes it."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise OSError(
                f"{what}{path!r} is not a regular file (a device, a FIFO, a socket): not read"
            )
    except BaseException:
        os.close(handle)
        raise
    return handle


def read_local(path: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the local file `path`, at most `max_bytes` (None: the active options'
    `max_object_bytes`). A path that is not a regular file (a device such as /dev/zero, a
    FIFO, through a symlink or not) or a file larger than the cap raises OSError naming it:
    nothing is read past the cap, and nothing blocks on a FIFO without a writer."""
    cap = active_options().max_object_bytes if max_bytes is None else max_bytes
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _O_CLOEXEC)
    try:
        return read_capped(handle, path, cap)
    finally:
        os.close(handle)


def read_capped(handle: int, path: str, cap: int) -> bytes:
    """The bytes of the open file `handle` (named `path` in errors) from its start: OSError
    when it is not a regular file, holds more than `cap` bytes (nothing is read past the cap,
    even when it grows while read), or changed while it was read (`_version`: its size or
    modification time differ before and after the read, as `os.fstat` tells: a file rewritten
    in place, whose bytes may be half old and half new). Its change time is not compared: a
    rename, a link or a chmod moves it and leaves the bytes whole, so a file replaced by rename
    while it is read is returned whole (the version `handle` opened). A rewrite in place that
    moves neither the size nor the modification time while the file is read is not seen. The
    one bounded read of a local file: `read_local`, and the index files of
    `prefetch.sources.shards._index`. The caller closes `handle`."""
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path!r} is not a regular file (a device, a FIFO, a socket): not read")
    if info.st_size > cap:
        raise OSError(
            f"{path!r} is {info.st_size} bytes, larger than max_object_bytes={cap}: raise "
            "RemoteOptions(max_object_bytes=...) if it is meant to be that large"
        )
    data = os.pread(handle, info.st_size + 1, 0)  # usually all of it, in one read
    while len(data) <= cap:  # to the end (it may have grown), never past the cap
        more = os.pread(handle, min(cap + 1 - len(data), _LOCAL_CHUNK), len(data))
        if not more:
            break
        data += more
    if len(data) > cap:
        raise OSError(
            f"{path!r} grew past max_object_bytes={cap} while it was read: raise "
            "RemoteOptions(max_object_bytes=...) if it is meant to be that large"
        )
    after = os.fstat(handle)
    if len(data) != info.st_size or _version(after) != _version(info):
        raise OSError(
            f"{path!r} changed while it was read (its size or modification time differ before "
            "and after: rewritten in place?), so its bytes may be half old and half new: not "
            "used. Write files to a new name and rename them into place, or read it again once "
            "written"
        )
    return data


def _version(info: os.stat_result) -> tuple[int, int]:
    """What a write to an open file moves: its size and modification time (in nanoseconds; a
    write stamps it with the file system's clock, whose tick is coarser on older kernels). Not
    the change time or the link count, which a rename or a link moves too, nor the inode, the
    same for one descriptor. C twin: `same_version` in prefetch/decode/_c/chunk.c."""
    return info.st_size, info.st_mtime_ns


# Bytes `read_local` reads at a time after the file's stated size.
_LOCAL_CHUNK = 64 * 1024
