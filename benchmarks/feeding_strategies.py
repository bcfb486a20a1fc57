"""Benchmark: three ways of feeding a compiled train step, across micro and macro batch sizes.

    python benchmarks/feeding_strategies.py [--images 8192] [--image-size 32]
        [--micro 32,128] [--macro 512,2048] [--epochs 5] [--device GPU:0]

  input           every micro-batch is passed in from host memory (copied to the device each step)
  shared all      the whole dataset is uploaded once; the step slices its micro-batch by index
  shared batched  macro-batches are uploaded one after the other; micro-batches sliced by index

The step is a softmax regression with SGD in a tf.function (prefetch.tools.feeding). It runs
on GPU:0 when TensorFlow sees one, else on the CPU, where host and device memory are the same RAM
and the strategies differ only in their per-step overhead.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from prefetch.tools.bench import cpu_model


def sizes(text: str) -> list[int]:
    """'32,128' -> [32, 128]."""
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8192)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--micro", type=sizes, default=[32, 128], help="micro-batch sizes")
    parser.add_argument("--macro", type=sizes, default=[512, 2048], help="macro-batch sizes")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs (median)")
    parser.add_argument("--device", default=None, help="default: GPU:0 if there is one")
    args = parser.parse_args()

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from prefetch.tools.feeding import feeding_benchmark

    rng = np.random.default_rng(0)
    shape = (args.images, args.image_size, args.image_size, 3)
    images = rng.integers(0, 256, size=shape, dtype=np.uint8)
    labels = rng.integers(0, 10, size=args.images).astype(np.int32)
    rows = feeding_benchmark(
        images,
        labels,
        micro_batch_sizes=args.micro,
        macro_batch_sizes=args.macro,
        epochs=args.epochs,
        device=args.device,
    )
    print(
        f"\n{args.images} images {args.image_size}x{args.image_size}x3 uint8 "
        f"({images.nbytes / 2**20:.0f} MiB), 10 classes, on {rows[0].device} "
        f"({cpu_model()}, {os.cpu_count()} cores); "
        f"median of {args.epochs} epochs after a warm-up"
    )
    print(
        f"{'strategy':15s} {'micro':>6s} {'macro':>6s} {'setup s':>8s} {'epoch s':>8s} "
        f"{'images/s':>9s} {'MiB/epoch':>10s} {'vs input':>9s}"
    )
    baseline: dict[int, float] = {}
    for row in rows:
        if row.strategy == "input":
            baseline[row.micro_batch_size] = row.epoch_s
        macro = "-" if row.macro_batch_size is None else str(row.macro_batch_size)
        print(
            f"{row.strategy:15s} {row.micro_batch_size:6d} {macro:>6s} {row.setup_s:8.3f} "
            f"{row.epoch_s:8.3f} {row.images_per_s:9.0f} {row.bytes_per_epoch / 2**20:10.1f} "
            f"{baseline[row.micro_batch_size] / row.epoch_s:8.2f}x"
        )


if __name__ == "__main__":
    main()
