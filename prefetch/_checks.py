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


def check_shard(num_shards: Any, shard_index: Any) -> tuple[int, int]:
    """(num_shards, shard_index) as ints, or ValueError when the index is outside the shards."""
    num_shards = positive("num_shards", num_shards)
    if not 0 <= shard_index < num_shards:
        raise ValueError(f"shard_index must be in [0, num_shards={num_shards}), got {shard_index}")
    return num_shards, int(shard_index)
