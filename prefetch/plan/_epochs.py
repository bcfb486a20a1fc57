"""Which samples go in which batch, in every epoch, on every rank; and where an iteration stands.

`EpochPlan` is pure: the batches of an epoch derive from (seed, epoch) and the plan's fields
only, so every process, worker count and backend draws the same ones. Shard `i` of `n` takes
every n-th sample of the same permutation, padded so that every shard has as many batches
(see `EpochPlan`), so shards together cover the epoch and advance through it in lockstep. The
`Loader` and the device-resident dataset (`prefetch.tf.resident`) both plan with it.

`Cursor` holds the position: which epoch the next iteration begins, and how many batches the
latest one has delivered; `state()` and `restore()` are what `state_dict` saves and loads
(`prefetch.plan._resume` turns them into the saved state and back, on any layout).
"""

from __future__ import annotations

import dataclasses
import functools
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

    Ranks (`num_shards`, `shard_index`): every shard gets the same number of samples, so the
    same number of batches (a collective step waits for every rank). The epoch's order is
    padded, as torch's `DistributedSampler` pads: when `size` is not a multiple of
    `num_shards`, its first `pad` samples (`pad = -size % num_shards`, fewer than
    `num_shards`) come again at its end; shard `i` then takes every `num_shards`-th sample from
    the `i`-th. Padding, not trimming: no sample is ever left out of an epoch (trimming would
    leave out the same last samples in every epoch of an unshuffled or `"batches"` loader),
    and a step that waits for every rank finds each with a batch. With one shard, nothing is
    padded.

    Lockstep: step `k` of the epoch (batch `k` of every shard) takes positions
    `[k * batch_size * num_shards, (k + 1) * batch_size * num_shards)` of the padded order, so
    after `k` steps the shards together have read its first `consumed(epoch, k)` samples: the
    epoch's global position, which `prefetch.plan.loader_state` saves and another layout
    resumes from. `resume_at=(epoch, samples)` makes that epoch a resumed one: it yields the
    order from sample `samples` on, padded from the order's start and split among this plan's
    shards in the same way; its batches are the last of the epoch's `len(self)` (positions
    `run_offset(epoch)` on), so `len(self) - position` is always the batches left.
    """

    size: int
    batch_size: int
    seed: int
    shuffle: bool | str = True
    drop_remainder: bool = False
    num_shards: int = 1
    shard_index: int = 0
    resume_at: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        positive("batch_size", self.batch_size)
        check_shard(self.num_shards, self.shard_index)
        if self.shuffle is True:
            object.__setattr__(self, "shuffle", "samples")
        elif self.shuffle is not False and self.shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be 'batches', 'samples' or False, got {self.shuffle!r}")
        if self.resume_at is not None:
            if self.shuffle == "batches":
                raise ValueError("shuffle='batches' resumes only on its own layout")
            if not 0 <= self.resume_at[1] < self.size:
                raise ValueError(f"resume_at {self.resume_at} is outside {self.size} samples")

    def replace(self, **changes: object) -> EpochPlan:
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def shard_size(self) -> int:
        """Samples per epoch in each shard, padding included: `ceil(size / num_shards)`."""
        return -(-self.size // self.num_shards)

    def _count(self, samples: int) -> int:
        """Batches of a shard of `samples`."""
        full, rest = divmod(samples, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __len__(self) -> int:
        """Batches per epoch, the same in every shard."""
        return self._count(self.shard_size)

    @property
    def elastic(self) -> bool:
        """Whether a state taken mid-epoch with other ranks or another batch size resumes on
        this plan (not with `shuffle="batches"`, whose batches are fixed for one layout)."""
        return self.shuffle != "batches"

    def sequence(self, epoch: int) -> np.ndarray:
        """The epoch's samples in the order the shards read them together, unpadded."""
        if self.shuffle == "batches":
            return fixed_grouping(self.size, self.seed)
        return epoch_order(self.size, shuffle=bool(self.shuffle), seed=self.seed, epoch=epoch)

    def begins_at(self, epoch: int) -> int:
        """The sample of the epoch's order where its run begins (`resume_at`, else 0)."""
        resumed = self.resume_at
        return resumed[1] if resumed is not None and resumed[0] == epoch else 0

    def run_offset(self, epoch: int) -> int:
        """The position of the epoch's first batch: 0, or for a resumed epoch `len(self)` less
        its run's batches."""
        begin = self.begins_at(epoch)
        if begin == 0:
            return 0
        return len(self) - self._count(-(-(self.size - begin) // self.num_shards))

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """The sample indices of each batch of `epoch` from batch `start` on, in order."""
        order = self.sequence(epoch).astype(np.int64)
        rest = order[self.begins_at(epoch) :]
        padded = np.concatenate([rest, np.resize(order, -len(rest) % self.num_shards)])
        mine = padded[self.shard_index :: self.num_shards]
        size = self.batch_size
        batches = [mine[i : i + size] for i in range(0, self._count(len(mine)) * size, size)]
        if self.shuffle == "batches":
            turn = epoch_order(len(batches), shuffle=True, seed=self.seed, epoch=epoch)
            batches = [batches[i] for i in turn]
        return batches[max(0, start - self.run_offset(epoch)) :]

    def _step_ends(self, epoch: int) -> np.ndarray:
        """`shuffle="batches"`: the samples read after each step, from 0 (`_batch_step_ends`)."""
        return _batch_step_ends(self, epoch)

    def consumed(self, epoch: int, position: int) -> int:
        """Samples of the epoch's order the shards together have read after `position` batches
        each (lockstep): the global position. At the epoch's end (`position` >= `len(self)`)
        it is `size` in every layout: nothing of the epoch is left. Before it, for
        `shuffle="batches"` it counts the padding too, and names a place in this layout only."""
        if position >= len(self):
            return self.size
        if self.shuffle == "batches":
            return int(self._step_ends(epoch)[position])
        steps = position - self.run_offset(epoch)
        return self.begins_at(epoch) + steps * self.batch_size * self.num_shards

    def position_of(self, epoch: int, samples: int) -> int | None:
        """The batch position before the epoch's end where `consumed(epoch, position)` is
        `samples`, or None when no batch boundary of this plan's run falls there."""
        if self.shuffle == "batches":
            found = np.flatnonzero(self._step_ends(epoch)[: len(self)] == samples)
            return int(found[0]) if len(found) else None
        offset = self.run_offset(epoch)
        steps, rest = divmod(samples - self.begins_at(epoch), self.batch_size * self.num_shards)
        position = offset + steps
        return position if steps >= 0 and not rest and position < len(self) else None


# An adapter takes a state for every batch it reads ahead (prefetch.plan.Handoff), so
# `consumed` must not draw an epoch's turn each time: 2 ms at 40,000 batches of 32.
@functools.lru_cache(maxsize=4)
def _batch_step_ends(plan: EpochPlan, epoch: int) -> np.ndarray:
    """`shuffle="batches"`: the samples read after each step of `plan`'s `epoch`, from 0
    (without drawing the grouping: every batch is full but the last of the grouping, which the
    turn moves). Cached; read-only."""
    count = len(plan)
    sizes = np.full(count, plan.batch_size * plan.num_shards, np.int64)
    turn = epoch_order(count, shuffle=True, seed=plan.seed, epoch=epoch)
    last = plan.shard_size - (count - 1) * plan.batch_size
    sizes[turn == count - 1] = min(last, plan.batch_size) * plan.num_shards
    ends = np.concatenate([[0], np.cumsum(sizes)])
    ends.flags.writeable = False
    return ends


class Cursor:
    """Where iteration stands: the (epoch, batch) the next iteration begins at, and the latest
    iteration's (epoch, batches delivered, the batch it began at). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = (0, 0)
        self._current: list[int] | None = None  # [epoch, position, the position it began at]

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
            self._current = [epoch, start, start]
            return epoch, start

    def advance(self, epoch: int) -> None:
        """One more batch of `epoch` was delivered (ignored if a later epoch has begun)."""
        with self._lock:
            if self._current is not None and self._current[0] == epoch:
                self._current[1] += 1

    def state(self, batches_per_epoch: int, held_back: int = 0) -> tuple[int, int]:
        """(epoch, position) to save: the epoch in progress, or the next at position 0.
        `held_back`: batches the latest iteration delivered that the consumer has not taken
        yet (not counted): ValueError unless 0 <= held_back <= the batches it delivered."""
        with self._lock:
            current = self._current
            delivered = 0 if current is None else current[1] - current[2]
            if (
                isinstance(held_back, bool)
                or not isinstance(held_back, (int, np.integer))
                or not 0 <= held_back <= delivered
            ):
                raise ValueError(
                    f"held_back counts batches delivered but not yet taken, so it must be an "
                    f"int from 0 to the {delivered} the running epoch has delivered; got "
                    f"held_back={held_back!r}"
                )
            if current is not None and current[1] - held_back < batches_per_epoch:
                return current[0], current[1] - int(held_back)
            return self._next

    def restore(self, epoch: int, position: int) -> None:
        """Make the next iteration resume `epoch` at batch `position`."""
        with self._lock:
            self._next = (int(epoch), int(position))
            self._current = None
