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
from typing import Any

import numpy as np

from prefetch._machine import usable_cores
from prefetch.backends import (
    ROWS_AHEAD_PER_READER,
    Backend,
    SlotLayout,
    SlotRing,
    choose_backend,
    fits_free_space,
    make_backend,
    reader_threads,
    ring_capacity,
    sweep_stale,
)
from prefetch.coordinator import Coordinator
from prefetch.runtime._autoscale import WorkerTuner, connection_cap, tuner_for
from prefetch.runtime._options import (
    REMOTE_PROCESSES_PER_CORE,
    REMOTE_READER_THREADS,
    LoaderOptions,
)
from prefetch.sample import SampleReader
from prefetch.sources import reads_over_network

log = logging.getLogger("prefetch.loader")


class Workers:
    """Starts, tunes and closes one loader's workers; see the module docstring.

    `backend_name` is "thread" or "process" once started ("auto" before), `backend_reason` why,
    and `count` the current worker count. `tuned` is whether a tuner changes it: for
    workers="auto", and for the default workers=None when the files are remote URLs, whose
    reads are mostly waiting (`reads_over_network`); workers then start at more than one per
    core (`remote_start`).
    """

    def __init__(self, options: LoaderOptions, reader: SampleReader, count: int) -> None:
        self.options = options
        self.reader = reader
        self.count = count
        self.remote = reads_over_network(reader.source)
        self.tuned = options.tuned or (options.workers is None and self.remote)
        self.backend_name = options.backend
        asked = options.backend != "auto"
        self.backend_reason = f"backend={options.backend!r} was asked for" if asked else ""
        self.coordinator = Coordinator()
        self.backend: Backend | None = None
        self.ring: SlotRing | None = None
        self.tuner: WorkerTuner | None = None
        self._lock = threading.Lock()

    def start(self, first_batch: np.ndarray) -> tuple[Backend, SlotRing]:
        """Start the workers unless they run; returns the backend and its ring.

        `first_batch` (sample indices) is what backend="auto" measures to choose.
        """
        with self._lock:
            if self.backend is not None and self.ring is not None:
                return self.backend, self.ring
            self.coordinator.clear_stop()
            sweep_stale()  # segments of this user's loaders that died
            if self.backend_name == "auto":
                choice = choose_backend(self.reader, first_batch, tuned=self.tuned)
                self.backend_name, self.backend_reason = choice.name, choice.reason
                ring_bytes = self.ring_bytes()
                if choice.name == "process" and not fits_free_space(ring_bytes):
                    self.backend_name = "thread"
                    self.backend_reason = choice.reason.replace("auto: process", "auto: thread") + (
                        f"; but the shared-memory folder has less than the "
                        f"{ring_bytes / 2**20:.0f} MiB free that the process backend's "
                        "batch slots take (docs/processes.md: /dev/shm)"
                    )
                log.info("prefetch %s", choice.reason)
            options = self.options
            if self.tuned and self.remote and self.tuner is None:
                self.count = max(self.count, remote_start(self.backend_name == "process"))
            backend = make_backend(
                self.backend_name,
                self.reader,
                workers=self.count,
                batch_size=options.batch_size,
                depth=self.in_flight(),
                coordinator=self.coordinator,
                process=options.process,
            )
            backend.start()
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
                )
            self.backend, self.ring = backend, SlotRing(backend)
            _OPEN.add(self)
            return self.backend, self.ring

    def ring_bytes(self) -> int:
        """The bytes of batch slots the ring may own at once: the loader's memory bound for
        decoded batches (`ring_capacity(in_flight())` slots of `batch_size` rows)."""
        layout = SlotLayout(self.options.batch_size, self.reader.options.shape)
        return ring_capacity(self.in_flight()) * layout.nbytes

    def in_flight(self) -> int:
        """Batches an epoch keeps submitted: `depth`, and more when the workers need more rows
        than that to all be busy: `ROWS_AHEAD_PER_READER` rows for every reader (a worker
        thread, or each reader thread of a worker process), so that dozens of workers, or
        workers waiting on remote storage, each have a sample to read while the oldest batch's
        last rows finish. Both backends share every batch's rows among their workers."""
        depth, options = self.options.depth, self.options
        readers = self.count
        if self.backend_name == "process":
            readers *= reader_threads(options.process, self.reader, options.batch_size)
        return max(depth, -(-ROWS_AHEAD_PER_READER * readers // options.batch_size))

    def owns(self, backend: Backend | None) -> bool:
        """Whether `backend` is still the running backend (not closed meanwhile)."""
        return backend is not None and self.backend is backend

    def observe(self, waited_s: float, ready: int, outcome: Any) -> None:
        """A batch was delivered: let workers="auto" change the worker count."""
        backend = self.backend
        if self.tuner is None or backend is None:
            return
        blocked_s = outcome.busy_s - outcome.cpu_s - outcome.runnable_s
        starting = backend.starting() > 0
        count = self.tuner.observe(waited_s, ready, outcome.busy_s, blocked_s, starting)
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
        self.coordinator.request_stop()  # shutdown step 1 (prefetch.backends._lifecycle)
        backend.close()  # steps 4 to 6: one deadline for all the workers
        # Step 7: the first undelivered error; no more waiting (the backend's close did).
        self.coordinator.join(stop_grace_period_secs=0.0, ignore_live_threads=True)


def remote_start(process: bool) -> int:
    """The worker count a tuned loader of remote URLs starts at: `REMOTE_READER_THREADS`
    threads per core (within `connection_cap`), or `REMOTE_PROCESSES_PER_CORE` processes per
    core (each reads a batch per reader thread): reads wait, so one per core is too few, and
    processes started later cost a spawn each while the tuner waits for them."""
    if process:
        return REMOTE_PROCESSES_PER_CORE * usable_cores()
    return min(REMOTE_READER_THREADS * usable_cores(), connection_cap())


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
