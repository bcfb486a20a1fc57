"""A worker process of `prefetch shards write` (`_work.Preparer` starts and stops it): its loop,
and the writing of one whole shard.

`serve` answers the parent's messages until `Stop` (or the parent is gone): a folder descriptor
to write into, chunks of samples to `prepare`, and whole shards to write (`write_shard`: each
image prepared, framed by `_layout`, hashed and written to a temporary file of the folder).
Between two images of a shard it checks whether it is asked to stop. SIGTERM, which the
parent sends a worker that missed `Stop`'s deadline (one long decode), stops it the same way,
wherever it lands (a decode's `except Exception` cannot take it: a stop is never data): the
shard it was writing is removed, then it exits by SIGTERM, so the parent names the signal.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, NamedTuple, NoReturn

from prefetch.backends import Stop, parent_alive, receive_descriptor, with_traceback_text
from prefetch.coordinator import POLL_S
from prefetch.tools.shards._layout import Sample, sample_bytes, shard_end
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._samples import Options, Skip, prepare

# Samples between two progress messages of a worker that writes a whole shard.
PROGRESS_SAMPLES = 64


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


class _Stopped(BaseException):
    """The parent asked a worker to stop (or is gone, or sent SIGTERM) while it wrote a shard.
    A `BaseException`, as KeyboardInterrupt is: SIGTERM's handler raises it wherever the worker
    is, also inside the `except Exception` that turns a photo Pillow cannot open or decode into
    a skip (`_samples.prepare`), and a stop is never data."""


class _Worker:
    """A worker process's side of its pipe: messages kept aside while a shard is written."""

    def __init__(self, connection: Connection, options: Options, parent: int) -> None:
        self.connection = connection
        self.options = options
        self.parent = parent
        self.kept: deque[Any] = deque()
        self.folder: OutFolder | None = None
        self.terminated = False

    def terminate(self, signum: int, frame: object) -> NoReturn:
        """SIGTERM's handler: stop where it is (`_Stopped`, as `Stop` between two images)."""
        self.terminated = True
        raise _Stopped

    def next_message(self) -> Any:
        """The next message; `Stop` when asked to stop or the parent is gone."""
        if self.kept:
            return self.kept.popleft()
        while True:
            try:
                if self.connection.poll(POLL_S):
                    return self.connection.recv()
            except (EOFError, OSError):
                return Stop()
            if not parent_alive(self.parent):
                return Stop()

    def check_stop(self) -> None:
        """Between samples of a shard: raise `_Stopped` when the parent asks to stop or is
        gone (or SIGTERM came); keep other messages for later."""
        if self.terminated:
            raise _Stopped
        try:
            while self.connection.poll(0):
                message = self.connection.recv()
                if isinstance(message, Stop):
                    raise _Stopped
                self.kept.append(message)
        except (EOFError, OSError):
            raise _Stopped from None
        if not parent_alive(self.parent):
            raise _Stopped

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            self.connection.send(message)
        except (OSError, ValueError):
            raise _Stopped from None

    def serve(self) -> None:
        while True:
            message = self.next_message()
            if isinstance(message, Stop):
                return
            kind = message[0]
            if kind == "folder":
                if self.folder is not None:
                    self.folder.close()
                descriptor = receive_descriptor(self.connection)
                self.folder = OutFolder.from_descriptor(descriptor, message[1])
            elif kind == "chunk":
                _, chunk, samples = message
                try:
                    answer: tuple[Any, ...] = ("chunk", chunk, prepare(samples, self.options), None)
                except _Stopped:
                    raise
                except BaseException as error:
                    answer = ("chunk", chunk, None, with_traceback_text(error))
                if self.terminated:  # an answer made while SIGTERM came is never sent
                    raise _Stopped
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


def serve(connection: Connection, parent: int, options: Options) -> None:
    """A worker process (`start_worker`'s target): answer chunks and write shards until told
    to stop or the parent is gone. SIGTERM (a worker that missed `Stop`'s deadline, in one
    long decode) stops it as `Stop` does, so the shard it was writing is removed."""
    worker = _Worker(connection, options, parent)
    signal.signal(signal.SIGTERM, worker.terminate)
    try:
        worker.serve()
    except _Stopped:
        pass
    finally:
        if worker.folder is not None:
            worker.folder.close()
    if worker.terminated:  # it exits as SIGTERM's default would have: its parent names that
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


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
