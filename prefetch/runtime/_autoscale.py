"""workers="auto" and the machine readers it needs: cores, memory, per-thread CPU clocks.

workers="auto" grows or shrinks the worker count while the loader runs.

`WorkerTuner` sees, per delivered batch, how long the consumer waited and how many batches were
already decoded when it asked. Once per span (at least `SPAN_S` and `SPAN_BATCHES`, or
`SLOW_SPAN_S` and 2 batches when batches are slow) it decides:

- grow geometrically (up to `io_maximum`) when the consumer waited more than `GROW_WAIT` of
  the span and the workers spent at least `IO_BLOCKED` of their busy time blocked (waiting
  for a remote store, a network mount or a disk, neither on a CPU nor waiting for one): the
  storage, not the CPU, limits the rate, and the count it needs (latency x rate) can be dozens.
  When at least `GROW_IDLE_CORES` of the machine sat idle (or idle is unknown) the step aims
  at the count that would use the idle cores: each worker uses (1 - blocked) of a core, so
  `workers + idle / (1 - blocked)`, at least x2 and at most x`MAX_IO_STEP` for threads (with
  20 ms reads and 2 idle cores that is x8 at once, not three doublings) and x2 for processes,
  which cost more each. On a busy CPU, whose extra share comes off other work, the step is
  x1.5 (at least +1). The span after such a step is measured, not skipped (but no span is
  judged while new workers are still starting, such as spawned processes importing): if the
  throughput rose by less than `IO_RISE` (x1.1) over the span before the step, the count
  steps back to where it was and I/O growth never goes past it again; otherwise it steps
  again. The cap `io_maximum` is `MAX_IO_WORKERS`
  threads, fewer when the open-file limit is low (`connection_cap`: each read in flight holds
  a connection); `depth` processes, or `IO_PROCESSES_PER_CORE` per core when each has several
  reader threads (`tuner_for`); and always the memory budget;
- grow by one worker when the consumer waited more than `GROW_WAIT` of the span, another
  worker fits the memory budget and `maximum`, and there is CPU for it: at least
  `GROW_IDLE_CORES` of the machine sat idle, or the workers themselves spent more than
  `GROW_BLOCKED` of their busy time blocked, where more workers overlap more waiting;
- shrink by one when the consumer never waited (below `SHRINK_WAIT`) and nearly all `depth`
  batches were already waiting, for two spans in a row: the workers are ahead, and the
  training step can have their CPU;
- otherwise keep the count. A span after a change is skipped, so each change is measured.

Decisions that change the count are kept (`decisions`) with their reason and reported in
`LoaderStats.worker_decisions`.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from prefetch.backends import ROWS_AHEAD_PER_READER
from prefetch.host import available_memory_bytes, usable_cores

GROW_WAIT = 0.05
SHRINK_WAIT = 0.01
GROW_IDLE_CORES = 0.3
GROW_BLOCKED = 0.3
IO_BLOCKED = 0.6
IO_RISE = 1.1
MAX_IO_STEP = 8
# Threads waiting on a remote store cost little CPU: at 80 ms per request a 2-core machine
# needed about 128 reads in flight to reach 80% of its 0 ms rate (docs/performance.md).
MAX_IO_WORKERS = 128
# Worker processes with reader threads, per core, for I/O: each holds its own connections (its
# own open-file limit), and each reads a batch at a time, so at 80 ms a 2-core machine needed 8
# processes of 32 readers to reach 84% of its 0 ms rate (docs/performance.md).
IO_PROCESSES_PER_CORE = 4
# The span the tuner measures before each decision: at least this long and this many batches.
SPAN_S = 1.0
SPAN_BATCHES = 4
# Slow batches (high latency, few workers: 1.4 s a batch at 80 ms, 2 workers, 32 images) close a
# span after this long and 2 batches, so that the first decisions do not take 4 batches each.
SLOW_SPAN_S = 2.0
# Memory one more worker costs, for the budget: a worker process holds its own interpreter,
# numpy and Pillow (measured at 40-60 MiB here); a thread holds one image being decoded.
PROCESS_WORKER_BYTES = 64 * 2**20
THREAD_WORKER_BYTES = 8 * 2**20


@dataclass(frozen=True)
class WorkerDecision:
    """One change of the worker count: after `batches` batches, `before` -> `after`, and why."""

    batches: int
    before: int
    after: int
    reason: str

    def __str__(self) -> str:
        return f"batch {self.batches}: {self.before} -> {self.after} workers ({self.reason})"


class CpuIdle:
    """Idle CPU, in cores, between successive calls (from /proc/stat; None where unavailable)."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[float, float] | None:
        try:
            with open("/proc/stat") as stat:
                fields = [float(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, total

    def __call__(self) -> float | None:
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[1] <= last[1]:
            return None
        cores = os.cpu_count() or 1
        return cores * (now[0] - last[0]) / (now[1] - last[1])


class WorkerTuner:
    """Decides the worker count from consumer wait and CPU idle; see the module docstring."""

    def __init__(
        self,
        start: int,
        maximum: int,
        depth: int,
        worker_bytes: int,
        budget_bytes: int,
        idle_cores: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        io_maximum: int | None = None,
        cores: int | None = None,
        max_io_step: int = MAX_IO_STEP,
    ) -> None:
        self.workers = start
        self._max_io_step = max_io_step
        self._cores = cores or usable_cores()
        fits = budget_bytes // max(worker_bytes, 1)
        self.maximum = max(1, min(maximum, fits))
        self.io_maximum = max(self.maximum, min(io_maximum or maximum, fits))
        self.depth = depth
        self.decisions: list[WorkerDecision] = []
        self._idle = idle_cores if idle_cores is not None else CpuIdle()
        self._clock = clock
        self._batches = 0
        self._settling = False
        self._calm_spans = 0
        self._io_before: tuple[int, float] | None = None  # (workers, rate) before an I/O step
        self._io_ceiling = self.io_maximum
        self._open_span()

    def _open_span(self) -> None:
        self._span_start = self._clock()
        self._span_batches = 0
        self._waited = 0.0
        self._ready = 0.0
        self._busy = 0.0
        self._blocked = 0.0
        self._idle()  # the idle count restarts with the span

    def observe(
        self,
        waited_s: float,
        ready_batches: int,
        busy_s: float,
        blocked_s: float,
        starting: bool = False,
    ) -> int | None:
        """Record one delivered batch; returns the new worker count when it should change.

        `busy_s` is the workers' time on the batch, `blocked_s` the part of it they spent
        neither on a CPU nor waiting for one. While `starting` (some workers are not ready:
        spawned processes still importing, which also take CPU), spans are not judged.
        """
        self._batches += 1
        self._span_batches += 1
        self._waited += waited_s
        self._ready += ready_batches
        self._busy += busy_s
        self._blocked += blocked_s
        elapsed = self._clock() - self._span_start
        enough = self._span_batches >= SPAN_BATCHES or (
            elapsed >= SLOW_SPAN_S and self._span_batches >= 2
        )
        if elapsed < SPAN_S or not enough:
            return None
        wait = self._waited / elapsed
        ready = self._ready / self._span_batches
        idle = self._idle()
        blocked = self._blocked / self._busy if self._busy > 0 else 0.0
        rate = self._span_batches / elapsed
        self._open_span()
        if self._settling or starting:
            self._settling = False
            return None
        return self._decide(wait, ready, idle, blocked, rate)

    def _decide(
        self, wait: float, ready: float, idle: float | None, blocked: float, rate: float
    ) -> int | None:
        doubled, self._io_before = self._io_before, None
        if wait > GROW_WAIT:
            self._calm_spans = 0
            cpu_free = idle is None or idle >= GROW_IDLE_CORES
            idle_text = "unknown" if idle is None else f"{idle:.1f}"
            reason = (
                f"consumer waited {wait:.0%} of the span; {idle_text} cores idle, workers "
                f"blocked {blocked:.0%} of their time"
            )
            if blocked >= IO_BLOCKED:
                return self._grow_for_io(reason, rate, doubled, idle, blocked)
            if self.workers >= self.maximum:
                return None
            if not cpu_free and blocked <= GROW_BLOCKED:
                return None
            return self._change(self.workers + 1, reason)
        if wait < SHRINK_WAIT and ready >= self.depth - 0.5 and self.workers > 1:
            self._calm_spans += 1
            if self._calm_spans >= 2:
                self._calm_spans = 0
                reason = f"consumer never waited, {ready:.1f}/{self.depth} batches ready"
                return self._change(self.workers - 1, reason)
            return None
        self._calm_spans = 0
        return None

    def _grow_for_io(
        self,
        reason: str,
        rate: float,
        doubled: tuple[int, float] | None,
        idle: float | None,
        blocked: float,
    ) -> int | None:
        """Grow towards the idle cores (x1.5 on a busy CPU) while storage limits the rate and
        the last step paid; step back after a step that did not pay."""
        if doubled is not None and rate < doubled[1] * IO_RISE:
            before, before_rate = doubled
            gain = rate / before_rate - 1 if before_rate > 0 else 0.0
            self._io_ceiling = before
            reason = (
                f"stepping back: {before} -> {self.workers} workers changed the rate {gain:+.0%} "
                f"({before_rate:.1f} -> {rate:.1f} batches/s), less than +{IO_RISE - 1:.0%}; "
                f"{reason}"
            )
            return self._change(before, reason, settle=False)
        if self.workers >= self._io_ceiling:
            return None
        self._io_before = (self.workers, rate)
        if idle is None or idle >= GROW_IDLE_CORES:
            cores = idle if idle is not None else float(self._cores)
            aim = self.workers + cores / max(1.0 - blocked, 1e-3)
            after = round(min(max(aim, 2 * self.workers), self._max_io_step * self.workers))
            after = min(after, self._io_ceiling)
            step = f"x{after / self.workers:.1f} towards {cores:.1f} idle cores"
        else:  # the extra workers' CPU comes off someone else's: a smaller step
            after = min(max(self.workers + 1, self.workers * 3 // 2), self._io_ceiling)
            step = "x1.5 on a busy CPU"
        reason = f"I/O-bound, {step} at {rate:.1f} batches/s; {reason}"
        return self._change(after, reason, settle=False)

    def _change(self, workers: int, reason: str, settle: bool = True) -> int:
        self.decisions.append(WorkerDecision(self._batches, self.workers, workers, reason))
        self.workers = workers
        self._settling = settle
        return workers


def connection_cap() -> int:
    """Reads in flight that the open-file limit leaves room for: a quarter of the soft
    `RLIMIT_NOFILE` (each remote read holds a connection, a descriptor), at most
    `MAX_IO_WORKERS`; the rest stays for the training program's own files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_IO_WORKERS
    return max(1, min(MAX_IO_WORKERS, soft // 4))


def tuner_for(
    *,
    process: bool,
    workers: int,
    depth: int,
    ring_bytes: int,
    memory_budget: int | None,
    row_bytes: int = 0,
    batch_size: int = 1,
    readers_per_worker: int = 1,
    cores: int | None = None,
    ranks: int = 1,
) -> WorkerTuner:
    """The tuner of a loader whose slot ring takes `ring_bytes` (rows of `row_bytes` each).

    The ring comes off the budget (a quarter of the free memory unless `memory_budget` is
    given). When bound by I/O, thread workers may grow to `connection_cap()`, and worker
    processes to `IO_PROCESSES_PER_CORE` per core (each process has its own open-file limit).
    CPU-bound threads grow to twice the cores, processes to the cores (a process holds no
    GIL to wait for). Each worker also costs the batch rows it keeps in flight
    (`Workers.in_flight`): `ROWS_AHEAD_PER_READER` rows per reader, thread or reader thread of
    a process. `cores` is this rank's share of the host's cores (default: the usable cores) and
    `ranks` the ranks on the host (`prefetch.host.host_share`): the default budget is their
    equal part of the quarter.
    """
    cores = cores or usable_cores()
    budget = memory_budget or available_memory_bytes() // 4 // ranks
    if process:
        io_maximum = max(depth, IO_PROCESSES_PER_CORE * cores)
        rows = ROWS_AHEAD_PER_READER * readers_per_worker
        worker_bytes = PROCESS_WORKER_BYTES + rows * row_bytes
    else:
        io_maximum = connection_cap()
        worker_bytes = THREAD_WORKER_BYTES + ROWS_AHEAD_PER_READER * row_bytes
    return WorkerTuner(
        start=workers,
        maximum=cores if process else 2 * cores,
        cores=cores,
        depth=depth,
        worker_bytes=worker_bytes,
        budget_bytes=max(budget - ring_bytes, 0),
        io_maximum=io_maximum,
        max_io_step=2 if process else MAX_IO_STEP,
    )
