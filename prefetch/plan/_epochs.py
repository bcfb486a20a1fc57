"""Which samples go in which batch, in every epoch; and where an iteration stands.

`EpochPlan` is pure: the batches of an epoch derive from (seed, epoch) and the plan's fields
only, so every process, worker count and backend draws the same ones. Shard `i` of `n` takes
every n-th sample of the same permutation, so shards are disjoint and cover the epoch. The
`Loader` and the device-resident dataset (`prefetch.tf.resident`) both plan with it.

`Cursor` holds the position: which epoch the next iteration begins, and how many batches the
latest one has delivered; `state()` and `restore()` are what `state_dict` saves and loads.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import numpy as np

from prefetch._checks import check_shard, positive

SHUFFLE_MODES = ("samples", "batches")
# Appended to the seed to derive the fixed sample grouping of shuffle="batches".
_GROUPING_KEY = (0, 1)


def epoch_order(size: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The sample indices of an epoch: a permutation derived from (seed, epoch) only."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(size).astype(np.int64)


def fixed_grouping(size: int, seed: int) -> np.ndarray:
    """The fixed sample order of shuffle="batches": one permutation derived from the seed."""
    return np.random.default_rng([seed, *_GROUPING_KEY]).permutation(size).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The batches of each epoch of `size` samples; immutable (`replace` makes a changed copy).

    `shuffle`: "samples" (a new permutation each epoch; True means this), "batches" (a fixed
    grouping drawn once from the seed, the groups' order shuffled each epoch) or False (in
    order). The last, shorter batch is kept unless `drop_remainder`.
    """

    size: int
    batch_size: int
    seed: int
    shuffle: bool | str = True
    drop_remainder: bool = False
    num_shards: int = 1
    shard_index: int = 0

    def __post_init__(self) -> None:
        positive("batch_size", self.batch_size)
        check_shard(self.num_shards, self.shard_index)
        if self.shuffle is True:
            object.__setattr__(self, "shuffle", "samples")
        elif self.shuffle is not False and self.shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be 'batches', 'samples' or False, got {self.shuffle!r}")

    def replace(self, **changes: object) -> EpochPlan:
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def shard_size(self) -> int:
        """Samples per epoch in this shard."""
        return len(range(self.shard_index, self.size, self.num_shards))

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.shard_size, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """The sample indices of each batch of `epoch` from batch `start` on, in order."""
        if self.shuffle == "batches":
            order = fixed_grouping(self.size, self.seed)
        else:
            order = epoch_order(self.size, shuffle=bool(self.shuffle), seed=self.seed, epoch=epoch)
        order = order.astype(np.int64)[self.shard_index :: self.num_shards]
        size = self.batch_size
        batches = [order[i : i + size] for i in range(0, len(self) * size, size)]
        if self.shuffle == "batches":
            turn = epoch_order(len(batches), shuffle=True, seed=self.seed, epoch=epoch)
            batches = [batches[i] for i in turn]
        return batches[start:]


class Cursor:
    """Where iteration stands: the (epoch, batch) the next iteration begins at, and the latest
    iteration's (epoch, batches delivered). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = (0, 0)
        self._current: list[int] | None = None

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration will produce."""
        return self._next[0]

    @property
    def next_position(self) -> int:
        """The batch the next iteration starts at (non-zero after `restore` mid-epoch)."""
        return self._next[1]

    @property
    def started(self) -> bool:
        """True once an iteration has begun since the last `restore`."""
        return self._current is not None

    def begin(self) -> tuple[int, int]:
        """Take the next iteration's (epoch, first batch); the one after is the next epoch."""
        with self._lock:
            epoch, start = self._next
            self._next = (epoch + 1, 0)
            self._current = [epoch, start]
            return epoch, start

    def advance(self, epoch: int) -> None:
        """One more batch of `epoch` was delivered (ignored if a later epoch has begun)."""
        with self._lock:
            if self._current is not None and self._current[0] == epoch:
                self._current[1] += 1

    def state(self, batches_per_epoch: int) -> tuple[int, int]:
        """(epoch, position) to save: the epoch in progress, or the next at position 0."""
        with self._lock:
            current = self._current
            if current is not None and current[1] < batches_per_epoch:
                return current[0], current[1]
            return self._next

    def restore(self, epoch: int, position: int) -> None:
        """Make the next iteration resume `epoch` at batch `position`."""
        with self._lock:
            self._next = (int(epoch), int(position))
            self._current = None
