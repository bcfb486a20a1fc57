"""Open files for worker processes: what they take, and one clear error when the limit is short.

Every open file, pipe, socket and shared-memory mapping of a process takes one of its file
descriptors, and a process may hold at most its open-file limit of them (`RLIMIT_NOFILE`, the
shell's `ulimit -n`; 1024 by default on many Linux systems, less in some containers). What
the loader's process backend takes in its own process (`parent_files`):

- per worker process: its end of the pipe and its sentinel, `FILES_PER_WORKER`;
- per batch slot: the segment's descriptor and its mapping's (Python's `mmap` keeps its own
  copy of the descriptor), `FILES_PER_SLOT`;
- while a worker starts: the pipes that spawning it opens for a moment, `FILES_TO_SPAWN`.

A worker process takes one per slot (its mapping) besides its interpreter's own. When the limit
is short, the OS error says only `[Errno 24] Too many open files`, and a worker that cannot
receive a slot's descriptor fails in multiprocessing's `received 0 items of ancdata`.
Instead: `FileNeeds.check` refuses at the start, before any worker runs, when the workers and
the ring's slots cannot fit beside the files already open; `FileNeeds.said` turns an EMFILE
raised later (a replacement worker, a new slot) into the same message; a worker that runs out
(`receive_descriptor`) exits quietly with `EXIT_OUT_OF_FILES`, which the parent turns into
`FileNeeds.worker_ran_out`. Each is an `OutOfFiles`: an `OSError` with errno EMFILE whose text
says what is short (the limit, what is open, what the workers need) and the fix (`ulimit -n`,
fewer workers).

A worker process raises its own soft limit to its hard limit as it starts (`use_hard_limit`):
it is ours, and a worker needs one file per slot whatever the shell's soft limit. The loader's
process is the user's: its limit is left as it is, and the message says how to raise it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

from prefetch._messages import counted

# Descriptors the loader's process holds per worker process: its pipe end and its sentinel.
FILES_PER_WORKER = 2
# ... per batch slot: the segment's descriptor and the one its mapping keeps.
FILES_PER_SLOT = 2
# ... for a moment while a worker starts: the new pipe and spawn's own pipes.
FILES_TO_SPAWN = 6
# The exit code of a worker process that ran out of open files (`receive_descriptor`): it
# exits quietly with it, and the parent says what is short (`FileNeeds.worker_ran_out`).
EXIT_OUT_OF_FILES = 75


class OutOfFiles(OSError):
    """An `OSError` (errno EMFILE) saying which open-file limit is short and how to fix it."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EMFILE, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[type[OutOfFiles], tuple[str]]:
        return OutOfFiles, (str(self.strerror),)


def open_files() -> int:
    """The descriptors this process has open now."""
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    return 0


def limits() -> tuple[int, int]:
    """This process's open-file limit: (soft, hard); RLIM_INFINITY is -1."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def parent_files(workers: int, slots: int) -> int:
    """The descriptors the loader's process needs for `workers` processes and `slots` slots."""
    return FILES_PER_WORKER * workers + FILES_PER_SLOT * slots + FILES_TO_SPAWN


def _fix(soft: int, hard: int, fewer: str) -> str:
    """How to get more open files, then `fewer` (the other fix, a sentence without its "Or")."""
    wanted = max(4096, 2 * soft)
    how = f"Raise the open-file limit: `ulimit -n {wanted}` in the shell that starts Python"
    if hard != resource.RLIM_INFINITY and hard < wanted:
        how += f" (its hard limit is {hard} here: only an administrator can raise that)"
    if hard == resource.RLIM_INFINITY or hard > soft:
        up_to = "" if hard == resource.RLIM_INFINITY else f" up to {hard}"
        how += f", or resource.setrlimit(resource.RLIMIT_NOFILE, ...){up_to} in the script"
    return f"{how}. Or {fewer}."


