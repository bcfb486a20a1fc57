"""The bytes of a cache folder shared by processes: its ledger and eviction; the folder's rules.

Every process that uses a cache folder (each rank of a host, each worker process) follows
these rules, so that the folder holds at most `limit` bytes and one download per object is
made on the host (the files' names, the per-object locks and the pins are
`prefetch.io._cache_files`'). In the folder, all 0600 and reached through its descriptor:

- copies, `<key><ext>`: whole objects (`ObjectCache`) or shards (the spool). A copy's mtime is
  when it was last read, to within `TOUCH_AFTER_S` (`pin` sets it when older): the least
  recently used copy is the oldest. Setting it changes the copy's times under any process
  reading it, whose check for a file rewritten in place then fails: so it is set at most once
  in `TOUCH_AFTER_S`, and `ObjectCache` decodes a copy whose times alone changed once more.
- `.partial-<name>`: the copy `name` being written, only by the holder of its object's lock.
- `.lock-<key>`: the lock of one object (`lock_object`: flock, exclusive), held while its copy
  is fetched, written and renamed into place, replaced or evicted, and the record of the
  bytes its holder reserved meanwhile. Its holder unlinks it when done; a waiter that then
  holds an unlinked file opens the new one. The kernel releases the lock of a killed process;
  its file, reservation and partial copy are returned by the next holder, or by the sweep of
  the next `CacheFolder.open`.
- `.users`: each process that uses the folder holds a shared flock on it (`CacheFolder`); one
  that can take it exclusive is alone (it sweeps and recounts). A file of the folder that only
  you may open, not the folder itself: another user who may read the folder (a 0755 one)
  could hold the folder's own flock, making every process wait for it and none ever alone.
- `.ledger`: a header (the bytes of copies and of copies being written, the eviction queue's
  head and length, the mtime of the oldest copy not queued) and the eviction queue (the
  oldest copies when it was filled, covering `limit / QUEUE_SHARE` bytes). Read and changed
  under its flock and, within a process, a thread lock: one short serial step per copy
  counted in or out, or batch of copies taken from the queue (they are unlinked after it is
  released), on the host. A hit never takes it.

A copy's bytes are reserved in the ledger (`Ledger.reserve`) before it is written, after
evicting the least recently used copies when the folder would pass its limit: so the copies
and partial copies never hold more than the ledger counts, nor the ledger (its own bytes
included) more than the limit. The reservation is recorded in the object's lock file (its
bytes and the copy's name: 56 bytes, counted with it) until the copy is renamed into place
(`settle`) or given up (`unreserve`): a process killed meanwhile (mid-download) leaves the
record in a lock file nobody holds, and whoever takes that lock next (`Ledger.lock`: the next
reader of the object, eviction, the sweep of the next `CacheFolder.open`) returns the bytes
and removes the partial copy. Each step writes the count before the record and clears the
record before the count, so a process killed between the two leaves the count too high, never
too low; `Ledger.recount`, run by a process that opens the folder alone, sets it from the
files. A header with a number out of range (a damaged ledger) is counted from the files too.

Which copies may go: any not in use (least recently used first), or, for a reserve that keeps
the copies read since a time (`keep_since_ns`: `ObjectCache` keeps those a loader read in this
epoch and the last), only older ones; when none is older the object is read but not kept, and
the header's oldest mtime not queued answers that without a scan of the folder. Shuffled
epochs over a set larger than the limit then read `limit / set` of each epoch from copies;
least recently used would evict each copy shortly before its next read (about half that
fraction squared: 15% instead of 50% for a set twice the limit).

A reader pins the copy it decodes (`pin`: flock shared on its open descriptor); eviction takes
the copy's flock exclusive and the object's lock without waiting, and skips the copy when it
cannot, or when it was read since it was queued: a copy being read is never removed (and on
Linux a descriptor opened before an unlink reads the whole file anyway). See docs/remote.md,
"A cache with a size".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import struct
import threading
from collections.abc import Iterator

from prefetch.io._cache_files import (
    LEDGER,
    PARTIAL_PREFIX,
    READ_FLAGS,
    is_copy_name,
    key_of,
    lock_object,
    open_own,
    unlock_object,
)
from prefetch.io._private import flock_within

# The ledger's header (magic, bytes used, queue head, queue length, the mtime of the oldest
# copy the last refill did not queue) and one queued copy (its mtime when queued, its size, its
# name: at most 48 bytes, a key and an extension).
_HEADER = struct.Struct("<8sqqqq")
_RECORD = struct.Struct("<qq48s")
_MAGIC = b"pfcache2"
_USED, _HEAD, _COUNT, _OLDEST = 0, 1, 2, 3
# `_OLDEST` when every copy was queued: no copy left out is older than anything; also the
# most bytes a header may count (a larger number is a damaged ledger, counted from the files).
_NEWEST = 2**62
# A reservation's record in its object's lock file: its bytes and the copy's name.
_RESERVATION = struct.Struct("<q48s")
# The eviction queue covers the oldest copies of limit / QUEUE_SHARE bytes, at most QUEUE_MAX
# of them (4 MiB of ledger): a folder is scanned (one stat a copy) once per eighth of its limit
# evicted, and the ledger stays a small part of the limit.
QUEUE_SHARE = 8
QUEUE_MAX = 65536
# Records read from the queue at a time.
QUEUE_BATCH = 256
# The longest wait for the ledger: it is held for microseconds, and for a scan of the folder
# (about 2 us a copy) once per eighth of the limit evicted.
LEDGER_WAIT_S = 60.0


class Ledger:
    """The bytes the folder `handle` holds and its eviction queue, in its `.ledger` file; see
    the module docstring. `limit` is this process's bound in bytes (None: none, but copies are
    still counted, for the processes that have one). Thread-safe; one per process and folder.
    `evictions` and `evicted_bytes` count the copies this process evicted."""

    def __init__(self, handle: int, limit: int | None) -> None:
        self.limit = limit
        self.evictions = 0
        self.evicted_bytes = 0
        self._dir = handle
        self._lock = threading.Lock()
        self._fd = open_own(handle, LEDGER)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def used(self) -> int:
        """The bytes of the folder's copies, and of those being written, as the ledger counts
        them; read without its locks (a gauge for statistics: a scan of a large folder holds
        them for seconds), the same header twice in a row."""
        raw, again = b"", os.pread(self._fd, _HEADER.size, 0)
        while raw != again:
            raw, again = again, os.pread(self._fd, _HEADER.size, 0)
        numbers = _numbers(raw)
        return 0 if numbers is None else numbers[_USED]

    def reserve(
        self, size: int, keep_since_ns: int | None = None, lock: int = -1, name: str = ""
    ) -> bool:
        """Count `size` more bytes (a copy about to be written), after evicting the least
        recently used copies when the folder would pass the limit; False (nothing counted)
        when even that leaves no room (at once, evicting nothing, for a copy larger than the
        limit). With `keep_since_ns`, copies read (or written) at or after that time are kept:
        only older ones are evicted, and when there are none it is False at once, without
        scanning the folder again (the header's `_OLDEST`). Copies are taken from the eviction
        queue under the ledger's locks and removed after they are released (still counted
        until then, so nobody counts their room twice): the serial step is the queue's, not
        the unlinks'. With `lock`, the descriptor of the lock of the object copied as `name`
        (`lock`), the reservation is recorded there until `settle` or `unreserve`."""
        counted = size + (_RESERVATION.size if lock >= 0 else 0)  # the record's bytes too
        if not self.fits_alone(size):
            return False  # not even alone in the folder: nothing is evicted for it
        if not self._count_in(counted, keep_since_ns):
            return False
        if lock >= 0:
            try:
                os.pwrite(lock, _RESERVATION.pack(size, name.encode("ascii")), 0)
            except OSError:  # no room for the record (a full disk): nothing reserved
                self.release(counted)
                raise
        return True

    def settle(self, lock: int) -> None:
        """The reservation recorded in `lock` is a copy now (about to be renamed into place):
        its bytes stay counted, as a copy's; the record's are counted out."""
        os.ftruncate(lock, 0)
        self.release(_RESERVATION.size)

    def unreserve(self, size: int, lock: int) -> None:
        """Give up the reservation of `size` bytes recorded in `lock` (its partial copy is
        removed already)."""
        os.ftruncate(lock, 0)
        self.release(size + _RESERVATION.size)

    def lock(self, key: str, timeout_s: float) -> int | None:
        """`lock_object` of `key`; a reservation its last holder left (killed mid-copy) is
        returned, and its partial copy removed, before this returns."""
        lock = lock_object(self._dir, key, timeout_s)
        if lock is None:
            return None
        try:
            raw = os.pread(lock, _RESERVATION.size, 0)
            if len(raw) == _RESERVATION.size:
                size, name = _RESERVATION.unpack(raw)
                copy = name.rstrip(b"\0").decode("ascii", "replace")
                if 0 < size < _NEWEST and is_copy_name(copy) and key_of(copy) == key:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(PARTIAL_PREFIX + copy, dir_fd=self._dir)
                    os.ftruncate(lock, 0)
                    self.release(size + _RESERVATION.size)
                else:
                    os.ftruncate(lock, 0)
        except BaseException:
            unlock_object(self._dir, key, lock)
            raise
        return lock

    def _count_in(self, size: int, keep_since_ns: int | None) -> bool:
        """`reserve`'s count: `size` more bytes, after evicting what the limit asks."""
        if self.limit is None:
            with self._held() as header:
                header[_USED] += size
            return True
        goal, everything, evicted = self.limit // QUEUE_SHARE, False, True
        while True:
            with self._held() as header:
                if not self._over(header, size):
                    header[_USED] += size
                    return True
                if header[_HEAD] >= header[_COUNT]:
                    if keep_since_ns is not None and header[_OLDEST] >= keep_since_ns:
                        return False  # every copy left out of the queue is kept
                    if not evicted:
                        if everything:
                            return False  # every copy left is in use or being replaced
                        goal *= 4  # queued copies were in use, or read since: look further
                    everything = self._refill(header, goal, keep_since_ns)
                    evicted = False
                    continue
                taken = self._take(header, size)
            freed = [self._evict(name, mtime_ns, keep_since_ns) for mtime_ns, name in taken]
            sizes = [value for value in freed if value is not None]
            stayed = [
                mtime_ns for (mtime_ns, _), value in zip(taken, freed, strict=True) if value is None
            ]
            if sizes or stayed:
                evicted = evicted or bool(sizes)
                with self._held() as header:
                    header[_USED] = max(0, header[_USED] - sum(sizes))
                    # a copy that stayed out of the queue is older than the ones left out
                    header[_OLDEST] = min([header[_OLDEST], *stayed])
                    self.evictions += len(sizes)
                    self.evicted_bytes += sum(sizes)

    def fits_alone(self, size: int) -> bool:
        """Whether a copy of `size` bytes fits the limit with no other copy in the folder (the
        ledger's header and the reservation's record beside it)."""
        return self.limit is None or size + _HEADER.size + _RESERVATION.size <= self.limit

    def release(self, size: int) -> None:
        """Count `size` bytes fewer (a copy, or a reservation, removed)."""
        with self._held() as header:
            header[_USED] = max(0, header[_USED] - size)

    def recount(self) -> None:
        """Set the count from the files (copies and partial copies): for a process that holds
        the folder alone, when nothing is being written."""
        with self._held() as header:
            header[_USED] = sum(size for _, size, _ in self._copies(partials=True))
            header[_HEAD] = header[_COUNT] = header[_OLDEST] = 0

    @contextlib.contextmanager
    def _held(self) -> Iterator[list[int]]:
        """The header's numbers [used, head, count, oldest], under the ledger's locks; written
        back when changed. A ledger that is new (empty), not one, or has a number out of range
        (`_numbers`) is counted from the files."""
        if not self._lock.acquire(timeout=LEDGER_WAIT_S):
            raise OSError(errno.ETIMEDOUT, "another thread held the cache's ledger too long")
        try:
            if not flock_within(self._fd, fcntl.LOCK_EX, LEDGER_WAIT_S):
                raise OSError(errno.ETIMEDOUT, "another process held the cache's ledger too long")
            try:
                numbers = _numbers(os.pread(self._fd, _HEADER.size, 0))
                if numbers is None:  # new, not a ledger, or damaged: counted from the files
                    counted = sum(size for _, size, _ in self._copies(partials=True))
                    numbers = [counted, 0, 0, 0]
                    self._write(numbers)
                header = list(numbers)
                try:
                    yield header
                finally:
                    if header != numbers:
                        self._write(header)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _write(self, header: list[int]) -> None:
        os.pwrite(self._fd, _HEADER.pack(_MAGIC, *header), 0)

    def _over(self, header: list[int], size: int) -> bool:
        """Whether `size` more bytes pass the limit (the ledger's own bytes counted)."""
        assert self.limit is not None
        ledger = _HEADER.size + header[_COUNT] * _RECORD.size
        return header[_USED] + size + ledger > self.limit

    def _take(self, header: list[int], size: int) -> list[tuple[int, str]]:
        """Take from the eviction queue the (queued mtime, name) of the oldest copies whose
        sizes cover what `size` more bytes pass the limit by (at most QUEUE_BATCH)."""
        assert self.limit is not None
        ledger = _HEADER.size + header[_COUNT] * _RECORD.size
        short = header[_USED] + size + ledger - self.limit
        count = min(QUEUE_BATCH, header[_COUNT] - header[_HEAD])
        raw = os.pread(self._fd, count * _RECORD.size, _HEADER.size + header[_HEAD] * _RECORD.size)
        taken, covered = [], 0
        for mtime_ns, queued, name in _RECORD.iter_unpack(
            raw[: len(raw) // _RECORD.size * _RECORD.size]
        ):
            taken.append((mtime_ns, name.rstrip(b"\0").decode("ascii", "replace")))
            covered += queued
            if covered >= short:
                break
        # a ledger shorter than it says is used up (refilled next)
        header[_HEAD] = header[_HEAD] + len(taken) if taken else header[_COUNT]
        return taken

    def _refill(self, header: list[int], goal: int, keep_since_ns: int | None) -> bool:
        """Queue the oldest copies of the folder (those older than `keep_since_ns`, when
        given), covering `goal` bytes (at most QUEUE_MAX copies), and note the mtime of the
        oldest copy left out (`_OLDEST`); whether every copy that may go was queued."""
        copies = sorted(self._copies(partials=False))
        covered, queue = 0, list[bytes]()
        header[_OLDEST] = _NEWEST
        for mtime_ns, size, name in copies:
            if (
                covered >= goal
                or len(queue) >= QUEUE_MAX
                or (keep_since_ns is not None and mtime_ns >= keep_since_ns)
            ):
                header[_OLDEST] = mtime_ns
                break
            queue.append(_RECORD.pack(mtime_ns, size, name.encode("ascii")))
            covered += size
        os.pwrite(self._fd, b"".join(queue), _HEADER.size)
        os.ftruncate(self._fd, _HEADER.size + len(queue) * _RECORD.size)
        header[_HEAD], header[_COUNT] = 0, len(queue)
        return header[_OLDEST] == _NEWEST or (
            keep_since_ns is not None and header[_OLDEST] >= keep_since_ns
        )

    def _copies(self, partials: bool) -> Iterator[tuple[int, int, str]]:
        """(mtime in ns, size, name) of each copy in the folder (and partial copy)."""
        me = os.geteuid()
        with os.scandir(self._dir) as entries:
            for entry in entries:
                name = entry.name
                partial = partials and name.startswith(PARTIAL_PREFIX)
                copy = name[len(PARTIAL_PREFIX) :] if partial else name
                if not is_copy_name(copy):
                    continue  # bookkeeping, or not a copy (a file of yours stays)
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode) and info.st_uid == me:
                        yield info.st_mtime_ns, info.st_size, name

    def _evict(self, name: str, mtime_ns: int, keep_since_ns: int | None) -> int | None:
        """Remove the copy `name` if it was not read since it was queued (its mtime) nor at
        or after `keep_since_ns`, nobody reads it (its flock) and nobody replaces it (its
        object's lock); its size, or None."""
        if keep_since_ns is not None and mtime_ns >= keep_since_ns:
            return None  # queued by a process that keeps less
        try:
            info = os.stat(name, dir_fd=self._dir, follow_symlinks=False)
        except OSError:
            return None
        if info.st_mtime_ns != mtime_ns or not stat.S_ISREG(info.st_mode):
            return None  # read since it was queued (or not a copy): it stays
        key = key_of(name)
        lock = self.lock(key, 0)
        if lock is None:
            return None  # being fetched or replaced
        try:
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=self._dir)
            except OSError:
                return None
            try:
                if not flock_within(fd, fcntl.LOCK_EX, 0):
                    return None  # pinned: being read
                now = os.fstat(fd)
                if (now.st_ino, now.st_mtime_ns) != (info.st_ino, mtime_ns):
                    return None
                os.unlink(name, dir_fd=self._dir)
                return now.st_size
            finally:
                os.close(fd)
        finally:
            unlock_object(self._dir, key, lock)


def _numbers(raw: bytes) -> list[int] | None:
    """The numbers of the ledger header `raw` ([used, head, count, oldest]); None when it is
    not one (new, another file's) or a number is out of range (damaged)."""
    if len(raw) != _HEADER.size:
        return None
    magic, *numbers = _HEADER.unpack(raw)
    used, head, count, oldest = numbers
    if magic != _MAGIC or not (0 <= used <= _NEWEST and 0 <= head <= count <= QUEUE_MAX):
        return None
    return numbers if 0 <= oldest <= _NEWEST else None
