"""Shared-memory batch slots for the process backend: create, attach, unlink, sweep, preflight.

The parent process owns every segment (a file in /dev/shm): it creates them and unlinks them
all when the backend closes. Workers only map them. Mappings are never closed explicitly: a
mapping is unmapped when the last array that views it is freed, so a batch the user still
holds stays valid after close (its name is already gone). Segment names carry the owner's pid,
`prefetch_<pid>_<random>`, so segments left by a parent that died are found and swept.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import shutil
from dataclasses import dataclass

import numpy as np

from prefetch.backends.base import Slot

PREFIX = "prefetch_"
SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class SlotLayout:
    """Where a slot's arrays live in its segment: images first, then int32 labels."""

    batch_size: int
    image_shape: tuple[int, int, int]

    @property
    def image_bytes(self) -> int:
        return self.batch_size * int(np.prod(self.image_shape))

    @property
    def nbytes(self) -> int:
        return self.image_bytes + 4 * self.batch_size

    def map(self, name: str, create: bool = False) -> Slot:
        """Map segment `name` (creating it if asked) and view it as a Slot."""
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.nbytes)
            mapping = mmap.mmap(fd, self.nbytes)
        finally:
            os.close(fd)
        images = np.ndarray((self.batch_size, *self.image_shape), np.uint8, mapping, 0)
        labels = np.ndarray((self.batch_size,), np.int32, mapping, self.image_bytes)
        return Slot(images, labels, name)


class SharedSlots:
    """The parent's segments: `create()` a slot, `close()` unlinks them all. Not thread-safe."""

    def __init__(self, layout: SlotLayout) -> None:
        self.layout = layout
        self._names: list[str] = []

    def create(self) -> Slot:
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        self._names.append(name)
        return self.layout.map(name, create=True)

    def forget(self, slot: Slot) -> None:
        """Unlink one slot's segment now; its mapping goes when the last view of it is freed."""
        if slot.name in self._names:
            self._names.remove(slot.name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, slot.name))

    def close(self) -> None:
        """Unlink every segment; each mapping goes when the last view of it is freed."""
        for name in self._names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))
        self._names = []


def sweep_stale() -> list[str]:
    """Unlink segments whose owning process no longer exists; returns their names."""
    swept: list[str] = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return swept
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        try:
            pid = int(entry[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if not _alive(pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, entry))
            swept.append(entry)
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_free_space(needed_bytes: int, slots: int, batch_size: int) -> None:
    """Fail before starting when /dev/shm cannot hold the ring, saying how to fix it."""
    if not os.path.isdir(SHM_DIR):
        return
    free = shutil.disk_usage(SHM_DIR).free
    if free < needed_bytes:
        raise MemoryError(
            f"the process backend needs {needed_bytes / 2**20:.0f} MiB of shared memory for "
            f"{slots} batches of {batch_size}, but {SHM_DIR} has {free / 2**20:.0f} MiB free. "
            f"Enlarge {SHM_DIR} (docker: --shm-size={2 * needed_bytes // 2**20 + 1}m), or lower "
            "depth or batch_size, or use backend='thread'"
        )
