"""A Ray decode actor: what runs on a node of the cluster for the Ray backend.

`DecodeActor` holds the loader's `SampleReader` (sent once through the object store) and a slot
of its own. `read(task)` runs `SampleReader.read_into` on every row of `task` (one part of a
batch: its sample indices, rows numbered from 0) into that slot, as a thread or process worker
does into the loader's, and returns the rows, their labels and the outcome. An actor on the
training process's own node is sent parts with `read_shared` instead: it writes the rows
straight into the batch's slot, a memory file of the loader's (`MemorySlots`: opened through
the loader's descriptor and checked to be that very file, `FileId`), as a worker process does,
and returns only the outcome: no row crosses the object store. An error that reading raised
comes back as a value (its portable form and traceback text,
`_remote_error.with_traceback_text`), never as Ray's own wrapper, so the consumer raises the
original type with the note that names the sample and this actor's node. `reading()` runs in
a concurrency group of its own, beside a `read` in progress: the rows being read and for how
long (`sample_timeout_s`; a shared slot's clocks the consumer reads itself). One `read` runs
at a time (Ray's default for an actor's methods); the rows returned are serialized into the
object store before the next `read` reuses the slot.

This module imports no Ray: the backend makes the class remote (`ray.remote(DecodeActor)`),
and Ray imports it by name on the node, where prefetch must be installed.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np

from prefetch.backends._remote_error import portable, with_traceback_text
from prefetch.backends._shm import FileId, SlotLayout
from prefetch.sample import BatchTask, ChunkOutcome, SampleReader, Skipped, Slot

# What `read` returns: (images, labels, outcome) of the part's rows, or the error it raised.
Answer = tuple[np.ndarray | None, np.ndarray | None, ChunkOutcome | None, Any]
# A shared slot as `read_shared` is sent it: its name, path and identity.
Segment = tuple[str, str, FileId]


class DecodeActor:
    """Reads parts of batches on a node of a Ray cluster; see the module docstring.

    - `reader`: the loader's `SampleReader` (what every backend runs).
    - `name`: the actor's name in the loader ("prefetch-ray-3"); errors name it with its node.
    - `rows`: the most rows a part has (the size of its slot).
    - `node_ip`: the address of the node it was placed on, for its name.
    - `layout`: the loader's slots, which `read_shared` maps (an actor on its node).
    """

    def __init__(
        self, reader: SampleReader, name: str, rows: int, node_ip: str, layout: SlotLayout
    ) -> None:
        import ray  # on the node, inside the actor: Ray is there

        self._reader = reader
        height, width, channels = reader.options.shape
        self._slot = Slot(
            np.empty((rows, height, width, channels), np.uint8),
            np.empty((rows,), np.int32),
            started=np.zeros((rows,), np.float64),
        )
        node_id = ray.get_runtime_context().get_node_id()
        self._layout = layout
        self._mapped: dict[str, Slot] = {}  # shared slots, by name
        self._task: BatchTask | None = None  # the part being read (`reading`)
        self.name = f"ray actor {name} (pid {os.getpid()}) on node {node_ip} (id {node_id[:8]})"
        with contextlib.suppress(Exception):  # a failure shows again, named, at its sample
            reader.prepare()

    def where(self) -> str:
        """This actor's name with its pid and node: answered once it is ready."""
        return self.name

    def read(self, task: BatchTask) -> Answer:
        """Rows 0..len(task.indices) of `task` into this actor's slot: their images, labels and
        outcome (skipped samples' errors made portable), or (None, None, None, the error)."""
        rows = len(task.indices)
        self._task = task
        try:
            outcome = self._portable(self._reader.read_into(task, self._slot, 0, rows, self.name))
        except Exception as error:
            return None, None, None, with_traceback_text(error)
        return self._slot.images[:rows], self._slot.labels[:rows], outcome, None

    @staticmethod
    def _portable(outcome: ChunkOutcome) -> ChunkOutcome:
        """`outcome` with its skipped samples' errors as they can cross to the consumer."""
        outcome.skipped = [
            Skipped(s.position, s.path, portable(s.error))  # type: ignore[arg-type]
            for s in outcome.skipped
        ]
        return outcome

    def read_shared(
        self, task: BatchTask, segment: Segment, start: int, stop: int
    ) -> tuple[ChunkOutcome | None, Any]:
        """Rows [start, stop) of `task` straight into the loader's slot `segment`: (the outcome,
        None), or (None, the error)."""
        try:
            slot = self._mapped.get(segment[0]) or self._map(segment)
            return self._portable(self._reader.read_into(task, slot, start, stop, self.name)), None
        except Exception as error:
            return None, with_traceback_text(error)

    def _map(self, segment: Segment) -> Slot:
        """Map a slot of the loader's, opened through its descriptor, refusing any other file."""
        name, path, identity = segment
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if FileId.of(os.fstat(fd)) != identity:
                raise OSError(f"{path} is no longer the loader's slot {name}")
            slot = self._mapped[name] = self._layout.map(fd, name)
        finally:
            os.close(fd)  # the mapping keeps the file
        return slot

    def forget(self, name: str) -> None:
        """The loader no longer uses its slot `name`: unmap it (once no array views it)."""
        self._mapped.pop(name, None)

    def reading(self) -> list[tuple[int, int, float]]:
        """(row, sample index, seconds) of each row being read now: its row in the part, its
        sample and for how long it has been read (this node's clock)."""
        started, task = self._slot.started, self._task
        assert started is not None
        now = time.monotonic()
        rows = np.flatnonzero(started)
        if task is None:
            return []
        return [(int(row), int(task.indices[row]), now - float(started[row])) for row in rows]
