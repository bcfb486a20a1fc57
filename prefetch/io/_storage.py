"""Where image bytes come from: local paths, or fsspec URLs (`gs://`, `s3://`, `http(s)://`, ...).

`is_url(path)` tells them apart: a `scheme://` other than `file://` is read through fsspec (the
`remote` extra); plain paths and `file://` stay on the local fast path (`open`, `os.walk`).
`read_bytes` reads one whole object in one request, retrying transient failures (5xx, dropped
connections, timeouts) with a short backoff (`prefetch.io._retries`), and raises an error whose
message names the URL; `read_range` reads a span of one, `download` writes one into a file.
Over http(s) each request is `prefetch.io._http`'s; local files are read by
`prefetch.io._local_files`; `prefetch.io._tree.RemoteTree` lists a folder with one bulk listing
(over http(s), one index page per folder). A sample's location (a path, a URL or a shard's
member) is read by `prefetch.io._locations.read_location`, through these.
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
import os
import re
from typing import Any, BinaryIO

from prefetch.io import _http as http

# Re-exported (`name as name`): readers and sources reach the options (prefetch.io._remote_options)
# and `read_local` through this module.
from prefetch.io._local_files import read_local as read_local
from prefetch.io._remote_options import RemoteOptions as RemoteOptions
from prefetch.io._remote_options import active_options as active_options
from prefetch.io._remote_options import using as using
from prefetch.io._retries import READ_RETRIES, DeadlineError, retrying

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


def is_url(path: Any) -> bool:
    """True for a `scheme://...` string other than `file://...`: read through fsspec."""
    if not isinstance(path, str):
        return False
    match = _SCHEME.match(path)
    return match is not None and match.group(1).lower() != "file"


def url_scheme(place: str) -> str:
    """The scheme of the URL `place`, lower-cased ("memory", "http", ...); "" for a local path
    (a plain path or `file://`)."""
    match = _SCHEME.match(place) if is_url(place) else None
    return match.group(1).lower() if match else ""


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
        fetched = http.get(fs, url, options, retries, options.max_object_bytes)
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
        return http.get(fs, url, options, retries, length, "the sample's length", span).data
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
        http.get(fs, url, options, retries, cap, sink=file)
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


def _with_request_timeout(options: RemoteOptions, timeout_s: float) -> RemoteOptions:
    return dataclasses.replace(options, request_timeout_s=timeout_s)


def is_paged(fs: Any) -> bool:
    """Whether the fsspec filesystem `fs` is listed a folder page at a time (http(s): no bulk
    listing) and read through `prefetch.io._http`."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _PAGED_PROTOCOLS)
