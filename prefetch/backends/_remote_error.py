"""A worker process's error on its way to the consumer: its type kept, its traceback as text.

`portable(error)` (in the worker) returns what can cross the pipe, and `rebuild()` (in the
parent) the error to raise, in order of preference:

1. the error itself, when it pickles and unpickles to the same type;
2. a copy of the same type made without `__init__` (`cls.__new__(cls, *args)`), keeping the
   attributes that pickle, when that round-trips (an error holding a lock, a file, a socket);
3. otherwise (a class defined in a function, or one that cannot be rebuilt from its args) an
   `ErrorSpec`, rebuilt in the parent as a class of the same name deriving from `PrefetchError`
   and the nearest builtin base that fits (`except RuntimeError` still catches it), with the
   same message and notes.

The worker's formatted traceback always travels beside it and becomes `__cause__`.
"""

from __future__ import annotations

import builtins
import pickle
import traceback
from dataclasses import dataclass
from typing import Any

from prefetch.errors import PrefetchError, RemoteTraceback, add_note


@dataclass(frozen=True)
class ErrorSpec:
    """An error that cannot cross as itself: its class's name, builtin bases, message, notes."""

    name: str
    module: str
    bases: tuple[str, ...]  # builtin exception classes in its MRO, nearest first
    message: str
    notes: tuple[str, ...]

    def rebuild(self) -> BaseException:
        for base_name in self.bases:
            base = getattr(builtins, base_name, None)
            if not isinstance(base, type) or not issubclass(base, Exception):
                continue
            try:
                cls = type(self.name, (PrefetchError, base), {"__module__": self.module})
                error: BaseException = cls(self.message)
            except TypeError:  # a base that cannot take one message (UnicodeDecodeError)
                continue
            break
        else:
            error = PrefetchError(f"{self.name}: {self.message}")
        for note in self.notes:
            add_note(error, note)
        return error


def portable(error: BaseException) -> BaseException | ErrorSpec:
    """What of `error` can be pickled to the parent; see the module docstring."""
    if _round_trips(error):
        return error
    cls = type(error)
    try:
        copy = cls.__new__(cls, *error.args)
        copy.args = error.args
        for key, value in vars(error).items():
            if _round_trips(value):
                setattr(copy, key, value)
    except Exception:
        copy = None
    if copy is not None and _round_trips(copy):
        return copy
    return ErrorSpec(
        cls.__name__,
        cls.__module__,
        tuple(c.__name__ for c in cls.__mro__ if getattr(builtins, c.__name__, None) is c),
        str(error),
        tuple(str(note) for note in getattr(error, "__notes__", ())),
    )


def with_traceback_text(error: BaseException) -> tuple[BaseException | ErrorSpec, str]:
    """What a worker sends for `error`: its portable form and its formatted traceback."""
    return portable(error), "".join(traceback.format_exception(error))


def rebuild(sent: BaseException | ErrorSpec, text: str | None = None) -> BaseException:
    """The error to raise in the parent; with `text`, the worker's traceback is its cause."""
    error = sent.rebuild() if isinstance(sent, ErrorSpec) else sent
    if text is not None:
        error.__cause__ = RemoteTraceback(text)
    return error


def _round_trips(value: Any) -> bool:
    try:
        return type(pickle.loads(pickle.dumps(value))) is type(value)
    except Exception:
        return False
