"""The window: the one bounded queue of a loader's batches in flight, across epochs.

A `Window` is made when the workers start (`Epochs.start`) and dropped when they stop. It
submits batches to the backend, each into a slot of the ring, in the order they will be
delivered, and keeps at most `limit()` of them in flight (`Workers.in_flight`: `depth`, more
for many workers), so the ring never needs more than `ring_capacity` of that many slots.

What it submits comes from *runs*: an epoch's batches from one position on, drawn from the
plan. A stream claims a run when it begins its epoch (`claim`) and takes its batches in order
(`take`). Once every claimed run is submitted and room is left, the window asks its owner for
the run that comes next (`Epochs.run_ahead`: the cursor's next epoch, only while `with loader:`
keeps the workers and one stream runs) and submits that run's first batches, so the workers do
not idle at an epoch boundary. The next stream claims that run if it begins where the run
begins, with the same plan; otherwise the run is given up (`give_up`).

Nothing about a batch is counted (the cursor, the stats, a skipped sample, a worker's error)
until a stream takes it: an error in a batch submitted ahead is raised at that batch.

A batch given up (a run abandoned, the window dropped) is cancelled if still queued; one
being decoded is waited for within `DRAIN_S` while the workers go on, and its slot returned;
a slot a worker may still write is forgotten rather than reused (shutdown steps 2 and 3 of
`prefetch.backends._lifecycle`), so no worker is killed and no batch is overwritten.

Thread-safe: a stream iterates on one thread while `close()` or `stats()` run on another.

    claim(run) ──> runs: [run of epoch e (claimed), run of e+1 (ahead)]
                          │ top_up(): next batch of the first run with batches left
                          ▼
    backend.submit(task, slot) ──> batches: deque of InFlight, at most limit()
                          │ take(run): its oldest batch
                          ▼
                   the stream waits for it and delivers it
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from prefetch.backends import DRAIN_S, Backend, PendingBatch, SlotRing
from prefetch.coordinator import Deadline
from prefetch.plan import EpochPlan
from prefetch.sample import BatchTask, Slot


@dataclass(eq=False)
class Run:
    """The batches of `epoch` from batch `start` on, drawn from `plan`; `claimed` once a
    stream delivers them (before, they are submitted ahead of it). `submitted` counts those
    handed to the backend so far: batch `start + submitted` is the next."""

    plan: EpochPlan
    epoch: int
    start: int
    todo: deque[np.ndarray]
    claimed: bool = False
    submitted: int = 0

    @classmethod
    def of(cls, plan: EpochPlan, epoch: int, start: int, batches: Iterable[np.ndarray]) -> Run:
        """The run of `batches` (the plan's batches of `epoch` from `start`)."""
        return cls(plan, epoch, start, deque(batches))

    def begins(self, plan: EpochPlan, epoch: int, start: int) -> bool:
        """Whether this run is what a stream of `epoch` from `start` with `plan` delivers."""
        return self.plan is plan and (self.epoch, self.start) == (epoch, start)


class InFlight(NamedTuple):
    """A submitted batch: its run, its slot, its pending result and its sample indices."""

    run: Run
    slot: Slot
    pending: PendingBatch
    indices: np.ndarray


class Window:
    """The batches in flight of one loader on one started backend; see the module docstring.

    - `backend`, `ring`: the running backend and its slot ring.
    - `limit`: the batches to keep in flight (read at every top-up: a tuner may change it).
    - `before_submit`: called with a batch's position in its epoch before it is submitted
      (a streamed source's spool makes its shards local), or None.
    - `next_run`: the run to submit ahead once the claimed ones are submitted, or None.
    """

    def __init__(
        self,
        backend: Backend,
        ring: SlotRing,
        limit: Callable[[], int],
        before_submit: Callable[[int], None] | None,
        next_run: Callable[[], Run | None],
    ) -> None:
        self.backend, self.ring = backend, ring
        self._limit, self._before_submit, self._next_run = limit, before_submit, next_run
        self._runs: list[Run] = []
        self._batches: deque[InFlight] = deque()
        self._lock = threading.RLock()

    # ---- a stream's side -----------------------------------------------------------------

    def claim(
        self,
        plan: EpochPlan,
        epoch: int,
        start: int,
        draw: Callable[[int, int], list[np.ndarray]],
    ) -> Run:
        """The run a stream of `epoch` from batch `start` delivers: the one submitted ahead if
        it begins there with `plan`, else a new one of `draw(epoch, start)` (the runs ahead
        given up)."""
        with self._lock:
            for run in self._runs:
                if not run.claimed and run.begins(plan, epoch, start):
                    run.claimed = True
                    return run
            self.give_up(ahead_only=True, running=True)
            run = Run.of(plan, epoch, start, draw(epoch, start))
            run.claimed = True
            self._runs.append(run)
            return run

    def top_up(self) -> None:
        """Submit batches until `limit()` are in flight, the claimed runs first, then a run
        ahead (`next_run`)."""
        with self._lock:
            limit = self._limit()
            while len(self._batches) < limit:
                run = next((r for r in self._runs if r.todo), None)
                if run is None:
                    run = self._next_run() if not any(not r.claimed for r in self._runs) else None
                    if run is None or not run.todo:
                        return
                    self._runs.append(run)
                self._submit(run)

    def take(self, run: Run) -> InFlight | None:
        """The oldest batch of `run` in flight (submitted now if none is: another stream's
        batches may fill the window), or None when the run has no batch left."""
        with self._lock:
            for item in self._batches:
                if item.run is run:
                    self._batches.remove(item)
                    return item
            if not run.todo:
                return None
            self._submit(run)
            return self._batches.pop()

    def end(self, run: Run, running: bool) -> None:
        """A stream is done with `run`: give up its batches still in flight (drained while
        `running`: the workers go on)."""
        with self._lock:
            run.todo.clear()
            if run in self._runs:
                self._runs.remove(run)
            mine = [item for item in self._batches if item.run is run]
            self._batches = deque(item for item in self._batches if item.run is not run)
        settle(mine, self.backend, self.ring, running)

    # ---- the owner's side ----------------------------------------------------------------

    def give_up(self, *, ahead_only: bool, running: bool) -> None:
        """Give up the runs submitted ahead (all runs unless `ahead_only`) and their batches
        (drained while `running`)."""
        with self._lock:
            gone = [run for run in self._runs if not (ahead_only and run.claimed)]
            for run in gone:
                run.todo.clear()
                self._runs.remove(run)
            dropped = [item for item in self._batches if item.run in gone]
            self._batches = deque(item for item in self._batches if item.run not in gone)
        settle(dropped, self.backend, self.ring, running)

    def ready(self, ahead_only: bool = False) -> int:
        """Batches in flight already decoded (of the runs submitted ahead only, with
        `ahead_only`); a process backend's answers are received by the thread that iterates."""
        items = [item for item in list(self._batches) if not (ahead_only and item.run.claimed)]
        return sum(item.pending.wait(0.0) for item in items)

    def reads(self) -> int:
        """Samples that workers are reading right now."""
        slots = [item.slot for item in list(self._batches)]
        return sum(int(np.count_nonzero(s.started)) for s in slots if s.started is not None)

    def _submit(self, run: Run) -> None:
        """Submit `run`'s next batch into a slot of the ring."""
        if self._before_submit is not None:
            self._before_submit(run.start + run.submitted)
        slot = self.ring.acquire()
        task = BatchTask(run.todo.popleft(), run.epoch, run.plan.seed)
        self._batches.append(InFlight(run, slot, self.backend.submit(task, slot), task.indices))
        run.submitted += 1


def settle(items: Iterable[InFlight], backend: Backend, ring: SlotRing, running: bool) -> None:
    """Give up submitted batches (shutdown steps 2 and 3 of prefetch.backends._lifecycle):
    cancel those still queued, wait for those being decoded within `DRAIN_S` (not at all when
    `running` is False: no worker writes any more, or they are about to be stopped), and
    return their slots to `ring`. A slot a worker may still write is forgotten rather than
    reused, so no worker is killed and no batch is overwritten."""
    items = list(items)
    for item in items:
        item.pending.cancel()
    deadline = Deadline(DRAIN_S if running else 0.0)
    for item in items:
        if item.pending.wait(deadline.remaining()):
            ring.release(item.slot)
        else:
            backend.forget_slot(item.slot)
