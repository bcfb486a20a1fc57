"""Where image bytes come from: local paths, or fsspec URLs (`gs://`, `s3://`, `http(s)://`, ...).

`is_url(path)` tells them apart: a `scheme://` other than `file://` is read through fsspec (the
`remote` extra); plain paths and `file://` stay on the local fast path (`open`, `os.walk`).
`read_bytes` reads one whole object in one request, retrying transient failures (5xx, dropped
connections, timeouts) with a short backoff, and raises an error whose message names the URL.
`prefetch.io._tree.RemoteTree` lists a folder with one bulk listing (over http(s), one
index page per folder: `prefetch.io._http`); local files are read by `prefetch.io._local_files`.
Nothing a store sends can make these block forever or take unbounded memory: every request
has the deadlines of a `RemoteOptions` (connect, each read, the whole request), every body a
size cap (`read_local` too: a `.jpg` that is /dev/zero is refused), every listing caps on
pages, page bytes and depth, and a link that leads out of the listed root is not followed.
The options in effect are the calling thread's (`using`), else the defaults.
fsspec is imported only when a URL is used: `import prefetch` does not import it. Everything
here is stateless and thread-safe (fsspec caches its filesystem instances itself); credentials
are fsspec's and the protocol package's own (environment, config files), never stored here.
See docs/remote.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

# The options live in prefetch.io._remote_options; `using` and `RemoteOptions` are re-exported
# because readers and sources reach them through this module.
from prefetch.io._local_files import read_local as read_local
from prefetch.io._remote_options import RemoteOptions as RemoteOptions
from prefetch.io._remote_options import active_options as active_options
from prefetch.io._remote_options import using as using

if TYPE_CHECKING:
    from prefetch.io import _http as remote_http
    from prefetch.io._members import Location

log = logging.getLogger("prefetch.loader")

# Attempts after the first for a transient failure (a 5xx or 429 status, a dropped connection,
# a timeout); a missing object or a refused permission is never retried.
READ_RETRIES = 3
# The wait before the first retry; it doubles at each further one (0.1, 0.2, 0.4 s).
RETRY_BACKOFF_S = 0.1
# The package fsspec needs for a protocol, named in the error when it is missing.
PROTOCOL_PACKAGES = {
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "s3": "s3fs",
    "s3a": "s3fs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
    "http": "aiohttp",
    "https": "aiohttp",
    "hf": "huggingface_hub",
}
INSTALL_HINT = "pip install 'prefetch[remote]' (fsspec and aiohttp)"

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_FILE_SCHEME = "file://"
# Filesystems listed a folder page at a time (`prefetch.io._http`): no bulk listing, and
# their reads go through it too (deadlines, redirects, caps).
_PAGED_PROTOCOLS = frozenset({"http", "https"})
# HTTP statuses worth another attempt: the server's failures, throttling, a request timeout.
_TRANSIENT_STATUS = frozenset({408, 429})
# Exception class names (anywhere in the type's MRO) that mean the connection failed, not the
# object: aiohttp's and botocore's connection errors do not derive from ConnectionError.
_TRANSIENT_NAMES = ("ConnectionError", "Disconnected", "PayloadError", "Timeout")


def is_url(path: Any) -> bool:
    """True for a `scheme://...` string other than `file://...`: read through fsspec."""
    if not isinstance(path, str):
        return False
    match = _SCHEME.match(path)
    return match is not None and match.group(1).lower() != "file"


def source_scheme(source: Any) -> str:
    """The URL scheme of a file source's files ("memory", "http", ...), "" when they are local
    (plain paths or `file://`) or the source has no files (it is not a file source,
    `prefetch.sources._folders.is_file_source`). Judged by its first path."""
    from prefetch.sources._folders import is_file_source  # sources imports this module

    if not is_file_source(source):
        return ""
    paths = source.paths
    if len(paths) == 0 or not is_url(str(paths[0])):
        return ""
    match = _SCHEME.match(str(paths[0]))
    return match.group(1).lower() if match else ""


def reads_over_network(source: Any) -> bool:
    """Whether a file source's reads wait on a network: URLs other than `memory://`. Such a
    loader's `workers=None` is tuned like "auto", starting above one worker per core
    (`prefetch.runtime._session.remote_start`). A streamed shard source's workers read local copies
    (`prefetch.sources.shards._spool`): not over a network."""
    from prefetch.sources.shards._sources import ShardSource  # it imports this module

    if isinstance(source, ShardSource) and source.streaming:
        return False
    return source_scheme(source) not in ("", "memory")


def local_path(path: str) -> str:
    """`path` without a leading `file://` (local paths are returned unchanged)."""
    return path[len(_FILE_SCHEME) :] if path.startswith(_FILE_SCHEME) else path


def filesystem_for(url: str) -> tuple[Any, str]:
    """`(filesystem, path)` for `url`, as `fsspec.core.url_to_fs` gives them.

    Raises ImportError naming the `remote` extra when fsspec is missing, and naming the
    protocol's package (gcsfs for `gs://`, s3fs for `s3://`, ...) when that is missing.
    """
    try:
        import fsspec.core  # type: ignore[import-untyped]  # the remote extra, untyped
    except ImportError as error:
        raise ImportError(f"reading {url!r} needs fsspec: {INSTALL_HINT}") from error
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as error:
        protocol = url.split("://", 1)[0].lower()
        package = PROTOCOL_PACKAGES.get(protocol, f"the fsspec package for {protocol}://")
        raise ImportError(
            f"reading {url!r} needs {package}: pip install {package} ({error})"
        ) from error
    return fs, str(path)


def read_bytes(
    url: str,
    timeout_s: float | None = None,
    retries: int = READ_RETRIES,
    options: RemoteOptions | None = None,
) -> bytes:
    """The whole object at `url` (or a local path), in one request per attempt.

    Transient failures are retried `retries` times, waiting `RETRY_BACKOFF_S` then twice as
    long each time. `options` (None: `active_options()`) bound each attempt (its deadlines;
    `timeout_s`, when given, replaces its `request_timeout_s`) and the object's size
    (`max_object_bytes`, for local files too). Raises FileNotFoundError, PermissionError,
    TimeoutError or OSError (the original error as `__cause__`) with the URL in the message.
    """
    return fetch_object(url, timeout_s, retries, options)[0]


def fetch_object(
    url: str,
    timeout_s: float | None = None,
    retries: int = READ_RETRIES,
    options: RemoteOptions | None = None,
) -> tuple[bytes, bool]:
    """`(data, whole)`: `read_bytes`, and whether the data were checked to be the whole object
    (False only for an http(s) answer with neither a Content-Length nor chunked encoding,
    whose body ends wherever the connection did; other stores' clients check the length
    they announce, and a local file is read to its end)."""
    options = options or active_options()
    if timeout_s is not None:
        options = _with_request_timeout(options, timeout_s)
    if not is_url(url):
        return read_local(local_path(url), options.max_object_bytes), True
    fs, path = filesystem_for(url)
    if is_paged(fs):
        fetched = _http_get(fs, url, options, retries, options.max_object_bytes)
        return fetched.data, fetched.whole
    cap = options.max_object_bytes
    kwargs: dict[str, Any] = {"start": 0, "end": cap + 1}  # a range: never more than cap + 1
    if getattr(fs, "async_impl", False):
        kwargs["timeout"] = options.request_timeout_s  # fsspec.asyn.sync's per-call timeout

    def attempt() -> bytes:
        try:
            data = bytes(fs.cat_file(path, **kwargs))
        except Exception as error:
            if "Timeout" in type(error).__name__:
                from prefetch.io._http import DeadlineError

                raise DeadlineError(
                    "no whole answer", "request_timeout_s", options.request_timeout_s
                ) from error
            raise
        if len(data) > cap:
            raise OSError(
                f"{url!r} is larger than max_object_bytes={cap}: raise "
                "RemoteOptions(max_object_bytes=...) if it is meant to be that large"
            )
        return data

    return retrying(url, retries, attempt), True


def read_whole(path: Location) -> bytes:
    """The bytes of `path`: a local or `file://` path through `read_local` (a regular file, at
    most `max_object_bytes`), an fsspec URL through `read_bytes` (retried, capped), a sample
    of a shard (a `Member` value, `prefetch.io._members`) through `read_member`. A string
    is always a path or URL, whatever its characters."""
    if not isinstance(path, str):
        from prefetch.io._members import read_member

        return read_member(path)
    if "://" not in path:  # the local fast path: one substring test
        return read_local(path)
    return read_bytes(path) if is_url(path) else read_local(local_path(path))


def beside(place: str, name: str) -> str:
    """The path or URL of the file `name` in the folder of `place` (a path or URL)."""
    if is_url(place):
        return f"{place.rpartition('/')[0]}/{name}"
    return os.path.join(os.path.dirname(place), name)


def read_small(place: str, cap: int) -> bytes:
    """The whole of the small file at `place` (a path or URL: a manifest, a `classes.txt`, an
    index beside a shard), at most `cap` bytes (for a URL, at most `max_object_bytes` too),
    a URL retried once. OSError naming it (FileNotFoundError when there is none)."""
    if is_url(place):
        options = active_options()
        capped = dataclasses.replace(options, max_object_bytes=min(cap, options.max_object_bytes))
        return read_bytes(place, retries=1, options=capped)
    return read_local(local_path(place), cap)


def read_range(url: str, offset: int, length: int, retries: int = READ_RETRIES) -> bytes:
    """`length` bytes of the object at `url` from byte `offset`, in one ranged request per
    attempt, within the active options' deadlines; retried and named as `read_bytes`."""
    options = active_options()
    fs, path = filesystem_for(url)
    if is_paged(fs):
        span = (offset, offset + length)
        return _http_get(fs, url, options, retries, length, "the sample's length", span).data
    return bytes(
        retrying(url, retries, lambda: fs.cat_file(path, start=offset, end=offset + length))
    )


