"""The worker processes of `prefetch shards write`, which share out its per-sample work: the
parent's side (the workers' side is `_shard_worker`).

`Preparer(workers, options)` runs `prepare` (`_samples`) on chunks of
samples: in the calling thread for one worker, else in `workers` spawned worker processes.
`write(tasks, out, on_progress)` has the workers write whole shards instead
(`_shard_worker.write_shard`; the folder descriptor of `out` is passed to each worker over its
pipe), yielding each `ShardWritten` as it finishes.
`map(chunks)` yields each chunk's answers in the chunks' order; at most `CHUNKS_PER_WORKER`
chunks per worker are sent or held unyielded at any time, so the parent holds at most `workers *
CHUNKS_PER_WORKER` chunks of encoded images (the memory bound; docs/shards.md gives it in
bytes). Workers answer an error with its type and traceback (raised in the parent; a worker
that dies is a `ChildProcessError` naming its exit code or signal). One thread uses a
`Preparer`.

The workers live as the loader's do, on the same code (`prefetch.backends._lifecycle`, whose
note gives the order): started by `start_worker` (spawn, the main script hidden, SIGINT
ignored, out of open files a quiet exit that `_died` explains), stopped by the same `Stop`
message, checking `parent_alive` while they wait and between two images of a shard, and
`close()` (idempotent; a context manager) is `stop_processes`: one deadline for all of them,
then SIGTERM (which a worker takes as `Stop`: the shard it writes is removed), then SIGKILL.
What differs is only what a worker does: it answers chunks and writes shards instead of
filling batch slots, so it has its own messages and loop (`_shard_worker`), and it maps no
shared memory.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import send_handle
from types import TracebackType
from typing import Any, NoReturn

from prefetch.backends import (
    EXIT_OUT_OF_FILES,
    FileNeeds,
    exit_code,
    exit_reason,
    rebuild_error,
    start_worker,
    stop_processes,
    worker_context,
)
from prefetch.coordinator import POLL_S
from prefetch.tools.shards._layout import Sample
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._samples import Answer, Options, prepare
from prefetch.tools.shards._shard_worker import ShardTask, ShardWritten, serve

# Samples per task sent to a worker: large enough that a message per chunk costs little next to
# its images (8 decodes of a 2 MP photo take about 0.3 s), small enough to balance the workers
# and bound what is in flight.
CHUNK_SAMPLES = 8
# Chunks sent to or answered by a worker and not yet written, per worker: one being worked on,
# one queued, so a worker never waits for the parent between chunks.
CHUNKS_PER_WORKER = 2
# Whole shards sent to a worker at a time (the next is sent as it finishes one: a round trip of
# about a millisecond against a shard's seconds).
SHARDS_AT_ONCE = 1
# What `Preparer.write` calls after each chunk of samples: (samples, skipped, bytes of images).
ShardProgress = Callable[[int, int, int], None]


class Preparer:
    """`prepare` on chunks of samples, in this thread or in `workers` processes (module
    docstring)."""

    def __init__(self, workers: int, options: Options) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self.options = options
        self._processes: list[BaseProcess] = []
        self._connections: list[Connection] = []
        if workers > 1:
            context = worker_context("spawn")
            files = _files(workers)
            try:
                files.check()
                for index in range(workers):
                    with files.said():
                        process, parent_end = start_worker(
                            context, serve, (options,), f"prefetch-shard-writer-{index}"
                        )
                    self._processes.append(process)
                    self._connections.append(parent_end)
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> Preparer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def map(self, chunks: Iterable[list[Sample]]) -> Iterator[list[Answer]]:
        """Each chunk's answers, in the order of `chunks`."""
        if self.workers == 1:
            for chunk in chunks:
                yield prepare(chunk, self.options)
            return
        window = self.workers * CHUNKS_PER_WORKER
        feed: Iterator[list[Sample] | None] = iter(chunks)
        sent = 0  # chunks sent so far; chunk k is the k-th of `chunks`
        given = 0  # chunks yielded so far
        queued: list[deque[int]] = [deque() for _ in self._processes]  # chunk ids per worker
        answered: dict[int, list[Answer]] = {}
        exhausted = False
        while True:
            while not exhausted and sent - given < window:
                item = next(feed, None)
                if item is None:
                    exhausted = True
                    break
                worker = min(range(self.workers), key=lambda index: len(queued[index]))
                try:
                    self._connections[worker].send(("chunk", sent, item))
                except OSError:  # its end of the pipe is closed: it died
                    self._died(worker)
                queued[worker].append(sent)
                sent += 1
            if given in answered:
                yield answered.pop(given)
                given += 1
                continue
            if exhausted and given == sent:
                return
            self._receive(queued, answered)

    def _receive(self, queued: list[deque[int]], answered: dict[int, list[Answer]]) -> None:
        """Take the answers that arrive within `POLL_S`; raise a worker's error, or say which
        worker died."""
        for index, message in self._messages(queued):
            _, chunk, answers, error = message
            if error is not None:
                raise rebuild_error(*error)
            queued[index].remove(chunk)
            answered[chunk] = answers

    def _messages(self, queued: list[deque[int]]) -> Iterator[tuple[int, Any]]:
        """(worker, message) for the messages that arrive within `POLL_S`; ChildProcessError
        when a worker with work queued has died."""
        for connection in wait(self._connections, timeout=POLL_S):
            assert isinstance(connection, Connection)
            index = self._connections.index(connection)
            try:
                message = connection.recv()
            except (EOFError, OSError):
                self._died(index)
            yield index, message
        for index, process in enumerate(self._processes):
            if queued[index] and not process.is_alive():
                self._died(index)

    def write(
        self, tasks: Iterable[ShardTask], out: OutFolder, on_progress: ShardProgress
    ) -> Iterator[ShardWritten]:
        """Each shard of `tasks` written by a worker process into `out` under a temporary name
        (`write_shard`), in the order they finish; `on_progress(samples, skipped, bytes)` after
        each chunk of samples. One shard per worker at a time: the next goes to the first
        worker free, so the last ones are spread over the workers."""
        assert self.workers > 1, "one worker writes its shards in the calling thread"
        for connection, process in zip(self._connections, self._processes, strict=True):
            connection.send(("folder", out.path))
            send_handle(connection, out.fd, process.pid or 0)
        feed: Iterator[ShardTask | None] = iter(tasks)
        queued: list[deque[int]] = [deque() for _ in self._processes]  # shard indexes
        exhausted = False
        while True:
            while not exhausted and min(len(items) for items in queued) < SHARDS_AT_ONCE:
                task = next(feed, None)
                if task is None:
                    exhausted = True
                    break
                worker = min(range(self.workers), key=lambda index: len(queued[index]))
                try:
                    self._connections[worker].send(("shard", task))
                except OSError:
                    self._died(worker)
                queued[worker].append(task.shard)
            if exhausted and not any(queued):
                return
            for index, message in self._messages(queued):
                if message[0] == "progress":
                    on_progress(*message[1:])
                    continue
                _, shard, written, error = message
                if error is not None:
                    raise rebuild_error(*error)
                queued[index].remove(shard)
                yield written

    def _died(self, index: int) -> NoReturn:
        process = self._processes[index]
        code = exit_code(process)
        if code == EXIT_OUT_OF_FILES:
            raise _files(self.workers).worker_ran_out(process.name, process.pid)
        killer = ", often the kernel's out-of-memory killer" if code == -9 else ""
        advice = "write again with fewer --workers, or --workers 1 to work in this process"
        if code == -signal.SIGTERM:  # sent by someone: it removed the shard it was writing
            advice = (
                "it was stopped (the shard it was writing is removed): run the same command "
                "again to continue from the shards finished"
            )
        raise ChildProcessError(
            f"shard writer worker process {index} (pid {process.pid}) died with "
            f"{exit_reason(code)}{killer}; {advice}"
        )

    def close(self) -> None:
        """Stop the worker processes: one deadline for all, then SIGTERM, then SIGKILL
        (`stop_processes`)."""
        workers = list(zip(self._processes, self._connections, strict=True))
        self._processes = []
        self._connections = []
        stop_processes(workers)


def _files(workers: int) -> FileNeeds:
    """What the writer's worker processes take of this process's open files."""
    what = f"prefetch shards write --workers {workers}"
    return FileNeeds(workers, 0, what, "write with fewer --workers")
