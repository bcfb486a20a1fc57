"""A worker process's answers to its parent, framed by us on the worker's own pipe.

Parent to worker, the pipe carries `multiprocessing` messages (`Connection.send`, and file
descriptors). Worker to parent, it carries only answers (part id, outcome, error): each is one
frame, an 8-byte big-endian length and a pickle, written whole by `send_answer`.
`AnswerReader.read` takes every byte that has arrived in ONE `os.read` and returns the complete
answers in it, keeping a partial frame for the next read. `WorkerPoll` says which workers
have answers waiting and which exited, with one `poll` object kept as workers come and go.

Why not `Connection.recv`: the parent's thread that drains the loader (prefetch.torch's, Keras's,
tf.data's) runs beside a training thread that runs Python, and every system call it makes
releases the GIL, which it then waits for behind the training thread (up to the interpreter's
5 ms switch interval). `poll` + `recv` cost about four system calls per answer; one read per
wake-up, however many answers it brings, costs one. And it holds the GIL while it runs Python:
`multiprocessing.connection.wait` builds a selector and registers every pipe and sentinel at
each call (about 0.2 ms for 16 workers, 0.45 ms for 32 on a loaded 2-core machine, against
0.01 ms for a kept `poll` object), several times per batch.
"""

from __future__ import annotations

import math
import os
import pickle
import select
import struct
from typing import Any

_LENGTH = struct.Struct("!Q")
# The most bytes one read takes from a worker's pipe; what is left is read at the next wake-up.
# Under malloc's mmap threshold (128 KiB): a larger buffer costs three more system calls per
# read (mmap, mremap, munmap) for answers of a few hundred bytes each.
READ_BYTES = 1 << 16


def send_answer(fd: int, answer: Any) -> None:
    """Write `answer` (a picklable value) to the pipe `fd` as one frame."""
    payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_LENGTH.pack(len(payload)) + payload)
    while view:
        view = view[os.write(fd, view) :]


class AnswerReader:
    """The parent's end of one worker's answers: `read()` after its pipe became readable."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def read(self) -> tuple[list[Any], bool]:
        """(the complete answers that arrived, whether the worker's end is closed). One read;
        call it only when the pipe is readable (or the worker is gone), or it blocks."""
        data = os.read(self._fd, READ_BYTES)
        self._buffer += data
        answers = []
        while len(self._buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer)
            end = _LENGTH.size + length
            if len(self._buffer) < end:
                break
            answers.append(pickle.loads(self._buffer[_LENGTH.size : end]))
            del self._buffer[:end]
        return answers, not data


class WorkerPoll:
    """Waits on the workers' answer pipes and process sentinels: `add` a worker when it starts,
    `remove` it before its pipe is closed, `wait` for what is ready."""

    def __init__(self) -> None:
        self._poll = select.poll()
        self._owners: dict[int, tuple[Any, bool]] = {}  # fd -> (worker, is its sentinel)

    def add(self, worker: Any, answers_fd: int, sentinel: int) -> None:
        """Watch `worker`'s answers pipe and its process sentinel."""
        for fd, is_sentinel in ((answers_fd, False), (sentinel, True)):
            self._poll.register(fd, select.POLLIN)
            self._owners[fd] = (worker, is_sentinel)

    def remove(self, answers_fd: int, sentinel: int) -> None:
        """Stop watching a worker (before its descriptors are closed and their numbers reused)."""
        for fd in (answers_fd, sentinel):
            if self._owners.pop(fd, None) is not None:
                self._poll.unregister(fd)

    def wait(self, timeout_s: float) -> tuple[list[Any], list[Any]]:
        """(workers with answers to read, workers whose process ended), waiting at most
        `timeout_s` for either; a pipe closed by a dead worker counts as readable."""
        readable: list[Any] = []
        exited: list[Any] = []
        for fd, _ in self._poll.poll(max(0, math.ceil(timeout_s * 1000))):
            owner = self._owners.get(fd)
            if owner is not None:
                (exited if owner[1] else readable).append(owner[0])
        return readable, exited
