"""How worker processes start and stop: one truth for the process backend and the shard writer.

The loader's process backend (`_processes`, its workers' loop in `_process_worker`) and the
writer of `prefetch shards write` (`prefetch.tools.shards._work`) start, stop and watch their
worker processes with this module's functions, and the thread backend and the runtime take
their deadlines from it. The code that does a step of the shutdown cites it as "shutdown
step N"; docs/shutdown.md tells the same order to users.

Starting (`start_worker`)
-------------------------
A worker process starts with spawn or forkserver (`worker_context`), never fork: the parent
may run TensorFlow's threads. It does not run the parent's main script again unless something
it is sent lives there (`main_script_hidden`). It gets one duplex pipe; the parent closes the
child's end at once, so either side sees end-of-file when the other is gone. In the worker
(`_entry`): SIGINT is ignored (Ctrl-C is the main process's: one traceback), its soft
open-file limit is raised to its hard limit, and running out of open files is an exit with
`EXIT_OUT_OF_FILES`, quietly, which the parent reports with the fix (`_file_limit`). A start
that fails stops what was started before it (steps 4 to 6): no process, pipe or memory file
is left.

A worker exits at a `Stop` message, once the work sent before it is answered; at end-of-file
on its pipe; or when its parent is gone (`parent_alive`, checked every `POLL_S` while it
waits). It never owns shared memory: when the parent is gone it unlinks the segments it maps,
as the parent cannot any more.

The shutdown order
------------------
`Loader.close()`, the end of `with loader:`, or the end of the last epoch iterated without
`with`:

1. Request a stop on the loader's Coordinator: a consumer waiting for a batch and every worker
   thread see it within `POLL_S` (runtime `Workers.close`).
2. Stop submitting and cancel the queued work: batches submitted ahead or still queued are
   cancelled (a thread's queued chunks are dropped; a worker process is sent `Cancel` for each
   part it has not begun, and answers `Cancelled`) (runtime `settle`).
3. Drain, only where the workers go on running (an epoch ended early inside `with loader:`):
   the batches being decoded are waited for within `DRAIN_S` in all, then their slots go back
   to the ring; a slot still written after that is forgotten, never reused. At close nothing
   is drained: the workers stop next and no slot is used again.
4. Tell every worker at once, without waiting in between: a wake-up per worker thread on its
   queue; a `Stop` to every worker process, after which the parent closes its end of each pipe
   (`stop_processes`), so a worker that is blocked sending an answer nobody will read stops at
   once.
5. One deadline for all the workers together, never one per worker: worker processes get
   `STOP_GRACE_S` from step 4; those still running are sent SIGTERM and get
   `TERMINATE_GRACE_S` more, together; those still running are killed (SIGKILL); then every
   process is joined (reaped). So 64 workers stuck in a sample hold close() for
   `STOP_GRACE_S + TERMINATE_GRACE_S` plus the kill, not 64 times that. Worker threads cannot
   be stopped from outside: they get `THREAD_JOIN_S` in all (`STUCK_THREAD_JOIN_S` once one
   is known stuck in a sample), and a thread still running is logged and left (a daemon).
6. Free the memory: unlink every slot's segment (a batch the user still holds stays readable
   through its mapping until dropped) and close the memory file of the shared arrays. Only
   now, when no worker can write any more.
7. Raise the first worker error not yet delivered (the Coordinator's join, which waits no
   more: step 5 did).

The writer of `prefetch shards write` runs steps 4 and 5 for its worker processes; its
temporary files are its out folder's. `prefetch.background` (one producer thread, its own
`CLOSE_TIMEOUT_S`) and `Coordinator.join` (`tf.train.Coordinator`'s default grace) sit in the
layer below the backends and keep their own deadlines.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from prefetch.backends._file_limit import EXIT_OUT_OF_FILES, OutOfFiles, use_hard_limit
from prefetch.backends._spawning import main_script_hidden
from prefetch.coordinator import Deadline

# The shutdown's deadlines (the note above says where each applies). Each is one deadline for
# all the workers together.
# Step 3: batches still being decoded when an epoch ends early and the workers go on.
DRAIN_S = 5.0
# Step 5: worker processes, from the Stop message until SIGTERM ...
STOP_GRACE_S = 2.0
# ... and from SIGTERM until SIGKILL.
TERMINATE_GRACE_S = 1.0
# Step 5: worker threads, which finish the chunk of samples they are decoding ...
THREAD_JOIN_S = 10.0
# ... or, when one is known to be stuck in a sample (sample_timeout_s), no longer than this.
STUCK_THREAD_JOIN_S = 0.5

START_METHODS = ("spawn", "forkserver")


class Stop:
    """The message that asks a worker process to exit once the work sent before it is done."""


def worker_context(start_method: str) -> BaseContext:
    """The multiprocessing context for `start_method` ("spawn" or "forkserver"; never fork)."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    return multiprocessing.get_context(start_method)


