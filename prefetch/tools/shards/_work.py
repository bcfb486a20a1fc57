"""The worker processes of `prefetch shards write`, which share out its per-sample work.

`Preparer(workers, options)` runs `prepare` (`_samples`) on chunks of
samples: in the calling thread for one worker, else in `workers` spawned worker processes (the
loader's start-up rules: `prefetch.backends.main_script_hidden`, spawn, never fork).
`write(tasks, out, on_progress)` has the workers write whole shards instead (`write_shard`: each
image prepared, framed by `_layout`, hashed and written to a temporary file
of `out`, whose folder descriptor is passed to each worker over its pipe), yielding each
`ShardWritten` as it finishes; a worker checks between two images whether it is asked to stop.
`map(chunks)` yields each chunk's answers in the chunks' order; at most `CHUNKS_PER_WORKER`
chunks per worker are sent or held unyielded at any time, so the parent holds at most `workers *
CHUNKS_PER_WORKER` chunks of encoded images (the memory bound; docs/shards.md gives it in
bytes). Worker processes ignore SIGINT (Ctrl-C reaches the parent only), exit when their parent
dies (end of file on their pipe or their parent pid gone), and answer an error with its type and
traceback (raised in the parent; a worker that dies is a `ChildProcessError` naming its exit
code). `close()` (idempotent; a context manager) stops and joins them, terminating any that do
not exit within `GRACE_S`. One thread uses a `Preparer`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import recv_handle, send_handle
from types import TracebackType
from typing import Any, NamedTuple, NoReturn

from prefetch.backends import main_script_hidden, rebuild_error, with_traceback_text
from prefetch.coordinator import POLL_S
from prefetch.tools.shards._layout import Sample, sample_bytes, shard_end
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._samples import Answer, Options, Skip, prepare

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
# Samples between two progress messages of a worker that writes a whole shard.
PROGRESS_SAMPLES = 64
# Seconds a worker process is given to exit after it is asked to, before it is terminated.
GRACE_S = 2.0


class ShardTask(NamedTuple):
    """A shard for a worker to write: its number and final name, its samples, the layout
    (`format`), the listed folder (`top`) and whether a file to skip is refused (`strict`)."""

    shard: int
    name: str
    samples: list[Sample]
    format: str
    top: str
    strict: bool


class ShardWritten(NamedTuple):
    """A shard a worker wrote: its temporary name, size, SHA-256, samples written, files
    skipped (path, reason) and images re-encoded."""

    shard: int
    temporary: str
    size: int
    sha256: str
    samples: int
    skipped: tuple[tuple[str, str], ...]
    resized: int


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
            context = multiprocessing.get_context("spawn")
            try:
                for _ in range(workers):
                    parent_end, child_end = context.Pipe()
                    process = context.Process(
                        target=_serve,
                        args=(child_end, options, os.getpid()),
                        name="prefetch-shard-writer",
                        daemon=True,
                    )
                    with main_script_hidden():
                        process.start()
                    child_end.close()
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
        process.join(GRACE_S)
        raise ChildProcessError(
            f"shard writer worker process {index} (pid {process.pid}) died with exit code "
            f"{process.exitcode} (a negative code is the signal that ended it: -9 is often the "
            "kernel's out-of-memory killer); write again with fewer --workers, or --workers 1 to "
            "work in this process"
        )

    def close(self) -> None:
        """Stop the worker processes and wait for them (terminated after `GRACE_S`)."""
        for connection in self._connections:
            with contextlib.suppress(OSError, ValueError):
                connection.send(None)
            connection.close()  # a worker sending an answer nobody will read stops at once
        for process in self._processes:
            process.join(GRACE_S)
            if process.is_alive():
                process.terminate()
                process.join(GRACE_S)
        self._processes = []
        self._connections = []


class _Stopped(Exception):
    """The parent asked a worker to stop (or is gone) while it wrote a shard."""


class _Worker:
    """A worker process's side of its pipe: messages kept aside while a shard is written."""

    def __init__(self, connection: Connection, options: Options, parent: int) -> None:
        self.connection = connection
        self.options = options
        self.parent = parent
        self.kept: deque[Any] = deque()
        self.folder: OutFolder | None = None

    def next_message(self) -> Any:
        """The next message; None to stop (asked, or the parent is gone)."""
        if self.kept:
            return self.kept.popleft()
        while True:
            try:
                if self.connection.poll(POLL_S):
                    return self.connection.recv()
            except (EOFError, OSError):
                return None
            if os.getppid() != self.parent:
                return None

    def check_stop(self) -> None:
        """Between samples of a shard: raise `_Stopped` when the parent asks to stop or is
        gone; keep other messages for later."""
        try:
            while self.connection.poll(0):
                message = self.connection.recv()
                if message is None:
                    raise _Stopped
                self.kept.append(message)
        except (EOFError, OSError):
            raise _Stopped from None
        if os.getppid() != self.parent:
            raise _Stopped

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            self.connection.send(message)
        except (OSError, ValueError):
            raise _Stopped from None

    def serve(self) -> None:
        while True:
            message = self.next_message()
            if message is None:
                return
            kind = message[0]
            if kind == "folder":
                if self.folder is not None:
                    self.folder.close()
                descriptor = recv_handle(self.connection)
                self.folder = OutFolder.from_descriptor(descriptor, message[1])
            elif kind == "chunk":
                _, chunk, samples = message
                try:
                    answer: tuple[Any, ...] = ("chunk", chunk, prepare(samples, self.options), None)
                except BaseException as error:
                    answer = ("chunk", chunk, None, with_traceback_text(error))
                self.send(answer)
            else:
                task: ShardTask = message[1]
                try:
                    assert self.folder is not None, "a shard before its folder"
                    written = write_shard(self.folder, task, self.options, self)
                    answer = ("shard", task.shard, written, None)
                except _Stopped:
                    return
                except BaseException as error:
                    answer = ("shard", task.shard, None, with_traceback_text(error))
                self.send(answer)


