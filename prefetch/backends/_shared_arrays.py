"""What a worker process is sent, with its large arrays in one shared-memory segment.

A worker process unpickles the `SampleReader` it is sent, and with it the source: a shard
source's member table, a file source's paths and labels, millions of samples in numpy arrays.
Pickled plainly, each worker would hold a private copy of them (and the loader's process a
pickled copy while each starts). `SharedArrays(value)` pickles `value` leaving out every plain
numpy array of at least `SHARED_ARRAY_BYTES`, which it writes once into an anonymous memory file
(`os.memfd_create`): it has no name in any folder (nothing to guess, to sweep or to leak, and
it does not count against /dev/shm's size), and it lives while the loader's process holds its
descriptor (until `close()`) or a worker maps it. Pickled into a worker's start-up arguments,
it hands over that descriptor itself (multiprocessing's `DupFd`, as for the worker's pipe);
the worker maps it copy-on-write (MAP_PRIVATE) and unpickles the rest with views of the mapping
in place of the arrays. Every worker then reads the same pages, each counted once however many
workers map them; a worker that writes into an array writes into a private copy of that page,
as it did into its own copy before. An array read-only in the loader's process is read-only in
the workers. Where there is no `memfd_create` the arrays travel in the pickle, as before.

`dumps_leaving_arrays(value)` pickles `value` without those arrays' bytes: to check that a
part can be sent, and whether it refers to the main script, at no cost in memory.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
from multiprocessing import reduction
from typing import Any

import numpy as np

# Arrays of at least this many bytes go to the shared segment; smaller ones are pickled.
SHARED_ARRAY_BYTES = 64 << 10
# Where each array starts in the segment: a multiple of this (any dtype's alignment).
_ALIGN = 64
# Bytes written to the segment per call (a write may not take more than about 2 GiB).
_WRITE_STEP = 64 << 20


class _LeavingArrays(pickle.Pickler):
    """A pickler that puts a reference ("array", n) in place of each large plain array and
    lists the arrays (each once, however many times it is referred to)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.arrays: list[np.ndarray] = []
        self._numbers: dict[int, int] = {}  # id of an array in `arrays` -> its number

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is not np.ndarray or obj.nbytes < SHARED_ARRAY_BYTES or obj.dtype.hasobject:
            return None
        number = self._numbers.get(id(obj))
        if number is None:
            number = self._numbers[id(obj)] = len(self.arrays)
            self.arrays.append(obj)
        return ("array", number)


def _pickled(value: Any) -> tuple[bytes, list[np.ndarray]]:
    buffer = io.BytesIO()
    pickler = _LeavingArrays(buffer)
    pickler.dump(value)
    return buffer.getvalue(), pickler.arrays


def dumps_leaving_arrays(value: Any) -> bytes:
    """A pickle of `value` that names its large arrays instead of holding their bytes (not to
    be loaded: for checking that `value` pickles and what it refers to)."""
    return _pickled(value)[0]


class _WithArrays(pickle.Unpickler):
    def __init__(self, data: bytes, arrays: list[np.ndarray]) -> None:
        super().__init__(io.BytesIO(data))
        self._arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        kind, number = pid
        if kind != "array":
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self._arrays[number]


class SharedArrays:
    """`value` for worker processes, its large arrays in one segment (module docstring).

    Pickling it (into a worker's start-up arguments) sends the descriptor; unpickling it in the
    worker gives `value` back. `nbytes`: the segment's size (0: no segment). The loader's
    process calls `close()` when its workers are gone; not thread-safe.
    """

    def __init__(self, value: Any) -> None:
        self._value = value
        self._fd = -1
        self.nbytes = 0
        self._data = b""
        self._layout: list[tuple[int, np.dtype[Any], tuple[int, ...], bool]] = []
        if not hasattr(os, "memfd_create"):
            return
        data, arrays = _pickled(value)
        if not arrays:
            return
        offsets = np.cumsum([0] + [-(-array.nbytes // _ALIGN) * _ALIGN for array in arrays])
        self._fd = os.memfd_create("prefetch-shared-arrays", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self._fd, int(offsets[-1]))
            for array, offset in zip(arrays, offsets.tolist(), strict=False):
                _write(self._fd, np.ascontiguousarray(array), offset)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        self.nbytes = int(offsets[-1])
        self._data = data
        self._layout = [
            (offset, array.dtype, array.shape, bool(array.flags.writeable))
            for array, offset in zip(arrays, offsets.tolist(), strict=False)
        ]

    def __reduce__(self) -> tuple[Any, ...]:
        if self._fd < 0:
            return _as_it_was, (self._value,)
        return _mapped, (self._data, self._layout, reduction.DupFd(self._fd), self.nbytes)

    def close(self) -> None:
        """Close the loader's descriptor: the memory goes when no worker maps it any more."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _write(fd: int, array: np.ndarray, offset: int) -> None:
    view = array.reshape(-1).view(np.uint8).data  # contiguous: a view, not a copy
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + _WRITE_STEP], offset + done)


def _as_it_was(value: Any) -> Any:
    return value


def _mapped(
    data: bytes,
    layout: list[tuple[int, np.dtype[Any], tuple[int, ...], bool]],
    descriptor: Any,
    nbytes: int,
) -> Any:
    """In a worker: map the segment copy-on-write and unpickle `data` with views of it."""
    fd = descriptor.detach()
    try:
        mapping = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE)
    finally:
        os.close(fd)  # the mapping keeps the file
    arrays = []
    for offset, dtype, shape, writeable in layout:
        array: np.ndarray = np.ndarray(shape, dtype, mapping, offset)
        array.flags.writeable = writeable
        arrays.append(array)
    return _WithArrays(data, arrays).load()
