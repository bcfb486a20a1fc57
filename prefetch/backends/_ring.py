"""The slot ring: preallocated batch slots, recycled once delivered and no longer referenced.

A stream takes a slot per batch it submits (`acquire`), hands it back when the batch is
delivered (`deliver`) or abandoned (`release`), and the ring reuses a delivered slot only once
nothing else holds its arrays (checked by reference count), so a batch the consumer keeps is
never overwritten. While the consumer keeps `KEPT_REFERENCED_SLOTS` delivered batches the ring is
`crowded()` and the stream hands out copies instead of delivering more slots, so a ring never
owns more than `ring_capacity(depth)` slots, and keeping any number of batches costs no slot.
"""

from __future__ import annotations

import sys
import threading
from collections import deque

import numpy as np

from prefetch.backends._base import Backend
from prefetch.sample import Slot

# Delivered batches the consumer may keep as views of ring slots; while it keeps this many,
# further batches are handed out as copies (the ring is `crowded`).
KEPT_REFERENCED_SLOTS = 4


def _references(slot: Slot) -> int:
    return sys.getrefcount(slot.images) + sys.getrefcount(slot.labels)


def _unreferenced_count() -> int:
    """What `_references` reads for a slot that only the ring holds (interpreter-specific)."""
    slot = Slot(np.empty(1, np.uint8), np.empty(1, np.int32))
    return _references(slot)


_UNREFERENCED = _unreferenced_count()


def _in_use(slot: Slot) -> bool:
    """True while anything besides the ring holds the slot's arrays (a view, a tensor)."""
    return _references(slot) > _UNREFERENCED


class SlotRing:
    """Preallocated slots, recycled once delivered and unreferenced. Thread-safe."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._free: list[Slot] = []
        self._delivered: deque[Slot] = deque()
        self._lock = threading.Lock()

    def acquire(self) -> Slot:
        with self._lock:
            if self._free:
                return self._free.pop()
            for slot in self._delivered:
                if not _in_use(slot):
                    self._delivered.remove(slot)
                    return slot
            if len(self._delivered) > KEPT_REFERENCED_SLOTS:
                # Only when the consumer let go of a batch and took it back meanwhile (another
                # thread): the oldest kept batch is its memory now, not the ring's.
                self._backend.forget_slot(self._delivered.popleft())
        return self._backend.new_slot()

    def crowded(self) -> bool:
        """True while the consumer still holds all `KEPT_REFERENCED_SLOTS` delivered batches.

        The stream then hands out copies, so the ring needs no new slot (nor, for the process
        backend, a new shared-memory segment and its file descriptor) per batch kept.
        """
        with self._lock:
            return len(self._delivered) >= KEPT_REFERENCED_SLOTS and all(
                _in_use(slot) for slot in self._delivered
            )

    def release(self, slot: Slot) -> None:
        """Return a slot that was never delivered (cancelled, failed)."""
        with self._lock:
            self._free.append(slot)

    def deliver(self, slot: Slot) -> None:
        """The consumer has moved past this slot's batch; reuse it once unreferenced."""
        with self._lock:
            self._delivered.append(slot)


def ring_capacity(depth: int) -> int:
    """The most slots a ring owns at once: `depth` in flight plus the kept delivered ones."""
    return depth + KEPT_REFERENCED_SLOTS
