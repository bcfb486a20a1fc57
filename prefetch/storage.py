"""Where image bytes come from: local paths, or fsspec URLs (`gs://`, `s3://`, `http(s)://`, ...).

`is_url(path)` tells them apart: a `scheme://` other than `file://` is read through fsspec (the
`remote` extra); plain paths and `file://` stay on the local fast path (`open`, `os.walk`).
`read_bytes` reads one whole object in one request, retrying transient failures (5xx, dropped
connections, timeouts) with a short backoff, and raises an error whose message names the URL.
`RemoteTree` lists a folder with one bulk listing of the filesystem (`find` with details), never
one call per file (over http(s), one index page per folder: `prefetch.remote_http`);
`prefetch.sources.index_directory` applies Keras's rules to it.
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

import contextlib
import contextvars
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("prefetch.loader")

# The deadlines of one request (RemoteOptions' defaults). Connecting takes milliseconds to an
# object store; 10 s covers a lost SYN and its retransmits. 30 s without a byte is botocore's
# read timeout halved: stores answer in well under a second, and a stalled stream is retried.
# 60 s for a whole request is the Google Cloud client's default; it also bounds a server that
# trickles a byte just often enough to dodge the read timeout.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 60.0
# The largest object read (1 GiB): far above any real image (a 100-megapixel PNG is about
# 300 MB), small enough that a few of them in flight do not exhaust memory.
MAX_OBJECT_BYTES = 1 << 30
# The most folder index pages one listing reads (http(s): one per folder; a bulk listing, gcs
# or s3, counts its entries in pages of LISTING_PAGE_ENTRIES): ImageNet's training set has
# 1,001 folders; 100,000 lists in minutes even at 80 ms a page.
MAX_LISTING_PAGES = 100_000
LISTING_PAGE_ENTRIES = 1000
# The largest index page (32 MiB): about 200,000 links, ten times nginx's page of a folder of
# 20,000 images; with 16 pages read at once, at most half a GiB in flight.
MAX_PAGE_BYTES = 32 << 20
# The deepest folder listed below the root: image trees are 1 to 4 folders deep.
MAX_DEPTH = 32
# Where a redirect may lead: "same-host" (the same scheme, host and port), "any" (any http or
# https URL) or "none" (a redirect is an error). Other schemes are never followed.
FOLLOW_REDIRECTS = ("same-host", "any", "none")
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
# Filesystems listed a folder page at a time (`prefetch.remote_http`): no bulk listing, and
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
    `prefetch.sources.is_file_source`). Judged by its first path."""
    from prefetch.sources import is_file_source  # sources imports this module

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
    (`prefetch.session.remote_start`)."""
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
    url: str, timeout_s: float | None = READ_TIMEOUT_S, retries: int = READ_RETRIES
) -> bytes:
    """The whole object at `url` (or a local path), in one request per attempt.

    Transient failures are retried `retries` times, waiting `RETRY_BACKOFF_S` then twice as
    long each time; `timeout_s` bounds each attempt on async filesystems (http, gcs, s3).
    Raises FileNotFoundError, PermissionError, TimeoutError or OSError (the original error as
    `__cause__`) with the URL in the message.
    """
    if not is_url(url):
        with open(local_path(url), "rb") as file:
            return file.read()
    fs, path = filesystem_for(url)
    kwargs: dict[str, Any] = {}
    if timeout_s is not None and getattr(fs, "async_impl", False):
        kwargs["timeout"] = timeout_s  # fsspec.asyn.sync's per-call timeout
    return bytes(_retrying(url, retries, lambda: fs.cat_file(path, **kwargs)))


def _retrying(url: str, retries: int, call: Callable[[], Any]) -> Any:
    """`call()`, retried `retries` times on a transient error; errors name `url`."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as error:
            if attempt >= retries or not is_transient(error):
                raise _naming(error, url, attempt + 1) from error
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


def _naming(error: Exception, url: str, attempts: int) -> Exception:
    """A builtin error of the closest kind whose message names `url`."""
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    status = getattr(error, "status", None)
    if isinstance(error, FileNotFoundError) or status == 404:
        return FileNotFoundError(f"no object at {url!r}{tried}: {error!r}")
    if isinstance(error, PermissionError) or status in (401, 403):
        return PermissionError(f"not allowed to read {url!r}{tried}: {error!r}")
    if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__:
        return TimeoutError(f"reading {url!r} timed out{tried}: {error!r}")
    return OSError(f"cannot read {url!r}{tried}: {error!r}")


