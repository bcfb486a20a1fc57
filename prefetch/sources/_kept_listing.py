"""A folder's listing kept as a file, so that the ranks on a host and later runs list it once.

`load_or_list(key, place, started_ns, list_now)` returns the `Listing` kept in the file for
`key` in the folder `place` when it passes every check below, else lists now (`list_now()`) and
keeps the result. The first process to take the key's lock (`fcntl.flock` on `<key>.lock` in
that folder: the kernel releases it when its holder dies, however it dies) lists and writes the
file; the others wait on the lock, polling every `LOCK_POLL_S` (so Ctrl-C interrupts the wait,
and none waits past `LOCK_WAIT_S`: then it lists for itself), and then read the file.

The file (`<key>.listing`): a magic, a JSON header (the key, when the listing began, the length
of each array), the arrays (the folders walked and their stamps, the class names, the paths,
the labels: `PathArray` parts and int32/int64 columns, little-endian), and a BLAKE2b digest of
everything before it. It is written to `.partial-<key>-<random>` (created exclusively, 0600,
never through a link) and renamed into place: a reader never sees half a file. It is read
memory-mapped: the ranks of a host share its pages in the page cache instead of a copy each.

A kept listing is used only when:
- the folder holding it is the user's own and no one else may write to it
  (`prefetch.io.open_private_folder`), and the file is a regular file of the user's, not
  writable by group or others, opened without following a link or blocking;
- its digest, magic, version and key (the folder as given and the working directory for a
  relative one, the host, the options, the extensions) match, and its arrays are well formed;
- every folder it walked has the stamp it had (`stamp`: device, inode, modification and change
  times, taken before the folder was read): adding, removing or renaming an entry changes them;
- and no folder had changed within `RACY_NS` before the listing began (a change in the same
  clock tick as the stamp would leave it unchanged), unless the caller began before the
  listing did (its own listing would not have been newer).
Anything else is listed again and the file replaced. A listing of a URL is never kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import mmap
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from prefetch.io import PathArray

log = logging.getLogger("prefetch.loader")

# Bumped whenever what a kept listing holds changes: older files are listed again.
LISTING_VERSION = 1
MAGIC = b"PFLIST\x00\x01"
SUFFIX = ".listing"
PARTIAL_PREFIX = ".partial-"
# A folder changed less than this before its listing began may have changed again within the
# same timestamp (2 s: FAT's granularity; ext4's is a clock tick): such a listing is trusted
# only by callers that began before it.
RACY_NS = 2_000_000_000
# Waiters poll the lock this often (Ctrl-C is seen between polls), say whom they wait for after
# LOCK_SAY_S, and list for themselves after LOCK_WAIT_S (a holder stopped with Ctrl-Z).
LOCK_POLL_S = 0.05
LOCK_SAY_S = 10.0
LOCK_WAIT_S = 600.0
# The longest header read (a key naming a thousand long class names fits many times over).
MAX_HEADER_BYTES = 16 << 20
DIGEST_BYTES = 32
_ALIGN = 64
# The arrays of a file, in order, with their dtypes.
_ARRAYS = (
    ("folder_bytes", "u1"),
    ("folder_starts", "<i8"),
    ("stamps", "<i8"),
    ("class_bytes", "u1"),
    ("class_starts", "<i8"),
    ("path_bytes", "u1"),
    ("path_starts", "<i8"),
    ("labels", "<i4"),
)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_MISSING = (-1, -1, -1, -1)


class Refused(ValueError):
    """A kept listing that is damaged, someone else's, or made for another folder or state."""


@dataclass(frozen=True, eq=False)
class Listing:
    """A folder's listing: the `paths` and their int32 `labels`, the `class_names`, and what it
    is valid for: the `folders` walked, their `stamps` (int64, one row of `stamp` each), and
    `listed_ns` (the wall clock when the listing began)."""

    paths: PathArray
    labels: np.ndarray
    class_names: list[str]
    folders: PathArray
    stamps: np.ndarray
    listed_ns: int

    def changed(self) -> str | None:
        """The first folder whose stamp is not the one recorded (named), else None."""
        for folder, then in zip(self.folders, self.stamps.tolist(), strict=True):
            if stamp(folder) != tuple(then):
                return f"{folder!r} changed since it was listed"
        return None

    def racy(self) -> bool:
        """Whether a folder's modification and change times both lie within `RACY_NS` before
        the listing began (or after): a change in the same tick would leave both as stamped.
        (One older time is enough: a change sets both to now.)"""
        if not len(self.stamps):
            return False
        newest = int(self.stamps[:, 2:].min(axis=1).max())
        return newest >= self.listed_ns - RACY_NS


def stamp(folder: str) -> tuple[int, int, int, int]:
    """(device, inode, modification time, change time) of `folder` (links followed), or -1s
    when it cannot be read."""
    try:
        info = os.stat(folder)
    except OSError:
        return _MISSING
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)


