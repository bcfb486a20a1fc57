"""A loader's epochs as its streams see them: the seam between `Loader` and `Stream`.

The `Loader` makes one `Epochs` and hands it to every `Stream` it makes (`iter(loader)`); a
stream works only through it. `Epochs` owns what outlives one epoch: the plan that draws each
epoch's batches (`plan`, which `replan` and `load` replace between epochs for `Loader.shard`
and `load_state_dict`, a loaded state carried over to new shards), the `cursor` of where
iteration stands, the skip counter, the stats recorder, the worker set (`workers`), the
`window` of batches in flight on them (prefetch.runtime._window) and, for a streamed shard
source, the `spool` that fetches its shards ahead. It starts the workers, with a new window,
when the first stream begins (or at `with loader:`, `enter`) and closes them when the last
stream ends unless a `with` block owns them. While a `with` block owns them, the window
submits the next epoch's first batches once the current epoch's are all submitted
(`run_ahead`), which the next stream claims; replacing the `plan` or closing gives them up.
Thread-safe where a stream is iterated on one thread and `stats()` or `close()` run on another.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import replace
from typing import Any

import numpy as np

from prefetch._messages import counted
from prefetch.backends import Backend, BatchOutcome, SlotRing
from prefetch.decode import (
    decoder_name,
    get_decoder,
    window_engine,
    window_engine_name,
)
from prefetch.errors import TooManySkippedError
from prefetch.plan import Cursor, EpochPlan, LoaderState, loader_state, resume
from prefetch.runtime._options import LoaderOptions
from prefetch.runtime._spool import ShardSpool, streaming_parts
from prefetch.runtime._stats import LoaderStats, StatsRecorder
from prefetch.runtime._window import Run, Window
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
        self.window: Window | None = None  # the batches in flight, while the workers run
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
        # The batches `_draw` drew last, for the `begin` that follows a `start`.
        self._drawn: tuple[EpochPlan, int, int, list[np.ndarray]] | None = None

    @property
    def plan(self) -> EpochPlan:
        """The plan that draws each epoch's batches; replacing it gives up the batches
        submitted ahead for the next epoch."""
        return self._plan

    @plan.setter
    def plan(self, plan: EpochPlan) -> None:
        self._plan = plan
        window = self.window
        if window is not None:
            window.give_up(ahead_only=True, running=True)

    def replan(self, plan: EpochPlan) -> None:
        """Plan with `plan` (other shards) from the next iteration on; a loaded state
        (`load`) continues on it."""
        epoch, position = self.cursor.next_epoch, self.cursor.next_position
        if self.restored is not None:
            plan, position = resume(plan, self.restored)
        self.plan = plan
        self.cursor.restore(epoch, position)

    def shard(self, num_shards: int, shard_index: int) -> bool:
        """Plan shard `shard_index` of `num_shards` from the next iteration on (`Loader.shard`);
        whether anything changed. RuntimeError once an epoch has begun on other shards;
        ValueError when the shard has no whole batch."""
        options = self.options
        if (num_shards, shard_index) == (options.num_shards, options.shard_index):
            return False
        if self.cursor.started:
            raise RuntimeError(
                f"cannot re-shard a loader that has begun an epoch (it yields shard "
                f"{options.shard_index} of {options.num_shards}): call "
                f"shard({num_shards}, {shard_index}) before iterating it"
            )
        plan = self.plan.replace(num_shards=num_shards, shard_index=shard_index)
        if len(plan) == 0:
            raise ValueError(
                f"shard {shard_index} of {num_shards} has "
                f"{counted(plan.shard_size, 'sample')}, {counted(len(plan), 'batch')} of "
                f"{options.batch_size}: too few for an epoch; lower batch_size or the "
                "number of shards"
            )
        self.replan(plan)
        self._reconfigure(num_shards=num_shards, shard_index=shard_index)
        return True

    def load(self, state: LoaderState) -> None:
        """The next iteration continues `state` (`Loader.load_state_dict`), on this plan's
        shards and batch size, whatever it was taken with (`prefetch.plan.resume`)."""
        plan, position = resume(self.plan, state)
        self.plan, self.restored = plan, state
        self.cursor.restore(state.epoch, position)
        self._reconfigure(seed=state.seed)

    def _reconfigure(self, **changes: Any) -> None:
        """`options` (the loader's, and its workers') with `changes` applied."""
        self.options = self.workers.options = replace(self.options, **changes)

    def state(self, held_back: int = 0) -> dict[str, int]:
        """The state to save (`Loader.state_dict`): the cursor's place and the epoch's global
        position, less `held_back` batches delivered but not yet taken."""
        epoch, position = self.cursor.state(len(self.plan), held_back)
        return loader_state(self.plan, epoch, position)

    # ---- the workers' lifetime ----------------------------------------------------------

    def start(self, epoch: int | None = None, position: int = 0) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run, with a new `window`; returns the backend and its
        ring. The first batch of `epoch` from `position` (else where the next iteration
        begins) is what backend="auto" measures; for a streamed source, its shards are
        fetched first."""
        if epoch is None:
            epoch, position = self.cursor.next_epoch, self.cursor.next_position
        if self.spool is not None:
            self.spool.begin(epoch, self._draw(epoch, position), position)
            self.spool.ready(position)
        backend, ring = self.workers.start(
            lambda: (self._draw(epoch, position) or self.plan.batches(epoch))[0]
        )
        with self._lock:
            if self.window is None or self.window.backend is not backend:
                spool = self.spool
                self.window = Window(
                    backend,
                    ring,
                    self.workers.in_flight,
                    spool.ready if spool is not None else None,
                    self.run_ahead,
                )
        return backend, ring

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

        The batches in flight are cancelled, not drained (shutdown step 3 of
        `prefetch.backends._lifecycle`): the workers are stopped next."""
        with self._lock:
            window, self.window = self.window, None
        self._drawn = None
        if window is not None:
            window.give_up(ahead_only=False, running=False)
        if self.spool is not None:
            self.spool.end()  # its folder goes with the loader (the Loader's finalizer)
        self.workers.close()

    def runs(self, window: Window | None) -> bool:
        """Whether `window` is still the loader's (its workers not closed meanwhile)."""
        return window is not None and self.window is window

    # ---- one epoch, as a stream drives it ------------------------------------------------

    def begin(self) -> tuple[Window, Run]:
        """A stream begins the next epoch: take it from the cursor, start the workers, and
        claim the epoch's run of batches in the window (the one submitted ahead, if it begins
        there)."""
        with self._lock:
            self._streams += 1
        epoch, position = self.cursor.begin()
        self.start(epoch, position)
        window = self.window
        assert window is not None
        run = window.claim(self.plan, epoch, position, self._draw)
        self._drawn = None  # claimed: the run holds them
        return window, run

    def _draw(self, epoch: int, position: int) -> list[np.ndarray]:
        """The plan's batches of `epoch` from `position`, drawn once for `start` and the
        `begin` that follows (an epoch's order: 0.1 s at 1.28 M samples)."""
        drawn = self._drawn
        if drawn is None or drawn[0] is not self.plan or drawn[1:3] != (epoch, position):
            drawn = self._drawn = (self.plan, epoch, position, self.plan.batches(epoch, position))
        return drawn[3]

    def run_ahead(self) -> Run | None:
        """The run the window submits once the claimed ones are: the cursor's next epoch, if
        a `with` block keeps the workers running and one stream runs (not for streamed shard
        sources, whose spool fetches one epoch at a time)."""
        if self.spool is not None:
            return None
        with self._lock:
            if self._entered == 0 or self._streams != 1:
                return None
        epoch, position = self.cursor.next_epoch, self.cursor.next_position
        return Run.of(self.plan, epoch, position, self.plan.batches(epoch, position))

    def delivered(self, epoch: int, position: int) -> None:
        """Batch `position - 1` of `epoch` was handed out: advance the cursor, drop the
        spooled shards no later batch reads."""
        self.cursor.advance(epoch)
        if self.spool is not None:
            self.spool.release(position)

    def count(self, outcome: BatchOutcome) -> None:
        """Add a finished batch's work to the stats; enforce the skip cap."""
        stats = self.stats
        stats.work += outcome.work
        stats.read_s.extend(outcome.read_s)
        if self.spool is not None and self.spool.cache is not None:  # its fetches, here
            stats.work.cache += self.spool.cache.take_counts()
        self.skips.count(outcome.skipped, stats)

    def labels(self, raw: np.ndarray) -> np.ndarray | None:
        """A batch's labels in the loader's `label_mode`, from the slot's class indices."""
        return encode_labels(raw, self.options.label_mode, self.num_classes)

    def end(self, window: Window, run: Run) -> None:
        """A stream that began has ended: give up its batches still in flight (drained
        within `DRAIN_S` while the workers go on), stop fetching its shards; the last stream
        to end closes the workers unless `with loader:` owns them."""
        with self._lock:
            goes_on = self._entered > 0 or self._streams > 1
        window.end(run, running=goes_on and self.runs(window))
        if self.spool is not None:
            self.spool.end()
        with self._lock:
            self._streams -= 1
            owner_left = self._streams == 0 and self._entered == 0
        if owner_left:
            self.close()
            forget_dummy_thread()

    def ready_ahead(self) -> int:
        """Batches in flight already decoded that no stream has claimed yet (the next epoch's,
        submitted ahead)."""
        window = self.window
        return window.ready(ahead_only=True) if window is not None else 0

    def snapshot(self) -> LoaderStats:
        """The stats now (`Loader.stats`)."""
        workers, window = self.workers, self.window
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
            window.reads() if window is not None else 0,
            workers.in_flight(),
            self.cache_bytes(),
            workers.places(),
        )

    def cache_bytes(self) -> int:
        """The bytes `cache_dir` holds now (its ledger's count); 0 without one."""
        cache = self.workers.reader.cache or (self.spool.cache if self.spool else None)
        return cache.used_bytes() if cache is not None else 0


def make_epochs(
    owner: object,
    source: Any,
    options: LoaderOptions,
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
        options=options.decode,
        skip_errors=options.on_error.skip,
        labelled=options.label_mode is not None,
        num_classes=len(class_names) or None,
        cache=None if spool else cache_for(source, options.remote),
        augment=options.augment,
        window_engine=window_engine(options.decoder),
        remote=options.remote,
        spool_folder=spool.folder if spool else None,
    )
    workers = Workers(options, reader)
    weakref.finalize(owner, close_quietly, workers)
    return Epochs(plan, options, workers, spool, len(class_names))
