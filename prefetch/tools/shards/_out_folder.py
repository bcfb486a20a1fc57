"""An output folder that a neighbour cannot subvert: opened once, every file relative to it.

`OutFolder(path)` opens the folder once as a directory descriptor (`O_DIRECTORY|O_NOFOLLOW`:
the folder itself is not a link) and does everything after through it (`dir_fd=`), so a folder
renamed or replaced under it by someone else does not redirect a write. Files are created only
under fresh, unpredictable hidden names (`.<name>.<random>.partial`, `O_CREAT|O_EXCL|
O_NOFOLLOW`, mode 0o644), so a link planted at any name is never written through, and put in
place with `os.replace` (which replaces a link at the final name, never follows it). Files
read from the folder (`read_small`) are opened without following a link and without blocking
(a FIFO does not hang), must be regular files, and are capped in size. Not thread-safe: one
writer uses one `OutFolder`, and closes it (a context manager). `lock()` takes the folder's
exclusive lock, held until `close()`: a second writer is refused at once (`FolderBusyError`).
The lock is an `flock` of the 0600 file `LOCK_NAME` in the folder, never of the folder itself:
another user who may read the folder (a 0755 one) could hold that flock and block every write.
A lock file that is not a regular file of yours is refused, naming it. The folders it
makes for `path` are added, before each is made, to a list the caller gives: `remove_created`
removes those still empty (a write that left nothing leaves no folder either).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable
from types import TracebackType

# Where the system lacks a flag, 0 (no effect) rather than a failure.
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# A temporary file is `.<final name>.<TOKEN_BYTES random bytes as hex>.partial`.
TEMPORARY_SUFFIX = ".partial"
TOKEN_BYTES = 8
# Mode of the files written (before the umask): readable by all, written by the owner.
FILE_MODE = 0o644
# The writers' lock file (hidden: no shard glob matches it), removed by its holder at close.
LOCK_NAME = ".prefetch-write.lock"
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
# Errors that mean a folder may not be written to (by this user, or at all).
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}
# What a lock file that is not a regular file is, in words.
_KINDS = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder"}
# Errors that mean the disk (or a quota, or a file size limit) is full.
_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


class FolderBusyError(BlockingIOError):
    """Another writer holds the output folder's lock."""