def key_name(key: str) -> str:
    """The file name (less its suffix) of the listing kept for `key`."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(frozen=True)
class Outcome:
    """How `load_or_list` got its listing: `read` from the kept file (else listed now), the
    kept `file` (None when none was written or read), and the seconds spent `waited_s` on
    another process's lock."""

    read: bool
    file: str | None
    waited_s: float


def load_or_list(
    key: str, folder: int, place: str, started_ns: int, list_now: Callable[[], Listing]
) -> tuple[Listing, Outcome]:
    """The listing for `key` kept in the folder `folder` (a descriptor of `place`, checked by
    the caller), or `list_now()` kept there; see the module docstring."""
    name = key_name(key)
    path = os.path.join(place, name + SUFFIX)
    kept = _read_usable(folder, name, key, started_ns, path, say=False)
    if kept is not None:
        return kept, Outcome(True, path, 0.0)
    waited = time.monotonic()
    with _locked(folder, name, place) as lock:
        waited = time.monotonic() - waited
        kept = _read_usable(folder, name, key, started_ns, path, say=True) if lock else None
        if kept is not None:  # kept by the process that held the lock before
            return kept, Outcome(True, path, waited)
        listing = list_now()
        if not lock:
            return listing, Outcome(False, None, waited)
        try:
            _write(folder, name, key, listing)
        except OSError as error:
            log.warning("prefetch: cannot keep the listing in %r (%s): not kept", place, error)
            return listing, Outcome(False, None, waited)
        return listing, Outcome(False, path, waited)


def _read_usable(
    folder: int, name: str, key: str, started_ns: int, path: str, say: bool
) -> Listing | None:
    """The kept listing when it passes every check; None otherwise (the reason logged when
    `say`)."""
    try:
        listing = read_listing(folder, name + SUFFIX, key)
        if listing is None:
            return None
        reason = listing.changed()
        if reason is None and listing.racy() and started_ns > listing.listed_ns:
            reason = "a folder changed just before it was listed"
    except Refused as error:
        reason = str(error)
    if reason is None:
        return listing
    if say:
        log.info("prefetch: the kept listing %r is not used (%s): listing the folder", path, reason)
    return None


@contextlib.contextmanager
def _locked(folder: int, name: str, place: str) -> Iterator[bool]:
    """Hold the lock of `name` for the block: True when held, False when it could not be
    taken (locks not supported there, or waited past `LOCK_WAIT_S`): list without keeping.
    The holder writes its pid into the lock file and removes the partial files of `name`
    (only a holder writes them: any there were left by a holder that was killed)."""
    try:
        flags = os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
        handle = os.open(name + ".lock", flags, 0o600, dir_fd=folder)
    except OSError as error:
        log.warning("prefetch: cannot lock in %r (%s): listing without keeping", place, error)
        yield False
        return
    try:
        held = _private_file(os.fstat(handle))
        if not held:
            log.warning("prefetch: lock file %r is not yours alone: not kept", name + ".lock")
        held = held and _wait_for(handle, place)
        if held:
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()}\n".encode(), 0)
            with contextlib.suppress(OSError):
                for entry in os.listdir(folder):
                    if entry.startswith(f"{PARTIAL_PREFIX}{name}-"):
                        os.unlink(entry, dir_fd=folder)
        yield held
    finally:
        os.close(handle)  # releases the lock


def _wait_for(handle: int, place: str) -> bool:
    """Take the lock on `handle`, polling; False when it cannot be had (see `_locked`)."""
    start = time.monotonic()
    said = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError as error:  # ENOLCK, EOPNOTSUPP: no locks on this filesystem
            log.warning("prefetch: cannot lock in %r (%s): listing without keeping", place, error)
            return False
        waited = time.monotonic() - start
        if waited > LOCK_WAIT_S:
            log.warning(
                "prefetch: waited %.0f s for process %s listing into %r: listing without it",
                waited,
                _holder(handle),
                place,
            )
            return False
        if waited > LOCK_SAY_S and not said:
            said = True
            log.info("prefetch: waiting for process %s to list into %r", _holder(handle), place)
        time.sleep(LOCK_POLL_S)


def _holder(handle: int) -> str:
    """The pid the lock's holder wrote into the lock file, as text ("?" when unknown)."""
    with contextlib.suppress(OSError, ValueError):
        return str(int(os.pread(handle, 32, 0)))
    return "?"


def _private_file(info: os.stat_result) -> bool:
    """Whether `info` is a regular file of ours that no group or other user may write."""
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _parts(listing: Listing) -> list[tuple[str, np.ndarray]]:
    folder_bytes, folder_starts = listing.folders.parts()
    class_bytes, class_starts = PathArray(listing.class_names).parts()
    path_bytes, path_starts = listing.paths.parts()
    arrays = [
        folder_bytes,
        folder_starts,
        listing.stamps.reshape(-1),
        class_bytes,
        class_starts,
        path_bytes,
        path_starts,
        listing.labels,
    ]
    return [
        (name, np.ascontiguousarray(array, dtype=dtype))
        for (name, dtype), array in zip(_ARRAYS, arrays, strict=True)
    ]


