"""How large a folder grows while a block runs: for tests and benchmarks of a bounded cache."""

from __future__ import annotations

import contextlib
import os
import threading
from types import TracebackType


def folder_bytes(folder: str | os.PathLike[str]) -> int:
    """The bytes of the files in `folder`, each file once. A listing is not a snapshot: a file
    renamed while it is listed is counted once (by its inode), but a file removed and another
    written meanwhile can both be counted."""
    sizes = {}
    with os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):  # removed while listed
                sizes[entry.inode()] = entry.stat(follow_symlinks=False).st_size
    return sum(sizes.values())


class FolderSizeSampler:
    """`with FolderSizeSampler(folder, every_s) as sampler:` samples `folder_bytes(folder)` in
    a thread every `every_s` seconds while the block runs (not while the folder is missing):
    `largest`, the most it held in a sample, and `samples`, how many were taken."""

    def __init__(self, folder: str | os.PathLike[str], every_s: float = 0.002) -> None:
        self.folder, self.every_s = folder, every_s
        self.largest = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="folder-size-sampler")

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                self.largest = max(self.largest, folder_bytes(self.folder))
                self.samples += 1

    def __enter__(self) -> FolderSizeSampler:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
