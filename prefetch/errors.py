"""The exception tree of prefetch, and helpers that attach context to errors.

Errors raised by user code (decoders, transforms, sources) keep their original type; prefetch
only adds a note naming the file and the worker. Errors that prefetch itself raises derive from
`PrefetchError`.
"""

from __future__ import annotations


class PrefetchError(Exception):
    """Base class of the errors that prefetch raises itself."""


class TooManySkippedError(PrefetchError):
    """More samples failed than `max_skipped` allows with `on_error="skip"`.

    `paths` lists the files skipped so far, oldest first; `__cause__` is the last decode error.
    """

    def __init__(self, message: str, paths: list[str]) -> None:
        super().__init__(message)
        self.paths = paths


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
