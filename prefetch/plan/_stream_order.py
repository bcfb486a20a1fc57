"""The order of each epoch of a streamed shard source: whole shards through a shuffle buffer.

A streamed shard source (`ShardSource.streaming`, the default for URLs) is never read one
sample at a time from its store. `StreamingPlan` orders an epoch as a streaming reader would
see it: this host's shards in an order drawn from `(seed, epoch)`, their samples in sequence,
mixed by a shuffle buffer of `buffer` samples (tf.data's algorithm: each sample that comes in
replaces a uniformly drawn one of the buffer, which goes out). The order is a pure function
of `(seed, epoch)` and the shards' sample counts, so resume (`state_dict`) and every backend
give the same batches, as with a folder. It is not an exact permutation of the dataset: a
sample leaves at most about `buffer` places before... anywhere after its shard arrives
(docs/shards.md).

Hosts (`num_shards`) take whole shard files: file `f` goes to host `f % num_shards`, every
epoch. Each host reads the same number of samples per epoch, the smallest host's count; a
larger host's extra samples are the last ones of its order, a different few each epoch. The
shards themselves are fetched by the runtime's spool (`prefetch.runtime`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from prefetch.plan._epochs import EpochPlan

# Appended to the seed for the shard order and the shuffle buffer's draws.
_SHARD_ORDER_KEY = (2, 0)
_BUFFER_KEY = (2, 1)
# Epoch orders a StreamingPlan keeps (the current epoch's and the next one's).
KEPT_ORDERS = 2
# Samples of the shuffle buffer's draws computed at once (a few arrays of this length).
STEPS_AT_ONCE = 1 << 18


@dataclass(frozen=True, kw_only=True, eq=False)
class StreamingPlan(EpochPlan):
    """The batches of each epoch of a streamed shard source (see the module docstring).

    `shard_starts` (int64, one more than the shards) is where each shard's samples begin;
    `buffer` the shuffle buffer's size in samples. `shuffle="batches"` is not offered.
    """

    shard_starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    buffer: int = 1
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.shuffle == "batches":
            raise ValueError(
                "shuffle='batches' is not offered for streamed shards (their order comes "
                "through a shuffle buffer): pass shuffle=True or False"
            )
        if self.resume_at is not None:
            raise ValueError("a streamed shard source resumes only on its own layout")
        object.__setattr__(self, "_orders", {})
        if self.shard_size == 0:
            raise ValueError(
                f"{self.num_shards} hosts (num_shards) for {len(self.shard_starts) - 1} shard "
                "files: a streamed source gives each host whole files, so some hosts get none; "
                "use at most as many hosts as files, or streaming=False"
            )

    def replace(self, **changes: object) -> StreamingPlan:
        """A copy with `changes` applied (and checked)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def elastic(self) -> bool:
        """False: each host streams its own whole shard files, so a state taken mid-epoch
        resumes only with the same hosts and batch size."""
        return False

    def host_shards(self, host: int | None = None) -> np.ndarray:
        """The shard files of `host` (default: this plan's `shard_index`)."""
        count = len(self.shard_starts) - 1
        return np.arange(count)[self.shard_index if host is None else host :: self.num_shards]

    @property
    def shard_size(self) -> int:
        """Samples per epoch on each host: the smallest host's count."""
        counts = np.diff(self.shard_starts)
        return min(int(counts[self.host_shards(host)].sum()) for host in range(self.num_shards))

    def shard_order(self, epoch: int) -> np.ndarray:
        """This host's shards in the order `epoch` streams them."""
        shards = self.host_shards()
        if not self.shuffle:
            return shards
        rng = np.random.default_rng([self.seed, epoch, *_SHARD_ORDER_KEY])
        return shards[rng.permutation(len(shards))]

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of `epoch` on this host, in order: 8 bytes per sample (int64),
        and the last `KEPT_ORDERS` epochs' orders are kept."""
        found = self._orders.get(epoch)
        if found is not None:
            return found
        starts = self.shard_starts
        shards = self.shard_order(epoch)
        counts = (starts[shards + 1] - starts[shards]).astype(np.int64)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, *_BUFFER_KEY])
            order = _through_buffer(starts[shards], counts, self.buffer, rng)
        else:
            order = np.empty(int(counts.sum()), np.int64)
            for begin in range(0, len(order), STEPS_AT_ONCE):
                end = min(begin + STEPS_AT_ONCE, len(order))
                order[begin:end] = _incoming(starts[shards], counts, begin, end)
        order = order[: self.shard_size]
        if len(self._orders) >= KEPT_ORDERS:
            self._orders.pop(next(iter(self._orders)))
        self._orders[epoch] = order
        return order

    def batches(self, epoch: int, start: int = 0) -> list[np.ndarray]:
        """The sample indices of each batch of `epoch` from batch `start` on, in order."""
        order, size = self.order(epoch), self.batch_size
        return [order[i : i + size] for i in range(0, len(self) * size, size)][start:]

    @classmethod
    def of(cls, plan: EpochPlan, shard_starts: np.ndarray, buffer: int) -> StreamingPlan:
        """`plan` streamed: shards beginning at `shard_starts`, mixed by a buffer of `buffer`."""
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(EpochPlan)}
        return cls(**fields, shard_starts=shard_starts, buffer=buffer)


def _incoming(firsts: np.ndarray, counts: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Items [begin, end) of the samples of shards whose first samples are `firsts` and
    sample counts `counts`, taken in that order (without the whole sequence in memory)."""
    ends = np.cumsum(counts)
    positions = np.arange(begin, end, dtype=np.int64)
    shard = np.searchsorted(ends, positions, "right")
    items: np.ndarray = (
        np.asarray(firsts, np.int64)[shard] + positions - (ends[shard] - counts[shard])
    )
    return items


def _through_buffer(
    firsts: np.ndarray, counts: np.ndarray, buffer: int, rng: np.random.Generator
) -> np.ndarray:
    """The samples of the shards (`_incoming`) as they leave a shuffle buffer of `buffer`
    samples: the buffer fills first; then each sample that comes in takes the place of a
    uniformly drawn one, which goes out; at the end the rest go out in a random order.
    Computed `STEPS_AT_ONCE` samples at a time with numpy (a sample leaving at step k is the
    last one put in its drawn place before k, or the place's first occupant): the result's
    8 bytes per sample and a fixed amount for each step."""
    total = int(counts.sum())
    size = min(buffer, total)
    held = _incoming(firsts, counts, 0, size)
    out = np.empty(total, np.int64)
    for begin in range(size, total, STEPS_AT_ONCE):
        end = min(begin + STEPS_AT_ONCE, total)
        arriving = _incoming(firsts, counts, begin, end)
        picks = rng.integers(0, size, end - begin)
        by_place = np.argsort(picks, kind="stable")
        places = picks[by_place]
        after_same = np.zeros(len(places), bool)
        after_same[1:] = places[1:] == places[:-1]
        leaving = held[places]
        leaving[after_same] = arriving[by_place[:-1][after_same[1:]]]
        out[begin - size + by_place] = leaving
        last = np.ones(len(places), bool)
        last[:-1] = ~after_same[1:]
        held[places[last]] = arriving[by_place[last]]
    out[total - size :] = held[rng.permutation(size)]
    return out
