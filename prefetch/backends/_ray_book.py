"""The Ray backend's book of parts and actors: who holds which part, each settled once.

`PartBook` is the state the consumer's thread (submit, cancel, time out) and the backend's
dispatcher thread (answers, lost actors) share, under its one lock: the parts waiting
(`queue`, oldest batch first), the batches not settled (`batches`), the decode actors with
the parts each holds (`ActorState.running`, at most `RAY_PARTS_PER_ACTOR`) and what each node
decoded (`NodeTally`). Its rules are the backend's exactly-once contract:

- `dispatch` hands the waiting parts to ready actors with room, the least busy first, so each
  actor's share follows its rate (an actor that answers sooner gets the next part sooner);
- `answered` takes an actor's answer: its rows are copied into the batch's slot under the
  lock, unless the part was settled meanwhile (cancelled, failed, timed out): then it is
  dropped;
- `lose` takes an actor's parts back when it is gone: they are queued again, first, each
  counting a death, and a part past `max_retries` fails its batch (`WorkerCrashedError`);
- `check_starved` fails every batch once parts have waited `lost_timeout_s` with no actor
  ready;
- `probe` and `stuck` find a row read for longer than `sample_timeout_s` in an actor (which
  answers `reading()` beside a part in progress) and start its clock in the batch's slot,
  for the consumer to time out.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prefetch._messages import counted
from prefetch.backends._options import RAY_PARTS_PER_ACTOR, RayOptions
from prefetch.backends._ray_actor import Segment
from prefetch.backends._ray_parts import ActorState, NodeTally, RayPart, Sent
from prefetch.backends._remote_error import rebuild
from prefetch.errors import WorkerCrashedError
from prefetch.sample import SampleReader, Skipped, Slot

log = logging.getLogger("prefetch.backends")

# How often, at most, a busy actor is asked which rows it is reading (`sample_timeout_s`).
PROBE_EVERY_S = 1.0

# The errors of Ray (`ray.exceptions`) that mean a part's actor, or the object holding its
# answer, is gone: the part runs again elsewhere. Any other error of Ray's fails the part.
LOST_ERRORS = (
    "RayActorError",
    "ObjectLostError",
    "OwnerDiedError",
    "NodeDiedError",
    "WorkerCrashedError",
    "LocalRayletDiedError",
    "ActorUnschedulableError",
)


class PartBook:
    """The parts and actors of one Ray backend; see the module docstring.

    - `ray`: the Ray module (imported by the backend).
    - `options`: the backend's `RayOptions`.
    - `reader`: the loader's reader (to name a part's samples in errors).
    - `sample_timeout_s`: the loader's limit per sample, or None (then no actor is probed).
    - `address`: the cluster's address, for errors.
    - `segment_of`: a slot's shared-memory segment, which an actor on this node writes into
      (`read_shared`), or None for a slot in this process's memory only.
    """

    def __init__(
        self,
        ray: Any,
        options: RayOptions,
        reader: SampleReader,
        sample_timeout_s: float | None,
        address: str,
        segment_of: Callable[[Slot], Segment | None],
    ) -> None:
        self.ray = ray
        self.options = options
        self.reader = reader
        self.limit = sample_timeout_s
        self.address = address
        self.segment_of = segment_of
        self.lock = threading.RLock()
        self.changed = threading.Event()  # set whenever a part settles (`pump`)
        self.actors: list[ActorState] = []
        self.tallies: dict[str, NodeTally] = {}
        self.queue: deque[RayPart] = deque()
        self.batches: dict[int, list[RayPart]] = {}
        self.failed: BaseException | None = None
        self.probes: dict[Any, ActorState] = {}
        self._starved_since: float | None = None
        self._last_loss = ""
        self._lost_errors = tuple(
            getattr(ray.exceptions, name) for name in LOST_ERRORS if hasattr(ray.exceptions, name)
        )

    def ready(self) -> list[ActorState]:
        """The actors that may take parts: ready, and neither leaving nor stopped."""
        return [a for a in self.actors if a.ready is None and not a.retiring and not a.dying]

    def refs(self) -> list[Any]:
        """Every object ref an answer may come on: parts in flight, actors starting, probes."""
        with self.lock:
            refs = [ref for actor in self.actors for ref in actor.running]
            refs += [actor.ready for actor in self.actors if actor.ready is not None]
            return refs + list(self.probes)

    def on_another_node(self, ref: Any) -> bool:
        """Whether `ref` is the answer of a part whose rows come from another node (pulled
        through Ray's store before `answered` takes it)."""
        with self.lock:
            for actor in self.actors:
                sent = actor.running.get(ref)
                if sent is not None:
                    return not actor.local and not sent.shared
        return False

    def dispatch(self) -> None:
        """Hand waiting parts to ready actors with room, the least busy first (this node's
        first among equals)."""
        with self.lock:
            free = [a for a in self.ready() if len(a.running) < RAY_PARTS_PER_ACTOR]
            while self.queue and free:
                part = self.queue.popleft()
                if part.settled:
                    continue
                actor = min(free, key=lambda a: (len(a.running), not a.local))
                began = time.monotonic() if not actor.running else float("inf")
                segment = self.segment_of(part.slot) if actor.local else None
                if segment is not None:  # its rows straight into the slot, none in Ray's store
                    ref = actor.handle.read_shared.remote(part.task, segment, part.start, part.stop)
                else:
                    ref = actor.handle.read.remote(part.sent())
                actor.running[ref] = Sent(part, began, segment is not None)
                if len(actor.running) >= RAY_PARTS_PER_ACTOR:
                    free.remove(actor)

    def answered(self, ref: Any) -> None:
        """Take the answer that arrived on `ref`: a part's rows, an actor ready, or a probe."""
        ray = self.ray
        try:
            value, error = ray.get(ref), None
        except ray.exceptions.RayError as raised:
            value, error = None, raised
        with self.lock:
            prober = self.probes.pop(ref, None)
            if prober is not None:
                if error is None:
                    self.stuck(prober, value)
                return
            holder = None
            for actor in self.actors:
                if actor.ready is not None and actor.ready == ref:
                    if error is not None:
                        self.lose(actor, f"it did not start: {error}")
                    else:
                        actor.ready, actor.described = None, str(value)
                        self.dispatch()
                    return
                if ref in actor.running:
                    holder = actor
            if holder is None:
                return  # an actor already dropped: its parts were taken back
            lost = isinstance(error, self._lost_errors)
            if holder.dying:  # killed by this backend: Ray says now whether it wrote the part
                if lost:
                    self._take_back([holder.running.pop(ref)], holder, "", retry=False)
                else:
                    self._part_answered(holder, ref, value, error)
                if not holder.running:
                    self.actors.remove(holder)
                return
            if lost:
                why = str(error).splitlines()[0] if str(error) else repr(error)
                dead = not isinstance(error, self.ray.exceptions.ActorUnavailableError)
                self.lose(holder, why, dead=dead)
                return
            self._part_answered(holder, ref, value, error)
            self.dispatch()

    def _part_answered(self, actor: ActorState, ref: Any, answer: Any, error: Any) -> None:
        """A part's answer (or an error of Ray's that is not a lost actor): settle the part
        unless it is settled already; the actor's next part begins now."""
        sent = actor.running.pop(ref)
        part = sent.part
        now = time.monotonic()
        for waiting in actor.running.values():
            waiting.began = min(waiting.began, now)
        if actor.retiring and not actor.running:
            self.drop(actor)
        if part.settled or part.dropped:
            self.settle(part, None)  # nothing once settled; a dropped part's slot is free now
            return
        if error is not None:
            self.settle(part, error)
            return
        # An actor writing into the slot answers (outcome, error); else (images, labels, ...).
        outcome, sent_error = answer if sent.shared else answer[2:]
        if sent_error is not None:
            self.settle(part, rebuild(*sent_error))
            return
        outcome.skipped = [Skipped(s.position, s.path, rebuild(s.error)) for s in outcome.skipped]
        tally = self.tallies[actor.node_id]
        tally.images += part.stop - part.start - len(outcome.skipped)
        tally.busy_s += outcome.work.busy_s
        if not sent.shared:  # its rows came through Ray's store: copied into the slot now
            outcome = part.answered(answer[0], answer[1], outcome)
        self.settle(part, outcome)

    def settle(self, part: RayPart, answer: Any) -> None:
        """Settle `part` once (None: dropped); its batch is done once all its parts are."""
        with self.lock:
            if part.settled:
                return
            part.settled = True
            part.stop_clocks()
            part.pending.settle_part(part.number, answer)
            if part.pending.done():
                self.batches.pop(part.pending.batch_id, None)
        self.changed.set()

    def lose(self, actor: ActorState, why: str, retry: bool = True, dead: bool = True) -> None:
        """`actor` is gone, or being stopped (`dead` False: this backend kills it now): its
        unsettled parts are queued again, first, each counting a death when `retry`; a part
        past `max_retries` fails its batch. The parts a stopped actor writes straight into
        slots are taken back only once Ray says it died (their refs answer, `answered`), so
        no slot is reused, and no row written twice, while it may still write."""
        with self.lock:
            if actor not in self.actors or actor.dying:
                return
            self.tallies[actor.node_id].lost += 1
            self._last_loss = f"{actor.label()}: {why}"
            writing = {r: sent for r, sent in actor.running.items() if sent.shared and not dead}
            again = [sent for r, sent in actor.running.items() if r not in writing]
            actor.running, actor.dying = writing, True
            if not writing:
                self.actors.remove(actor)
            count = self._take_back(again, actor, why, retry)
            self._kill(actor)
            log.warning(
                "prefetch: lost %s (%s); %s run again elsewhere",
                actor.label(),
                why,
                counted(count + len(writing), "part"),
            )

    def _take_back(self, sent: list[Sent], actor: ActorState, why: str, retry: bool) -> int:
        """Queue the parts of a lost actor again, first (oldest first); a part past
        `max_retries` fails its batch, one cancelled meanwhile is let go. Returns how many
        were queued."""
        again = []
        for part in (item.part for item in sent):
            part.stop_clocks()
            if part.settled or part.dropped:
                self.settle(part, None)  # a dropped part's slot is free: nothing writes
                continue
            part.deaths += retry
            if part.deaths > self.options.max_retries:
                self.settle(part, self._crashed(actor, part, why))
            else:
                again.append(part)
        again.sort(key=lambda p: (p.pending.batch_id, p.number), reverse=True)
        self.queue.extendleft(again)  # oldest first, before every part waiting
        self.dispatch()
        return len(again)

    def drop(self, actor: ActorState) -> None:
        """Let an actor go that holds no part (it is leaving, or the backend closes)."""
        with self.lock:
            if actor in self.actors:
                self.actors.remove(actor)
        self._kill(actor)

    def _kill(self, actor: ActorState) -> None:
        with contextlib.suppress(Exception):  # gone already
            self.ray.kill(actor.handle, no_restart=True)

    def _crashed(self, actor: ActorState, part: RayPart, why: str) -> WorkerCrashedError:
        files = [self.reader.describe(index) for index in part.samples()]
        return WorkerCrashedError(
            f"{actor.label()} died ({why}), and its part of a batch has now lost "
            f"{counted(part.deaths, 'actor')}, more than max_retries="
            f"{self.options.max_retries} allows; the part held {counted(len(files), 'file')}: "
            f"{files[:8]}" + (" ..." if len(files) > 8 else "")
        )

    def check_starved(self) -> None:
        """With parts waiting and no actor ready for `lost_timeout_s`, fail every batch."""
        with self.lock:
            if self.ready() or not (self.queue or self.batches):
                self._starved_since = None
                return
            now = time.monotonic()
            if self._starved_since is None:
                self._starved_since = now
                return
            if now - self._starved_since <= self.options.lost_timeout_s:
                return
            last = f"; the last one lost: {self._last_loss}" if self._last_loss else ""
            self.fail_all(
                WorkerCrashedError(
                    f"backend=RayOptions(...) had no decode actor for lost_timeout_s="
                    f"{self.options.lost_timeout_s:g} s ({counted(len(self.actors), 'actor')} "
                    f"starting, none ready, in the Ray cluster at {self.address}){last}. Give "
                    "the loader workers on this node (workers >= 1), add decode nodes, or see "
                    "`ray status` for free CPUs"
                )
            )

    def fail_all(self, error: BaseException) -> None:
        """Every batch fails with `error`, and so will every later one."""
        with self.lock:
            self.failed = error
            self.queue.clear()
            for parts in list(self.batches.values()):
                for part in parts:
                    self.settle(part, error)
            self.batches.clear()

    def probe(self) -> None:
        """Ask the actors decoding a part for longer than `sample_timeout_s` which rows they
        are reading (each at most every `PROBE_EVERY_S`)."""
        if self.limit is None:
            return
        now = time.monotonic()
        with self.lock:
            for actor in self.actors:
                if not actor.running or actor in self.probes.values():
                    continue
                if all(sent.shared for sent in actor.running.values()):
                    continue  # its clocks are in the slots, which the consumer reads
                if now - actor.began() > self.limit and now - actor.probed_at > PROBE_EVERY_S:
                    actor.probed_at = now
                    probe = actor.handle.reading.options(concurrency_group="probe").remote()
                    self.probes[probe] = actor

    def stuck(self, actor: ActorState, rows: list[tuple[int, int, float]]) -> None:
        """An actor's rows being read (row in its part, sample index, seconds): start the
        clock, in the batch's slot, of each read for longer than `sample_timeout_s`, so the
        consumer times it out. Rows are matched by sample index: the part may have changed
        since the probe was sent."""
        assert self.limit is not None
        now = time.monotonic()
        for sent in actor.running.values():
            part = sent.part
            for row, index, seconds in rows:
                position = part.start + row
                if seconds <= self.limit or position >= part.stop or part.settled:
                    continue
                if int(part.task.indices[position]) == index and part.slot.started is not None:
                    part.slot.started[position] = now - seconds

    def cancel(self, batch_id: int) -> None:
        """Drop batch `batch_id`: its parts settle at once, but those an actor is writing
        into the slot (`Sent.shared`), which settle once it answered or is gone, so the slot
        is not reused while it may still be written. Rows on their way through Ray's store are
        never copied: only this process writes them, under this lock."""
        with self.lock:
            writing = {
                sent.part for actor in self.actors for sent in actor.running.values() if sent.shared
            }
            for part in self.batches.pop(batch_id, []):
                if part in writing:
                    part.dropped = True
                else:
                    self.settle(part, None)

    def holder(self, pending: Any, row: int) -> tuple[ActorState, RayPart] | None:
        """The actor decoding row `row` of the batch `pending`, and that part."""
        with self.lock:
            for actor in self.actors:
                for sent in actor.running.values():
                    part = sent.part
                    if part.pending is pending and part.start <= row < part.stop:
                        return actor, part
        return None
