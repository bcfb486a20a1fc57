"""A loader's epochs as its streams see them: the seam between `Loader` and `Stream`.

The `Loader` makes one `Epochs` and hands it to every `Stream` it makes (`iter(loader)`); a
stream works only through it. `Epochs` owns what outlives one epoch: the plan that draws each
epoch's batches (`plan`, which `replan` and `load` replace between epochs for `Loader.shard`
and `load_state_dict`, a loaded state carried over to new shards), the `cursor` of where
iteration stands, the skip counter, the stats recorder, the worker set
(`workers`) and, for a streamed shard source, the `spool` that fetches its shards ahead. It
starts the workers when the first stream begins (or at `with loader:`, `enter`) and closes them
when the last stream ends unless a `with` block owns them. While a `with` block owns them, an
ending epoch's stream has the next epoch's first batches submitted ahead (`look_ahead`,
prefetch.runtime._lookahead), which the next stream takes over; replacing the `plan` or
closing discards them. Thread-safe where a stream is iterated on one thread and `stats()` or
`close()` run on another.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, NamedTuple, Protocol

import numpy as np

from prefetch._messages import counted
from prefetch.backends import Backend, BatchOutcome, SlotRing
from prefetch.coordinator import Coordinator
from prefetch.decode import DecodeOptions, decoder_name, get_decoder, window_engine_name
from prefetch.errors import TooManySkippedError
from prefetch.plan import Cursor, EpochPlan, LoaderState, loader_state, resume
from prefetch.runtime._lookahead import Lookahead, Submitted
from prefetch.runtime._options import LoaderOptions
from prefetch.runtime._spool import ShardSpool, streaming_parts
from prefetch.runtime._stats import LoaderStats, StatsRecorder
from prefetch.runtime._workers import Workers, close_quietly, forget_dummy_thread
from prefetch.sample import SampleReader, Skipped
from prefetch.sources import cache_for, encode_labels

# skipped files are reported on the logger users already filter on
log = logging.getLogger("prefetch.loader")


class SkipCounter:
    """Counts the samples skipped under on_error="skip" across a loader's life; enforces the cap.

    `max_skipped` caps the number of distinct files skipped (None: no cap); passing it raises
    `TooManySkippedError` listing them all.
    """

    def __init__(self, max_skipped: int | None) -> None:
        self.max_skipped = max_skipped
        self.files: set[str] = set()

    def count(self, skipped: list[Skipped], stats: StatsRecorder) -> None:
        for item in skipped:
            log.warning("prefetch skipped %s: %r", item.path, item.error)
            stats.skipped += 1
            stats.skipped_paths.append(item.path)
            self.files.add(item.path)
        if self.max_skipped is not None and len(self.files) > self.max_skipped:
            raise TooManySkippedError(
                f"{len(self.files)} samples could not be read, more than "
                f"max_skipped={self.max_skipped}; the last was {skipped[-1].path!r}. Fix or "
                "remove the files (see .paths), or raise max_skipped",
                sorted(self.files),
            ) from skipped[-1].error


class Reading(Protocol):
    """A stream, as `Epochs.reads_in_flight` counts it."""

    def reads_in_flight(self) -> int: ...


class Begun(NamedTuple):
    """What a stream gets when it begins: its epoch, the batch it starts at, the batches still
    to come, the running backend and its slot ring, and the batches already submitted ahead
    (those that follow `position`, before `batches`)."""

    epoch: int
    position: int
    batches: list[np.ndarray]
    backend: Backend
    ring: SlotRing
    submitted: list[Submitted]


class Epochs:
    """The epochs of one loader; see the module docstring. Made by the `Loader`.

    - `plan`: the `EpochPlan` that draws each epoch's batches.
    - `options`: the loader's `LoaderOptions`.
    - `workers`: the loader's worker set (`Workers`).
    - `spool`: the `ShardSpool` of a streamed shard source, else None.
    - `num_classes`: the label classes (for one-hot labels).
    """

    def __init__(
        self,
        plan: EpochPlan,
        options: LoaderOptions,
        workers: Workers,
        spool: ShardSpool | None,
        num_classes: int,
    ) -> None:
        self._ahead: Lookahead | None = None
        self._lock = threading.Lock()
        self._plan = plan
        self.options = options
        self.workers = workers
        self.spool = spool
        self.num_classes = num_classes
        self.cursor = Cursor()
        self.restored: LoaderState | None = None  # the state loaded last: `replan` resumes it
        self.stats = StatsRecorder()
        self.skips = SkipCounter(options.on_error.max_skipped)
        self._entered = 0
        self._streams = 0
        self._running: weakref.WeakSet[Reading] = weakref.WeakSet()
        # The batches `start` drew for the next `begin` (an epoch's order: 0.1 s at 1.28 M).
        self._drawn: tuple[EpochPlan, int, int, list[np.ndarray]] | None = None

    @property
    def plan(self) -> EpochPlan:
        """The plan that draws each epoch's batches; replacing it discards the lookahead."""
        return self._plan

    @plan.setter
    def plan(self, plan: EpochPlan) -> None:
        self._plan = plan
        self.discard_lookahead()

    def replan(self, plan: EpochPlan) -> None:
        """Plan with `plan` (other shards) from the next iteration on; a loaded state
        (`load`) continues on it."""
        epoch, position = self.cursor.next_epoch, self.cursor.next_position
        if self.restored is not None:
            plan, position = resume(plan, self.restored)
        self.plan = plan
        self.cursor.restore(epoch, position)

    def load(self, state: LoaderState) -> None:
        """The next iteration continues `state` (`Loader.load_state_dict`), on this plan's
        shards and batch size, whatever it was taken with (`prefetch.plan.resume`)."""
        plan, position = resume(self.plan, state)
        self.plan, self.restored = plan, state
        self.cursor.restore(state.epoch, position)

    def state(self, held_back: int = 0) -> dict[str, int]:
        """The state to save (`Loader.state_dict`): the cursor's place and the epoch's global
        position, less `held_back` batches delivered but not yet taken."""
        epoch, position = self.cursor.state(len(self.plan), held_back)
        return loader_state(self.plan, epoch, position)

    @property
    def coordinator(self) -> Coordinator:
        """The Coordinator that stops the workers and keeps their first error."""
        return self.workers.coordinator

    # ---- the workers' lifetime ----------------------------------------------------------

    def start(
        self, epoch: int | None = None, position: int = 0, batches: list[np.ndarray] | None = None
    ) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run; returns the backend and its ring. The first of
        `batches` (given with `epoch`; else where the next iteration begins) is what
        backend="auto" measures; for a streamed source, its shards are fetched first."""
        if epoch is None or batches is None:
            epoch, position = self.cursor.next_epoch, self.cursor.next_position
            batches = self.plan.batches(epoch, position)
            self._drawn = (self.plan, epoch, position, batches)  # `begin` reads them next
        batches = batches or self.plan.batches(epoch)
        if self.spool is not None:
            self.spool.begin(epoch, batches, position)
            self.spool.ready(position)
        return self.workers.start(batches[0])

    def enter(self) -> None:
        """A `with loader:` block begins: it owns the workers, started now."""
        self._entered += 1
        try:
            self.start()
        except BaseException:  # `with` calls no __exit__ after a failed __enter__
            self._entered -= 1
            self.close()
            raise

    def leave(self) -> None:
        """A `with loader:` block ends: close the workers (raises an undelivered error)."""
        self._entered -= 1
        self.close()

    def close(self) -> None:
        """Stop the fetching and the workers; raise a worker error nobody received. Idempotent.

        The batches submitted ahead are cancelled, not drained (shutdown step 3 of
        `prefetch.backends._lifecycle`): the workers are stopped next."""
        self.discard_lookahead(drain=False)
        self._drawn = None
        if self.spool is not None:
            self.spool.end()  # its folder goes with the loader (the Loader's finalizer)
        try:
            self.workers.close()
        finally:
            self.discard_lookahead()  # one a stream made meanwhile, on another thread

    # ---- one epoch, as a stream drives it ------------------------------------------------

    def begin(self, stream: Reading) -> Begun:
        """A stream begins the next epoch: take it from the cursor and start the workers."""
        with self._lock:
            self._streams += 1
            self._running.add(stream)
        epoch, position = self.cursor.begin()
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.fits(self.plan, epoch, position, self.workers.backend):
            return Begun(
                epoch, position, list(ahead.todo), ahead.backend, ahead.ring, [*ahead.submitted]
            )
        if ahead is not None:
            ahead.discard(self.workers.owns(ahead.backend))
        drawn, self._drawn = self._drawn, None  # what `start` drew at `with loader:`, if these
        if drawn is not None and drawn[0] is self.plan and drawn[1:3] == (epoch, position):
            batches = drawn[3]
        else:
            batches = self.plan.batches(epoch, position)
        backend, ring = self.start(epoch, position, batches)
        return Begun(epoch, position, batches, backend, ring, [])

    def look_ahead(self, room: int) -> None:
        """The running stream has submitted its epoch's last batch and leaves `room` batches
        free in flight: submit the next epoch's first batches into it, if a `with` block keeps
        the workers running and this is the only stream (not for streamed shard sources, whose
        spool fetches one epoch at a time)."""
        if room <= 0 or self.spool is not None:
            return
        with self._lock:
            backend, ring = self.workers.backend, self.workers.ring
            if self._entered == 0 or self._streams != 1 or backend is None or ring is None:
                return
            if self._ahead is None:
                epoch, position = self.cursor.next_epoch, self.cursor.next_position
                self._ahead = Lookahead(self.plan, epoch, position, backend, ring)
            self._ahead.extend(room)

    def discard_lookahead(self, drain: bool = True) -> None:
        """Cancel the batches submitted ahead, if any, and return their slots (those being
        decoded drained within `DRAIN_S` with `drain`, while the workers run)."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.discard(drain and self.workers.owns(ahead.backend))

    def ready_ahead(self) -> int:
        """Batches submitted ahead for the next epoch that are already decoded."""
        ahead = self._ahead
        return ahead.ready() if ahead is not None else 0

    def in_flight(self) -> int:
        """The batches an epoch keeps submitted (`Workers.in_flight`)."""
        return self.workers.in_flight()

    def ready(self, batch: int) -> None:
        """Return once the shards batch number `batch` reads are local (streamed sources)."""
        if self.spool is not None:
            self.spool.ready(batch)

    def delivered(self, epoch: int, position: int) -> None:
        """Batch `position - 1` of `epoch` was handed out: advance the cursor, drop the
        spooled shards no later batch reads."""
        self.cursor.advance(epoch)
        if self.spool is not None:
            self.spool.release(position)

    def count(self, outcome: BatchOutcome) -> None:
        """Add a finished batch's work to the stats; enforce the skip cap."""
        stats = self.stats
        stats.producer_busy_s += outcome.busy_s
        stats.read_s.extend(outcome.read_s)
        stats.cache_hits += outcome.cache_hits
        stats.cache_misses += outcome.cache_misses
        stats.cache_fetched_bytes += outcome.cache_fetched_bytes
        stats.cache_evictions += outcome.cache_evictions
        stats.cache_evicted_bytes += outcome.cache_evicted_bytes
        if self.spool is not None and self.spool.cache is not None:  # its fetches, here
            counts = self.spool.cache.take_counts()
            stats.cache_fetched_bytes += counts.fetched_bytes
            stats.cache_evictions += counts.evictions
            stats.cache_evicted_bytes += counts.evicted_bytes
        self.skips.count(outcome.skipped, stats)

    def labels(self, raw: np.ndarray) -> np.ndarray | None:
        """A batch's labels in the loader's `label_mode`, from the slot's class indices."""
        return encode_labels(raw, self.options.label_mode, self.num_classes)

    def observe(self, waited_s: float, ready: int, outcome: BatchOutcome) -> None:
        """A batch was delivered: let a tuned worker count change (`Workers.observe`)."""
        self.workers.observe(waited_s, ready, outcome)

    def owns(self, backend: Backend | None) -> bool:
        """Whether `backend` is still the running backend (not closed meanwhile)."""
        return self.workers.owns(backend)

    def describe(self, index: int) -> str:
        """The file (or sample) behind source index `index`, for messages."""
        return self.workers.reader.describe(index)

    def workers_go_on(self) -> bool:
        """Whether the workers keep running once the calling stream ends (a `with` block owns
        them, or another stream runs): else its `end()` closes them."""
        with self._lock:
            return self._entered > 0 or self._streams > 1

    def end(self) -> None:
        """A stream that began has ended: stop fetching its shards; the last stream to end
        closes the workers unless `with loader:` owns them."""
        if self.spool is not None:
            self.spool.end()
        with self._lock:
            self._streams -= 1
            owner_left = self._streams == 0 and self._entered == 0
        if owner_left:
            self.close()
            forget_dummy_thread()

    def snapshot(self) -> LoaderStats:
        """The stats now (`Loader.stats`)."""
        workers = self.workers
        decisions = tuple(map(str, workers.tuner.decisions)) if workers.tuner else ()
        reader = workers.reader
        if reader.augment.crop is not None:  # what decodes: the window decoder, or the decoder
            decoder = window_engine_name(reader.window_engine)
        else:
            decoder = decoder_name(reader.decoder)
        return self.stats.snapshot(
            workers.backend_name,
            workers.count,
            self.options.depth,
            workers.backend_reason,
            decisions,
            decoder,
            self.reads_in_flight(),
            workers.in_flight(),
            self.cache_bytes(),
        )

    def cache_bytes(self) -> int:
        """The bytes `cache_dir` holds now (its ledger's count); 0 without one."""
        cache = self.workers.reader.cache or (self.spool.cache if self.spool else None)
        return cache.used_bytes() if cache is not None else 0

    def reads_in_flight(self) -> int:
        """Samples that workers are reading right now, over the running streams."""
        ahead = self._ahead
        reads = ahead.reads() if ahead is not None else 0
        return reads + sum(stream.reads_in_flight() for stream in list(self._running))


