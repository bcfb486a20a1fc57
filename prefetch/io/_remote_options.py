"""The bounds on what remote storage may cost: `RemoteOptions`, and the options in effect.

`RemoteOptions` is a frozen value with every check written once; `using(options)` makes it the
one that reads and listings in this thread (or task) honour, and `active_options()` reads it
back (the defaults outside any `using`). prefetch.io._storage and prefetch.io._http apply them.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from dataclasses import dataclass

from prefetch._messages import suggest_keywords

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
# What a cache_limit evicts: "keep" (copies not read in this epoch or the last) or "lru".
CACHE_POLICIES = ("keep", "lru")


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class RemoteOptions:
    """Bounds on what remote storage may cost: `Loader(..., remote=RemoteOptions(...))`,
    `ImageFolder(url, remote=...)`. The defaults suit object stores and real image trees; a
    passed bound is an error that names the URL (or file) and the option to raise.

    - `connect_timeout_s`: seconds to open a connection (10).
    - `read_timeout_s`: seconds without a byte from the server, at any point of an answer
      (30): a stalled index page or object.
    - `request_timeout_s`: seconds for a whole request, redirects included (60). Each is per
      attempt; a timed-out request is retried 3 times (`READ_RETRIES`).
    - `max_object_bytes`: the largest object (or local file, through the fast and window
      decoders) read, in bytes (1 GiB): an endless body, or a `.jpg` that is /dev/zero, is an
      error naming it and this cap.
    - `max_listing_pages`: the most folder pages one listing reads (100,000): over http(s) one
      per folder; a bulk listing (gcs, s3) counts 1,000 entries as a page.
    - `max_page_bytes`: the largest folder index page, in bytes (32 MiB).
    - `max_depth`: the deepest folder listed below the root (32).
    - `follow_redirects`: `"same-host"` (the default: only to the same scheme, host and port),
      `"any"` (any http or https URL), or `"none"` (a redirect is an error). A redirect to
      another scheme (`file://`) is never followed.
    - `cache_dir`: a `Loader`'s local folder that keeps each remote object (or streamed
      shard) after its first read, so later epochs and runs read local disk; None for none.
      Processes and ranks of a host may share it: each object is fetched once on the host.
    - `cache_limit`: the most bytes `cache_dir` holds (None: no bound, the default): copies
      are evicted to make room (as `cache_policy` says), never one being read. Give the same
      limit to every process that shares the folder.
    - `cache_policy`: which copies of whole objects a `cache_limit` lets go. `"keep"` (the
      default): only copies nobody read in this epoch or the last (stale ones, of an earlier
      run or another set); when there are none, an object beyond the limit is read but not
      kept, so shuffled epochs over a set larger than the limit read `limit / set` of each
      epoch from copies. `"lru"`: the least recently read copy, always: better when several
      jobs read the same objects at about the same time (a copy one fetched is there for the
      others), worse for one shuffled pass after another (each copy tends to go shortly
      before its next read: about half of `limit / set` squared). Streamed shards are always
      evicted least recently read (a shard must be on disk to be read).

    Only http(s) requests have all three deadlines; other async filesystems (gcs, s3) get
    `request_timeout_s` per request, and their own clients' connect and read timeouts.
    """

    connect_timeout_s: float = CONNECT_TIMEOUT_S
    read_timeout_s: float = READ_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S
    max_object_bytes: int = MAX_OBJECT_BYTES
    max_listing_pages: int = MAX_LISTING_PAGES
    max_page_bytes: int = MAX_PAGE_BYTES
    max_depth: int = MAX_DEPTH
    follow_redirects: str = "same-host"
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    cache_policy: str = "keep"

    def __post_init__(self) -> None:
        for name in ("connect_timeout_s", "read_timeout_s", "request_timeout_s"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not 0 < value < float("inf"):
                raise ValueError(
                    f"{name} must be a number of seconds > 0, got {value!r}: pass e.g. "
                    f"RemoteOptions({name}=30)"
                )
        for name in ("max_object_bytes", "max_listing_pages", "max_page_bytes", "max_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} must be an int >= 1, got {value!r}: pass e.g. "
                    f"RemoteOptions({name}={getattr(RemoteOptions, name)})"
                )
        limit = self.cache_limit
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(
                    f"cache_limit must be a number of bytes >= 1 (an int) or None, got "
                    f"{limit!r}: pass e.g. RemoteOptions(cache_dir=..., cache_limit=50 * 2**30)"
                )
            if self.cache_dir is None:
                raise ValueError(
                    f"cache_limit={limit} bounds the folder cache_dir, which is not given: "
                    "pass RemoteOptions(cache_dir=..., cache_limit=...)"
                )
        if self.cache_policy not in CACHE_POLICIES:
            raise ValueError(
                f"cache_policy must be one of {CACHE_POLICIES}, got {self.cache_policy!r}: "
                "'keep' evicts only copies not read in this epoch or the last, 'lru' the least "
                "recently read"
            )
        if self.follow_redirects not in FOLLOW_REDIRECTS:
            raise ValueError(
                f"follow_redirects must be one of {FOLLOW_REDIRECTS}, got "
                f"{self.follow_redirects!r}: 'same-host' follows redirects within the same "
                "scheme, host and port, 'any' to any http(s) URL, 'none' to none"
            )


DEFAULT_OPTIONS = RemoteOptions()
# The options of the reads and listings of the current thread (or task): `using`.
_ACTIVE: contextvars.ContextVar[RemoteOptions] = contextvars.ContextVar(
    "prefetch_remote_options", default=DEFAULT_OPTIONS
)


def active_options() -> RemoteOptions:
    """The `RemoteOptions` in effect in this thread: those of the innermost `using`, else the
    defaults."""
    return _ACTIVE.get()


@contextlib.contextmanager
def using(options: RemoteOptions | None) -> Iterator[RemoteOptions]:
    """Make `options` (None: leave them as they are) the ones reads and listings in this
    thread use, for the `with` block: a decoder's `read_bytes(url)` then honours the
    loader's options without being passed them."""
    if options is None:
        yield active_options()
        return
    token = _ACTIVE.set(options)
    try:
        yield options
    finally:
        _ACTIVE.reset(token)
