"""PathArray: many file paths (or URLs) in one compact buffer, indexable like a numpy array.

A folder of a million images as Python strs costs about 100 bytes a path and is copied into
every worker process that reads it; as numpy `str_` it costs 4 bytes per character. A
`PathArray` holds one UTF-8 buffer plus int64 offsets, so it pickles in one piece and a path
costs its bytes plus 8.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from prefetch._messages import counted

# Paths handled per step when packing, gathering or iterating a PathArray: keeps the temporary
# arrays (a gather's byte index is 8 bytes per byte of path) small enough to stay in cache.
PATHS_PER_STEP = 1 << 12
# str <-> UTF-8 for any Python str, including the surrogates os.fsdecode makes of odd bytes.
_ERRORS = "surrogatepass"


class PathArray:
    """File paths held compactly: one UTF-8 buffer and an offset per path, read like an array.

    `paths[i]` is the `str`; `paths[indices]` (a slice, ints or a bool mask, as numpy takes them)
    is a new PathArray; `len`, iteration and `tolist()` behave as on a numpy array of `str`. It
    costs the UTF-8 bytes of each path plus 9 bytes, where a numpy `str_` array costs 4 bytes per
    character of the longest path (1.28M ImageNet paths: about 90 MB against 360 MB). Both parts
    are numpy arrays, so worker processes read them without copying and pickling sends two
    buffers. Any `str` round-trips, including the surrogates `os.fsdecode` makes of undecodable
    bytes; a path may not contain NUL.
    """

    __slots__ = ("_data", "_starts", "_view")

    def __init__(self, paths: Iterable[str | os.PathLike[str]] = ()) -> None:
        if isinstance(paths, PathArray):
            self._set(paths._data, paths._starts)
            return
        chunks = _chunks((os.fspath(path) for path in paths), PATHS_PER_STEP)
        other = pack_chunks(chunks)
        self._set(other._data, other._starts)

    def _set(self, data: np.ndarray, starts: np.ndarray) -> None:
        # Invariant: starts[0] == 0, starts[-1] == len(data); path i is
        # data[starts[i] : starts[i + 1] - 1], followed by one NUL.
        data.flags.writeable = False
        starts.flags.writeable = False
        self._data, self._starts = data, starts
        self._view = data.data  # a memoryview: str(view[a:b], ...) decodes without a copy

    @classmethod
    def _from_parts(cls, data: np.ndarray, starts: np.ndarray) -> PathArray:
        paths = cls.__new__(cls)
        paths._set(data, starts)
        return paths

    @classmethod
    def from_parts(cls, data: np.ndarray, starts: np.ndarray) -> PathArray:
        """The PathArray of `parts()` (a uint8 buffer and int64 offsets), checked: ValueError
        when they are not such a pair (offsets from 0 to the buffer's end, each path ended by
        one NUL, none inside)."""
        data = np.ascontiguousarray(data, dtype=np.uint8)
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        ok = starts.ndim == 1 and len(starts) >= 1 and starts[0] == 0
        ok = ok and starts[-1] == len(data) and bool((np.diff(starts) >= 1).all())
        if ok and _zeros(data) != len(starts) - 1:
            ok = False
        if ok and len(starts) > 1 and bool(data[starts[1:] - 1].any()):
            ok = False
        if not ok:
            raise ValueError("not the parts of a PathArray (a buffer and its offsets)")
        return cls._from_parts(data, starts)

    def parts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the UTF-8 buffer, uint8, each path ended by NUL; the int64 offsets of the paths,
        one more than the paths): what `from_parts` takes back."""
        return self._data, self._starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    @property
    def nbytes(self) -> int:
        """Bytes held: the UTF-8 paths with their separators, plus 8 per offset."""
        return int(self._data.nbytes + self._starts.nbytes)

    def __getitem__(self, index: Any) -> Any:
        """`str` for an integer index; a PathArray for a slice, an index array or a bool mask."""
        if isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_)):
            position = int(index)
            size = len(self)
            if not -size <= position < size:
                raise IndexError(f"index {position} is out of bounds for {size} paths")
            position %= size
            start, stop = self._starts[position : position + 2].tolist()
            return str(self._view[start : stop - 1], "utf-8", _ERRORS)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self._gather(np.arange(start, stop, step, dtype=np.int64))
            stop = max(start, stop)
            first, last = int(self._starts[start]), int(self._starts[stop])
            return PathArray._from_parts(
                self._data[first:last], self._starts[start : stop + 1] - first
            )
        array = np.asarray(index)
        if array.dtype == np.bool_:
            if array.shape != (len(self),):
                raise IndexError(f"a bool mask must have {len(self)} entries, got {array.shape}")
            return self._gather(np.flatnonzero(array))
        if array.size == 0:
            return self._gather(np.zeros(0, dtype=np.int64))
        if array.dtype.kind not in "iu" or array.ndim != 1:
            raise IndexError(
                "PathArray takes an int, a slice, a 1-d array of ints or a bool mask, "
                f"got {type(index).__name__} of dtype {array.dtype} and shape {array.shape}"
            )
        return self._gather(array.astype(np.int64))

    def _gather(self, indices: np.ndarray) -> PathArray:
        size = len(self)
        if len(indices) and (indices.min() < -size or indices.max() >= size):
            bad = indices[(indices < -size) | (indices >= size)][0]
            raise IndexError(f"index {int(bad)} is out of bounds for {size} paths")
        indices = np.where(indices < 0, indices + size, indices)
        starts = self._starts[indices]
        lengths = self._starts[indices + 1] - starts
        new_starts = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_starts[1:])
        data = np.empty(int(new_starts[-1]), dtype=np.uint8)
        for a in range(0, len(indices), PATHS_PER_STEP):
            b = min(a + PATHS_PER_STEP, len(indices))
            # Output byte p of path k comes from input byte p + starts[k] - new_starts[k].
            shift = np.repeat(starts[a:b] - new_starts[a:b], lengths[a:b])
            shift += np.arange(new_starts[a], new_starts[b], dtype=np.int64)
            np.take(self._data, shift, out=data[new_starts[a] : new_starts[b]])
        return PathArray._from_parts(data, new_starts)

    def __iter__(self) -> Iterator[str]:
        for a in range(0, len(self), PATHS_PER_STEP):
            yield from self[a : a + PATHS_PER_STEP].tolist()

    def tolist(self) -> list[str]:
        """The paths as a list of `str` (about 100 bytes of Python objects per path)."""
        if not len(self):
            return []
        return str(self._view, "utf-8", _ERRORS).split("\0")[:-1]

    def __reduce__(self) -> tuple[Any, tuple[np.ndarray, np.ndarray]]:
        return PathArray._from_parts, (self._data, self._starts)

    def __repr__(self) -> str:
        shown = self[:3].tolist()
        more = ", ..." if len(self) > 3 else ""
        return f"PathArray({counted(len(self), 'path')}: {str(shown)[:-1]}{more}])"


def _zeros(data: np.ndarray) -> int:
    """The NUL bytes in `data` (counted without a temporary: a shard's member names or a kept
    listing's paths may be hundreds of MB)."""
    return len(data) - int(np.count_nonzero(data))


def _chunks(items: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def pack_chunks(chunks: Iterable[list[str]]) -> PathArray:
    """One PathArray of the paths in `chunks`, grown in place (no second copy of the bytes)."""
    data = bytearray()
    ends: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    for chunk in chunks:
        if not chunk:
            continue
        encoded = ("\0".join(chunk) + "\0").encode("utf-8", _ERRORS)
        found = np.flatnonzero(np.frombuffer(encoded, dtype=np.uint8) == 0)
        if len(found) != len(chunk):
            bad = next(path for path in chunk if "\0" in path)
            raise ValueError(f"a path may not contain NUL characters, got {bad!r}")
        ends.append(found + (len(data) + 1))
        data += encoded
    return PathArray._from_parts(np.frombuffer(data, dtype=np.uint8), np.concatenate(ends))
