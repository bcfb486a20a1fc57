"""The loop a process-backend worker runs, and the messages it understands.

Over its own duplex pipe a worker receives, in order:

- `Segment(name, path)` followed by the segment's file descriptor (SCM_RIGHTS): map it. A worker
  never opens a segment by name, so nobody who can create files in /dev/shm can hand it theirs.
- `SentTask(part_id, task, slot_name, start, stop)`, `task` the batch's `BatchTask` pickled
  once by the parent for all its parts (read here as a `Task`): fill rows [start, stop) of the
  slot (a part of a batch whose other rows other workers fill), answer (part id, outcome,
  None) or (part id, None, (error, traceback text)). Answers are frames of our own
  (`_answers.send_answer`), which the parent reads many at a time.
- `Cancel(part_id)`: if that part is still queued here, drop it and answer (part id,
  `Cancelled()`, None) at once.
- `Forget(name)`: unmap the segment; `Stop()` (`_lifecycle`'s): exit once the tasks before it
  are done.

Messages are read as they arrive (between samples' batches), so a cancel overtakes the queued
tasks. With `threads_per_worker` > 1 a part is split in contiguous chunks across that many
reader threads of the worker, so one process overlaps reads that wait on storage, and parts
start while fewer than `BATCHES_AT_ONCE` rows per reader thread run: the next part's reads
wait on storage while the current one's rows are decoded. A `Forget` or `Stop` waits until the
parts before it are answered. The worker starts as `_lifecycle.start_worker` says (SIGINT
ignored, out of open files an exit the parent explains) and exits when its parent dies
(end-of-file on the pipe, or `parent_alive` false); it then unlinks the segments it maps, as
the parent cannot any more.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import pickle
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from multiprocessing.connection import Connection
from typing import NamedTuple

from prefetch.backends._answers import send_answer
from prefetch.backends._file_limit import receive_descriptor
from prefetch.backends._lifecycle import Stop, parent_alive
from prefetch.backends._options import BATCHES_AT_ONCE
from prefetch.backends._remote_error import portable, with_traceback_text
from prefetch.backends._shm import FileId, SlotLayout, unlink_if_same
from prefetch.coordinator import POLL_S
from prefetch.sample import BatchTask, ChunkOutcome, SampleReader, Skipped, Slot, split_rows


class Cancelled:
    """The answer to a task cancelled before the worker began it: its slot was not touched."""


class Forget(NamedTuple):
    """Unmap segment `name` (the loader no longer uses it)."""

    name: str


class Cancel(NamedTuple):
    """Drop part `part_id` if it is still queued."""

    part_id: int


class Segment(NamedTuple):
    """Map segment `name`; its file descriptor follows this message on the pipe."""

    name: str
    path: str


class Task(NamedTuple):
    """Fill rows [start, stop) of segment `slot_name` with samples of `task`: part `part_id`."""

    part_id: int
    task: BatchTask
    slot_name: str
    start: int
    stop: int


class SentTask(NamedTuple):
    """A `Task` as the parent sends it: `task` pickled once per batch, not once per part (with
    64 workers a batch has 64 parts, and each pickling of its indices holds the parent's GIL)."""

    part_id: int
    task: bytes
    slot_name: str
    start: int
    stop: int

    def read(self) -> Task:
        """The task it carries."""
        return Task(self.part_id, pickle.loads(self.task), self.slot_name, self.start, self.stop)


class _ParentGone(Exception):
    pass


def worker_main(
    conn: Connection, parent: int, reader: SampleReader, layout: SlotLayout, threads: int = 1
) -> None:
    """A worker process (`_lifecycle.start_worker`'s target): run tasks from `conn` until told
    to stop or the parent dies.

    With `threads` > 1, each part is split between that many reader threads, and parts start
    while fewer than `BATCHES_AT_ONCE` rows per thread are being read.
    """
    name = f"{multiprocessing.current_process().name} (pid {os.getpid()})"
    segments: dict[str, tuple[Slot, str, FileId]] = {}
    queued: deque[Task | Forget | Stop] = deque()
    pool = _Readers(threads) if threads > 1 else None
    running: list[_Running] = []
    try:
        with contextlib.suppress(Exception):  # a failure shows again, named, at its sample
            reader.prepare()  # imports now, not inside the first task's samples
        while True:
            if not queued and not running and not conn.poll(POLL_S):
                if not parent_alive(parent):
                    raise _ParentGone
                continue
            _read_arrived(conn, layout, segments, queued)
            if pool is not None:
                if _pipeline(reader, queued, running, segments, conn, name, pool):
                    return
                continue
            if not queued:
                continue
            message = queued.popleft()
            if isinstance(message, Stop):
                return
            if isinstance(message, Forget):
                segments.pop(message.name, None)
                continue
            _run(reader, message, segments.get(message.slot_name), conn, name)
    except (_ParentGone, EOFError, BrokenPipeError, ConnectionResetError):
        # The parent is gone and cannot unlink its segments: do it for it, those it sent but
        # this worker had not read yet too (a worker busy with its part when the parent died
        # learns of it writing the answer, before it read the newest segment).
        owned = [(path, identity) for _, path, identity in segments.values()]
        for path, identity in owned + _unread_segments(conn):
            unlink_if_same(path, identity)
    finally:
        if pool is not None:
            pool.executor.shutdown(wait=False, cancel_futures=True)


def _unread_segments(conn: Connection) -> list[tuple[str, FileId]]:
    """The segments among the messages still in the pipe from a parent that is gone."""
    found = []
    with contextlib.suppress(EOFError, OSError):
        while conn.poll(0):
            message = conn.recv()
            if isinstance(message, Segment):
                fd = receive_descriptor(conn)
                try:
                    found.append((message.path, FileId.of(os.fstat(fd))))
                finally:
                    os.close(fd)
    return found


class _Running(NamedTuple):
    """A part whose chunks the reader threads are reading."""

    message: Task
    futures: list[Future[ChunkOutcome]]


def _pipeline(
    reader: SampleReader,
    queued: deque[Task | Forget | Stop],
    running: list[_Running],
    segments: dict[str, tuple[Slot, str, FileId]],
    conn: Connection,
    name: str,
    pool: _Readers,
) -> bool:
    """One turn with reader threads: answer finished parts, start queued ones (while fewer
    than `BATCHES_AT_ONCE` rows per thread run), apply a `Forget` once nothing before it runs;
    True at a `Stop`."""
    for batch in [b for b in running if all(f.done() for f in b.futures)]:
        running.remove(batch)
        _answer(batch.message, functools.partial(_merged, batch.futures), conn)
    while queued:
        message = queued[0]
        if isinstance(message, Task):
            rows_at_once = BATCHES_AT_ONCE * pool.threads
            if sum(b.message.stop - b.message.start for b in running) >= rows_at_once:
                break
            queued.popleft()
            segment = segments.get(message.slot_name)
            if segment is None:  # forgotten: nobody waits for it
                send_answer(conn.fileno(), (message.part_id, Cancelled(), None))
                continue
            running.append(_Running(message, _start_batch(reader, message, segment[0], name, pool)))
            continue
        if running:  # a Forget or Stop waits for the batches before it
            break
        queued.popleft()
        if isinstance(message, Stop):
            return True
        segments.pop(message.name, None)
    reading = [f for batch in running for f in batch.futures if not f.done()]
    if reading:  # until a chunk finishes (or a message may have come): never a busy loop
        wait(reading, timeout=POLL_S, return_when=FIRST_COMPLETED)
    return False


def _read_arrived(
    conn: Connection,
    layout: SlotLayout,
    segments: dict[str, tuple[Slot, str, FileId]],
    queued: deque[Task | Forget | Stop],
) -> None:
    """Take every message that has arrived: map segments, apply cancels, queue the rest."""
    while conn.poll(0):
        message = conn.recv()
        if isinstance(message, Segment):
            fd = receive_descriptor(conn)
            try:
                slot = layout.map(fd, message.name)
                segments[message.name] = (slot, message.path, FileId.of(os.fstat(fd)))
            finally:
                os.close(fd)
        elif isinstance(message, SentTask):
            queued.append(message.read())
        elif isinstance(message, Cancel):
            for task in queued:
                if isinstance(task, Task) and task.part_id == message.part_id:
                    queued.remove(task)
                    send_answer(conn.fileno(), (task.part_id, Cancelled(), None))
                    break
        else:
            queued.append(message)


def _run(
    reader: SampleReader,
    message: Task,
    segment: tuple[Slot, str, FileId] | None,
    conn: Connection,
    name: str,
) -> None:
    if segment is None:  # forgotten: nobody waits for it
        send_answer(conn.fileno(), (message.part_id, Cancelled(), None))
        return
    slot, start, stop = segment[0], message.start, message.stop
    _answer(message, lambda: reader.read_into(message.task, slot, start, stop, name), conn)


def _merged(futures: list[Future[ChunkOutcome]]) -> ChunkOutcome:
    """A batch's chunks as one outcome; the first failing chunk's error, in row order."""
    return ChunkOutcome.merged([future.result() for future in futures])


def _answer(message: Task, outcome_of: Callable[[], ChunkOutcome], conn: Connection) -> None:
    """Send `outcome_of()` for `message`, or the error it raised."""
    try:
        outcome = outcome_of()
        outcome.skipped = [
            Skipped(s.position, s.path, portable(s.error))  # type: ignore[arg-type]
            for s in outcome.skipped
        ]
        send_answer(conn.fileno(), (message.part_id, outcome, None))
    except Exception as error:
        send_answer(conn.fileno(), (message.part_id, None, with_traceback_text(error)))


class _Readers:
    """A worker process's reader threads (`threads_per_worker` > 1)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.executor = ThreadPoolExecutor(threads, "prefetch-reader")


def _start_batch(
    reader: SampleReader, message: Task, slot: Slot, name: str, pool: _Readers
) -> list[Future[ChunkOutcome]]:
    """Split the part in contiguous chunks across `pool`'s threads; the chunks' futures."""
    bounds = split_rows(message.stop - message.start, pool.threads, message.start)
    return [
        pool.executor.submit(reader.read_into, message.task, slot, a, b, name) for a, b in bounds
    ]
