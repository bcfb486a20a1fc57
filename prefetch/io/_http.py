"""One HTTP(S) request with deadlines, a size cap and a redirect policy: `storage`'s http part.

`fetch` reads one URL on fsspec's event loop with aiohttp (fsspec's session: its connections,
headers and credentials), within three deadlines (connect, each read, the whole request,
`RemoteOptions`), at most `max_bytes` of body, following redirects only as
`RemoteOptions.follow_redirects` allows, and says whether the body was checked to be whole
(a Content-Length, or a chunked body's last chunk). `fetch_retrying` retries it
(`prefetch.io._retries`); `get` runs that from a plain thread. `run` runs a coroutine from a
plain thread and cancels it when that thread is interrupted (Ctrl-C), so nothing here waits
past its deadline or outlives its caller. Listing a folder page by page is
`prefetch.io._tree`'s. asyncio, aiohttp and yarl are imported on first use, so
`import prefetch` imports none of them. See docs/remote.md, "Bounds".
"""

from __future__ import annotations

import concurrent.futures
import urllib.parse
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from prefetch.io._links import normalise, redirect_allowed
from prefetch.io._remote_options import RemoteOptions
from prefetch.io._retries import (
    RETRY_BACKOFF_S,
    CapError,
    DeadlineError,
    StatusError,
    is_transient,
    naming,
)

T = TypeVar("T")

# Redirects followed at most for one request (aiohttp's own default).
MAX_REDIRECTS = 10
# Body chunks read at a time (the size caps are checked after each).
CHUNK_BYTES = 256 * 1024
# The seconds `get` waits past each attempt's own deadline before it gives up on the loop.
DEADLINE_SLACK_S = 2.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class Fetched:
    """A body and what is known of it: `whole` when its length was checked (a Content-Length,
    or a chunked body's terminating chunk), `url` the URL that answered (after redirects),
    `content_type` its media type ("" when the server named none)."""

    data: bytes
    whole: bool
    url: str
    content_type: str


# --- one request ------------------------------------------------------------------------------


def _timeout(options: RemoteOptions) -> Any:
    import aiohttp

    # The whole request's deadline is `fetch`'s own (asyncio.wait_for), so it is told apart.
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=options.connect_timeout_s,
        sock_read=options.read_timeout_s,
    )


async def fetch(
    fs: Any,
    url: str,
    options: RemoteOptions,
    *,
    max_bytes: int,
    cap_name: str,
    byte_range: tuple[int, int] | None = None,
    sink: BinaryIO | None = None,
) -> Fetched:
    """One GET of `url` on `fs`'s session, within `options`' deadlines and redirect policy and
    at most `max_bytes` of body (`cap_name` names that cap in the error). Raises
    DeadlineError, StatusError (an error status), CapError, PermissionError (a refused
    redirect) or aiohttp's own errors (a dropped connection).

    `byte_range=(start, stop)` asks for those bytes only (a `Range` header; a server that
    answers with the whole object instead raises OSError). With `sink`, the body is written
    to it from its start (emptied first, so a retry starts over) instead of kept in memory,
    and the `Fetched` holds no data."""
    import asyncio

    try:
        return await asyncio.wait_for(
            _fetch(fs, url, options, max_bytes, cap_name, byte_range, sink),
            options.request_timeout_s,
        )
    except asyncio.TimeoutError as error:
        if isinstance(error, DeadlineError):
            raise
        raise DeadlineError(
            "no whole answer", "request_timeout_s", options.request_timeout_s
        ) from None


async def _fetch(
    fs: Any,
    url: str,
    options: RemoteOptions,
    max_bytes: int,
    cap_name: str,
    byte_range: tuple[int, int] | None = None,
    sink: BinaryIO | None = None,
) -> Fetched:
    import aiohttp
    import yarl

    session = await fs.set_session()
    kwargs = {k: v for k, v in fs.kwargs.items() if k not in ("allow_redirects", "timeout")}
    if byte_range is not None:
        start, stop = byte_range
        kwargs["headers"] = {**kwargs.get("headers", {}), "Range": f"bytes={start}-{stop - 1}"}
    current = normalise(url)
    for _ in range(MAX_REDIRECTS + 1):
        try:
            async with session.get(
                yarl.URL(current, encoded=True),
                allow_redirects=False,
                timeout=_timeout(options),
                **kwargs,
            ) as response:
                if response.status in _REDIRECTS and "Location" in response.headers:
                    target = normalise(urllib.parse.urljoin(current, response.headers["Location"]))
                    if not redirect_allowed(url, target, options.follow_redirects):
                        raise PermissionError(
                            f"{current!r} redirects ({response.status}) to {target!r}, which "
                            f"follow_redirects={options.follow_redirects!r} does not follow "
                            "(same-host: the same scheme, host and port only); pass "
                            "RemoteOptions(follow_redirects='any') to follow it"
                        )
                    current = target
                    continue
                if response.status >= 400:
                    raise StatusError(response.status, current, response.reason or "")
                if byte_range is not None and response.status != 206:
                    raise OSError(
                        f"{current!r} answered a range request with the whole object "
                        f"(status {response.status}): this server cannot serve one sample "
                        "of a shard; read its shards whole (streaming, the default for URLs)"
                    )
                return await _body(response, current, max_bytes, cap_name, sink)
        except aiohttp.ServerTimeoutError as error:
            if isinstance(error, aiohttp.ConnectionTimeoutError):
                raise DeadlineError(
                    "no connection", "connect_timeout_s", options.connect_timeout_s
                ) from None
            raise DeadlineError(
                "no byte arrived", "read_timeout_s", options.read_timeout_s
            ) from None
    raise OSError(f"{url!r}: more than {MAX_REDIRECTS} redirects")


