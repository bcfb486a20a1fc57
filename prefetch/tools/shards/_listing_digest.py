"""The fingerprint of a shard write's input listing, computed beside the write, not before it.

Not a lister: the folder is listed by `ImageFolder` (`prefetch.sources._listing`, through the
listing kept for the host). The kept listing's folder stamps say whether a file was added,
removed or renamed; this digest also sees a file rewritten in place (its size and time).

`ListingDigest(paths, labels, local)` starts computing, in `STAT_THREADS` background threads,
a SHA-256 of the listing in its own order (`ImageFolder`'s): the paths (one bulk update over the
`PathArray`'s UTF-8 buffer), the labels (one update) and, for a local folder, each file's size
and modification time in nanoseconds (one `os.stat` a file, chunk by chunk, each chunk's
SHA-256 kept in the chunks' order: 32 bytes per `STAT_CHUNK` files; the threads hold the GIL
only between system calls, so on many cores, or on a network filesystem where a `stat` waits,
they overlap). The order the samples are written in is not hashed: it follows from the
listing and the plan's `seed` and `shuffle`, which the plan holds beside it (`_resume.Plan`).
`result()` waits for the digest (`ready()` says whether it would); `close()` (idempotent)
stops the threads between two chunks and joins them. A file that cannot be stat'ed counts as
size and time -1 (the write that reads it names it). The writer starts one as soon as the
folder is listed and waits for its result only where it must: before a rerun compares it with
a progress journal, and before the commit; the shards finished before it is ready are written
to the journal once it is (`_job`). So a first write's images start at once, and a
million-file listing's 2 us a file of `stat` calls (the planning's largest part, measured in
docs/shards.md) overlap the writing. Used by one thread (the writer's).
"""

from __future__ import annotations

import hashlib
import os
import threading

import numpy as np

from prefetch.coordinator import Deadline
from prefetch.io import PathArray

# Threads that stat the files (each holds the GIL only between its system calls).
STAT_THREADS = 4
# Files a thread stats per chunk (a stop is noticed between chunks). Part of the digest: another
# value gives other digests (change `_resume._VERSION` with it).
STAT_CHUNK = 4096


class ListingDigest:
    """The SHA-256 of a listing (module docstring), computed in the background from creation."""

    def __init__(self, paths: PathArray, labels: np.ndarray, *, local: bool) -> None:
        self.paths = paths
        self.labels = labels
        self.local = local
        count = len(paths)
        self._chunks: list[bytes] = [b""] * -(-count // STAT_CHUNK)  # each chunk's SHA-256
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._digest: str | None = None
        threads = min(STAT_THREADS, -(-count // STAT_CHUNK)) if local else 0
        self._threads = [
            threading.Thread(target=self._stat_chunks, name="prefetch-listing-stat", daemon=True)
            for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _stat_chunks(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    start = self._next
                    self._next += STAT_CHUNK
                if start >= len(self.paths):
                    return
                stop = min(start + STAT_CHUNK, len(self.paths))
                stamps: list[int] = []
                for path in self.paths[start:stop].tolist():
                    try:
                        info = os.stat(path)
                    except OSError:
                        stamps += (-1, -1)
                        continue
                    stamps += (info.st_size, info.st_mtime_ns)
                data = np.array(stamps, dtype="<i8").data
                self._chunks[start // STAT_CHUNK] = hashlib.sha256(data).digest()
        except BaseException as error:  # MemoryError: given to result()'s caller
            self._errors.append(error)

    def ready(self, wait_s: float = 0.0) -> bool:
        """Whether `result()` would not wait (every file is stat'ed), after waiting at most
        `wait_s` seconds for it."""
        deadline = Deadline(wait_s)
        for thread in self._threads:
            thread.join(deadline.remaining())
        return not any(thread.is_alive() for thread in self._threads)

    def result(self) -> str:
        """The digest (hex), waiting for the threads to finish."""
        if self._digest is None:
            for thread in self._threads:
                thread.join()
            if self._errors:
                raise self._errors[0]
            if self._stop.is_set():
                raise RuntimeError("the listing digest was closed before it was done")
            data, _ = self.paths.parts()
            digest = hashlib.sha256(f"listing {len(self.paths)} local={self.local}\n".encode())
            digest.update(np.ascontiguousarray(data).data)
            digest.update(np.ascontiguousarray(self.labels, dtype="<i8").data)
            if self.local:
                digest.update(b"".join(self._chunks))
            self._digest = digest.hexdigest()
        return self._digest

    def close(self) -> None:
        """Stop the threads (between chunks) and join them; idempotent."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
