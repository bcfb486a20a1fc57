"""The Ray backend's bookkeeping: a batch's parts, the decode actors, and where rows came from.

A batch is a `ProcessPending` (the process backend's: settled once every part is) whose rows
are cut into `RayPart`s. A part is sent to one actor at a time; `deaths` counts the actors
that died running it, and once it is settled (answered, cancelled, failed) any later answer
for it is dropped: a part runs again only when its actor is lost, and counts once.
`ActorState` is what the backend keeps per actor: its handle, node and the parts it holds (at
most `RAY_PARTS_PER_ACTOR`, each a `Sent` by its object ref); `NodeTally` what a node's actors
decoded, and `DecodePlace` one node's figures in `Loader.stats().decoded_on`. Plain data; the
backend's lock guards it all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from prefetch.backends._base import DecodePlace
from prefetch.backends._process_pending import ProcessPending
from prefetch.sample import BatchTask, ChunkOutcome, Skipped, Slot


@dataclass(eq=False)
class RayPart:
    """Rows [start, stop) of the batch `pending` (its part `number`), to decode from `task`."""

    pending: ProcessPending
    number: int
    task: BatchTask
    slot: Slot
    start: int
    stop: int
    deaths: int = 0  # actors that died while running it
    settled: bool = False  # answered, dropped or failed: a later answer is dropped
    dropped: bool = False  # cancelled while an actor writes its slot: settled once it stops

    def sent(self) -> BatchTask:
        """What an actor is sent: the part's samples, rows numbered from 0 (its rows that
        timed out too, renumbered)."""
        task = self.task
        skipped = tuple(row - self.start for row in task.timed_out if self.start <= row < self.stop)
        return replace(task, indices=task.indices[self.start : self.stop], timed_out=skipped)

    def answered(self, images: Any, labels: Any, outcome: ChunkOutcome) -> ChunkOutcome:
        """Copy an actor's rows into the batch's slot; returns `outcome` with its skipped
        samples at their rows in the batch."""
        self.slot.images[self.start : self.stop] = images
        self.slot.labels[self.start : self.stop] = labels
        outcome.skipped = [
            Skipped(s.position + self.start, s.path, s.error) for s in outcome.skipped
        ]
        return outcome

    def stop_clocks(self) -> None:
        """No row of the part is being read any more (its actor answered or is gone)."""
        if self.slot.started is not None:
            self.slot.started[self.start : self.stop] = 0.0

    def samples(self) -> list[int]:
        """The part's sample indices."""
        return [int(index) for index in self.task.indices[self.start : self.stop]]


@dataclass
class Sent:
    """A part an actor holds: since when it is being decoded, as far as the backend can tell
    (`inf` while it waits behind another), and whether the actor writes its rows straight into
    the batch's slot (`shared`: an actor on this node, a shared-memory slot)."""

    part: RayPart
    began: float
    shared: bool


@dataclass(eq=False)
class ActorState:
    """One decode actor: its handle, its node, whether it is ready (`ready` is the object ref
    of its `where()` until it answered) and the parts it holds by object ref, in the order
    sent."""

    handle: Any
    name: str
    node_id: str
    node_ip: str
    local: bool
    ready: Any  # the object ref of its where() until it answered, then None
    described: str = ""  # its own name for itself, with pid and node (where())
    running: dict[Any, Sent] = field(default_factory=dict)
    retiring: bool = False
    dying: bool = False  # stopped by the backend; kept until Ray says it died (`PartBook.lose`)
    probed_at: float = 0.0  # when its stuck rows were last asked for (`sample_timeout_s`)

    def label(self) -> str:
        """How errors and logs name it: its own description once ready, else its name."""
        return self.described or f"ray actor {self.name} on node {self.node_ip}"

    def began(self) -> float:
        """When the part it is decoding now began: when the one before it was answered, or
        when it was sent (`time.monotonic()`)."""
        return min((sent.began for sent in self.running.values()), default=time.monotonic())


@dataclass
class NodeTally:
    """What one node's actors did: images decoded, seconds busy, actors lost."""

    node_ip: str
    local: bool
    images: int = 0
    busy_s: float = 0.0
    lost: int = 0


def places(actors: list[ActorState], tallies: dict[str, NodeTally]) -> tuple[DecodePlace, ...]:
    """One `DecodePlace` per node in `tallies` (by node id), with its actors now among
    `actors`; this process's node first, then by address."""
    running: dict[str, int] = {}
    for actor in actors:
        running[actor.node_id] = running.get(actor.node_id, 0) + 1
    found = []
    for node_id, tally in tallies.items():
        count = running.get(node_id, 0)
        rate = tally.images / tally.busy_s * count if tally.busy_s > 0 else 0.0
        found.append(
            DecodePlace(
                tally.node_ip,
                node_id,
                tally.local,
                count,
                tally.images,
                tally.busy_s,
                rate,
                tally.lost,
            )
        )
    return tuple(sorted(found, key=lambda place: (not place.local, place.node, place.node_id)))