class RemoteTree:
    """A folder on an fsspec filesystem, listed once, read like `os.listdir`/`os.walk`.

    One `fs.find(..., withdirs=True, detail=True)` lists everything under `top` (retried like
    `read_bytes`). Over http(s), which has no bulk listing, the index page of each folder is
    read with `fs.ls` and retried on its own, so a flaky server costs a page, not the whole
    listing (`walk_pages`); the folder
    strings it answers for are `os.path.join(top, ...)` of `top` as given (a URL), so
    `index_directory` builds the same path strings as for a local folder. A folder that does
    not exist (nothing listed under it) raises FileNotFoundError naming the URL.
    """

    def __init__(self, top: str, retries: int = READ_RETRIES) -> None:
        fs, root = filesystem_for(top)
        self.top = top
        self._folders: dict[str, tuple[list[str], list[str]]] = {}
        try:
            protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
            if protocols & _PAGED_PROTOCOLS:
                entries = walk_pages(fs, root, retries)
            else:
                entries = _retrying(top, retries, lambda: fs.find(root, withdirs=True, detail=True))
        except FileNotFoundError:
            entries = {}
        prefix = root.rstrip("/") + "/"
        for name, info in entries.items():
            name = name.rstrip("/")
            if not name.startswith(prefix):
                continue  # the root itself, or a link that leads out of it (http)
            parts = name[len(prefix) :].split("/")
            is_dir = info.get("type") == "directory"
            for depth in range(len(parts)):
                folder = self._key(parts[:depth])
                subdirs, files = self._folders.setdefault(folder, ([], []))
                last = depth == len(parts) - 1
                if last and not is_dir:
                    files.append(parts[depth])
                elif parts[depth] not in subdirs:
                    subdirs.append(parts[depth])
                    self._folders.setdefault(self._key(parts[: depth + 1]), ([], []))

    def _key(self, parts: list[str]) -> str:
        # Folders are keyed without a trailing "/", so "gs://b/train/" finds "gs://b/train".
        return os.path.join(self.top, *parts).rstrip("/")

    def _entry(self, folder: str) -> tuple[list[str], list[str]]:
        entry = self._folders.get(folder.rstrip("/"))
        if entry is None:
            raise FileNotFoundError(f"no folder at {folder!r} (nothing is listed under it)")
        return entry

    def listdir(self, folder: str) -> list[str]:
        """The names in `folder` (subfolders and files), as `os.listdir`."""
        subdirs, files = self._entry(folder)
        return subdirs + files

    def isdir(self, folder: str) -> bool:
        """Whether `folder` is a folder of the listing."""
        return folder.rstrip("/") in self._folders

    def walk(
        self, folder: str, followlinks: bool = False
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        """`(folder, subfolders, files)` for `folder` and every folder below it, as `os.walk`
        (an unknown folder yields nothing, as os.walk does)."""
        if not self.isdir(folder):
            return
        pending = [folder]
        while pending:
            current = pending.pop()
            subdirs, files = self._entry(current)
            yield current, list(subdirs), list(files)
            pending.extend(os.path.join(current, name) for name in subdirs)


def walk_pages(fs: Any, root: str, retries: int = READ_RETRIES) -> dict[str, dict[str, Any]]:
    """Every entry under `root` as `fs.find(..., withdirs=True, detail=True)` gives them,
    listed a folder per request with `fs.ls(folder, detail=True)`, each folder retried like
    `read_bytes`. The folders of one level are listed `LISTING_THREADS` at a time (a thousand
    class folders at 80 ms each take seconds, not minutes); links that lead out of `root` are
    not followed."""
    prefix = root.rstrip("/") + "/"
    entries: dict[str, dict[str, Any]] = {}

    def page(folder: str) -> list[dict[str, Any]]:
        return list(_retrying(folder, retries, functools.partial(fs.ls, folder, detail=True)))

    level = [root]
    with ThreadPoolExecutor(LISTING_THREADS, thread_name_prefix="prefetch-listing") as pool:
        while level:
            below = []
            for listing in pool.map(page, level):
                for info in listing:
                    name = str(info["name"]).rstrip("/")
                    if name.startswith(prefix) and name not in entries:
                        entries[name] = info
                        if info.get("type") == "directory":
                            below.append(str(info["name"]))  # as linked: "dir/", no redirect
            level = below
    return entries


def list_images(root_url: str) -> list[str]:
    """Every image under `root_url` (any depth), as URLs in Keras's order: the unlabelled
    listing of `prefetch.sources.index_directory`, from one bulk listing."""
    from prefetch.sources import index_directory  # sources imports this module

    paths, _, _ = index_directory(root_url, infer_labels=False)
    return paths.tolist()
