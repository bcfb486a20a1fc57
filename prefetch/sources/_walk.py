"""The local walk of the folder lister: every folder read whole, or an error naming it.

`os.walk` leaves out a folder it cannot open (its `onerror` default): one EIO on a flaky
network mount, or one EMFILE under a low open-file limit, would give a listing without a class
that is then kept and read by every later run and every rank of the host. `FolderWalk` reads
each folder with one `os.scandir`, after taking its `stamp` (`os.stat`), and raises when it
cannot: an error that is transient by nature (`TRANSIENT_ERRNOS`: EIO, EMFILE, ENFILE,
ENOMEM, EAGAIN, EINTR, ESTALE, ...) is retried `FOLDER_RETRIES` times, waiting
`FOLDER_BACKOFF_S` and twice as long at each further attempt; any other (a refused permission,
a folder gone, a link cycle) at once. The error is an `OSError` of the same errno (so a
`PermissionError` stays one) whose `filename` is the folder, saying what to fix.

The rest is `os.walk`'s, so the lister keeps Keras's listing: top-down, a subfolder is an
entry that is a folder once links are followed (a broken link is a file), walked into unless
it is a link and `followlinks` is off. Where `os.walk` takes an entry whose type cannot be
read for a file (a link into a folder you may not search, a followed link cycle past the
system's limit), the walk raises too, naming the entry. A walk records the folders it read,
with their stamps, for the kept listing's checks. One walk per listing; not thread-safe.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator

from prefetch.sources._listing_file import stamp, stamp_of

# Errors of opening or reading a folder that another attempt may not meet: the device or
# network (EIO, ESTALE, ETIMEDOUT, ...), the process's or system's table of open files
# (EMFILE, ENFILE), memory (ENOMEM, ENOBUFS), a busy or interrupted call. A refused
# permission, a missing folder or a link cycle is never retried.
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EIO",
        "EMFILE",
        "ENFILE",
        "ENOMEM",
        "ENOBUFS",
        "EAGAIN",
        "EINTR",
        "EBUSY",
        "ESTALE",
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNABORTED",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "ENETUNREACH",
    )
    if hasattr(errno, name)
)
# Attempts after the first for a transient error, and the wait before the first of them (it
# doubles at each further one: 0.1 + 0.2 + 0.4 + 0.8 = 1.5 s at most per folder).
FOLDER_RETRIES = 4
FOLDER_BACKOFF_S = 0.1


class FolderWalk:
    """Local folders read whole or not at all (see the module docstring); `folders` and
    `stamps` are those read so far, each stamp taken before its folder was read."""

    def __init__(self) -> None:
        self.folders: list[str] = []
        self.stamps: list[tuple[int, int, int, int]] = []

    def subfolders(self, folder: str) -> list[str]:
        """The names of `folder`'s entries that are folders (links followed), as `os.walk`'s
        `dirs`; its files are not kept. The folder the user named (the lister's root) missing,
        or a file, raises as `os.listdir` does (Keras's own error, for the drop-in): it is
        not a folder that could not be read but no folder at all."""
        try:
            return self._read(folder)[0]
        except (FileNotFoundError, NotADirectoryError) as error:
            cause = error.__cause__
            if isinstance(cause, OSError) and cause.filename == folder:
                raise cause from None
            raise

    def walk(
        self, folder: str, followlinks: bool = False, missing_ok: bool = False
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        """`os.walk(folder, followlinks=followlinks)`, top-down, raising where `os.walk`
        leaves a folder out. With `missing_ok`, a `folder` that does not exist (or is not a
        folder) yields nothing, as `os.walk` has it (its stamp says so)."""
        pending = [folder]
        while pending:
            current = pending.pop()
            try:
                dirs, files, links = self._read(current)
            except (FileNotFoundError, NotADirectoryError):
                if not (missing_ok and current is folder):
                    raise
                self.folders.append(folder)
                self.stamps.append(stamp(folder))
                return
            yield current, dirs, files
            pending.extend(
                os.path.join(current, name)
                for name in reversed(dirs)
                if followlinks or name not in links
            )

    def _read(self, folder: str) -> tuple[list[str], list[str], set[str]]:
        """(subfolders, files, the subfolders that are links) of `folder`, stamped and
        recorded; transient errors retried; an OSError naming it otherwise."""
        attempt = 0
        while True:
            try:
                info = os.stat(folder)
                dirs, files, links = _entries(folder)
            except OSError as error:
                if error.errno not in TRANSIENT_ERRNOS or attempt >= FOLDER_RETRIES:
                    raise _unlistable(error, folder, attempt + 1) from error
            else:
                self.folders.append(folder)
                self.stamps.append(stamp_of(info))
                return dirs, files, links
            time.sleep(FOLDER_BACKOFF_S * 2**attempt)
            attempt += 1


def _entries(folder: str) -> tuple[list[str], list[str], set[str]]:
    """One read of `folder`: its subfolders, files and linked subfolders, as `os.walk` sorts
    them; an entry whose type cannot be read raises (its error names it)."""
    dirs: list[str] = []
    files: list[str] = []
    links: set[str] = set()
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.is_dir():
                files.append(entry.name)
                continue
            dirs.append(entry.name)
            if entry.is_symlink():
                links.add(entry.name)
    return dirs, files, links


def _unlistable(error: OSError, folder: str, attempts: int) -> OSError:
    """An OSError of `error`'s errno (and so of its kind) naming the folder (or the entry of
    `folder` whose type could not be read) and the fix."""
    tried = f" (tried {attempts} times)" if attempts > 1 else ""
    reason = error.strerror or str(error)
    return OSError(
        error.errno,
        f"{reason}{tried}: prefetch cannot list this folder (or tell whether it is one), and "
        "a listing without it would miss its images (none is made or kept); make it readable "
        "(its permissions, its mount; a link cycle: list without follow_links) and list again",
        error.filename if isinstance(error.filename, str) else folder,
    )