class OutFolder:
    """The folder `path` (created with its parents when missing), opened as a descriptor."""

    def __init__(self, path: str, created: list[str] | None = None) -> None:
        """`created`, when given, is the list the folders made for `path` are added to
        (deepest first) before they are made: a caller interrupted anywhere, even before this
        returns, can remove them (`remove_created(created)`); without it they stay."""
        self.path = path
        self.fd = -1
        self._lock = -1
        if os.path.lexists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"output {path!r} is a file: give a folder for the shards")
        if created is not None:
            created.extend(_missing_folders(path))
        os.makedirs(path, exist_ok=True)
        try:
            self.fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
        except OSError as error:
            if os.path.islink(path):
                raise NotADirectoryError(
                    f"output {path!r} is a symbolic link: give the folder it points to "
                    f"({os.path.realpath(path)!r})"
                ) from None
            raise OSError(error.errno, f"cannot open the output folder {path!r}: {error}") from None

    @classmethod
    def from_descriptor(cls, descriptor: int, path: str) -> OutFolder:
        """The folder `path` already open as `descriptor` (received from the process that
        opened it); closing it closes the descriptor."""
        folder = cls.__new__(cls)
        folder.path = path
        folder.fd = descriptor
        folder._lock = -1
        return folder

    def __enter__(self) -> OutFolder:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock (its file is removed) and close the folder's descriptor
        (idempotent)."""
        if self._lock >= 0:
            with contextlib.suppress(OSError):
                if os.stat(LOCK_NAME, dir_fd=self.fd, follow_symlinks=False).st_ino == (
                    os.fstat(self._lock).st_ino
                ):
                    os.unlink(LOCK_NAME, dir_fd=self.fd)
            os.close(self._lock)
            self._lock = -1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lock(self) -> None:
        """Take the folder's exclusive lock until `close()`; `FolderBusyError` at once when
        another writer (another process, or another `OutFolder` of this folder) holds it;
        an OSError naming the lock file and the fix when it is not a regular file of yours (a
        link, a folder, another user's: PermissionError) or cannot be made (`_lock_refused`)."""
        while self._lock < 0:
            try:
                fd = os.open(LOCK_NAME, _LOCK_FLAGS, 0o600, dir_fd=self.fd)
            except OSError as error:
                raise self._lock_refused(error) from None
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    raise self._lock_refused(None, info)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise FolderBusyError(
                        errno.EWOULDBLOCK,
                        f"{self.path!r} is being written by another `prefetch shards write` (it "
                        "holds the folder's lock): wait until it ends, or write into another "
                        "folder",
                    ) from None
            except BaseException:
                os.close(fd)
                raise
            if os.fstat(fd).st_nlink > 0:  # else its last holder removed it as this opened it
                self._lock = fd
            else:
                os.close(fd)

    def _lock_refused(self, error: OSError | None, info: os.stat_result | None = None) -> OSError:
        """The error for a lock file that cannot be this writer's, naming it and the fix: it is
        not a regular file of yours (`info`, or found after `error`), or none could be opened
        (`error`: a folder you may not write to, a full disk)."""
        where = self.where(LOCK_NAME)
        if info is None and error is not None:
            with contextlib.suppress(OSError):
                info = os.stat(LOCK_NAME, dir_fd=self.fd, follow_symlinks=False)
            if info is None or (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()):
                fix = ": write into a folder you may write to" if error.errno in _DENIED else ""
                text = f"cannot open {where!r}, the lock of `prefetch shards write` "
                return OSError(error.errno, f"{text}({error.strerror}){fix}")
        assert info is not None
        kind = stat.S_IFMT(info.st_mode)
        what = f"a file of user {info.st_uid}" if kind == stat.S_IFREG else _KINDS.get(kind)
        return PermissionError(
            errno.EPERM,
            f"{where!r}, the lock of `prefetch shards write`, is not a regular file of yours "
            f"({what or 'a FIFO, a socket or a device'}): remove it if you made it; else "
            f"another user may write into {self.path!r}: write into a folder only you may write to",
        )

    def names(self) -> list[str]:
        """The names in the folder."""
        return os.listdir(self.fd)

    def where(self, name: str) -> str:
        """The path of `name` in the folder (for messages and for readers)."""
        return os.path.join(self.path, name)

    def is_file(self, name: str) -> bool:
        """Whether `name` is a regular file of the folder (a link is not)."""
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(info.st_mode)

    def size(self, name: str) -> int:
        """The size of the regular file `name` (FileNotFoundError when there is none)."""
        info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise FileNotFoundError(f"{self.where(name)!r} is not a regular file")
        return info.st_size

    def write_temporary(self, name: str, chunks: Iterable[bytes], what: str) -> Written:
        """Write `chunks` to a new temporary file for the final name `name`, fsynced; return
        it (its temporary name, size and SHA-256). On any error (Ctrl-C included) it is
        removed; an OSError is raised again naming `what`, the file and the byte offset."""
        temporary, handle = self._create(name)
        digest = hashlib.sha256()
        size = 0
        try:
            try:
                for chunk in chunks:  # reading a chunk may fail too: its error is its own
                    try:
                        _write_all(handle, chunk)
                    except OSError as error:
                        raise self._failed(error, what, name, temporary, size) from error
                    digest.update(chunk)
                    size += len(chunk)
                try:
                    os.fsync(handle)
                except OSError as error:
                    raise self._failed(error, what, name, temporary, size) from error
            finally:
                os.close(handle)
        except BaseException:
            self.remove(temporary)
            raise
        return Written(temporary, size, digest.hexdigest())

    def write_file(self, name: str, data: bytes, what: str) -> None:
        """Put a file of `data` at `name`: written under a temporary name, then renamed."""
        written = self.write_temporary(name, [data], what)
        try:
            self.replace(written.temporary, name)
        except BaseException:
            self.remove(written.temporary)
            raise

    def append(self, name: str, data: bytes, what: str) -> None:
        """Append `data` to the regular file `name` (never through a link), fsynced; an OSError
        names `what` and the file."""
        flags = os.O_WRONLY | os.O_APPEND | _O_NOFOLLOW | _O_CLOEXEC
        try:
            handle = os.open(name, flags, dir_fd=self.fd)
        except OSError as error:
            raise OSError(
                error.errno, f"cannot append to {what} {self.where(name)!r}: {error.strerror}"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(handle).st_mode):
                raise OSError(f"{self.where(name)!r} is not a regular file: not written")
            _write_all(handle, data)
            os.fsync(handle)
        except OSError as error:
            if error.errno is None:
                raise
            raise OSError(
                error.errno, f"cannot append to {what} {self.where(name)!r}: {error.strerror}"
            ) from error
        finally:
            os.close(handle)

    def replace(self, source: str, target: str) -> None:
        """Rename `source` to `target` in the folder (a link at `target` is replaced)."""
        os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove the file `name` (nothing when it is not there)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def sync(self) -> None:
        """Make the renames and removals so far durable (where the system can; POSIX)."""
        with contextlib.suppress(OSError):
            os.fsync(self.fd)

    def read_small(self, name: str, cap: int) -> bytes | None:
        """The bytes of the file `name`, None when there is none. A link, a FIFO, a device or
        a file of more than `cap` bytes raises OSError naming it, at once: nothing is
        followed, nothing blocks, nothing past the cap is read."""
        flags = os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC
        try:
            handle = os.open(name, flags, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise OSError(
                    error.errno,
                    f"{self.where(name)!r} is a symbolic link: not read (remove it, or write "
                    "into another folder)",
                ) from None
            raise
        with os.fdopen(handle, "rb", buffering=0) as file:
            info = os.fstat(handle)
            if not stat.S_ISREG(info.st_mode):
                raise OSError(
                    f"{self.where(name)!r} is not a regular file (a FIFO, a device, a socket): "
                    "not read; remove it, or write into another folder"
                )
            if info.st_size > cap:
                raise OSError(
                    f"{self.where(name)!r} is {info.st_size} bytes, more than the {cap} that "
                    "such a file can hold: not read; remove it, or write into another folder"
                )
            data = file.read(cap + 1)
        if len(data) > cap:
            raise OSError(f"{self.where(name)!r} grew past {cap} bytes while it was read")
        return data

    def _create(self, name: str) -> tuple[str, int]:
        """A new file under a fresh temporary name for `name`: (that name, its descriptor)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        for _ in range(8):
            temporary = f".{name}.{secrets.token_hex(TOKEN_BYTES)}{TEMPORARY_SUFFIX}"
            try:
                return temporary, os.open(temporary, flags, FILE_MODE, dir_fd=self.fd)
            except FileExistsError:
                continue  # someone took that name first: draw another
        raise FileExistsError(f"cannot create a temporary file in {self.path!r}: names taken")

    def _failed(self, error: OSError, what: str, name: str, temporary: str, offset: int) -> OSError:
        full = error.errno in _FULL
        advice = (
            ": the disk (or a quota, or a file size limit) is full; free space there or write "
            "into another folder"
            if full
            else ""
        )
        return OSError(
            error.errno,
            f"cannot write {what} {self.where(name)!r} at byte {offset} (temporary file "
            f"{temporary!r}): {error.strerror}{advice}",
        )


def remove_created(folders: list[str]) -> None:
    """Remove `folders` (deepest first: those an `OutFolder` made, its `created` list) while they
    are empty, each after its lock file when nobody holds it (left by a writer interrupted as
    it took the lock); a missing one is passed over, the first that is not empty stays with
    those above it. `folders` is emptied."""
    for folder in folders:
        _remove_unheld_lock(folder)
        try:
            os.rmdir(folder)
        except FileNotFoundError:
            continue
        except OSError:
            break
    folders.clear()


def _remove_unheld_lock(folder: str) -> None:
    """Remove `folder`'s `LOCK_NAME` when it is a regular file of yours that nobody holds
    (taking its flock first: a writer that opens it meanwhile sees it unlinked and makes
    another, as `OutFolder.lock` does)."""
    with contextlib.suppress(OSError):
        place = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
        try:
            lock = os.open(LOCK_NAME, _LOCK_FLAGS & ~os.O_CREAT, dir_fd=place)
            try:
                info = os.fstat(lock)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.unlink(LOCK_NAME, dir_fd=place)
            finally:
                os.close(lock)
        finally:
            os.close(place)


def _missing_folders(path: str) -> list[str]:
    """The folders of `path` (itself, then its parents) that do not exist yet, deepest first."""
    missing = []
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        missing.append(here)
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return missing


def _write_all(handle: int, chunk: bytes) -> None:
    """Write `chunk` whole (a full disk may give short writes before its error)."""
    view = memoryview(chunk)
    while view:
        view = view[os.write(handle, view) :]


class Written:
    """A temporary file written by `OutFolder.write_temporary`: its name, size, SHA-256."""

    __slots__ = ("sha256", "size", "temporary")

    def __init__(self, temporary: str, size: int, sha256: str) -> None:
        self.temporary = temporary
        self.size = size
        self.sha256 = sha256
