"""Benchmark: a Source that keeps its images in memory, already at the target size.

What a user with preprocessed arrays (or a test of the input pipeline without disk) gets: the
loader's own cost per sample, with nothing to decode. Each row is one open Loader (one
long-lived pipeline), a warm-up epoch untimed, then --epochs timed; rows alternate over
--rounds; medians with min-max. Printed: images/s and MB/s copied into the batches.

    python benchmarks/in_memory_source.py [--images 2048] [--size 224] [--batch-size 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import prefetch


class InMemory:
    """`n` random uint8 images of `size` x `size` x 3 and their labels, in one array."""

    def __init__(self, n: int, size: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.labels = np.arange(n) % 4
        self.class_names = ["a", "b", "c", "d"]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])


def rate(source: InMemory, backend: str, workers: int, args: argparse.Namespace) -> float:
    """Images/s of one open Loader over --epochs, after one untimed epoch."""
    loader = prefetch.Loader(
        source, batch_size=args.batch_size, image_size=args.size, workers=workers, backend=backend
    )
    with loader:
        for _ in loader:  # warm-up: workers start, batches go in flight
            pass
        began, images = time.perf_counter(), 0
        for _ in range(args.epochs):
            for batch in loader:
                images += len(batch.labels)
        return images / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    source = InMemory(args.images, args.size)
    rows = ["thread", "process", "auto"]
    rates: dict[str, list[float]] = {row: [] for row in rows}
    for round_index in range(args.rounds):
        for row in rows if round_index % 2 == 0 else rows[::-1]:
            rates[row].append(rate(source, row, args.workers, args))
    megabytes = args.size * args.size * 3 / 1e6
    print(
        f"in-memory source, {args.images} images of {args.size}x{args.size}x3, batch "
        f"{args.batch_size}, {args.workers} workers; {args.epochs} epochs timed after one, "
        f"{args.rounds} rounds: median (min-max)"
    )
    for row in rows:
        values = rates[row]
        print(
            f"  backend={row:8s} {statistics.median(values):9,.0f} images/s "
            f"({min(values):,.0f}-{max(values):,.0f})  "
            f"{statistics.median(values) * megabytes:7,.0f} MB/s"
        )


if __name__ == "__main__":
    main()
