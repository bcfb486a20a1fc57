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
from typing import Any

from prefetch._messages import counted
from prefetch.backends._options import RAY_PARTS_PER_ACTOR, RayOptions
from prefetch.backends._ray_parts import ActorState, NodeTally, RayPart
from prefetch.backends._remote_error import rebuild
from prefetch.errors import WorkerCrashedError
from prefetch.sample import SampleReader, Skipped

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
    """

    def __init__(
        self,
        ray: Any,
        options: RayOptions,
        reader: SampleReader,
        sample_timeout_s: float | None,
        address: str,
    ) -> None:
        self.ray = ray
        self.options = options
        self.reader = reader
        self.limit = sample_timeout_s
        self.address = address
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
        """The actors that may take parts: ready, and not leaving."""
        return [a for a in self.actors if a.ready is None and not a.retiring]

    def refs(self) -> list[Any]:
        """Every object ref an answer may come on: parts in flight, actors starting, probes."""
        with self.lock:
            refs = [ref for actor in self.actors for ref in actor.running]
            refs += [actor.ready for actor in self.actors if actor.ready is not None]
            return refs + list(self.probes)

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
                actor.running[actor.handle.read.remote(part.sent())] = (part, began)
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
            if isinstance(error, self._lost_errors):
                self.lose(holder, str(error).splitlines()[0] if str(error) else repr(error))
                return
            self._part_answered(holder, ref, value, error)
            self.dispatch()

    def _part_answered(self, actor: ActorState, ref: Any, answer: Any, error: Any) -> None:
        """A part's answer (or an error of Ray's that is not a lost actor): settle the part
        unless it is settled already; the actor's next part begins now."""
        part, _ = actor.running.pop(ref)
        now = time.monotonic()
        for key, (waiting, began) in actor.running.items():
            actor.running[key] = (waiting, min(began, now))
        if actor.retiring and not actor.running:
            self.drop(actor)
        if part.settled:
            return
        if error is not None:
            self.settle(part, error)
            return
        images, labels, outcome, sent_error = answer
        if sent_error is not None:
            self.settle(part, rebuild(*sent_error))
            return
        outcome.skipped = [Skipped(s.position, s.path, rebuild(s.error)) for s in outcome.skipped]
        tally = self.tallies[actor.node_id]
        tally.images += part.stop - part.start - len(outcome.skipped)
        tally.busy_s += outcome.work.busy_s
        self.settle(part, part.answered(images, labels, outcome))

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

    def lose(self, actor: ActorState, why: str, retry: bool = True) -> None:
        """`actor` is gone (or stopped): its unsettled parts are queued again, first, each
        counting a death when `retry`; a part past `max_retries` fails its batch."""
        with self.lock:
            if actor not in self.actors:
                return
            self.actors.remove(actor)
            self.tallies[actor.node_id].lost += 1
            self._last_loss = f"{actor.label()}: {why}"
            again = []
            for part, _ in actor.running.values():
                part.stop_clocks()
                if part.settled:
                    continue
                part.deaths += retry
                if part.deaths > self.options.max_retries:
                    self.settle(part, self._crashed(actor, part, why))
                else:
                    again.append(part)
            actor.running.clear()
            again.sort(key=lambda p: (p.pending.batch_id, p.number), reverse=True)
            self.queue.extendleft(again)  # oldest first, before every part waiting
            self._kill(actor)
            log.warning(
                "prefetch: lost %s (%s); %s run again elsewhere",
                actor.label(),
                why,
                counted(len(again), "part"),
            )
            self.dispatch()

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
        for part, _ in actor.running.values():
            for row, index, seconds in rows:
                position = part.start + row
                if seconds <= self.limit or position >= part.stop or part.settled:
                    continue
                if int(part.task.indices[position]) == index and part.slot.started is not None:
                    part.slot.started[position] = now - seconds

    def holder(self, pending: Any, row: int) -> tuple[ActorState, RayPart] | None:
        """The actor decoding row `row` of the batch `pending`, and that part."""
        with self.lock:
            for actor in self.actors:
                for part, _ in actor.running.values():
                    if part.pending is pending and part.start <= row < part.stop:
                        return actor, part
        return None
