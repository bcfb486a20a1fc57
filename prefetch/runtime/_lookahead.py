"""The next epoch's first batches, submitted while the current epoch's last ones are consumed.

An open loader (`with loader:`) keeps its workers between epochs. Without a lookahead they
would idle from the moment epoch e's last batch is decoded until epoch e+1 is asked for, and
e+1's first batch would then make the consumer wait a whole batch's load time. Once the
ending epoch has submitted its last batch, `Epochs.look_ahead` submits the batches of the
cursor's next epoch and position (drawn from the plan of the moment, as that epoch would draw
them) into the room the ending epoch leaves in flight: the sum stays within
`Workers.in_flight`, and so within the slot ring's capacity.

The next stream takes them over (`Epochs.begin`) only if the plan, the epoch, the position and
the running backend are still those they were drawn with; otherwise, and at `close()`, they
are cancelled and their slots returned (`settle`). Nothing about them is counted (the cursor,
the stats, the skipped samples, a worker's error) until the next epoch's stream takes the
batch: an error in one is raised at that batch, as any other.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from prefetch.backends import DRAIN_S, Backend, PendingBatch, SlotRing
from prefetch.plan import EpochPlan
from prefetch.sample import BatchTask, Slot


class Submitted(NamedTuple):
    """A batch in flight: its slot, its pending result and its sample indices."""

    slot: Slot
    pending: PendingBatch
    indices: np.ndarray


def settle(submitted: Iterable[Submitted], backend: Backend, ring: SlotRing, running: bool) -> None:
    """Give up `submitted` batches (shutdown steps 2 and 3 of prefetch.backends._lifecycle):
    cancel those still queued, wait for those being decoded within `DRAIN_S` (not at all when
    `running` is False: no worker writes any more, or they are about to be stopped), and
    return their slots to `ring`. A slot a worker may still write is forgotten rather than
    reused, so no worker is killed and no batch is overwritten."""
    submitted = list(submitted)
    for item in submitted:
        item.pending.cancel()
    deadline = time.monotonic() + (DRAIN_S if running else 0.0)
    for item in submitted:
        if item.pending.wait(max(deadline - time.monotonic(), 0.0)):
            ring.release(item.slot)
        else:
            backend.forget_slot(item.slot)


class Lookahead:
    """The batches of `epoch` from `position`, drawn from `plan`, submitted to `backend` ahead
    of the stream that will deliver them (see the module docstring). Driven under the lock of
    its `Epochs`."""

    def __init__(
        self, plan: EpochPlan, epoch: int, position: int, backend: Backend, ring: SlotRing
    ) -> None:
        self.plan, self.epoch, self.position = plan, epoch, position
        self.backend, self.ring = backend, ring
        self.todo: deque[np.ndarray] = deque(plan.batches(epoch, position))
        self.submitted: deque[Submitted] = deque()

    def extend(self, room: int) -> None:
        """Submit the next batches until `room` of them are in flight (or none is left)."""
        while self.todo and len(self.submitted) < room:
            slot = self.ring.acquire()
            task = BatchTask(self.todo.popleft(), self.epoch, self.plan.seed)
            self.submitted.append(Submitted(slot, self.backend.submit(task, slot), task.indices))

    def fits(self, plan: EpochPlan, epoch: int, position: int, backend: Backend | None) -> bool:
        """Whether these are the batches a stream of `epoch` from `position` with `plan` on
        `backend` would submit."""
        same_place = (self.epoch, self.position) == (epoch, position)
        return self.plan is plan and same_place and self.backend is backend

    def ready(self) -> int:
        """Batches already decoded (a process backend's answers received first: from the
        thread that iterates)."""
        return sum(item.pending.wait(0.0) for item in list(self.submitted))

    def reads(self) -> int:
        """Samples that workers are reading right now."""
        slots = [item.slot for item in list(self.submitted)]
        return sum(int(np.count_nonzero(s.started)) for s in slots if s.started is not None)

    def discard(self, running: bool) -> None:
        """Cancel every batch and return the slots (`settle`)."""
        submitted, self.submitted = list(self.submitted), deque()
        self.todo.clear()
        settle(submitted, self.backend, self.ring, running)