async def _body(
    response: Any, url: str, max_bytes: int, cap_name: str, sink: BinaryIO | None = None
) -> Fetched:
    length = response.content_length
    if length is not None and length > max_bytes:
        raise CapError(
            f"{url!r} is {length} bytes, more than {cap_name}={max_bytes}: raise "
            f"RemoteOptions({cap_name}=...) if it is meant to be that large"
        )
    data = bytearray()
    received = 0
    if sink is not None:
        sink.seek(0)
        sink.truncate()
    while chunk := await response.content.read(CHUNK_BYTES):
        received += len(chunk)
        if sink is None:
            data += chunk
        else:
            sink.write(chunk)
        if received > max_bytes:
            raise CapError(
                f"{url!r} sent more than {cap_name}={max_bytes} bytes: raise "
                f"RemoteOptions({cap_name}=...) if it is meant to be that large"
            )
    chunked = "chunked" in response.headers.get("Transfer-Encoding", "").lower()
    # aiohttp raises when a Content-Length or chunked body ends early; without either, the
    # body ends where the connection did, which may be anywhere.
    whole = length is not None or chunked
    content_type = response.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    return Fetched(bytes(data), whole, str(response.url), content_type)


async def fetch_retrying(
    fs: Any,
    url: str,
    options: RemoteOptions,
    retries: int,
    *,
    max_bytes: int,
    cap_name: str,
    byte_range: tuple[int, int] | None = None,
    sink: BinaryIO | None = None,
) -> Fetched:
    """`fetch`, retried `retries` times on a transient failure (`prefetch.io._retries`);
    the error names `url`."""
    import asyncio

    attempt = 0
    while True:
        try:
            return await fetch(
                fs,
                url,
                options,
                max_bytes=max_bytes,
                cap_name=cap_name,
                byte_range=byte_range,
                sink=sink,
            )
        except Exception as error:
            if attempt >= retries or not is_transient(error):
                raise naming(error, url, attempt + 1) from error
        await asyncio.sleep(RETRY_BACKOFF_S * 2**attempt)
        attempt += 1


def run(fs: Any, coroutine: Coroutine[Any, Any, T], limit_s: float | None) -> T:
    """Run `coroutine` on `fs`'s event loop and wait for it, from a thread that is not the
    loop's; on any interruption of the wait (Ctrl-C in the main thread) the coroutine is
    cancelled before the exception goes on. `limit_s` (None: none) is a backstop for a loop
    that does not answer: the coroutine's own deadlines come first. The coroutine's error is
    raised as it is (its `__cause__` kept)."""
    import asyncio

    future = asyncio.run_coroutine_threadsafe(_carried(coroutine), fs.loop)
    try:
        outcome = future.result(limit_s)
    except BaseException as error:
        future.cancel()
        if isinstance(error, concurrent.futures.TimeoutError):
            raise TimeoutError(f"fsspec's event loop did not answer within {limit_s} s") from None
        raise
    if isinstance(outcome, _Raised):
        raise outcome.error
    return outcome


@dataclass(frozen=True)
class _Raised:
    """An error carried out of the loop as a value (asyncio would copy a TimeoutError without
    its `__cause__`)."""

    error: Exception


async def _carried(coroutine: Coroutine[Any, Any, T]) -> T | _Raised:
    try:
        return await coroutine
    except Exception as error:
        return _Raised(error)


def get(
    fs: Any,
    url: str,
    options: RemoteOptions,
    retries: int,
    max_bytes: int,
    cap_name: str = "max_object_bytes",
    byte_range: tuple[int, int] | None = None,
    sink: BinaryIO | None = None,
) -> Fetched:
    """`fetch_retrying` from a plain thread (retried, within `options`, at most `max_bytes`,
    optionally a byte range or into `sink`), run to its end or to `run`'s backstop: the
    longest the attempts and their backoff can take, with `DEADLINE_SLACK_S` each."""
    attempt_s = options.request_timeout_s + DEADLINE_SLACK_S
    backstop_s = (retries + 1) * attempt_s + sum(
        RETRY_BACKOFF_S * 2.0**attempt for attempt in range(retries)
    )
    coroutine = fetch_retrying(
        fs,
        url,
        options,
        retries,
        max_bytes=max_bytes,
        cap_name=cap_name,
        byte_range=byte_range,
        sink=sink,
    )
    return run(fs, coroutine, backstop_s)