def _write(folder: int, name: str, key: str, listing: Listing) -> None:
    """Write `listing` as the kept file of `name`: a partial file, fsynced, renamed into place."""
    arrays = _parts(listing)
    header = json.dumps(
        {"key": key, "listed_ns": listing.listed_ns, "counts": [len(a) for _, a in arrays]}
    ).encode()
    partial = f"{PARTIAL_PREFIX}{name}-{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    handle = os.open(partial, flags, 0o600, dir_fd=folder)
    try:
        digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
        with os.fdopen(handle, "wb") as file:
            written = 0
            pieces: list[bytes | memoryview] = [MAGIC, len(header).to_bytes(8, "little"), header]
            for piece in [*pieces, *(array.data for _, array in arrays)]:
                if isinstance(piece, memoryview):  # each array starts on an aligned offset
                    pad = bytes(-written % _ALIGN)
                    file.write(pad)
                    digest.update(pad)
                    written += len(pad)
                data = memoryview(piece).cast("B")
                file.write(data)
                digest.update(data)
                written += len(data)
            file.write(digest.digest())
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, name + SUFFIX, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial, dir_fd=folder)
        raise
    with contextlib.suppress(OSError):  # the rename's own durability: best effort
        os.fsync(folder)


def read_listing(folder: int, file_name: str, key: str) -> Listing | None:
    """The listing in `file_name` (in the folder `folder`) made for `key`, memory-mapped;
    None when there is none; `Refused` (with the reason) when it is not to be trusted or is
    damaged. Its folders' stamps are not checked here (`Listing.changed`)."""
    try:
        flags = os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | os.O_NONBLOCK
        handle = os.open(file_name, flags, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as error:  # a link (ELOOP), unreadable
        raise Refused(f"it cannot be opened as a file of yours: {error}") from None
    try:
        info = os.fstat(handle)
        if not _private_file(info):
            raise Refused(
                f"not a regular file of yours that only you may write (owner {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o})"
            )
        if info.st_size < len(MAGIC) + 8 + DIGEST_BYTES:
            raise Refused(f"{info.st_size} bytes is too short")
        data = mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(handle)
    return _decode(data, key)


def _decode(data: mmap.mmap, key: str) -> Listing:
    """The listing in the mapped file `data`, checked; `Refused` otherwise."""
    view = memoryview(data)
    body = view[:-DIGEST_BYTES]
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise Refused("not a kept listing of this version")
    if hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest() != bytes(view[-DIGEST_BYTES:]):
        raise Refused("its digest does not match: the file is damaged")
    length = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    if length > min(MAX_HEADER_BYTES, len(body) - start):
        raise Refused(f"a header of {length} bytes")
    try:
        header = json.loads(bytes(view[start : start + length]))
        same = header["key"] == key
        listed_ns, counts = int(header["listed_ns"]), [int(n) for n in header["counts"]]
    except (ValueError, KeyError, TypeError) as error:
        raise Refused(f"a damaged header ({error})") from None
    if not same:
        raise Refused("made for another folder, options or version")
    if len(counts) != len(_ARRAYS) or min(counts) < 0:
        raise Refused("a damaged header (the arrays' lengths)")
    arrays: dict[str, np.ndarray] = {}
    offset = start + length
    for (name, dtype), count in zip(_ARRAYS, counts, strict=True):
        offset += -offset % _ALIGN
        size = count * np.dtype(dtype).itemsize
        if offset + size > len(body):
            raise Refused("its arrays run past its end")
        arrays[name] = np.frombuffer(data, dtype, count, offset)
        offset += size
    if offset != len(body):
        raise Refused("bytes after its arrays")
    return _checked(arrays, listed_ns)


def _checked(arrays: dict[str, np.ndarray], listed_ns: int) -> Listing:
    """The listing of `arrays` when they are well formed; `Refused` otherwise."""
    try:
        folders = PathArray.from_parts(arrays["folder_bytes"], arrays["folder_starts"])
        classes = PathArray.from_parts(arrays["class_bytes"], arrays["class_starts"])
        paths = PathArray.from_parts(arrays["path_bytes"], arrays["path_starts"])
    except ValueError as error:
        raise Refused(f"damaged names ({error})") from None
    stamps, labels = arrays["stamps"], arrays["labels"]
    if len(stamps) != 4 * len(folders) or len(labels) != len(paths):
        raise Refused("its arrays have other lengths than its names")
    if len(labels) and (labels.min() < 0 or labels.max() >= max(len(classes), 1)):
        raise Refused("a label out of range")
    stamps = stamps.reshape(-1, 4)
    return Listing(paths, labels, classes.tolist(), folders, stamps, listed_ns)