@dataclass(frozen=True)
class FileNeeds:
    """What `workers` worker processes and `slots` batch slots take of this process's open
    files, for `what` (e.g. "backend='process' with 8 workers"). `fewer` names the fix besides
    a higher limit (e.g. "use fewer workers"), `also` adds to it."""

    workers: int
    slots: int
    what: str
    fewer: str
    also: str = ""

    def _or_fewer(self, fit: int | None = None) -> str:
        fits = f" (at most {fit} fit now)" if fit is not None and 0 < fit < self.workers else ""
        return f"{self.fewer}{fits}{self.also}"

    def short(self) -> OutOfFiles | None:
        """The error when they do not fit beside the files open now; None when they do."""
        soft, hard = limits()
        if soft == resource.RLIM_INFINITY:
            return None
        now, needed = open_files(), parent_files(self.workers, self.slots)
        if now + needed <= soft:
            return None
        fit = (soft - now - FILES_PER_SLOT * self.slots - FILES_TO_SPAWN) // FILES_PER_WORKER
        return OutOfFiles(
            f"too few open files for {self.what}: this process may have {soft} open at once "
            f"(its open-file limit, RLIMIT_NOFILE) and has {now} open, but its "
            f"{counted(self.workers, 'worker process', 'worker processes')} and "
            f"{counted(self.slots, 'batch slot')} take about {needed} more "
            f"({FILES_PER_WORKER} per worker, {FILES_PER_SLOT} per slot, {FILES_TO_SPAWN} to "
            "start a worker). " + _fix(soft, hard, self._or_fewer(fit))
        )

    def check(self) -> None:
        """Raise `short()`'s error, if there is one: before any worker starts."""
        error = self.short()
        if error is not None:
            raise error

    @contextlib.contextmanager
    def said(self) -> Iterator[None]:
        """Turn an EMFILE (or ENFILE: the system's table is full) raised inside into an
        `OutOfFiles` that says what is short and the fix."""
        try:
            yield
        except OutOfFiles:
            raise
        except OSError as error:
            if error.errno == errno.ENFILE:
                raise OutOfFiles(
                    f"the system's table of open files is full (ENFILE) while running "
                    f"{self.what}: other processes hold them; close some, or raise the "
                    "system's limit (sysctl fs.file-max)"
                ) from error
            if error.errno != errno.EMFILE:
                raise
            soft, hard = limits()
            raise self.short() or OutOfFiles(
                f"too few open files for {self.what}: this process reached its open-file "
                f"limit (RLIMIT_NOFILE, {soft}) with {open_files()} open. "
                + _fix(soft, hard, self._or_fewer())
            ) from error

    def worker_ran_out(self, name: str, pid: int | None) -> OutOfFiles:
        """The error for worker process `name` that exited with `EXIT_OUT_OF_FILES`."""
        soft, hard = limits()
        return OutOfFiles(
            f"worker process {name} (pid {pid}) of {self.what} ran out of open files: it "
            f"reached its open-file limit (RLIMIT_NOFILE, which workers inherit; this "
            f"process's is {soft}) while receiving a file descriptor from this process. "
            + _fix(soft, hard, self._or_fewer())
        )


def receive_descriptor(conn: Connection) -> int:
    """A file descriptor sent over `conn` (`multiprocessing.reduction.send_handle`).

    Receiving one takes two free descriptors (multiprocessing's copy of the pipe's, and the one
    received). A process without them gets EMFILE, or the kernel drops the descriptor and
    multiprocessing says "received 0 items of ancdata": either is raised as `OutOfFiles`, which
    the worker entry turns into an exit with `EXIT_OUT_OF_FILES`, without a traceback."""
    try:
        return recv_handle(conn)
    except RuntimeError as error:  # no descriptor came with the message: was there no room?
        if _no_room_for_two(conn.fileno()):
            raise OutOfFiles("out of open files receiving a descriptor") from error
        raise
    except OSError as error:
        if error.errno == errno.EMFILE:
            raise OutOfFiles("out of open files receiving a descriptor") from error
        raise


def _no_room_for_two(fd: int) -> bool:
    """Whether this process cannot open two more descriptors (tried with copies of `fd`: a
    new descriptor takes the lowest free number, which must be under the soft limit)."""
    copies: list[int] = []
    try:
        for _ in range(2):
            copies.append(os.dup(fd))
    except OSError as error:
        return error.errno == errno.EMFILE
    finally:
        for copy in copies:
            os.close(copy)
    return False


def use_hard_limit() -> None:
    """Raise this process's soft open-file limit to its hard limit (a worker process's own)."""
    with contextlib.suppress(OSError, ValueError):
        soft, hard = limits()
        if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
