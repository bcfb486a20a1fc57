"""Coordinator: stop a group of threads and processes together, and report the first error.

It has the public methods and semantics of `tf.train.Coordinator`, so TF1-era code works
unchanged, and it needs no TensorFlow. All methods are thread-safe. `join()` never waits longer
than until every thread ends, or until a stop plus the grace period; nothing blocks forever.

Beyond TensorFlow's: `request_stop` takes an exception object outside an `except` block, `join`
accepts `multiprocessing.Process` objects as well as threads, and the Coordinator is a context
manager that requests a stop and joins on exit.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Protocol, TypeAlias

from prefetch.errors import StopTimeoutError, add_note

log = logging.getLogger(__name__)

ExcInfo: TypeAlias = tuple[type[BaseException], BaseException, TracebackType | None]

# tf.train.Coordinator's default: how long `join` waits after a stop for threads to end.
DEFAULT_STOP_GRACE_PERIOD_S = 120.0
# How often a thread that waits (for a batch, a queue slot, a task) wakes to check for a stop;
# every bounded wait in prefetch uses it, so a stop is seen within this time.
POLL_S = 0.1


class Deadline:
    """A time limit as one value: made with its budget, asked how long is left.

    Every wait with a time limit in prefetch takes one (a drain, a join, a lock, a quiesce), so
    a limit is stated once and each wait in a loop gets only what is left of it. Monotonic
    clock; a budget of 0 (or less) is already expired; `None` never expires.

    - `budget_s`: the seconds from now until it expires, or None for no limit.
    """

    __slots__ = ("budget_s", "start")

    def __init__(self, budget_s: float | None) -> None:
        self.start = time.monotonic()
        self.budget_s = budget_s

    def remaining(self) -> float:
        """Seconds left, never below 0 (`math.inf` without a limit)."""
        if self.budget_s is None:
            return float("inf")
        return max(self.start + self.budget_s - time.monotonic(), 0.0)

    def expired(self) -> bool:
        """Whether the budget is spent."""
        return self.budget_s is not None and time.monotonic() >= self.start + self.budget_s

    def elapsed(self) -> float:
        """Seconds since it was made."""
        return time.monotonic() - self.start

    def __repr__(self) -> str:
        return f"Deadline({self.budget_s}, remaining={self.remaining():.3f})"


class Joinable(Protocol):
    """What `join` needs of a thread or process: a name and a liveness check."""

    name: str

    def is_alive(self) -> bool: ...


def default_clean_stop_exception_types() -> tuple[type[BaseException], ...]:
    """`StopIteration`, plus `tf.errors.OutOfRangeError` when TensorFlow is already imported."""
    types: list[type[BaseException]] = [StopIteration]
    tf = sys.modules.get("tensorflow")
    out_of_range = getattr(getattr(tf, "errors", None), "OutOfRangeError", None)
    if isinstance(out_of_range, type) and issubclass(out_of_range, BaseException):
        types.append(out_of_range)
    return tuple(types)


class Coordinator:
    """A coordinator for threads and processes, with `tf.train.Coordinator` semantics.

    Workers call `should_stop()` in their loop and `request_stop(ex)` on error; the owner calls
    `join()`, which returns once every thread has ended and re-raises the first reported error.
    Exceptions of a type in `clean_stop_exception_types` stop the group without being an error.

    - `clean_stop_exception_types`: exception types that, passed to `request_stop`, stop the
      group without counting as an error (`tf.train.Coordinator`'s argument of that name);
      `None` for `StopIteration`, and `tf.errors.OutOfRangeError` when TensorFlow is already
      imported.
    """

    def __init__(
        self, clean_stop_exception_types: Iterable[type[BaseException]] | None = None
    ) -> None:
        if clean_stop_exception_types is None:
            clean_stop_exception_types = default_clean_stop_exception_types()
        self._clean_stop_exception_types = tuple(clean_stop_exception_types)
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._exc_info_to_raise: ExcInfo | None = None
        self._joined = False
        self._registered: set[Joinable] = set()

    @property
    def clean_stop_exception_types(self) -> tuple[type[BaseException], ...]:
        """Exception types that request a clean stop rather than report an error."""
        return self._clean_stop_exception_types

    def _as_exc_info(self, ex: BaseException | ExcInfo | None) -> ExcInfo | None:
        """Normalise `ex` to an exc_info tuple, or None for no error or a clean stop."""
        if ex is None:
            return None
        if isinstance(ex, tuple):
            info = ex
        elif isinstance(ex, BaseException):
            info = (type(ex), ex, ex.__traceback__)
        else:
            raise TypeError(
                f"ex must be an exception or an exc_info tuple, got {type(ex).__name__}"
            )
        if len(info) != 3 or not isinstance(info[1], BaseException):
            raise ValueError(f"ex must be an exc_info tuple (type, value, traceback), got {info!r}")
        if isinstance(info[1], self._clean_stop_exception_types):
            return None
        return info

    def request_stop(self, ex: BaseException | ExcInfo | None = None) -> None:
        """Request that the threads stop, reporting `ex` if it is the first error.

        `ex` is an exception object or an exc_info tuple. The first error that is not a clean
        stop wins; later ones are ignored. After `join()` has run, a non-clean `ex` is raised at
        once, as in TensorFlow.
        """
        with self._lock:
            info = self._as_exc_info(ex)
            if self._joined and info is not None:
                raise info[1]
            if not self._stop_event.is_set():
                if info is not None and self._exc_info_to_raise is None:
                    log.info("Coordinator stopped with exception: %r", info[1])
                    self._exc_info_to_raise = info
                self._stop_event.set()

    def clear_stop(self) -> None:
        """Clear the stop flag, the stored exception and the joined state, for reuse."""
        with self._lock:
            self._joined = False
            self._exc_info_to_raise = None
            self._stop_event.clear()

    def should_stop(self) -> bool:
        """True once a stop has been requested."""
        return self._stop_event.is_set()

    @contextlib.contextmanager
    def stop_on_exception(self) -> Iterator[None]:
        """Context manager that reports an exception raised in its body and swallows it."""
        try:
            yield
        except BaseException:
            self.request_stop(ex=sys.exc_info())  # type: ignore[arg-type]

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """Wait until a stop is requested or `timeout` seconds pass; True if stopped."""
        return self._stop_event.wait(timeout)

    def register_thread(self, thread: Joinable) -> None:
        """Register a thread (or process) that `join()` will wait for."""
        with self._lock:
            self._registered.add(thread)

    def join(
        self,
        threads: Iterable[Joinable] | None = None,
        stop_grace_period_secs: float = DEFAULT_STOP_GRACE_PERIOD_S,
        ignore_live_threads: bool = False,
    ) -> None:
        """Wait for the given and the registered threads to end.

        Returns when they have all ended, or once a stop was requested and they did not end
        within `stop_grace_period_secs`. Then it re-raises the first reported exception, or else
        raises `StopTimeoutError` (a `RuntimeError`, as TensorFlow raises) naming the threads
        still running, unless `ignore_live_threads`.
        Threads registered after the call starts are not waited for.
        """
        with self._lock:
            group = list(self._registered.union(threads or ()))
        while any(t.is_alive() for t in group) and not self.wait_for_stop(1.0):
            pass
        deadline = Deadline(stop_grace_period_secs)
        pause_s = 0.001
        while any(t.is_alive() for t in group) and not deadline.expired():
            time.sleep(min(pause_s, deadline.remaining()))
            pause_s = min(pause_s * 2, 0.1)
        stragglers = [t.name for t in group if t.is_alive()]
        with self._lock:
            self._joined = True
            self._registered = set()
            if self._exc_info_to_raise is not None:
                raise self._exc_info_to_raise[1]
        if stragglers:
            if ignore_live_threads:
                log.info("Coordinator stopped with threads still running: %s", " ".join(stragglers))
            else:
                raise StopTimeoutError(
                    "Coordinator stopped with threads still running: " + " ".join(stragglers)
                )

    @property
    def joined(self) -> bool:
        """True once `join()` has run (until `clear_stop()`)."""
        return self._joined

    def raise_requested_exception(self) -> None:
        """Raise the exception reported to `request_stop`, if there is one."""
        with self._lock:
            if self._exc_info_to_raise is not None:
                raise self._exc_info_to_raise[1]

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Request a stop (reporting the body's exception) and join the registered threads.

        An exception from the body propagates as it is (a thread's earlier error is added to it
        as a note); otherwise `join` raises the first error a thread reported.
        """
        self.request_stop(exc)
        try:
            self.join()
        except BaseException as joined_error:
            if exc is None:
                raise
            if joined_error is not exc:
                add_note(exc, f"a coordinated thread had reported first: {joined_error!r}")
