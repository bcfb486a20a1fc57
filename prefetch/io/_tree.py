"""A folder of an fsspec filesystem, listed once and read like `os.listdir`/`os.walk`.

`RemoteTree` lists everything under a URL with one bulk listing (`find` with details), never
one call per file. A filesystem whose `find` is fsspec's generic one (a walk of one `ls` per
folder: sftp, ftp, smb, webdav, ...) is listed by `list_by_ls`, the same `ls` calls, because
that walk leaves out a folder whose `ls` fails: a listing is complete or an error. Over
http(s), which has no bulk listing, `list_pages` reads one index page per folder,
`LISTING_CONCURRENCY` pages at once (each a request of `prefetch.io._http`), following only
links that resolve (`prefetch.io._links.resolve`: dots, percent-encoding, empty segments, other
schemes and hosts) to a place inside the root. Every listing is bounded by the `RemoteOptions`
in effect (pages, page bytes, depth). `prefetch.sources._listing.index_directory` applies
Keras's rules to it. A tree is immutable once listed: thread-safe to read.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

from prefetch.io import _storage as storage
from prefetch.io._http import Fetched, fetch_retrying, run
from prefetch.io._links import as_folder, resolve
from prefetch.io._remote_options import LISTING_PAGE_ENTRIES, RemoteOptions, active_options
from prefetch.io._retries import READ_RETRIES, CapError, retrying

log = logging.getLogger("prefetch.loader")

T = TypeVar("T")

# Folder pages requested at once while listing (each waits on the server, not the CPU).
LISTING_CONCURRENCY = 16
# A long listing logs its progress on the `prefetch.runtime._loader` logger this often.
PROGRESS_EVERY_S = 10.0
# An anchor's href, as fsspec's HTTP filesystem finds them in an index page.
_HREF = re.compile(r"""<(?:a|A)\s+(?:[^>]*?\s+)?(?:href|HREF)=["'](?P<url>[^"']+)""")


class RemoteTree:
    """A folder on an fsspec filesystem, listed once, read like `os.listdir`/`os.walk`.

    One `fs.find(..., withdirs=True, detail=True)` lists everything under `top` (retried like
    `read_bytes`). Over http(s), which has no bulk listing, the index page of each folder is
    read and retried on its own, so a flaky server costs a page, not the whole listing, and so
    is each folder of a filesystem listed by `list_by_ls`
    (`list_pages`: deadlines, caps, and only links that resolve inside
    `top` followed; a failing sub-folder page raises OSError naming it, or with `skip_errors`
    is logged and left out). `options` (None: `active_options()`) bound it all. The folder
    strings it answers for are `os.path.join(top, ...)` of `top` as given (a URL), so
    `index_directory` builds the same path strings as for a local folder. A folder that does
    not exist (nothing listed under it) raises FileNotFoundError naming the URL; an entry
    with an empty, "." or ".." segment is left out.
    """

    def __init__(
        self,
        top: str,
        retries: int = READ_RETRIES,
        options: RemoteOptions | None = None,
        skip_errors: bool = False,
    ) -> None:
        options = options or active_options()
        fs, root = storage.filesystem_for(top)
        self.top = top
        self._folders: dict[str, tuple[list[str], list[str]]] = {}
        paged = storage.is_paged(fs)
        try:
            if paged:
                entries = run(fs, list_pages(fs, top, options, retries, skip_errors), None)
            elif walks_by_ls(fs):
                entries = list_by_ls(fs, root, top, options, retries)
            else:
                entries = retrying(top, retries, lambda: fs.find(root, withdirs=True, detail=True))
        except FileNotFoundError:
            entries = {}
        if not paged and len(entries) > options.max_listing_pages * LISTING_PAGE_ENTRIES:
            raise OSError(
                f"listing {top!r}: {len(entries)} entries, more than max_listing_pages="
                f"{options.max_listing_pages} pages of {LISTING_PAGE_ENTRIES}; raise "
                "RemoteOptions(max_listing_pages=...) if the tree is that large"
            )
        prefix = as_folder(top) if paged else root.rstrip("/") + "/"
        for name, info in entries.items():
            name = name.rstrip("/")
            if not name.startswith(prefix):
                continue  # the root itself
            parts = name[len(prefix) :].split("/")
            if any(part in ("", ".", "..") for part in parts):
                continue  # no folder of a local tree has such a name: not followed
            if len(parts) > options.max_depth + 1:
                raise OSError(
                    f"listing {top!r}: {name!r} is {len(parts) - 1} folders deep, more than "
                    f"max_depth={options.max_depth}; raise RemoteOptions(max_depth=...) if "
                    "the tree is that deep"
                )
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


# --- fsspec's generic find: one ls per folder -----------------------------------------------


def walks_by_ls(fs: Any) -> bool:
    """Whether `fs.find` is fsspec's generic one: a `walk` of one `ls` per folder, which leaves
    out a folder whose `ls` raises (its `on_error="omit"`, which a walk does not pass on to
    the folders below even when told otherwise)."""
    from fsspec.asyn import AsyncFileSystem  # type: ignore[import-untyped]  # remote extra
    from fsspec.spec import AbstractFileSystem  # type: ignore[import-untyped]

    if isinstance(fs, AsyncFileSystem):
        return type(fs)._find is AsyncFileSystem._find
    return type(fs).find is AbstractFileSystem.find


def list_by_ls(
    fs: Any, root: str, top: str, options: RemoteOptions, retries: int
) -> dict[str, dict[str, Any]]:
    """Every entry under `root` (the path of the URL `top` on `fs`), as `fs.find(root,
    withdirs=True, detail=True)` has them, from the `ls` of each folder, each retried on its
    own like a read (`retrying`). The root's failing raises its error; a sub-folder's raises
    OSError naming it: never a listing without it. At most `options.max_listing_pages` folders
    (CapError naming the cap)."""
    entries: dict[str, dict[str, Any]] = {}
    base = root.rstrip("/")
    pending = [(base, 0)]
    folders = 0
    while pending:
        folder, depth = pending.pop()
        folders += 1
        if folders > options.max_listing_pages:
            raise CapError(
                f"listing {top!r}: more than max_listing_pages={options.max_listing_pages} "
                "folders; raise RemoteOptions(max_listing_pages=...) if the tree has that many"
            )
        url = top.rstrip("/") + folder[len(base) :]
        try:
            listed = retrying(url, retries, functools.partial(fs.ls, folder, detail=True))
        except Exception as error:
            if folder == base:
                raise
            raise OSError(
                f"listing {top!r}: the folder {url!r} cannot be listed ({error}); a listing "
                "without it would miss its files"
            ) from error
        for info in listed:
            name = str(info["name"]).rstrip("/")
            if name == folder or not name.startswith(folder + "/"):
                continue  # the folder itself
            entries[name] = info
            if info.get("type") == "directory" and depth <= options.max_depth:
                pending.append((name, depth + 1))
    return entries


# --- http(s): one index page per folder ----------------------------------------------------


async def _all_or_cancel(awaitables: list[Awaitable[T]]) -> list[T]:
    """The results of `awaitables`, run at once; the first error cancels the others (and so
    does a cancellation of the caller)."""
    import asyncio

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
    import asyncio

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
