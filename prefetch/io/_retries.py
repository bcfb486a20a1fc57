"""Retries and the errors of a bounded request: what every read of a URL shares.

`retrying(url, retries, call)` runs a call again on a transient failure (`is_transient`: a 5xx,
408 or 429 status, a dropped connection, a timeout; never a missing object, a refused
permission or a bad request), waiting `RETRY_BACKOFF_S` and twice as long at each further
attempt, and raises `naming(error, url, attempts)`: a builtin error of the closest kind whose
message names the URL. `DeadlineError`, `StatusError` and `CapError` are what a request of
`prefetch.io._http` raises when a `RemoteOptions` bound or the server says no. Pure functions;
thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Attempts after the first for a transient failure (a 5xx or 429 status, a dropped connection,
# a timeout); a missing object or a refused permission is never retried.
READ_RETRIES = 3
# The wait before the first retry; it doubles at each further one (0.1, 0.2, 0.4 s).
RETRY_BACKOFF_S = 0.1
# HTTP statuses worth another attempt: the server's failures, throttling, a request timeout.
_TRANSIENT_STATUS = frozenset({408, 429})
# Exception class names (anywhere in the type's MRO) that mean the connection failed, not the
# object: aiohttp's and botocore's connection errors do not derive from ConnectionError.
_TRANSIENT_NAMES = ("ConnectionError", "Disconnected", "PayloadError", "Timeout")


class DeadlineError(TimeoutError):
    """A deadline of `RemoteOptions` passed: `option` names it, `seconds` is its value."""

    def __init__(self, what: str, option: str, seconds: float) -> None:
        super().__init__(
            f"{what} within {seconds:g} s ({option}={seconds:g}; raise it with "
            f"RemoteOptions({option}=...))"
        )
        self.option = option
        self.seconds = seconds


class StatusError(OSError):
    """An HTTP answer that is not the object: `status` is its code (read by `is_transient`)."""

    def __init__(self, status: int, url: str, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason} for {url!r}")
        self.status = status


class CapError(OSError):
    """More bytes (or pages, or depth) than a cap of `RemoteOptions` allows; never retried."""


# The errors of ours: their messages name the URL or the cap already.
_OURS = (DeadlineError, StatusError, CapError)


def retrying(url: str, retries: int, call: Callable[[], Any]) -> Any:
    """`call()`, retried `retries` times on a transient error; errors name `url`."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as error:
            if attempt >= retries or not is_transient(error):
                raise naming(error, url, attempt + 1) from error
        time.sleep(RETRY_BACKOFF_S * 2**attempt)
        attempt += 1


def is_transient(error: BaseException) -> bool:
    """Whether another attempt may succeed: a 5xx/408/429 status, a dropped connection or a
    timeout; never a missing object, a refused permission or a bad request."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    for attribute in ("status", "code", "status_code"):
        status = getattr(error, attribute, None)
        if isinstance(status, int) and 100 <= status <= 599:
            return status >= 500 or status in _TRANSIENT_STATUS
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return any(
        any(part in cls.__name__ for part in _TRANSIENT_NAMES) for cls in type(error).__mro__
    )


def naming(error: Exception, url: str, attempts: int) -> Exception:
    """A builtin error of the closest kind whose message names `url` (an error of ours that
    names it already, such as a passed cap, is kept as it is)."""
    from_us = isinstance(error, _OURS)
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    status = getattr(error, "status", None)
    said = str(error) if from_us else repr(error)
    if isinstance(error, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"no object at {url!r}{tried}: {said}")
    if isinstance(error, PermissionError) or status in (401, 403):
        return PermissionError(f"not allowed to read {url!r}{tried}: {said}")
    if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__:
        return TimeoutError(f"reading {url!r} timed out{tried}: {said}")
    if from_us and status is None:
        return type(error)(str(error))  # a cap: its message names the URL and the cap
    return OSError(f"cannot read {url!r}{tried}: {said}")
