"""The process backend: worker processes decode straight into shared-memory slots.

Workers start with spawn or forkserver (never fork: the loader's process may run TensorFlow's
threads). They do not re-run the main script unless the transform, decoder or source is defined
there, so a script's `import tensorflow` does not load TensorFlow in every worker. What a worker
is sent as it starts (the `SampleReader`, with the source) travels as a `SharedArrays`: the
source's large arrays are written once, at `start`, into a memory file every worker maps
(prefetch.backends._shared_arrays), not copied into each.

Each worker has its own pipe (prefetch.backends._process_worker lists the messages). The parent
passes every slot's segment to every worker as a file descriptor when the slot is created (and
to a new worker when it starts). A batch's rows are shared among the workers: `submit` splits
them into one contiguous part per live worker (the least busy first, `split_rows`) and sends
each (part id, task, slot name, rows); the worker fills its rows with `SampleReader.read_into`
and answers (part id, outcome) or (part id, error). No pixels cross a pipe, and the parent's
work per batch is one message to and from each worker (the batch's task pickled once for
all of them); it asks a worker's exit code only when its sentinel says it exited.
`ProcessPending.wait` returns once every part of that batch is settled (or the timeout
passed); `cancel` makes workers skip its parts they have not begun (both handles, the pending
batch and the worker, are in _process_pending.py).

The consumer thread drives everything from `pump()`, which waits on the pipes and on the
processes' sentinels, so a dead worker is seen within `POLL_S`; it is restarted and its batches
parts re-sent, up to `max_restarts` times, after which `WorkerCrashedError` names it, its exit
code or signal and the sample it was reading (a segfault in a decoder; a SIGBUS with /dev/shm
full says so). Workers start and stop as `_lifecycle` says (`close`: one deadline for all),
and too few open files is one error that says so (`_file_limit`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import threading
from dataclasses import replace
from multiprocessing.reduction import send_handle

from prefetch._messages import counted
from prefetch.backends import _shm as shm
from prefetch.backends._answers import WorkerPoll
from prefetch.backends._base import OnThisHost
from prefetch.backends._file_limit import EXIT_OUT_OF_FILES, FileNeeds
from prefetch.backends._lifecycle import (
    Stop,
    exit_reason,
    start_worker,
    stop_processes,
    worker_context,
)
from prefetch.backends._process_pending import (
    InFlight,
    Part,
    ProcessPending,
    WorkerHandle,
)
from prefetch.backends._process_worker import Cancel, Cancelled, Forget, Segment, SentTask
from prefetch.backends._process_worker import worker_main as _worker_main
from prefetch.backends._remote_error import rebuild
from prefetch.backends._ring import ring_capacity
from prefetch.backends._shared_arrays import SharedArrays
from prefetch.backends._shm import SharedSlots, SlotLayout
from prefetch.backends._spawning import check_picklable
from prefetch.coordinator import Coordinator
from prefetch.errors import WorkerCrashedError, add_note
from prefetch.sample import BatchTask, SampleReader, Skipped, Slot, split_rows

log = logging.getLogger("prefetch.backends")


class ProcessBackend(OnThisHost):
    """Spawned worker processes filling shared-memory slots; see the module docstring."""

    name = "process"

    def __init__(
        self,
        reader: SampleReader,
        workers: int,
        batch_size: int,
        depth: int,
        coordinator: Coordinator,
        max_restarts: int = 3,
        start_method: str = "spawn",
        threads_per_worker: int = 1,
    ) -> None:
        self.workers = workers
        self._reader = reader
        self._layout = SlotLayout(batch_size, reader.options.shape)
        self._depth = depth
        self._coordinator = coordinator
        self.max_restarts = max_restarts
        self.threads_per_worker = threads_per_worker
        self.restarts = 0
        self._context = worker_context(start_method)
        self._slots = SharedSlots(self._layout)
        self._workers: list[WorkerHandle] = []
        self._pending: dict[int, ProcessPending] = {}
        self._next_id = 0
        self._next_part = 0
        self._crashed: Exception | None = None
        self._lock = threading.RLock()
        self._pickled: tuple[BatchTask | None, bytes] = (None, b"")  # the newest task sent
        self._poll = WorkerPoll()
        self._needs_main = check_picklable(reader)
        self._sent: SharedArrays | None = None  # the reader as workers get it, from start()

    def start(self) -> None:
        """Start the workers; one that fails to start stops those before it, and nothing is
        left (no process, pipe, segment or memory file)."""
        try:
            self._sent = SharedArrays(self._reader)  # its large arrays once, for every worker
            self._files().check()
            for index in range(self.workers):
                self._workers.append(self._spawn(index))
        except BaseException:
            self.close()
            raise

    def _files(self) -> FileNeeds:
        """What the workers and slots take of this process's open files (`_file_limit`)."""
        what = f"backend='process' with {counted(self.workers, 'worker')}"
        fewer, also = "use fewer workers", ", or a smaller depth (fewer batch slots)"
        return FileNeeds(self.workers, ring_capacity(self._depth), what, fewer, also)

    def set_workers(self, count: int) -> None:
        """Run `count` workers: spawn more, or let the newest finish their batches and leave."""
        with self._lock:
            live = sorted((w for w in self._workers if not w.retiring), key=lambda w: w.index)
            used = {w.index for w in self._workers}
            while len(live) < count:
                index = min(i for i in range(len(used) + 1) if i not in used)
                used.add(index)
                worker = self._spawn(index)
                self._workers.append(worker)
                live.append(worker)
            for worker in live[count:]:
                worker.retiring = True
                with contextlib.suppress(OSError):
                    worker.conn.send(Stop())
            self.workers = count

    def _spawn(self, index: int) -> WorkerHandle:
        with self._files().said():
            process, parent_end = start_worker(
                self._context,
                _worker_main,
                (self._sent, self._layout, self.threads_per_worker),
                f"prefetch-process-{index}",
                needs_main=self._needs_main,
            )
        self._coordinator.register_thread(process)
        worker = WorkerHandle(index, process, parent_end)
        self._poll.add(worker, parent_end.fileno(), process.sentinel)
        for name in self._slots.segments():
            self._give_segment(worker, name)
        return worker

    def _give_segment(self, worker: WorkerHandle, name: str) -> None:
        """Pass a segment's file descriptor itself: the worker never opens it by name."""
        fd, path, _ = self._slots.segments()[name]
        with contextlib.suppress(OSError):  # a dead worker is noticed and handled by pump()
            worker.conn.send(Segment(name, path))
            send_handle(worker.conn, fd, worker.process.pid)

    def starting(self) -> int:
        """Live workers that have not answered a batch yet (spawning, importing)."""
        with self._lock:
            return sum(1 for w in self._workers if not w.retiring and w.answered == 0)

    def new_slot(self) -> Slot:
        with self._lock, self._files().said():
            slot = self._slots.create()
            for worker in self._workers:
                self._give_segment(worker, slot.name)
            return slot

    def forget_slot(self, slot: Slot) -> None:
        """The loader no longer uses `slot`: unlink its segment and have workers unmap it.

        Batches the consumer still holds stay readable: their mapping lives on in this process
        until the last view is freed.
        """
        with self._lock:
            self._slots.forget(slot)
            for worker in self._workers:
                with contextlib.suppress(OSError):
                    worker.conn.send(Forget(slot.name))

    def submit(self, task: BatchTask, slot: Slot) -> ProcessPending:
        """Split the batch's rows among the live workers, least busy first: one part each."""
        with self._lock:
            batch_id = self._next_id
            self._next_id += 1
            size = len(task.indices)
            live = [w for w in self._workers if not w.retiring]
            bounds = split_rows(size, len(live))
            pending = ProcessPending(self, batch_id, slot, size, len(bounds))
            if self._crashed is not None or not live:
                pending.fail(self._crashed or WorkerCrashedError("no worker processes left"))
                return pending
            self._pending[batch_id] = pending
            busy = {worker.index: worker.rows() for worker in live}
            for number, (start, stop) in enumerate(bounds):
                worker = min(live, key=lambda w: (busy[w.index], w.index))
                busy[worker.index] += stop - start
                self._send(worker, (batch_id, number, Part(task, slot, start, stop)))
            return pending

    def _send(self, worker: WorkerHandle, item: InFlight) -> None:
        part_id = self._next_part
        self._next_part += 1
        worker.in_flight[part_id] = item
        part = item[2]
        if part.task is not self._pickled[0]:  # the batch's task, pickled once for its parts
            self._pickled = (part.task, pickle.dumps(part.task, pickle.HIGHEST_PROTOCOL))
        message = SentTask(part_id, self._pickled[1], part.slot.name, part.start, part.stop)
        with contextlib.suppress(OSError):  # a dead worker is noticed and handled by pump()
            worker.conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))

    def cancel(self, batch_id: int) -> None:
        """Ask the workers that hold parts of batch `batch_id` to skip those not begun."""
        with self._lock:
            for worker in self._workers:
                for part_id, (owner, _, _) in worker.in_flight.items():
                    if owner == batch_id:
                        with contextlib.suppress(OSError):
                            worker.conn.send(Cancel(part_id))

    def time_out(self, pending: ProcessPending, row: int, error: BaseException, skip: bool) -> bool:
        """Kill the worker stuck in row `row` of `pending`; its replacement takes its parts.

        With `skip` the row's part is re-sent with that row marked to skip; otherwise the batch
        fails with `error` once its other parts are answered. No restart is spent either way.
        Always True: the batch settles by itself.
        """
        with self._lock:
            found = self._holder(pending.batch_id, row)
            if found is None:  # answered meanwhile
                return True
            worker, part_id = found
            owner, number, part = worker.in_flight[part_id]
            add_note(error, f"prefetch: killed {worker.process.name} (pid {worker.process.pid})")
            if skip:
                task = replace(part.task, timed_out=(*part.task.timed_out, row))
                worker.in_flight[part_id] = (owner, number, replace(part, task=task))
            else:
                del worker.in_flight[part_id]
                pending.settle_part(number, error)
            worker.timed_out = True
            worker.process.kill()
            return True

    def _holder(self, batch_id: int, row: int) -> tuple[WorkerHandle, int] | None:
        """The worker holding row `row` of batch `batch_id`, and that part's id."""
        for worker in self._workers:
            for part_id, (owner, _, part) in worker.in_flight.items():
                if owner == batch_id and part.start <= row < part.stop:
                    return worker, part_id
        return None

    def pump(self, timeout_s: float) -> None:
        """Receive results and handle dead workers, waiting at most `timeout_s`."""
        with self._lock:
            readable, exited = self._poll.wait(timeout_s)
            for worker in readable:
                self._receive(worker)
            for worker in exited:
                # Only these can have exited: asking every worker's exit code is a waitpid
                # each, each a wait for the GIL behind a training thread (issue 34).
                if worker in self._workers and worker.process.exitcode is not None:
                    self._receive(worker)  # what it sent before it died still counts
                    self._handle_death(worker)

    def _receive(self, worker: WorkerHandle) -> None:
        """Take the answers that arrived from `worker` (one read of its pipe)."""
        try:
            answers, _ = worker.answers.read()
            for part_id, outcome, error in answers:
                worker.answered += 1
                item = worker.in_flight.pop(part_id, None)
                if item is None:  # settled already: timed out, its answer sent as it was killed
                    continue
                batch_id, number, _ = item
                pending = self._pending.get(batch_id)
                if pending is None:
                    continue
                if isinstance(outcome, Cancelled):  # skipped before it began: rows untouched
                    pending.settle_part(number, None)
                elif error is not None:
                    pending.settle_part(number, rebuild(*error))
                else:
                    outcome.skipped = [
                        Skipped(s.position, s.path, rebuild(s.error)) for s in outcome.skipped
                    ]
                    pending.settle_part(number, outcome)
                if pending.done():
                    del self._pending[batch_id]
        except (EOFError, OSError):
            pass  # the worker died; its sentinel tells

    def _handle_death(self, worker: WorkerHandle) -> None:
        code = worker.process.exitcode
        reason = exit_reason(code)
        if code == -signal.SIGBUS:
            reason += shm.exhausted_note(self._layout.nbytes)
        lost = list(worker.in_flight.values())
        reading = worker.begun(self._reader.describe)  # the sample that killed it, if one did
        if reading:
            reason += f" while reading {', '.join(map(repr, reading[:8]))}"
        for _, _, part in lost:  # rows it was reading stopped with it: no clock runs
            if part.slot.started is not None:
                part.slot.started[part.start : part.stop] = 0.0
        self._poll.remove(worker.conn.fileno(), worker.process.sentinel)
        worker.conn.close()
        worker.process.join()
        self._workers.remove(worker)
        live = [w for w in self._workers if not w.retiring]
        if worker.timed_out:
            self._replace(worker, lost)
            return
        if worker.retiring and live:
            for item in lost:  # only if it died before finishing them
                if item[0] in self._pending:
                    self._send(min(live, key=lambda w: (w.rows(), w.index)), item)
            return
        if code == EXIT_OUT_OF_FILES or self.restarts >= self.max_restarts:
            files = worker.sent_files(self._reader.describe)
            error: Exception = worker.crashed(
                reason, self.restarts, self.max_restarts, files, began=bool(reading)
            )
            if code == EXIT_OUT_OF_FILES:  # a restart would run out the same way
                error = self._files().worker_ran_out(worker.process.name, worker.process.pid)
            self._crashed = error
            for batch_id, number, _ in lost:
                pending = self._pending.get(batch_id)
                if pending is not None:
                    pending.settle_part(number, error)
                    if pending.done():
                        del self._pending[batch_id]
            return
        for batch_id, number, _ in lost:
            pending = self._pending.get(batch_id)
            if pending is not None and pending.cancelled:  # nobody wants it: do not re-send
                pending.settle_part(number, None)
                if pending.done():
                    del self._pending[batch_id]
        lost = [item for item in lost if item[0] in self._pending and not self._cancelled(item)]
        self.restarts += 1
        log.warning(
            "prefetch worker %s (pid %s) died with %s; restarting it (%d/%d) and re-sending %s",
            worker.process.name,
            worker.process.pid,
            reason,
            self.restarts,
            self.max_restarts,
            counted(len(lost), "part") + " of batches",
        )
        self._replace(worker, lost)

    def _cancelled(self, item: InFlight) -> bool:
        pending = self._pending.get(item[0])
        return pending is None or pending.cancelled

    def _replace(self, worker: WorkerHandle, lost: list[InFlight]) -> None:
        """Start a worker in place of `worker` and send it the parts still wanted."""
        replacement = self._spawn(worker.index)
        self._workers.append(replacement)
        for item in lost:
            if item[0] in self._pending:
                self._send(replacement, item)

    def close(self) -> None:
        """Stop the workers within one deadline for all, then unlink every segment (shutdown
        steps 4 to 6 of `_lifecycle`'s note). Idempotent."""
        with self._lock:
            workers, self._workers = self._workers, []
            for worker in workers:
                self._poll.remove(worker.conn.fileno(), worker.process.sentinel)
            stop_processes([(worker.process, worker.conn) for worker in workers])
            for pending in self._pending.values():
                pending.cancelled = pending.abandoned = True  # no worker writes any more
            self._pending.clear()
            self._slots.close()  # step 6: only now, when no worker can write any more
            if self._sent is not None:
                self._sent.close()
                self._sent = None
