"""A local folder of remote objects: `Loader(url, cache_dir=...)` reads each object once.

`ObjectCache.open(folder, limit)` checks (or creates) the folder and holds it by a descriptor;
`decoded(url, decode)` decodes the local copy of the object at `url`, reading it with
`storage.fetch_object` (retried, bounded, errors naming the URL) the first time. A copy is kept
only when it is whole (its length checked: a Content-Length, or the store's client's own check)
and decodes: it is written to a private partial file in the folder (created exclusively,
fsynced), decoded from there, and only then renamed into place, so no reader ever sees half a
copy or a copy that never decoded. A kept copy that no longer decodes is removed and read again
from the store, once. An `ObjectCache` pickles as its folder's path, identity (device, inode)
and limit: worker processes open the folder again and refuse it if it is another one by then.
It outlives the loader, so later epochs and runs read from local disk. Objects are assumed not
to change: delete the folder to read them afresh.

Processes share the folder (the ranks of a host, worker processes) by the rules of
`prefetch.io._cache_ledger`: an object missing from it is fetched once on the host (a lock per
object: the others wait for that copy), every copy's bytes are counted in the folder's ledger
before it is written, and with a `limit` (`RemoteOptions.cache_limit`) the least recently read
copies are evicted first, never one that is being read. Under the "keep" policy
(`RemoteOptions.cache_policy`, the default) a loader's read (`decoded(url, decode, epoch)`)
evicts only copies that nobody read since the first read of the epoch before (by any process
of the host's loaders: worker processes and ranks share their epochs through `EpochMarks`;
while one still reads the epoch before, since the first read of the one before that; in the
first epoch, none): a shuffled pass over a set larger than the limit keeps the copies it has,
where evicting the least recently read would drop each one shortly before the next epoch
reads it. A copy that does not
fit (larger than the limit, or every other copy in use or kept) is decoded from a private
temporary file and not kept; so is one whose name holds something that is no copy (a folder,
a symlink, another user's file: never replaced).

The folder is the user's own, and every check goes through the descriptor that is then used
(`prefetch.io._cache_folder`): opened with O_NOFOLLOW, created with mode 0700 when missing,
refused when another user owns it or others may write to it, or when a folder above it lets
another user swap it. Copies are opened and renamed relative to that descriptor and handed to
decoders through it (/proc/self/fd on Linux), so a folder swapped after the check is never
read. Copies are 0600. When a copy cannot be written (a full disk, a quota, a file-size limit),
the sample is read as without a cache (the bytes already fetched are decoded from a private
temporary file, not fetched again), and the first such failure in each process is logged.
What a killed process leaves (a partial copy, a lock file) is removed by the next process that
fetches the object, or by the next `open`; a process that opens the folder alone recounts its
bytes from the files. See docs/remote.md, "Reading each object once".
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import urllib.parse
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from prefetch.io._cache_files import (
    PARTIAL_PREFIX,
    EpochMarks,
    is_copy_name,
    key_of,
    odd_entry,
    pin,
    unlock_object,
)
from prefetch.io._cache_folder import CacheFolder, wait_s
from prefetch.io._storage import fetch_object

log = logging.getLogger("prefetch.cache")

T = TypeVar("T")

# Characters of the URL's SHA-256 that name its copy: collisions are out of reach at any
# data set size, and the names stay short.
KEY_CHARS = 40
# The longest extension a copy keeps from its URL (".jpeg", ".webp"); decoders may read it.
MAX_SUFFIX = 5
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

_warned: set[str] = set()  # the warnings given in this process (each once)


class ObjectCache(CacheFolder):
    """Local copies of remote objects in `folder`, at most `limit` bytes of them (None: no
    bound); see the module docstring.

    Make one with `ObjectCache.open(folder, limit)`. `device` and `inode` identify the folder
    that was checked; a copy of the cache in another process (pickled) refuses any other.
    """

    def __init__(
        self,
        folder: str,
        device: int,
        inode: int,
        limit: int | None = None,
        policy: str = "keep",
    ) -> None:
        super().__init__(folder, device, inode, limit)
        self.policy = policy
        self._epochs = EpochMarks()  # the epochs the folder's loaders read (this process's part)
        weakref.finalize(self, self._epochs.close)  # its marks' descriptors go with the cache

    @classmethod
    def open(
        cls, folder: str | os.PathLike[str], limit: int | None = None, policy: str = "keep"
    ) -> ObjectCache:
        """`CacheFolder.open`, evicting by `policy` (`RemoteOptions.cache_policy`: "keep"
        or "lru") when a read gives its epoch."""
        cache = super().open(folder, limit)
        cache.policy = policy
        return cache

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.folder, self.device, self.inode, self.limit, self.policy)

    def name_for(self, url: str) -> str:
        """The file name of the copy of `url` in the folder: a key, and the URL's extension
        when the ledger counts such a name (`is_copy_name`: not ".jpé"), else none."""
        key = hashlib.sha256(url.encode("utf-8")).hexdigest()[:KEY_CHARS]
        name = key + _suffix(url)
        return name if is_copy_name(name) else key

    def path_for(self, url: str) -> str:
        """Where the copy of `url` is kept (whether or not it is there yet), by the folder's
        path (decoders are handed it through the descriptor instead)."""
        return os.path.join(self.folder, self.name_for(url))

    def decoded(
        self, url: str, decode: Callable[[str], T], epoch: int | None = None
    ) -> tuple[T, bool]:
        """`(decode(path), kept)`: `decode` run on a local path holding the bytes of `url`, and
        whether that was a copy kept already (False: it was read from storage just now).

        `epoch`, a loader's epoch: under the "keep" policy, room for a new copy is made only
        from copies that nobody read since the first read for the epoch before (by any
        process of the host's loaders), or for the one before that while the epoch before is
        still read (`EpochMarks.keep_since`; none in the first epoch: a copy from an earlier
        run that this one reads again is read before it can go). None, or the "lru" policy:
        from any copy, least recently read first.

        A kept copy is pinned while `decode` reads it (never evicted meanwhile). One that
        `decode` fails on is removed and the object read again from storage, once; a new copy
        is kept only when it was read whole, fits the limit and `decode` succeeded on it (its
        error is raised, as without a cache). While another process (or thread) fetches the
        same object, this waits for its copy. When no copy can be written, `decode(url)` reads
        the object from storage itself.
        """
        if epoch is None or self.policy != "keep" or self.limit is None:
            return self._decoded(url, decode, None)
        with self._epochs.reading(self._dir(), epoch):  # the host's epochs, in the folder
            return self._decoded(url, decode, epoch)

    def _decoded(self, url: str, decode: Callable[[str], T], epoch: int | None) -> tuple[T, bool]:
        handle = self._dir()
        name = self.name_for(url)
        stale = None
        pinned = pin(handle, name)
        if pinned is not None:
            try:
                return self._decode_pinned(handle, name, pinned, decode), True
            except Exception as error:
                _warn_once(
                    "stale",
                    "prefetch: a copy in cache_dir %r does not decode (%s: %s): removed and "
                    "read again from the store (said once per process)",
                    self.folder,
                    url,
                    error,
                )
                stale = os.fstat(pinned).st_ino
            finally:
                os.close(pinned)
        key = key_of(name)
        try:
            lock = self._books().lock(key, wait_s())
        except OSError as error:  # no lock file can be made (a quota of files)
            self._cannot_write(error)
            return decode(url), False
        if lock is None:
            _warn_once(
                "wait",
                "prefetch: another process fetched %r into cache_dir %r for longer than its "
                "requests may take: read from the store instead (said once per process)",
                url,
                self.folder,
            )
            return decode(url), False
        try:
            if stale is not None:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(name, dir_fd=handle, follow_symlinks=False).st_ino == stale:
                        self._remove(handle, name, self._books())
            else:
                pinned = pin(handle, name)  # fetched by another process while this waited
                if pinned is not None:
                    try:
                        return self._decode_pinned(handle, name, pinned, decode), True
                    finally:
                        os.close(pinned)
            keep_since_ns = None if epoch is None else self._epochs.keep_since(handle, epoch)
            return self._fetch_and_decode(handle, url, name, decode, lock, keep_since_ns), False
        finally:
            unlock_object(handle, key, lock)

    def _decode_pinned(self, handle: int, name: str, pinned: int, decode: Callable[[str], T]) -> T:
        """`decode` of the kept copy `name`, pinned as `pinned`; once more when it failed and
        only the copy's times changed meanwhile: another reader marked it used (`pin`), which
        a decode's check for a file rewritten in place takes for a change of its bytes. Copies
        are never rewritten in place, and `pin` marks one at most once in `TOUCH_AFTER_S`."""
        before = os.fstat(pinned)
        try:
            return decode(self._through(handle, name))
        except Exception:
            after = os.fstat(pinned)
            if (after.st_size, after.st_ctime_ns) == (before.st_size, before.st_ctime_ns):
                raise
        return decode(self._through(handle, name))

    def _fetch_and_decode(
        self,
        handle: int,
        url: str,
        name: str,
        decode: Callable[[str], T],
        lock: int,
        keep_since_ns: int | None,
    ) -> T:
        """Under the object's lock `lock`: fetch `url`, keep its copy as `name` if it may be
        kept (evicting only copies older than `keep_since_ns`, when given), and decode it."""
        ledger = self._books()
        partial = PARTIAL_PREFIX + name
        self._drop_partial(handle, name, ledger)  # left by a killed process
        data, whole = fetch_object(url)
        self._count_fetched(len(data))
        if not whole:
            _warn_once(
                "length",
                "prefetch: %r came without a Content-Length (its end could not be checked): "
                "not kept in cache_dir %r; objects like it are read from the store every "
                "time (said once per process)",
                url,
                self.folder,
            )
            return _decode_outside(data, _suffix(url), decode, url)
        odd = odd_entry(handle, name)
        if odd is not None:  # not ours to replace: read as without a cache
            self._cannot_write(OSError(f"{name!r} is {odd}, not a copy: remove it"))
            return _decode_outside(data, _suffix(url), decode, url)
        try:
            reserved = ledger.reserve(len(data), keep_since_ns, lock, name)
        except OSError as error:
            self._cannot_write(error)
            return _decode_outside(data, _suffix(url), decode, url)
        if not reserved and keep_since_ns is not None and ledger.fits_alone(len(data)):
            _warn_once(
                "kept",
                "prefetch: cache_dir %r is full (cache_limit=%d) of copies read in this epoch or "
                "the last: objects beyond them are read from the store and not kept, so each "
                "epoch reads the same part of the set from copies (said once per process)",
                self.folder,
                self.limit,
                level=logging.INFO,  # the policy at work, not a fault: stats() counts it
            )
            return _decode_outside(data, _suffix(url), decode, url)
        if not reserved:
            _warn_once(
                "room",
                "prefetch: %r (%d bytes) does not fit cache_limit=%d of cache_dir %r beside "
                "the copies in use: not kept (said once per process)",
                url,
                len(data),
                self.limit,
                self.folder,
            )
            return _decode_outside(data, _suffix(url), decode, url)
        kept = False
        try:
            try:
                _write(handle, partial, data)
            except OSError as error:  # the bytes read are decoded, not read again
                self._cannot_write(error)
                return _decode_outside(data, _suffix(url), decode, url)
            value = decode(self._through(handle, partial))
            ledger.settle(lock)  # whole and decoded: counted as a copy from here on
            try:
                os.replace(partial, name, src_dir_fd=handle, dst_dir_fd=handle)
            except OSError as error:  # a folder appeared at its name: read, not kept
                self._cannot_write(error)
                return value
            kept = True
            with contextlib.suppress(OSError):  # the rename's own durability: best effort
                os.fsync(handle)
            return value
        finally:
            if not kept:
                with contextlib.suppress(OSError):
                    os.unlink(partial, dir_fd=handle)
                ledger.unreserve(len(data), lock)

    def _cannot_write(self, error: OSError) -> None:
        _warn_once(
            "write",
            "prefetch: cannot write to cache_dir %r (%s): reading from storage instead, as "
            "without a cache (said once per process)",
            self.folder,
            error,
        )

    def local_copy(self, url: str) -> tuple[str, bool]:
        """`(path, kept)`: a local path (by the folder's path) with the bytes of `url`, and
        whether the copy was kept already (False: it was read from storage just now). When no
        copy could be kept (not written, or not known to be whole), the path is `url` itself
        (the caller reads it from storage). Without a limit the copy stays; with one, it may
        be evicted by a later read."""
        _, kept = self.decoded(url, _accept)
        path = self.path_for(url)
        return (path if os.path.exists(path) else url), kept


def _write(handle: int, name: str, data: bytes) -> None:
    """Write `data` to the new private file `name` in the folder, fsynced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    output = os.open(name, flags, 0o600, dir_fd=handle)
    with os.fdopen(output, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _decode_outside(data: bytes, suffix: str, decode: Callable[[str], T], url: str) -> T:
    """`decode` run on a private temporary file (outside the folder) holding `data`, removed
    after; when none can be written (a full disk), `decode(url)` (read from the store again)."""
    try:
        output, path = tempfile.mkstemp(prefix="prefetch-object-", suffix=suffix)
    except OSError:
        return decode(url)
    try:
        try:
            with os.fdopen(output, "wb") as file:
                file.write(data)
        except OSError:
            return decode(url)
        return decode(path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _accept(path: str) -> None:
    """A decode that accepts any bytes (`local_copy`: the caller decodes later)."""


def _suffix(url: str) -> str:
    suffix = os.path.splitext(urllib.parse.urlsplit(url).path)[1].lower()
    return suffix if len(suffix) <= MAX_SUFFIX else ""


def _warn_once(kind: str, message: str, *args: object, level: int = logging.WARNING) -> None:
    if kind not in _warned:
        _warned.add(kind)
        log.log(level, message, *args)
