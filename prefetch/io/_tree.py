"""A folder of an fsspec filesystem, listed once and read like `os.listdir`/`os.walk`.

`RemoteTree` lists everything under a URL with one bulk listing (`find` with details), never
one call per file; over http(s), one index page per folder (`prefetch.io._http`). Every
listing is bounded by the `RemoteOptions` in effect (pages, page bytes, depth), and a link
that leads out of the listed root is not followed. `prefetch.sources._folders.index_directory`
applies
Keras's rules to it. A tree is immutable once listed: thread-safe to read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prefetch.io import _storage as storage
from prefetch.io._links import as_folder
from prefetch.io._remote_options import LISTING_PAGE_ENTRIES, RemoteOptions, active_options


class RemoteTree:
    """A folder on an fsspec filesystem, listed once, read like `os.listdir`/`os.walk`.

    One `fs.find(..., withdirs=True, detail=True)` lists everything under `top` (retried like
    `read_bytes`). Over http(s), which has no bulk listing, the index page of each folder is
    read and retried on its own, so a flaky server costs a page, not the whole listing
    (`prefetch.io._http.list_pages`: deadlines, caps, and only links that resolve inside
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
        retries: int = storage.READ_RETRIES,
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
                from prefetch.io import _http as remote_http  # asyncio: imported only for http(s)

                entries = remote_http.run(
                    fs, remote_http.list_pages(fs, top, options, retries, skip_errors), None
                )
            else:
                entries = storage.retrying(
                    top, retries, lambda: fs.find(root, withdirs=True, detail=True)
                )
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
