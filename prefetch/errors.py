"""The exception tree of prefetch, and helpers that attach context to errors.

Errors raised while reading a sample keep their original type; prefetch only adds a note naming
the sample (its file, or `Source[index]`), the worker, and what failed with the fix for it: an
unreadable file (pass `on_error="skip"`), or code of the user's, a decoder, a transform or a
source's `__getitem__` (or what one returned), named with what to fix there. Errors that
prefetch itself raises derive from `PrefetchError`; the two that replace a bare `RuntimeError`
also derive from `RuntimeError`, so code that catches `RuntimeError` keeps working:

    Exception
     +-- PrefetchError          base of them all; also the base of a stand-in class for a
     |    |                     worker's error that cannot be pickled nor rebuilt (below)
     |    +-- TooManySkippedError   on_error="skip" and more files failed than max_skipped
     |    +-- WorkerCrashedError    a worker process died more often than max_restarts allows
     |    +-- SampleTimeoutError (+ TimeoutError)
     |    |                     a sample was read for longer than sample_timeout_s
     |    +-- ClosedError (+ RuntimeError)
     |    |                     a Loader or Background was closed (or its Coordinator stopped)
     |    |                     while its consumer waited for the next batch or item
     |    +-- StopTimeoutError (+ RuntimeError)
     |    |                     Coordinator.join: threads or processes still running after the
     |    |                     stop grace period ("Coordinator stopped with threads still ...")
     |    +-- DoesNotFitError (+ MemoryError)
     |    |                     prefetch.tf.resident / resident_stream: the data exceed the
     |    |                     memory budget; the message says what would fit
     |    +-- CorruptShardError (+ ValueError)
     |                          a TFRecord record or tar header is damaged (a CRC, a
     |                          truncation): names the shard and the byte offset
     +-- RemoteTraceback        not raised: the `__cause__` of an error raised in a worker
                                process, holding that worker's formatted traceback
    UserWarning
     +-- TooManyWorkersWarning  a worker count above this rank's share of the cores (or
                                ranks x workers above the host's cores), or more ranks than
                                the cores they share: said once, then run

Programming errors keep Python's types: a bad option is a `ValueError` or `TypeError`, and a
call in the wrong state (re-sharding a loader that has begun an epoch) a `RuntimeError`.
"""

from __future__ import annotations


class PrefetchError(Exception):
    """Base class of the errors that prefetch raises itself.

    A worker process's error that cannot be pickled keeps its own type where it can be
    rebuilt; otherwise it arrives as a class of the same name deriving from `PrefetchError` and
    its builtin base (so `except RuntimeError` still works), message and notes kept.
    """


class TooManySkippedError(PrefetchError):
    """More samples failed than `max_skipped` allows with `on_error="skip"`.

    Raised by the loader, not by user code; `__cause__` is the last decode error. Parameters
    (`paths` is kept as the attribute of that name):

    - `message`: what happened, with the count and the fix.
    - `paths`: the files skipped so far, oldest first.
    """

    def __init__(self, message: str, paths: list[str]) -> None:
        super().__init__(message)
        self.paths = paths


class WorkerCrashedError(PrefetchError):
    """A worker process died more often than `max_restarts` allows."""


class ClosedError(PrefetchError, RuntimeError):
    """A loader or background iterator was closed while its consumer waited for the next item.

    Raised by the consumer's `next()` when `Loader.close()` runs (or the loader's Coordinator
    is stopped without an error) from another thread, and by `Background` when it is closed
    from another thread. It is a `RuntimeError`, as these cases were before it existed.
    """


class StopTimeoutError(PrefetchError, RuntimeError):
    """Threads or processes did not stop within the grace period after a stop was requested.

    Raised by `Coordinator.join` (unless `ignore_live_threads`); the message begins as
    `tf.train.Coordinator`'s, "Coordinator stopped with threads still running:", followed by
    their names. It is a `RuntimeError`, as TensorFlow raises there.
    """


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process (set as the error's __cause__)."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0])


def add_note(exc: BaseException, note: str) -> None:
    """Attach `note` to `exc` (shown under its traceback); works before Python 3.11 too."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(exc, "__notes__", None)
        if notes is None:
            notes = []
            exc.__notes__ = notes
        notes.append(note)


class SampleTimeoutError(PrefetchError, TimeoutError):
    """A sample was read for longer than `sample_timeout_s` (a FIFO, a dead network mount, a
    source that blocks); the message names it. The process backend kills the stuck worker
    (and skips the sample under on_error="skip"); a stuck thread cannot be stopped, so the
    thread backend raises this and its loader closes."""


class DoesNotFitError(PrefetchError, MemoryError):
    """The data would not fit in the memory budget; the message says what would.

    Raised by `prefetch.tf.resident` and `resident_stream`. Parameters (each but `message`
    kept as the attribute of that name):

    - `message`: what did not fit and what would.
    - `needed_bytes`: the bytes the data (or the macro-batches) would need.
    - `budget_bytes`: the bytes the budget allows.
    - `max_macro_batches`: the largest `macro_batches` that `resident_stream` could use within
      the budget (0: none).
    """

    def __init__(self, message: str, needed_bytes: int, budget_bytes: int, max_macro_batches: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes
        self.max_macro_batches = max_macro_batches


class CorruptShardError(PrefetchError, ValueError):
    """A shard's bytes are not a valid TFRecord record, tf.train.Example or tar header.

    The message names the file and the byte offset (of the record or tar header) and the fix:
    re-write or re-download the shard. It gives no skip advice of its own: skipping cannot help
    while a source is made, and where it can (a sample read by a `Loader` with
    `on_error="raise"`) the loader's note says to pass `on_error="skip"`.

    Parameters:

    - `message`: the error's text.
    - `path`: the shard (kept as `.path`).
    - `offset`: the byte offset of the damaged record or header (kept as `.offset`; -1 when
      unknown). The error pickles with both.
    """

    def __init__(self, message: str, path: str = "", offset: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


class TooManyWorkersWarning(UserWarning):
    """More workers than this rank's share of the cores: said (`warnings.warn`) when a `Loader`
    is made with `workers=N` above that share, then run as asked.

    Workers beyond the cores only take turns on them: each worker process's start-up (imports,
    on cores the others are starting on too) delays the first batch, and the steady rate falls
    a little (docs/tuning.md, "Workers and cores", measured). The message names the count, the
    cores and where the share came from (the ranks on this host, `prefetch.host`), and the fix:
    leave `workers` unset, or at most the share. Not said for remote URLs, whose workers wait
    on the network.

    Also said, once per process, when the ranks on this host outnumber the cores they share
    (8 ranks on 2 cores, or under a CPU quota of 4: this rank's share is a fraction of a core),
    whatever `workers` is: each rank still runs at least one worker beside its training loop.
    The message names the ranks, the cores and the fraction ("a quarter of a core: the host's
    2 cores among 8 ranks"), and the fix: fewer ranks on these cores, or more cores.

    Silence it with `warnings.simplefilter("ignore", TooManyWorkersWarning)`.
    """