def download(url: str, file: BinaryIO, retries: int = READ_RETRIES) -> int:
    """Write the whole object at `url` into `file` (from its start; a retry starts over) in
    large sequential reads, never holding it in memory; returns its size. The active
    options bound it: at most `max_object_bytes`, and over http(s) each read's and the whole
    request's deadlines (other stores: their clients' own timeouts). Errors name the URL."""
    options = active_options()
    cap = options.max_object_bytes
    fs, path = filesystem_for(url)
    if is_paged(fs):
        _http_get(fs, url, options, retries, cap, sink=file)
        return file.tell()

    def attempt() -> int:
        file.seek(0)
        file.truncate()
        with fs.open(path, "rb", block_size=_DOWNLOAD_BLOCK) as remote:
            while chunk := remote.read(_DOWNLOAD_BLOCK):
                file.write(chunk)
                if file.tell() > cap:
                    raise OSError(
                        f"{url!r} is larger than max_object_bytes={cap}: raise "
                        "RemoteOptions(max_object_bytes=...) if it is meant to be that large"
                    )
        return file.tell()

    return int(retrying(url, retries, attempt))


# Bytes per request when a shard is downloaded whole from a store other than http(s).
_DOWNLOAD_BLOCK = 16 << 20


def _http_get(
    fs: Any,
    url: str,
    options: RemoteOptions,
    retries: int,
    max_bytes: int,
    cap_name: str = "max_object_bytes",
    byte_range: tuple[int, int] | None = None,
    sink: BinaryIO | None = None,
) -> remote_http.Fetched:
    """One http(s) GET through `remote_http` (retried, within `options`, at most `max_bytes`,
    optionally a byte range or into `sink`), run to its end or to the backstop."""
    from prefetch.io import _http as remote_http

    get = remote_http.fetch_retrying(
        fs,
        url,
        options,
        retries,
        max_bytes=max_bytes,
        cap_name=cap_name,
        byte_range=byte_range,
        sink=sink,
    )
    return remote_http.run(fs, get, _backstop_s(options, retries))


def _with_request_timeout(options: RemoteOptions, timeout_s: float) -> RemoteOptions:
    import dataclasses

    return dataclasses.replace(options, request_timeout_s=timeout_s)


def _backstop_s(options: RemoteOptions, retries: int) -> float:
    """How long a request with its retries can take at most, and a margin: `run`'s backstop."""
    backoff = sum(RETRY_BACKOFF_S * 2.0**attempt for attempt in range(retries))
    return (retries + 1) * (options.request_timeout_s + 2.0) + backoff


def is_paged(fs: Any) -> bool:
    """Whether the fsspec filesystem `fs` is listed a folder page at a time (http(s): no bulk
    listing) and read through `prefetch.io._http`."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _PAGED_PROTOCOLS)


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
    from_us = type(error).__module__ == "prefetch.io._http"
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


def list_images(root_url: str) -> list[str]:
    """Every image under `root_url` (any depth), as URLs in Keras's order: the unlabelled
    listing of `prefetch.sources._folders.index_directory`, from one bulk listing."""
    from prefetch.sources._folders import index_directory  # sources imports this module

    paths, _, _ = index_directory(root_url, infer_labels=False)
    return paths.tolist()
