"""The Ray backend: decode actors on a Ray cluster's nodes run the parts of each batch.

What decides a sample's pixels (order, crop box, flip, from `(seed, epoch, index)`) stays in
the training process: it submits batch tasks as with any backend. `submit` cuts a batch into
parts of at most `RAY_PART_ROWS` rows (`RayPart`); decode actors (`DecodeActor`) run
`SampleReader.read_into` on a part. The actors are the loader's `workers` on this process's
own node (pinned there; they reserve no Ray CPU: the rank's share of its host is prefetch's to
size, as for local workers) and, on the other nodes (`decode_nodes`), this rank's share of
their CPUs (`placement`), one reserved CPU each. An actor on another node returns its rows
through Ray's object store, and this process copies them into the batch's slot; an actor on
this node writes them straight into the slot, a memory file (`MemorySlots`, mapped as the
process backend's workers map theirs), and returns only what the part came to: no row of this
node crosses Ray's store.

Parts are pulled, not pushed: an actor holds at most `RAY_PARTS_PER_ACTOR` parts (one being
decoded, the next on its way) and the next part waiting goes to whichever actor has room first
(`PartBook.dispatch`), so each actor's share follows the rate it achieves, and the object
store holds no more than the parts in flight. The batches in flight, the runtime's one window
(`in_flight`, sized by the actors ready), bound the parts: a slow consumer stops the
submitting, and the actors idle rather than run ahead.

Exactly once is this backend's job, not Ray's (`PartBook`'s rules): a part is settled once;
when its actor dies (its node left, a crash, a `ray.kill`) it runs again elsewhere, at most
`max_retries` times; an answer for a part already settled is dropped. A dispatcher thread
waits on the actors' answers (`ray.wait`) and, every `NODES_EVERY_S`, lists the nodes again:
a node that joined gets actors, a lost actor is replaced where there is room. The consumer's
thread submits, waits (`pump`), cancels and times out; rows are copied under the book's lock,
and a part an actor writes into its slot settles only once that actor answered or Ray said it
died, so a cancelled batch's slot is never written once it is reused. `close` stops the
dispatcher, kills the actors (Ray frees their CPUs; a killed training process's actors end
with it, as Ray ends the actors of a driver that died) and leaves the cluster if it joined it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from prefetch._messages import counted
from prefetch.backends._base import DecodePlace
from prefetch.backends._lifecycle import THREAD_JOIN_S
from prefetch.backends._options import RAY_PART_ROWS, RayOptions
from prefetch.backends._process_pending import ProcessPending
from prefetch.backends._ray_actor import DecodeActor, Segment
from prefetch.backends._ray_book import PartBook
from prefetch.backends._ray_cluster import Node, connect, decode_nodes, import_ray, placement
from prefetch.backends._ray_parts import ActorState, NodeTally, RayPart, places
from prefetch.backends._ray_slots import MemorySlots
from prefetch.backends._shm import SlotLayout
from prefetch.coordinator import Coordinator
from prefetch.errors import add_note
from prefetch.sample import BatchTask, SampleReader, Slot, split_rows
from prefetch.sources import source_scheme

log = logging.getLogger("prefetch.backends")

# How long the dispatcher's `ray.wait` blocks before it looks again (parts the consumer sent
# meanwhile are waited on from then: a wait cannot be woken).
WAIT_S = 0.02
# How often the dispatcher lists the cluster's nodes again: a node that joined gets actors.
NODES_EVERY_S = 2.0
# How often the dispatcher looks whether the rows it is pulling from other nodes are here.
PULL_POLL_S = 0.002

_joined_lock = threading.Lock()
_joined = 0  # running backends that joined the cluster themselves (the last one leaves it)


class RayBackend:
    """Decode actors on a Ray cluster; see the module docstring. `workers` is the count of
    actors on this process's node (`set_workers` changes it).

    - `options`: its `RayOptions`.
    - `ranks`: (num_shards, shard_index): the loaders of the job among which each node's CPUs
      are shared, and this one's place among them.
    - `sample_timeout_s`: the loader's limit per sample, or None.
    """

    name = "ray"

    def __init__(
        self,
        options: RayOptions,
        reader: SampleReader,
        workers: int,
        batch_size: int,
        coordinator: Coordinator,
        ranks: tuple[int, int] = (1, 0),
        sample_timeout_s: float | None = None,
    ) -> None:
        self.workers = workers
        self.options = options
        self.address = ""
        self._reader = reader
        self._batch_size = batch_size
        self._coordinator = coordinator
        self._ranks, self._rank = ranks
        self._limit = sample_timeout_s
        self._stop = threading.Event()
        self._next_id = 0
        self._next_actor = 0
        self._book: PartBook | None = None
        self._layout = SlotLayout(batch_size, reader.options.shape)
        # With workers on this node, slots are memory files that its actors write straight
        # into (as worker processes do); else plain memory, written by this process alone.
        shared = workers > 0 and MemorySlots.available()
        self._shared = MemorySlots(self._layout) if shared else None
        self._ray: Any = None
        self._joined = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Join the cluster, send the reader to it once, start the actors and the dispatcher."""
        global _joined
        spooled = self._reader.spool_folder is not None  # a streamed shard source's copies
        if spooled and source_scheme(self._reader.source) not in ("", "memory"):
            raise ValueError(
                "backend=RayOptions(...) with a streamed shard source of URLs: its shards are "
                f"fetched whole into a spool on this host ({self._reader.spool_folder}), which "
                "the other nodes cannot read. Make the source with streaming=False: every node "
                "then reads its samples from the shards by byte range"
            )
        ray = self._ray = import_ray()
        with _joined_lock:
            self._joined = connect(ray, self.options)
            _joined += self._joined
        try:
            context = ray.get_runtime_context()
            self.address = str(context.gcs_address)
            self._own = context.get_node_id()
            self._own_ip = ray.util.get_node_ip_address()
            self._book = PartBook(
                ray, self.options, self._reader, self._limit, self.address, self._segment
            )
            self._remote_class = ray.remote(concurrency_groups={"probe": 1})(DecodeActor)
            self._reader_ref = ray.put(self._reader)  # once, for every actor
            self._place(decode_nodes(ray, self.options, self._own))
            self._thread = threading.Thread(
                target=self._dispatch_loop, name="prefetch-ray-dispatcher", daemon=True
            )
            self._coordinator.register_thread(self._thread)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    def _place(self, nodes: list[Node]) -> None:
        """Start the actors missing: `workers` on this node, `placement` on `nodes`."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        book = self._book
        if book is None or self._stop.is_set():
            return
        wanted = placement(nodes, self.options.cpus, self._ranks, self._rank)
        wanted[self._own] = self.workers
        ips = {node.node_id: node.ip for node in nodes} | {self._own: self._own_ip}
        resource = self.options.resource
        with book.lock:
            for node_id, count in wanted.items():
                running = [a for a in book.actors if a.node_id == node_id and not a.retiring]
                local = node_id == self._own
                for _ in range(count - len(running)):
                    name = f"prefetch-ray-{self._next_actor}"
                    self._next_actor += 1
                    handle = self._remote_class.options(
                        num_cpus=0 if local else 1,
                        resources={resource: 0.001} if resource and not local else {},
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                        max_restarts=0,
                        max_task_retries=0,
                    ).remote(
                        self._reader_ref,
                        name,
                        min(self._batch_size, RAY_PART_ROWS),
                        ips[node_id],
                        self._layout,
                    )
                    ready = handle.where.remote()
                    book.actors.append(
                        ActorState(handle, name, node_id, ips[node_id], local, ready)
                    )
                    book.tallies.setdefault(node_id, NodeTally(ips[node_id], local))

    def describe(self) -> str:
        """Where this loader decodes, for `stats().backend_reason`."""
        book = self._book
        remote = [a for a in book.actors if not a.local] if book is not None else []
        nodes = len({a.node_id for a in remote})
        which = f" with resource {self.options.resource!r}" if self.options.resource else ""
        return (
            f"ray: {counted(self.workers, 'worker')} on this node and "
            f"{counted(len(remote), 'decode actor')} on {counted(nodes, 'other node')}{which} "
            f"of the Ray cluster at {self.address}"
        )

    def decoders(self) -> int:
        """Decode actors ready now (at least 1): what the window of batches is sized by."""
        return max(1, len(self._book.ready())) if self._book is not None else 1

    def set_workers(self, count: int) -> None:
        """Run `count` actors on this node: start more, or let the newest leave after their
        parts."""
        self.workers = count
        book = self._book
        if book is None:
            return
        with book.lock:
            for actor in [a for a in book.actors if a.local and not a.retiring][count:]:
                actor.retiring = True
                if not actor.running:
                    book.drop(actor)
        self._place([])

    def starting(self) -> int:
        """Actors asked for that are not ready yet (being scheduled, starting)."""
        book = self._book
        return sum(1 for a in book.actors if a.ready is not None) if book is not None else 0

    def places(self) -> tuple[DecodePlace, ...]:
        """Where batches were decoded: one `DecodePlace` per node."""
        book = self._book
        if book is None:
            return ()
        with book.lock:
            running = [a for a in book.actors if a.ready is None and not a.dying]
            return places(running, book.tallies)

    def new_slot(self) -> Slot:
        """A memory file's slot (`MemorySlots`) when actors run on this node, else plain."""
        if self._shared is not None and self._book is not None:
            with self._book.lock:
                return self._shared.create()
        height, width, channels = self._reader.options.shape
        return Slot(
            np.empty((self._batch_size, height, width, channels), np.uint8),
            np.empty((self._batch_size,), np.int32),
            started=np.zeros((self._batch_size,), np.float64),
        )

    def _segment(self, slot: Slot) -> Segment | None:
        """What an actor on this node is sent to write into `slot`, or None (plain memory)."""
        return self._shared.segment(slot) if self._shared is not None else None

    def forget_slot(self, slot: Slot) -> None:
        """The loader no longer uses `slot`: let its memory file go, and have this node's
        actors unmap it. Batches still viewing it stay readable."""
        book = self._book
        if self._shared is None or book is None or not slot.name:
            return
        with book.lock:
            self._shared.forget(slot)
            for actor in book.actors:
                if actor.local:
                    actor.handle.forget.remote(slot.name)

    def submit(self, task: BatchTask, slot: Slot) -> ProcessPending:
        """Cut the batch into parts and queue them; actors with room take them at once."""
        size = len(task.indices)
        bounds = split_rows(size, -(-size // RAY_PART_ROWS))
        batch_id, self._next_id = self._next_id, self._next_id + 1
        pending = ProcessPending(self, batch_id, slot, size, len(bounds))
        book = self._book
        assert book is not None, "submit() before start()"
        if book.failed is not None:
            pending.fail(book.failed)
            return pending
        parts = [RayPart(pending, k, task, slot, a, b) for k, (a, b) in enumerate(bounds)]
        with book.lock:
            book.batches[batch_id] = parts
            book.queue.extend(parts)
        book.dispatch()
        return pending

    def pump(self, timeout_s: float) -> None:
        """Wait until a part settles, or `timeout_s` (what `ProcessPending.wait` calls)."""
        if self._book is not None:
            self._book.changed.wait(timeout_s)
            self._book.changed.clear()

    def cancel(self, batch_id: int) -> None:
        """Drop batch `batch_id` (`PartBook.cancel`)."""
        if self._book is not None:
            self._book.cancel(batch_id)

    def time_out(self, pending: ProcessPending, row: int, error: BaseException, skip: bool) -> bool:
        """Stop the actor stuck in row `row` of `pending`; its other parts run elsewhere. With
        `skip` the row's part runs again with that row skipped, else the batch fails with
        `error`. No retry is spent. Always True: the batch settles by itself."""
        book = self._book
        found = book.holder(pending, row) if book is not None else None
        if book is None or found is None:
            return True  # answered meanwhile
        actor, part = found
        with book.lock:
            add_note(error, f"prefetch: stopped {actor.label()}")
            if skip:
                part.task = replace(part.task, timed_out=(*part.task.timed_out, row))
            else:
                book.settle(part, error)
            book.lose(actor, "stopped by sample_timeout_s", retry=False, dead=False)
        self._place([])  # its replacement, on this node (others: at the next listing)
        return True

    def _dispatch_loop(self) -> None:
        """Wait for answers and hand out parts until closed; list the nodes now and then.

        An answer is waited for without pulling it (`fetch_local=False`: pulling every ref at
        every wait costs the raylet a millisecond of CPU per object on 2 cores); one whose rows
        are on another node is then pulled without blocking (`pulling`, polled every
        `PULL_POLL_S`) and taken once it is here, so a transfer never holds up the parts of
        the other actors."""
        ray, book = self._ray, self._book
        assert book is not None
        listed = time.monotonic()
        pulling: set[Any] = set()
        try:
            while not self._stop.is_set():
                if time.monotonic() - listed >= NODES_EVERY_S:
                    self._place(decode_nodes(ray, self.options, self._own))
                    listed = time.monotonic()
                book.dispatch()
                book.check_starved()
                book.probe()
                refs = [ref for ref in book.refs() if ref not in pulling]
                timeout = PULL_POLL_S if pulling else WAIT_S
                if not refs and not pulling:
                    self._stop.wait(WAIT_S)
                    continue
                done: list[Any] = []
                if refs:
                    done, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
                else:
                    self._stop.wait(timeout)
                if done:  # and every other answer that arrived meanwhile
                    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
                for ref in done:
                    if book.on_another_node(ref):
                        pulling.add(ref)
                    else:
                        book.answered(ref)
                if pulling:  # pulls them (again), waits for none
                    here, _ = ray.wait(
                        list(pulling), num_returns=len(pulling), timeout=0, fetch_local=True
                    )
                    for ref in here:
                        pulling.discard(ref)
                        book.answered(ref)
        except BaseException as error:  # a fault of this backend's: every batch says so
            log.exception("prefetch: the Ray backend's dispatcher failed")
            book.fail_all(error)

    def close(self) -> None:
        """Stop the dispatcher, kill every actor (Ray frees their CPUs), drop the reader's
        object; leave the cluster if this backend joined it and no other running one did.
        Idempotent."""
        global _joined
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:  # it looks at the stop flag every WAIT_S, or after a Ray call
            thread.join(THREAD_JOIN_S)
            if thread.is_alive():
                log.warning("prefetch: the Ray backend's dispatcher is still in a call to Ray")
        book = self._book
        if book is not None:
            with book.lock:
                for parts in book.batches.values():
                    for part in parts:  # nothing writes into their slots any more
                        part.pending.cancelled = part.pending.abandoned = True
                book.batches.clear()
                book.queue.clear()
                for actor in list(book.actors):
                    book.drop(actor)
                if self._shared is not None:  # no actor writes any more (killed)
                    self._shared.close()
            book.changed.set()
        self._reader_ref = None
        with _joined_lock:
            if self._joined:
                self._joined = False
                _joined -= 1
                if _joined == 0 and self._ray is not None:
                    with contextlib.suppress(Exception):
                        self._ray.shutdown()
