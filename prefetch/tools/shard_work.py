"""The per-sample work of `prefetch shards write`, and the worker processes that share it out.

`prepare(samples, options)` reads each sample's file, checks it as the loader's readers would
(`image_problem`: empty, not an image, a pixel or scan bomb) and, with `fit_crop`, re-encodes
it (`prefetch.tools.fit_crop.fit_image`, the loader's colour rules); the answer for each sample
is `Prepared(data, resized)` or `Skip(reason)`. A file that cannot be read raises (the write
stops, naming it); a file that cannot be decoded is a `Skip` naming why. A pure function of the
files and the options: the same answers in any process, so the shards do not depend on the
number of workers.

`Preparer(workers, options)` runs `prepare` on chunks of samples: in the calling thread for one
worker, else in `workers` spawned worker processes (the loader's start-up rules:
`prefetch.backends.main_script_hidden`, spawn, never fork). `map(chunks)` yields each chunk's
answers in the chunks' order; at most `CHUNKS_PER_WORKER` chunks per worker are sent or held
unyielded at any time, so the parent holds at most `workers * CHUNKS_PER_WORKER` chunks of
encoded images (the memory bound; docs/shards.md gives it in bytes). Worker processes ignore
SIGINT (Ctrl-C reaches the parent only), exit when their parent dies (end of file on their pipe
or their parent pid gone), and answer an error with its type and traceback (raised in the
parent; a worker that dies is a `ChildProcessError` naming its exit code). `close()`
(idempotent; a context manager) stops and joins them, terminating any that
do not exit within `GRACE_S`. One thread uses a `Preparer`.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, NamedTuple, NoReturn

from PIL import Image

from prefetch.backends import main_script_hidden, rebuild_error, with_traceback_text
from prefetch.coordinator import POLL_S
from prefetch.io import check_image_bytes, read_location
from prefetch.tools import fit_crop as fitting
from prefetch.tools.shard_layout import Sample

# Samples per task sent to a worker: large enough that a message per chunk costs little next to
# its images (8 decodes of a 2 MP photo take about 0.3 s), small enough to balance the workers
# and bound what is in flight.
CHUNK_SAMPLES = 8
# Chunks sent to or answered by a worker and not yet written, per worker: one being worked on,
# one queued, so a worker never waits for the parent between chunks.
CHUNKS_PER_WORKER = 2
# Seconds a worker process is given to exit after it is asked to, before it is terminated.
GRACE_S = 2.0


class Options(NamedTuple):
    """What `prepare` does to each image: `fit_crop` (None: keep the bytes) at `quality`."""

    fit_crop: int | None
    quality: int


class Prepared(NamedTuple):
    """A sample's bytes to store, and whether `fit_crop` re-encoded them."""

    data: bytes
    resized: bool


class Skip(NamedTuple):
    """A sample that is not written, and why."""

    reason: str


Answer = Prepared | Skip


def prepare(samples: Iterable[Sample], options: Options) -> list[Answer]:
    """The answer for each of `samples`, in order (module docstring)."""
    answers: list[Answer] = []
    for sample in samples:
        data = read_location(sample.path)
        reason = image_problem(data, sample.path)
        if reason is not None:
            answers.append(Skip(reason))
            continue
        if options.fit_crop is None:
            answers.append(Prepared(data, False))
            continue
        try:
            fitted, resized = fitting.fit_image(data, options.fit_crop, options.quality)
        except MemoryError:
            raise
        except Exception as error:  # Pillow raises many kinds for a file it cannot decode
            answers.append(Skip(f"cannot be decoded ({type(error).__name__}: {error})"))
            continue
        answers.append(Prepared(fitted, resized))
    return answers


def image_problem(data: bytes, name: str = "<image>") -> str | None:
    """Why `data` (the file `name`) cannot be a sample's image, or None: empty, not an image
    Pillow can open, no pixels, or over the readers' limits (a decompression bomb of pixels,
    Pillow's; a JPEG of more scans than `prefetch.io.MAX_JPEG_SCANS`). Reads the header only."""
    if not data:
        return "empty file (0 bytes)"
    try:
        check_image_bytes(data, name)
    except Image.DecompressionBombError as error:
        return f"over the readers' limits ({error})"
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Image.DecompressionBombError as error:
        return f"decompression bomb ({error})"
    except Exception as error:  # Pillow raises many kinds for a file that is not an image
        return f"not an image ({type(error).__name__}: {_without_address(str(error))})"
    if width < 1 or height < 1:
        return f"an image of {width}x{height} pixels"
    return None


def _without_address(text: str) -> str:
    """`text` with Pillow's `<_io.BytesIO object at 0x...>` said as "the bytes" (a memory
    address would make the manifest differ from run to run)."""
    start = text.find("<_io.BytesIO object at 0x")
    if start < 0:
        return text
    end = text.find(">", start)
    return text[:start] + "the file's bytes" + (text[end + 1 :] if end >= 0 else "")


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
                    self._connections[worker].send((sent, item))
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
        for connection in wait(self._connections, timeout=POLL_S):
            assert isinstance(connection, Connection)
            index = self._connections.index(connection)
            try:
                chunk, answers, error = connection.recv()
            except (EOFError, OSError):
                self._died(index)
            if error is not None:
                raise rebuild_error(*error)
            queued[index].remove(chunk)
            answered[chunk] = answers
        for index, process in enumerate(self._processes):
            if queued[index] and not process.is_alive():
                self._died(index)

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


def _serve(connection: Connection, options: Options, parent: int) -> None:
    """A worker process: answer chunks until told to stop or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            if not connection.poll(POLL_S):
                if os.getppid() != parent:
                    return
                continue
            message: Any = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        chunk, samples = message
        try:
            answer: tuple[Any, ...] = (chunk, prepare(samples, options), None)
        except BaseException as error:
            answer = (chunk, None, with_traceback_text(error))
        try:
            connection.send(answer)
        except (OSError, ValueError):
            return
