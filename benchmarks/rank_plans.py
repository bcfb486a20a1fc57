"""Benchmark: what planning an epoch costs one rank (docs/many-gpus.md, "What it costs").

Every rank draws the whole epoch's order (a permutation of `--samples`, derived from
(seed, epoch)), pads it to a multiple of the ranks and takes its share, once per epoch in its
main process, before the first batch of the epoch is submitted (`EpochPlan.batches`); a
resumed epoch does the same from the saved position (`resume`). `state_dict()` is O(1) for
`shuffle=True`. This prints, per rank count, the median and range of `--repeats` runs of each
step for one rank, and the bytes its batches hold. Pure numpy; no file is read.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from prefetch.plan import EpochPlan, LoaderState, loader_state, resume


def timed(step: Callable[[], object], repeats: int) -> str:
    """`step`'s median and range over `repeats` runs, in ms."""
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        step()
        runs.append((time.perf_counter() - began) * 1e3)
    return f"{statistics.median(runs):.1f} ({min(runs):.1f}-{max(runs):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_281_167, help="ImageNet's train set")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(f"{args.samples:,} samples, batch {args.batch_size}: one rank's cost, ms, median (range)")
    print(f"{'ranks':>6} {'batches':>8} {'epoch plan':>18} {'resume from 2 fewer':>22} {'MB':>6}")
    for ranks in args.ranks:
        plan = EpochPlan(size=args.samples, batch_size=args.batch_size, seed=0, num_shards=ranks)
        batches = plan.batches(3)
        held = sum(batch.nbytes for batch in batches) / 1e6
        before = plan.replace(num_shards=max(1, ranks - 2))
        state = LoaderState.of(loader_state(before, 3, len(before) // 2))

        def planned(plan: EpochPlan = plan) -> object:
            return plan.batches(3)

        def resumed(plan: EpochPlan = plan, state: LoaderState = state) -> object:
            again, position = resume(plan, state)
            return again.batches(3, position)

        print(
            f"{ranks:>6} {len(batches):>8} {timed(planned, args.repeats):>18} "
            f"{timed(resumed, args.repeats):>22} {held:>6.1f}"
        )


if __name__ == "__main__":
    main()
