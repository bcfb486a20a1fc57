"""Shared-memory batch slots for the process backend: create, map, unlink, preflight.

The parent process owns every segment, a file `prefetch-slot_<pid>_<random>` in `SHM_DIR`
(/dev/shm), mode 0600. It creates each one under a fresh unpredictable name (`O_EXCL`, a new
name on a clash), reserves its space at once (`posix_fallocate`: a full /dev/shm is a
`MemoryError` here, not a `SIGBUS` in a worker later), and takes a shared `flock` on it before
anything is written. The lock lives as long as any descriptor or mapping of the file, in any
process: it is the proof of liveness that `sweep_stale` tests. Workers never open a segment
by name: they receive its file descriptor over their pipe (`SharedSlots.fd`).

The parent unlinks a name only while it still refers to the file it created (same device and
inode). Mappings are never closed explicitly: a mapping is unmapped when the last array that
views it is freed, so a batch the user still holds stays valid after close.

`sweep_stale()` removes a segment only when it is proven dead: a regular file of this user,
not empty, whose lock it can take exclusively without waiting. The lock is held as long as a
descriptor or mapping of the file exists in any process, whatever its PID namespace or
container, so a free lock means nobody uses it. Anything else named like a segment (a
directory, a link, a FIFO, another user's file) is skipped, logged once at debug level, and
never makes a sweep (or a start) fail. It is cheap: one listdir, and an open per file of ours.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import secrets
import shutil
import stat
from dataclasses import dataclass

import numpy as np

from prefetch._messages import counted, sized
from prefetch.sample import Slot

log = logging.getLogger("prefetch.backends")

# Segment names begin with this; the pid after it only says who made one (liveness is the lock).
# Unlike the older "prefetch_" names, which were never locked: this sweep leaves those alone.
PREFIX = "prefetch-slot_"
# Where segments live; a module attribute so that tests can point it at a small tmpfs. The test
# suite sets PREFETCH_SHM_DIR to a private directory of its own, inherited by the processes it
# starts, so that another prefetch user's sweep never meets the segments a test plants.
SHM_DIR = os.environ.get("PREFETCH_SHM_DIR") or "/dev/shm"


@dataclass(frozen=True)
class SlotLayout:
    """Where a slot's arrays live in its segment: images, int32 labels, float64 start times."""

    batch_size: int
    image_shape: tuple[int, int, int]

    @property
    def image_bytes(self) -> int:
        return self.batch_size * int(np.prod(self.image_shape))

    @property
    def started_offset(self) -> int:
        """Where the rows' start times begin: after the labels, 8-byte aligned."""
        return -(-(self.image_bytes + 4 * self.batch_size) // 8) * 8

    @property
    def nbytes(self) -> int:
        return self.started_offset + 8 * self.batch_size

    def map(self, fd: int, name: str) -> Slot:
        """Map the open segment `fd` and view it as a Slot (the mapping keeps its own fd)."""
        mapping = mmap.mmap(fd, self.nbytes)
        images = np.ndarray((self.batch_size, *self.image_shape), np.uint8, mapping, 0)
        labels = np.ndarray((self.batch_size,), np.int32, mapping, self.image_bytes)
        started = np.ndarray((self.batch_size,), np.float64, mapping, self.started_offset)
        return Slot(images, labels, name, started)


@dataclass(frozen=True)
class FileId:
    """A file's identity, to unlink a name only while it still names that file."""

    device: int
    inode: int

    @classmethod
    def of(cls, status: os.stat_result) -> FileId:
        return cls(status.st_dev, status.st_ino)


def unlink_if_same(path: str, identity: FileId) -> bool:
    """Unlink `path` if it is still the regular file `identity` and ours; never follows links."""
    try:
        status = os.lstat(path)
        if FileId.of(status) != identity or not _ours(status):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def _ours(status: os.stat_result) -> bool:
    return stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()


class SharedSlots:
    """The parent's segments: `create()` a slot, `fd(name)` to send, `close()` unlinks all.

    Not thread-safe (the backend calls it under its lock).
    """

    def __init__(self, layout: SlotLayout) -> None:
        self.layout = layout
        self._segments: dict[str, tuple[int, str, FileId]] = {}  # name -> (fd, path, identity)

    def create(self) -> Slot:
        fd, name, path = _create_file()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # before any byte: the sweep skips empty files
            _reserve(fd, self.layout)
            identity = FileId.of(os.fstat(fd))
            slot = self.layout.map(fd, name)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        self._segments[name] = (fd, path, identity)
        return slot

    def fd(self, name: str) -> int:
        """The open descriptor of segment `name`, to pass to a worker."""
        return self._segments[name][0]

    def segments(self) -> dict[str, tuple[int, str, FileId]]:
        """Every live segment: name -> (fd, path, identity)."""
        return dict(self._segments)

    def forget(self, slot: Slot) -> None:
        """Unlink one slot's segment now; its mapping goes when the last view of it is freed."""
        segment = self._segments.pop(slot.name, None)
        if segment is not None:
            _release(*segment)

    def close(self) -> None:
        """Unlink every segment; each mapping goes when the last view of it is freed."""
        for segment in self._segments.values():
            _release(*segment)
        self._segments = {}


def _release(fd: int, path: str, identity: FileId) -> None:
    unlink_if_same(path, identity)
    os.close(fd)


def _create_file() -> tuple[int, str, str]:
    """Create a new segment file under a fresh random name; a name taken by anyone is skipped."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(12)}"
        path = os.path.join(SHM_DIR, name)
        try:
            return os.open(path, flags, 0o600), name, path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free segment name after 100 tries", SHM_DIR)


def _reserve(fd: int, layout: SlotLayout) -> None:
    """Allocate the segment's pages now, so that writing into it can never fail later."""
    try:
        os.posix_fallocate(fd, 0, layout.nbytes)
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        raise MemoryError(
            f"{SHM_DIR} is full: a batch slot of {layout.nbytes / 2**20:.1f} MiB "
            f"({counted(layout.batch_size, 'image')}) does not fit in its "
            f"{free_mib():.1f} MiB free. " + how_to_fix(2 * layout.nbytes)
        ) from error


def how_to_fix(needed_bytes: int) -> str:
    """The ways to get more shared memory, for error messages."""
    return (
        f"Enlarge {SHM_DIR} (docker: --shm-size={needed_bytes // 2**20 + 64}m) or free space "
        "there, or lower depth or batch_size, or use backend='thread'"
    )


def free_mib() -> float:
    """Free space in SHM_DIR, in MiB (0 when it does not exist)."""
    try:
        return shutil.disk_usage(SHM_DIR).free / 2**20
    except OSError:
        return 0.0


def exhausted_note(batch_bytes: int) -> str:
    """For a worker killed by SIGBUS: says so when SHM_DIR cannot hold one more batch ("" else)."""
    free = free_mib()
    if free * 2**20 >= batch_bytes:
        return ""
    return (
        f" (shared memory exhausted: {SHM_DIR} has {free:.1f} MiB free, a batch needs "
        f"{batch_bytes / 2**20:.1f} MiB. {how_to_fix(2 * batch_bytes)})"
    )


@dataclass(frozen=True)
class ShmRoom:
    """What the shared-memory folder holds (`total`, `free` bytes) and the ranks sharing it.

    A rank's `share` is its equal part of the folder's size, within what is free now: ranks that
    start one after another then all find their part, whichever starts first.
    """

    total: int
    free: int
    ranks: int = 1
    folder: str = SHM_DIR

    @property
    def share(self) -> int:
        """The bytes of batch slots this rank may take: its part, at most what is free."""
        return min(self.free, self.total // self.ranks)

    def describe(self) -> str:
        """E.g. "this rank's share 3.0 GiB: 24.0 GiB among 8 ranks, 23.1 GiB free"; with one
        rank, "23.1 GiB free of 24.0 GiB"."""
        if self.ranks == 1:
            return f"{sized(self.free)} free of {sized(self.total)}"
        return (
            f"this rank's share {sized(self.share)}: {sized(self.total)} among {self.ranks} "
            f"ranks, {sized(self.free)} free"
        )


def shm_room(ranks: int = 1) -> ShmRoom | None:
    """The shared-memory folder's room for `ranks` ranks of this host; None where it is not
    there (then the process backend's slots are not files of it)."""
    if not os.path.isdir(SHM_DIR):
        return None
    usage = shutil.disk_usage(SHM_DIR)
    return ShmRoom(usage.total, usage.free, ranks, SHM_DIR)


def check_free_space(needed_bytes: int, slots: int, batch_size: int) -> None:
    """Fail before starting when /dev/shm cannot hold the ring, saying how to fix it."""
    if not os.path.isdir(SHM_DIR):
        return
    free = shutil.disk_usage(SHM_DIR).free
    if free < needed_bytes:
        raise MemoryError(
            f"the process backend needs {sized(needed_bytes)} of shared memory for "
            f"{slots} batches of {batch_size}, but {SHM_DIR} has {sized(free)} free. "
            + how_to_fix(needed_bytes)
        )


_logged: set[str] = set()  # entries already reported as skipped, so each is logged once


def sweep_stale() -> list[str]:
    """Unlink this user's segments that no process holds; returns their names. Never raises."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    swept = []
    for entry in entries:
        if entry.startswith(PREFIX) and _sweep_one(os.path.join(SHM_DIR, entry)):
            swept.append(entry)
    return swept


def _sweep_one(path: str) -> bool:
    try:
        status = os.lstat(path)
    except OSError:
        return False  # gone meanwhile
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
        _skip(path, "not a regular file of this user")
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        _skip(path, f"cannot be opened ({error.strerror})")
        return False
    try:
        opened = os.fstat(fd)
        if FileId.of(opened) != FileId.of(status) or opened.st_size == 0:
            return False  # replaced meanwhile, or its creator has not locked it yet
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held: alive
        return unlink_if_same(path, FileId.of(opened))
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _skip(path: str, why: str) -> None:
    if path not in _logged:
        _logged.add(path)
        log.debug("prefetch sweep: skipping %s: %s", path, why)
