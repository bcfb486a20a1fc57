"""Small checks of option values, shared by every layer: each returns the value or raises
ValueError naming the option, the value and what is accepted. Imports nothing of prefetch."""

from __future__ import annotations

from typing import Any

import numpy as np


def positive(name: str, value: Any) -> int:
    """`value` as an int, or ValueError naming the option when it is not an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def one_of(name: str, value: Any, allowed: tuple[Any, ...]) -> Any:
    """`value`, or ValueError naming the option when it is not one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_shard(num_shards: Any, shard_index: Any, samples: int | None = None) -> tuple[int, int]:
    """(num_shards, shard_index) as ints, or ValueError when the index is outside the shards
    or there are more shards than `samples` (the source's samples, when given): each shard
    (rank) reads at least one sample per epoch, so shards beyond the samples would only repeat
    them, and an epoch's padded order holds `num_shards` samples (`shard(2**62, 0)` would fail
    at its first batch, out of memory)."""
    num_shards = positive("num_shards", num_shards)
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, num_shards={num_shards}), got {shard_index}")
    if samples is not None and num_shards > samples:
        raise ValueError(
            f"num_shards={num_shards} is more than this source's samples ({samples}): every "
            f"shard (rank) needs a sample of its own: pass num_shards <= {samples}, or give "
            "the source more samples"
        )
    return num_shards, int(shard_index)