def make_epochs(
    owner: object,
    source: Any,
    options: LoaderOptions,
    decode: DecodeOptions,
    class_names: list[str],
) -> Epochs:
    """The plan, spool, reader and worker set of a loader's `options`, as its `Epochs`. The
    spool and the workers are closed when `owner` (the Loader) is collected, at the latest."""
    plan = EpochPlan(
        size=len(source),
        batch_size=options.batch_size,
        seed=options.seed,
        shuffle=options.shuffle,
        drop_remainder=options.drop_remainder,
    )
    plan, spool = streaming_parts(source, plan, options.cache_dir, options.remote)
    if spool is not None:
        weakref.finalize(owner, spool.close)
    if len(plan) == 0:
        raise ValueError(
            f"drop_remainder=True with {counted(len(source), 'sample')} and batch_size "
            f"{options.batch_size} leaves no batch; lower batch_size"
        )
    reader = SampleReader(
        source=source,
        decoder=get_decoder(options.decoder),
        options=decode,
        skip_errors=options.on_error.skip,
        labelled=options.label_mode is not None,
        num_classes=len(class_names) or None,
        cache=None if spool else cache_for(source, options.remote),
        augment=options.augment,
        window_engine="pillow" if options.decoder == "pillow" else "turbo",
        remote=options.remote,
        spool_folder=spool.folder if spool else None,
    )
    workers = Workers(options, reader)
    weakref.finalize(owner, close_quietly, workers)
    return Epochs(plan, options, workers, spool, len(class_names))
