"""A loader's worker set: its backend, slot ring, worker tuner and coordinator.

A `Workers` starts at most once at a time (at the first epoch, or at `with loader:`) and is
closed by `Loader.close()`; as a backstop, by a finalizer when the loader is dropped unclosed,
and by an exit hook for loaders still open when the interpreter exits. It holds no reference to
its Loader, so those backstops can run while the Loader is being collected. Thread-safe.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from prefetch.backends import (
    Backend,
    DecodePlace,
    SlotRing,
    make_backend,
    sweep_stale,
)
from prefetch.coordinator import Coordinator
from prefetch.host import HostShare, host_share
from prefetch.runtime._autoscale import WorkerTuner, tuner_for
from prefetch.runtime._choice import (
    Decision,
    asked_for,
    decide,
    in_flight,
    planned_workers,
    reader_threads,
    ring_bytes,
)
from prefetch.runtime._options import LoaderOptions
from prefetch.sample import SampleReader
from prefetch.sources import reads_over_network

log = logging.getLogger("prefetch.loader")


class Workers:
    """Starts, tunes and closes one loader's workers; see the module docstring.

    `backend_name` is "thread" or "process" once started ("auto" before), `backend_reason` why,
    and `count` the current worker count. `share` is this rank's share of the host, which every
    default is sized by; the count, backend and slot memory are settled in one place,
    `prefetch.runtime._choice` (`planned_workers` here, `decide` at the first start). `tuned`
    is whether a tuner changes the count: for workers="auto", and for the default workers=None
    when the files are remote URLs, whose reads are mostly waiting (`reads_over_network`);
    workers then start at more than one per core (`remote_start`).
    """

    def __init__(self, options: LoaderOptions, reader: SampleReader) -> None:
        self.options = options
        self.reader = reader
        self.remote = reads_over_network(reader.source)
        self.share: HostShare = host_share()
        self.count = planned_workers(options, self.share, self.remote)
        remote_tuned = options.workers is None and self.remote and options.backend != "ray"
        self.tuned = options.tuned or remote_tuned
        self.decision: Decision | None = None  # settled at the first start, for good
        self.coordinator = Coordinator()
        self.backend: Backend | None = None
        self.ring: SlotRing | None = None
        self.tuner: WorkerTuner | None = None
        self._places: tuple[DecodePlace, ...] = ()  # a closed backend's (`places`)
        self._where = ""  # where the backend decodes, said once it started (`describe`)
        self._lock = threading.Lock()

    def start(self, first_batch: Callable[[], np.ndarray]) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run; returns the backend and its ring.

        `first_batch()` (sample indices) is what backend="auto" measures to choose, asked for
        only at the first start.
        """
        with self._lock:
            if self.backend is not None and self.ring is not None:
                return self.backend, self.ring
            self.coordinator.clear_stop()
            sweep_stale()  # segments of this user's loaders that died
            options = self.options
            if self.decision is None:  # the first start: settled once, for the loader's life
                self.decision = decide(
                    options,
                    self.reader,
                    first_batch(),
                    self.share,
                    self.count,
                    tuned=self.tuned,
                    remote=self.remote,
                )
                self.count = self.decision.workers
                log.info("prefetch %s", self.decision.reason)
            backend = make_backend(
                self.backend_name,
                self.reader,
                workers=self.count,
                batch_size=options.batch_size,
                depth=self.in_flight(),
                coordinator=self.coordinator,
                process=options.process,
                threads_per_worker=reader_threads(options, self.reader),
                ray=options.ray,
                shard=(options.num_shards, options.shard_index),
                sample_timeout_s=options.on_error.sample_timeout_s,
            )
            backend.start()
            self._where = backend.describe()  # where it decodes: known once it runs
            if self.tuned and self.tuner is None:
                height, width, channels = self.reader.options.shape
                row_bytes = height * width * channels + 4
                self.tuner = tuner_for(
                    process=self.backend_name == "process",
                    workers=self.count,
                    depth=options.depth,
                    ring_bytes=self.ring_bytes(),
                    memory_budget=options.memory_budget,
                    row_bytes=row_bytes,
                    batch_size=options.batch_size,
                    readers_per_worker=getattr(backend, "threads_per_worker", 1),
                    cores=self.share.cores,
                    ranks=self.share.ranks.count,
                )
            self.backend, self.ring = backend, SlotRing(backend)
            _OPEN.add(self)
            return self.backend, self.ring

    def ring_bytes(self) -> int:
        """The bytes of batch slots the ring may own at once (`_choice.ring_bytes`)."""
        return ring_bytes(self.options, self.reader, self.backend_name, self.count)

    @property
    def backend_name(self) -> str:
        """The backend decided ("thread", "process" or "ray"; as asked, "auto", before)."""
        return self.decision.backend if self.decision is not None else self.options.backend

    @property
    def backend_reason(self) -> str:
        """Why that backend and that many workers (`decide`), and where it decodes once it
        runs (`Backend.describe`); before the first start, what was asked for."""
        if self.decision is None:
            return asked_for(self.options)
        return "; ".join(filter(None, (self.decision.reason, self._where)))

    def in_flight(self) -> int:
        """Batches an epoch keeps submitted (`_choice.in_flight`: `depth`, or more for many
        workers: the backend's `decoders()` once it runs)."""
        backend = self.backend
        count = backend.decoders() if backend is not None else self.count
        return in_flight(self.options, self.reader, self.backend_name, count)

    def places(self) -> tuple[DecodePlace, ...]:
        """Where batches were decoded (`stats().decoded_on`; the Ray backend's nodes), as of
        its close once closed."""
        backend = self.backend
        return backend.places() if backend is not None else self._places

    def owns(self, backend: Backend | None) -> bool:
        """Whether `backend` is still the running backend (not closed meanwhile)."""
        return backend is not None and self.backend is backend

    def observe(self, waited_s: float, ready: int, outcome: Any) -> None:
        """A batch was delivered: let workers="auto" change the worker count."""
        backend = self.backend
        if self.tuner is None or backend is None:
            return
        work = outcome.work
        blocked_s = work.busy_s - work.cpu_s - work.runnable_s
        starting = backend.starting() > 0
        count = self.tuner.observe(waited_s, ready, work.busy_s, blocked_s, starting)
        if count is not None:
            log.info("prefetch %s", self.tuner.decisions[-1])
            backend.set_workers(count)
            self.count = count

    def close(self) -> None:
        """Stop and join the workers, free the slots; raise an undelivered worker error."""
        with self._lock:
            backend, self.backend, self.ring = self.backend, None, None
            _OPEN.discard(self)
        if backend is None:
            return
        self._places = backend.places()
        self.coordinator.request_stop()  # shutdown step 1 (prefetch.backends._lifecycle)
        backend.close()  # steps 4 to 6: one deadline for all the workers
        # Step 7: the first undelivered error; no more waiting (the backend's close did).
        self.coordinator.join(stop_grace_period_secs=0.0, ignore_live_threads=True)