def _serve(connection: Connection, options: Options, parent: int) -> None:
    """A worker process: answer chunks and write shards until told to stop or the parent is
    gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = _Worker(connection, options, parent)
    try:
        worker.serve()
    except _Stopped:
        pass
    finally:
        if worker.folder is not None:
            worker.folder.close()


def write_shard(
    out: OutFolder, task: ShardTask, options: Options, worker: _Worker | None = None
) -> ShardWritten:
    """Write the shard `task` into `out` under a temporary name, one sample at a time (a worker
    process's part of `Preparer.write`); a skipped file with `task.strict` is refused
    (`strict_refusal`)."""
    counts = {"samples": 0, "resized": 0}
    skipped: list[tuple[str, str]] = []

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(task.samples), PROGRESS_SAMPLES):
            part = task.samples[start : start + PROGRESS_SAMPLES]
            size = skips = 0
            for sample in part:
                if worker is not None:
                    worker.check_stop()
                (answer,) = prepare([sample], options)
                if isinstance(answer, Skip):
                    if task.strict:
                        raise strict_refusal(sample.path, answer.reason)
                    skipped.append((sample.path, answer.reason))
                    skips += 1
                    continue
                counts["samples"] += 1
                counts["resized"] += answer.resized
                size += len(answer.data)
                yield from sample_bytes(task.format, sample, answer.data, task.top)
            if worker is not None:
                worker.send(("progress", len(part), skips, size))
        yield shard_end(task.format)

    written = out.write_temporary(task.name, pieces(), "shard")
    return ShardWritten(
        task.shard,
        written.temporary,
        written.size,
        written.sha256,
        counts["samples"],
        tuple(skipped),
        counts["resized"],
    )


def strict_refusal(path: str, reason: str) -> ValueError:
    """The error that refuses a file with `strict` (a file that would be skipped)."""
    return ValueError(
        f"{path!r}: {reason}; remove it, or write without --strict to skip such files"
    )