def start_worker(
    context: BaseContext,
    target: Callable[..., None],
    args: tuple[Any, ...],
    name: str,
    *,
    needs_main: bool = False,
) -> tuple[BaseProcess, Connection]:
    """Start a daemon worker process running `target(conn, parent_pid, *args)`; return it and
    the parent's end of its pipe (see Starting, above). With `needs_main`, something sent lives
    in the main script, which the worker then runs again (as `__mp_main__`) to find it."""
    parent_end, child_end = context.Pipe()
    try:
        process = context.Process(  # type: ignore[attr-defined]
            target=_entry,
            args=(target, child_end, os.getpid(), *args),
            name=name,
            daemon=True,
        )
        with contextlib.nullcontext() if needs_main else main_script_hidden():
            process.start()
    except BaseException:
        parent_end.close()
        raise
    finally:
        child_end.close()
    return process, parent_end


def _entry(target: Callable[..., None], conn: Connection, parent: int, *args: Any) -> None:
    """A worker process's first call: SIGINT ignored, its hard open-file limit, then `target`;
    out of open files, it exits with `EXIT_OUT_OF_FILES`, without a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process only
    use_hard_limit()
    try:
        target(conn, parent, *args)
    except OutOfFiles:
        sys.exit(EXIT_OUT_OF_FILES)


def parent_alive(parent: int) -> bool:
    """Whether the process that started this worker still runs (under forkserver it is not
    this process's parent: the fork server is)."""
    if os.getppid() == parent:
        return True
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_processes(workers: Sequence[tuple[BaseProcess, Connection]]) -> None:
    """Shutdown steps 4 and 5 for worker processes: `Stop` to each and its pipe closed, then
    one deadline for all of them (`STOP_GRACE_S`), SIGTERM, `TERMINATE_GRACE_S`, SIGKILL,
    join. Returns once every one has exited and was reaped."""
    for _, conn in workers:
        with contextlib.suppress(OSError, ValueError):  # closed already, or the worker is gone
            os.set_blocking(conn.fileno(), False)  # a worker that reads nothing blocks no one
            conn.send(Stop())
        conn.close()
    processes = [process for process, _ in workers]
    late = _wait_exited(processes, STOP_GRACE_S)
    for process in late:
        with contextlib.suppress(OSError):
            process.terminate()
    for process in _wait_exited(late, TERMINATE_GRACE_S):
        with contextlib.suppress(OSError):
            process.kill()
    for process in processes:
        process.join()


def _wait_exited(processes: list[BaseProcess], seconds: float) -> list[BaseProcess]:
    """Wait until every process in `processes` has exited, or `seconds` passed; those still
    running."""
    deadline = Deadline(seconds)
    running = [p for p in processes if p.exitcode is None]
    while running and not deadline.expired():
        wait([p.sentinel for p in running], timeout=deadline.remaining())
        running = [p for p in running if p.exitcode is None]
    return running


def exit_reason(code: int | None) -> str:
    """A worker's exit code in words: "exit code 13", "exit code -11 (signal SIGSEGV)"."""
    if code is None:
        return "no exit code yet (it still runs)"
    if code < 0:
        try:
            return f"exit code {code} (signal {signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code} (signal {-code})"
    return f"exit code {code}"


def exit_code(process: BaseProcess) -> int | None:
    """The exit code of a worker whose pipe closed: it is exiting; waited for within
    `STOP_GRACE_S` (None if it still runs then)."""
    process.join(STOP_GRACE_S)
    return process.exitcode
