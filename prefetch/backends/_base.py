"""The backend protocol, and what a finished batch comes to.

A backend runs batch tasks and returns a `PendingBatch` per batch; the stream (one epoch) only
ever talks to this small protocol, from one thread:

    backend.start(); backend.new_slot() -> Slot; backend.submit(task, slot) -> PendingBatch;
    backend.set_workers(n); backend.forget_slot(slot); backend.close()

Every backend runs the same per-batch code, `SampleReader.read_into` (the layer below,
prefetch.sample), which writes decoded samples straight into a `Slot`; the task, the slot and
what reading rows produced (`BatchTask`, `Slot`, `ChunkOutcome`, `Skipped`) are defined there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

from prefetch.sample import BatchTask, ChunkOutcome, Skipped, Slot


@dataclass
class BatchOutcome(ChunkOutcome):
    """A finished batch: the first `count` rows of the slot are valid, in order; the rest are
    its chunks' outcome, merged (`skipped` in row order)."""

    count: int = 0

    @classmethod
    def of(cls, chunk: ChunkOutcome, count: int, skipped: list[Skipped]) -> BatchOutcome:
        """A finished batch of `count` valid rows from its (merged) chunk outcome."""
        shared = {field.name: getattr(chunk, field.name) for field in fields(chunk)}
        return cls(**{**shared, "skipped": skipped, "count": count})


def compact(slot: Slot, size: int, skipped: list[Skipped]) -> int:
    """Move the valid rows of the first `size` to the front of the slot; returns their count."""
    if not skipped:
        return size
    bad = {s.position for s in skipped}
    keep = [p for p in range(size) if p not in bad]
    slot.images[: len(keep)] = slot.images[keep]
    slot.labels[: len(keep)] = slot.labels[keep]
    return len(keep)


@dataclass(frozen=True)
class DecodePlace:
    """Where batches were decoded: one node's figures (`stats().decoded_on`; the Ray backend's).

    - `node`: the node's address ("10.0.0.5").
    - `node_id`: the node's id in Ray (nodes of one machine share an address).
    - `local`: whether it is the training process's own node (its actors are the loader's
      `workers`).
    - `actors`: its decode actors running now.
    - `images`: the images its actors decoded for delivered or pending batches.
    - `busy_s`: the seconds its actors spent decoding them, summed over its actors.
    - `images_per_s`: what the node decodes while kept busy: images per busy second of one
      actor, times its actors now (0 once it has none).
    - `lost_actors`: its actors that died (the node left, or an actor crashed or was stopped
      by `sample_timeout_s`); their parts ran again elsewhere.
    """

    node: str
    node_id: str
    local: bool
    actors: int
    images: int
    busy_s: float
    images_per_s: float
    lost_actors: int = 0


class PendingBatch(Protocol):
    """A submitted batch. `wait` blocks at most `timeout_s`; `result` raises a worker's error."""

    def wait(self, timeout_s: float) -> bool: ...

    def done(self) -> bool: ...

    def result(self) -> BatchOutcome: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    """Runs batch tasks. One owner (the Loader) calls these from one thread."""

    name: str
    workers: int

    def start(self) -> None: ...

    def new_slot(self) -> Slot: ...

    def submit(self, task: BatchTask, slot: Slot) -> PendingBatch: ...

    def set_workers(self, count: int) -> None: ...

    def starting(self) -> int:
        """Workers started but not ready yet (a spawned process that has not answered a batch:
        it is still importing), which the tuner must not judge a worker count by."""
        ...

    def forget_slot(self, slot: Slot) -> None: ...

    def time_out(self, pending: Any, row: int, error: BaseException, skip: bool) -> bool:
        """Row `row` of `pending` has been read for too long (`error` says so).

        Returns False when the backend cannot stop the stuck work: the consumer then raises
        `error` and closes the loader. Otherwise the pending batch settles by itself: re-sent
        with the row skipped when `skip`, else failing with `error`.
        """
        ...

    def decoders(self) -> int:
        """The workers decoding now, which the loader's window of batches is sized by: its
        threads or processes; the Ray backend's actors ready."""
        ...

    def describe(self) -> str:
        """Where it decodes, once started, beyond the loader's decision ("" on this host)."""
        ...

    def places(self) -> tuple[DecodePlace, ...]:
        """Where its batches were decoded, one entry per node; () when all on this host."""
        ...

    def close(self) -> None: ...


class OnThisHost:
    """What a backend whose `workers` all decode on this host says of them (threads,
    processes): `decoders` is `workers`, and no other place."""

    workers: int

    def decoders(self) -> int:
        return self.workers

    def describe(self) -> str:
        return ""

    def places(self) -> tuple[DecodePlace, ...]:
        return ()
