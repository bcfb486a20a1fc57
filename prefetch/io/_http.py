"""HTTP(S) reads and folder listings with deadlines, caps and a closed root: `storage`'s http part.

`fetch` reads one URL on fsspec's event loop with aiohttp (fsspec's session: its connections,
headers and credentials), within three deadlines (connect, each read, the whole request,
`RemoteOptions`), at most `max_bytes` of body, following redirects only as
`RemoteOptions.follow_redirects` allows, and says whether the body was checked to be whole
(a Content-Length, or a chunked body's last chunk). `list_pages` lists a folder tree one
index page per folder, `LISTING_CONCURRENCY` pages at once, following only links that resolve
(`prefetch.io._links.resolve`: dots, percent-encoding, empty segments, other schemes and
hosts) to a place inside the root, within `max_listing_pages`, `max_page_bytes` and
`max_depth`. `run` runs a coroutine from a plain thread and cancels it when that thread is
interrupted (Ctrl-C), so nothing here waits past its deadline or outlives its caller.
Imported only when an http(s) URL is used. See docs/remote.md, "Bounds".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from prefetch.io._links import as_folder, normalise, redirect_allowed, resolve
from prefetch.io._storage import (
    RETRY_BACKOFF_S,
    RemoteOptions,
    is_transient,
    naming,
)

log = logging.getLogger("prefetch.loader")

T = TypeVar("T")

# Folder pages requested at once while listing (each waits on the server, not the CPU).
LISTING_CONCURRENCY = 16
# Redirects followed at most for one request (aiohttp's own default).
MAX_REDIRECTS = 10
# A long listing logs its progress on the `prefetch.runtime._loader` logger this often.
PROGRESS_EVERY_S = 10.0
# Body chunks read at a time (the size caps are checked after each).
CHUNK_BYTES = 256 * 1024
# The seconds `run` waits past a request's own deadline before it gives up on the loop.
DEADLINE_SLACK_S = 2.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# An anchor's href, as fsspec's HTTP filesystem finds them in an index page.
_HREF = re.compile(r"""<(?:a|A)\s+(?:[^>]*?\s+)?(?:href|HREF)=["'](?P<url>[^"']+)""")


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
    """`fetch`, retried `retries` times on a transient failure (as `storage.read_bytes`);
    the error names `url`."""
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


# --- listing ----------------------------------------------------------------------------------


async def _all_or_cancel(awaitables: list[Awaitable[T]]) -> list[T]:
    """The results of `awaitables`, run at once; the first error cancels the others (and so
    does a cancellation of the caller)."""
    tasks = [asyncio.ensure_future(item) for item in awaitables]
    try:
        if tasks:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        # The failure, if any: the others may still be running (their result is not set).
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def links_of(page: Fetched) -> list[str]:
    """The hrefs of an HTML index page (none for another media type), as fsspec reads them."""
    if page.content_type not in ("text/html", ""):
        return []
    return [match.group("url") for match in _HREF.finditer(page.data.decode("utf-8", "replace"))]


async def list_pages(
    fs: Any, root: str, options: RemoteOptions, retries: int, skip_errors: bool
) -> dict[str, dict[str, Any]]:
    """Every entry under the folder URL `root`, as `{url: {"name", "type", "size"}}` (folder
    names without their trailing "/"), listed one index page per folder, level by level, at
    most `LISTING_CONCURRENCY` pages at once. Only links that `resolve` inside the page's
    folder (and so inside `root`) are followed. The root's page failing raises its error; a
    sub-folder's raises OSError naming that page and the page that linked it (with
    `skip_errors`, it is logged and the folder left out). Caps raise CapError naming the cap."""
    top = as_folder(root)
    entries: dict[str, dict[str, Any]] = {}
    semaphore = asyncio.Semaphore(LISTING_CONCURRENCY)
    pages = 0  # pages asked for
    listed = [0]  # pages read
    began = time.monotonic()
    reported = began

    async def page(folder: str, parent: str | None) -> list[str] | None:
        nonlocal reported
        async with semaphore:
            try:
                fetched = await fetch_retrying(
                    fs,
                    folder,
                    options,
                    retries,
                    max_bytes=options.max_page_bytes,
                    cap_name="max_page_bytes",
                )
            except CapError:
                raise
            except Exception as error:
                if parent is None:
                    raise
                message = (
                    f"listing {root!r}: the folder page {folder!r} (linked from {parent!r}) "
                    f"failed: {error}"
                )
                if skip_errors:
                    log.warning("prefetch: %s; left out (on_error='skip')", message)
                    return None
                raise OSError(message + "; pass on_error='skip' to leave it out") from error
        listed[0] += 1
        now = time.monotonic()
        if now - reported >= PROGRESS_EVERY_S:
            reported = now
            log.info(
                "prefetch: listing %s: %d folder pages read, %d entries, %.0f s so far",
                root,
                listed[0],
                len(entries),
                now - began,
            )
        base = as_folder(fetched.url)
        found = []
        for link in links_of(fetched):
            target = resolve(base, link)
            if target is not None and target.startswith(top):
                found.append(target)
        return found

    level: list[tuple[str, str | None]] = [(top, None)]
    depth = 0
    while level:
        if depth > options.max_depth:
            raise CapError(
                f"listing {root!r}: {level[0][0]!r} is {depth} folders deep, more than "
                f"max_depth={options.max_depth}; raise RemoteOptions(max_depth=...) if the "
                "tree is that deep"
            )
        if pages + len(level) > options.max_listing_pages:
            raise CapError(
                f"listing {root!r}: more than max_listing_pages={options.max_listing_pages} "
                "folder pages; raise RemoteOptions(max_listing_pages=...) if the tree has "
                "that many folders"
            )
        pages += len(level)
        results = await _all_or_cancel([page(folder, parent) for folder, parent in level])
        below: list[tuple[str, str | None]] = []
        for (folder, _), found in zip(level, results, strict=True):
            if found is None:  # its page failed, and on_error="skip": no such folder
                entries.pop(folder.rstrip("/"), None)
                continue
            for target in found:
                name = target.rstrip("/")
                if name in entries:
                    continue
                is_folder = target.endswith("/")
                entries[name] = {
                    "name": name,
                    "type": "directory" if is_folder else "file",
                    "size": None,
                }
                if is_folder:
                    below.append((target, folder))
        level = below
        depth += 1
    return entries
