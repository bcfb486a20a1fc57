"""The Ray backend's batch slots when actors run on this node: memory files they write into.

Each slot is an anonymous memory file (`os.memfd_create`, as `SharedArrays` makes): it has no
name in any folder, so there is nothing to guess, sweep or leak when the training process is
killed (its memory goes when the last process mapping it exits), and it does not count
against /dev/shm's size. Its space is reserved at once (`posix_fallocate`: memory short is a
`MemoryError` here, not a `SIGBUS` in an actor later). An actor on this node opens it through
this process's descriptor (`/proc/<pid>/fd/<fd>`, which the kernel lets only a process of the
same user open), checks that it is that very file (`FileId`), and maps it as the process
backend's workers map theirs (`SlotLayout.map`). `MemorySlots.available()` is False where
there is no `memfd_create` (not Linux): then slots are plain memory and every row comes
through Ray's object store. Not thread-safe: the backend calls it under its book's lock.
"""

from __future__ import annotations

import os

from prefetch._messages import sized
from prefetch.backends._ray_actor import Segment
from prefetch.backends._shm import FileId, SlotLayout
from prefetch.sample import Slot


class MemorySlots:
    """This process's slots as memory files: `create()` one, `segment(slot)` to send it to an
    actor on this node, `forget(slot)` and `close()` let them go (a batch that views one stays
    readable)."""

    def __init__(self, layout: SlotLayout) -> None:
        self.layout = layout
        self._files: dict[str, tuple[int, FileId]] = {}  # name -> (fd, identity)
        self._made = 0

    @staticmethod
    def available() -> bool:
        """Whether this system makes anonymous memory files."""
        return hasattr(os, "memfd_create")

    def create(self) -> Slot:
        name = f"prefetch-ray-slot-{self._made}"
        self._made += 1
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            try:
                os.posix_fallocate(fd, 0, self.layout.nbytes)
            except OSError as error:
                raise MemoryError(
                    f"no memory for a batch slot of {sized(self.layout.nbytes)} ({error}): "
                    "lower batch_size or depth, or free memory"
                ) from error
            slot = self.layout.map(fd, name)
            self._files[name] = (fd, FileId.of(os.fstat(fd)))
        except BaseException:
            os.close(fd)
            raise
        return slot

    def segment(self, slot: Slot) -> Segment | None:
        """What an actor on this node is sent to write into `slot`: its name, the path of
        this process's descriptor of it, and its identity; None for a slot not made here."""
        found = self._files.get(slot.name)
        if found is None:
            return None
        fd, identity = found
        return slot.name, f"/proc/{os.getpid()}/fd/{fd}", identity

    def forget(self, slot: Slot) -> None:
        """Let one slot go: its memory goes once no process maps it."""
        found = self._files.pop(slot.name, None)
        if found is not None:
            os.close(found[0])

    def close(self) -> None:
        """Let every slot go."""
        for fd, _ in self._files.values():
            os.close(fd)
        self._files = {}
