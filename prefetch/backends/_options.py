"""The process backend's options and the constants the backends share with the runtime.

`ProcessOptions` is frozen and keyword-only; `Loader(backend=ProcessOptions(...))` selects the
process backend with it. A bad value raises ValueError naming the option, the value and the fix.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass

import numpy as np

from prefetch._checks import positive
from prefetch._messages import suggest_keywords

# Reader threads of a worker process on remote URLs: one per row of its batch, at most this many.
MAX_REMOTE_READERS_PER_PROCESS = 32
# Rows a worker process with reader threads reads at once, per reader thread: the next part's
# reads wait on storage while the current one's rows are decoded.
BATCHES_AT_ONCE = 2
# Rows kept submitted for every reader (a worker thread, or a reader thread of a worker process):
# what `Workers.in_flight` sizes the batches in flight by, so that every worker has rows to read.
ROWS_AHEAD_PER_READER = 2
START_METHODS = ("spawn", "forkserver")


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class ProcessOptions:
    """Options of the process backend; `Loader(backend=ProcessOptions(...))` selects it.

    - `max_restarts`: how many times a crashed worker (killed, segfaulted) is restarted and its
      batches re-sent before `WorkerCrashedError`; 0 makes the first crash fatal.
    - `start_method`: "spawn" or "forkserver"; None takes the program's default when it is one
      of those, else "spawn". Workers are never forked: forking a process that runs threads
      (TensorFlow's, the loader's) can deadlock the child.
    - `threads_per_worker`: reader threads in each worker process, which split its batch
      between them. 1 suits local disks; more let a process overlap reads that wait on
      storage (a network mount, an object store) instead of the CPU. None (the default): on
      remote URLs, one per row of the batch (at most `MAX_REMOTE_READERS_PER_PROCESS`), so a
      process reads its whole batch at once; else 1.
    """

    max_restarts: int = 3
    start_method: str | None = None
    threads_per_worker: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(
            self.max_restarts, (int, np.integer)
        ):
            raise ValueError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.threads_per_worker is not None:
            positive("threads_per_worker", self.threads_per_worker)
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(
                f"start_method must be one of {START_METHODS}, got {self.start_method!r}: "
                "process workers are never forked, because forking a process that has started "
                "threads (TensorFlow's, the loader's) can deadlock the child"
            )

    @property
    def method(self) -> str:
        """The start method workers use: `start_method`, or the default as described."""
        if self.start_method is not None:
            return self.start_method
        # The default, as set by the program, else the platform's (forkserver from Python 3.14).
        default = multiprocessing.get_start_method(allow_none=True)
        default = default or multiprocessing.get_all_start_methods()[0]
        return default if default in START_METHODS else "spawn"
