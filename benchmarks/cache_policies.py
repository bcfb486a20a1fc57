"""What a cache of `limit / set` of a data set serves on shuffled epochs, by eviction policy.

A simulation (no files): `--objects` objects of one size, read in a new random permutation
each epoch, through a cache of a fraction of them; printed for each fraction, the share of
reads served from the cache in epochs 3 to `--epochs` (after the first fill) when the cache
evicts the least recently read copy (`cache_policy="lru"`), a copy at random, or nothing
while its copies were read in this epoch or the last (`cache_policy="keep"`: the copies of
the first epoch stay, the rest are read through). docs/remote.md, "A cache with a size",
quotes it.

    .venv/bin/python benchmarks/cache_policies.py [--objects 2000] [--epochs 6]
"""

from __future__ import annotations

import argparse
import collections
import random

import numpy as np


def shares(objects: int, fraction: float, epochs: int, seed: int = 0) -> dict[str, float]:
    """The share of reads from the cache in epochs 3.. for each policy."""
    capacity = int(fraction * objects)
    orders = [np.random.default_rng([seed, e]).permutation(objects) for e in range(epochs)]
    hits = dict.fromkeys(("least recently read", "at random", "keep"), 0)
    lru: collections.OrderedDict[int, None] = collections.OrderedDict()
    held: list[int] = []
    members: set[int] = set()
    kept: set[int] = set()
    pick = random.Random(seed)
    for epoch, order in enumerate(orders):
        counted = epoch >= 2
        for item in map(int, order):
            if item in lru:
                lru.move_to_end(item)
                hits["least recently read"] += counted
            else:
                lru[item] = None
                if len(lru) > capacity:
                    lru.popitem(last=False)
            if item in members:
                hits["at random"] += counted
            else:
                if len(held) >= capacity:
                    index = pick.randrange(len(held))
                    members.discard(held[index])
                    held[index] = held[-1]
                    held.pop()
                held.append(item)
                members.add(item)
            if item in kept:
                hits["keep"] += counted
            elif len(kept) < capacity:
                kept.add(item)
    reads = objects * (epochs - 2)
    return {policy: count / reads for policy, count in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    fractions = (0.25, 0.5, 0.75, 0.9)
    rows = {fraction: shares(args.objects, fraction, args.epochs) for fraction in fractions}
    print("| limit / set | " + " | ".join(f"{f:g}" for f in fractions) + " |")
    print("|---|" + "---:|" * len(fractions))
    for policy in ("least recently read", "at random", "keep"):
        cells = " | ".join(f"{rows[f][policy]:.0%}" for f in fractions)
        print(f"| {policy} | {cells} |")


if __name__ == "__main__":
    main()