def close_quietly(workers: Workers) -> None:
    """Close a worker set nobody closed (loader dropped, or open at exit): no traceback."""
    try:
        workers.close()
    except BaseException as error:  # an undelivered worker error: nobody is left to see it
        log.debug("prefetch: closing an abandoned loader: %r", error)


# Started worker sets, closed at interpreter exit. Registered after multiprocessing's own exit hook
# (imported above), so it runs first: workers stop on our message, not on multiprocessing's
# SIGTERM, which the process backend would report as a crash and restart.
_OPEN: set[Workers] = set()


def _close_all_at_exit() -> None:
    for workers in list(_OPEN):
        close_quietly(workers)


atexit.register(_close_all_at_exit)


def forget_dummy_thread() -> None:
    """Remove the current thread's `_DummyThread` entry, if it has one (a foreign thread).

    An epoch without `with loader:` joins its workers on the thread that iterates it, for
    `prefetch.tf.dataset` a thread of tf.data. Joining asks for `threading.current_thread()`,
    which registers a `_DummyThread` for a thread Python did not start, and Python 3.11 never
    removes it: one stale entry in `threading.enumerate()` per epoch.
    """
    dummy_type = getattr(threading, "_DummyThread", None)
    active: dict[int, threading.Thread] | None = getattr(threading, "_active", None)
    lock = getattr(threading, "_active_limbo_lock", None)
    if dummy_type is None or active is None or lock is None:
        return
    ident = threading.get_ident()
    with lock:
        if isinstance(active.get(ident), dummy_type):
            del active[ident]
