"""Counters as one value: a `Tally` adds up field by field, nested tallies too.

A count travels whole from where it is made (the object cache, a worker's reader) through a
batch's outcome to `Loader.stats()`: each stage adds tallies (`a + b`), never copies fields one
by one, so a new counter is one field of one tally and shows wherever that tally goes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="Tally")


@dataclass
class Tally:
    """A dataclass of counters (numbers, or nested tallies) that adds up field by field:
    `a + b` is a new tally of the sums. Subclasses declare their fields with defaults of 0
    (or a default-made tally)."""

    def __add__(self: T, other: T) -> T:
        sums: dict[str, Any] = {
            field.name: getattr(self, field.name) + getattr(other, field.name)
            for field in fields(self)
        }
        return type(self)(**sums)

    def flat(self, prefix: str = "") -> dict[str, float]:
        """The counters as one flat dict, a nested tally's named `<field>_<its field>`
        (for JSON and logs)."""
        out: dict[str, float] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Tally):
                out.update(value.flat(f"{prefix}{field.name}_"))
            else:
                out[f"{prefix}{field.name}"] = value
        return out


@dataclass
class CacheCounts(Tally):
    """What an object cache did (`cache_dir`): `hits`, samples read from a kept local copy;
    `misses`, samples whose object was read from storage (and copied) first; `fetched_bytes`
    read from storage into copies; `evictions` and `evicted_bytes`, the copies evicted to
    make room (`CacheFolder.take_counts`: those of this process since the last take)."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
