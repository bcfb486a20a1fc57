"""Feeding every batch through the Python call versus a queue-runner stage, on the same CNN.

The classic experiment: moving a training loop from feed_dict-style input (for each step, load
and decode the batch in Python, then call the step with it; nothing overlaps) to a queue fed by
background threads made training 36.8% faster. This demo runs both on the same small CNN
(`prefetch.testing.small_cnn`), the same images and the same number of steps:

- feed:  decode the batch in the main thread with `prefetch.decode_image`, then call a
         `tf.function` training step with the arrays.
- queue: a `prefetch.Loader` (``--workers`` threads) feeds a `prefetch.tf.QueueRunner`; the
         `tf.function` training step takes its batch with `dequeue_many` inside the graph.

It prints time per step, images/s and the measured difference. The first ``--warmup`` steps of
each run (tracing, filling the queue) are not timed. Timings on a shared machine are noisy.

    python demos/queue_vs_feed.py [--steps 60] [--batch-size 32] [--image-size 64]
                                  [--workers 1] [--folder root/<class>/<image>]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import prefetch
from prefetch.testing import small_cnn, write_image_folder

# Generated data: width x height of each JPEG (decode and resize are the CPU work per batch).
SOURCE_SIZE = (320, 240)
CLASSES = ("circle", "square", "triangle")
# Queue capacity, in batches. With the loader's window (depth 2) and the batch in the feeder's
# hand, the queue stage may start the timed steps with this many + 3 batches decoded ahead.
QUEUE_BATCHES = 1


def make_train_step(model: Any) -> Callable[[Any, Any], Any]:
    """One optimiser step on (images, labels), the same computation for both stages."""
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(images: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return train_step


def fresh_model(size: int, classes: int) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    return small_cnn(size, classes)


def run_feed(
    folder: prefetch.ImageFolder, args: argparse.Namespace, classes: int
) -> tuple[float, float, float]:
    """Feed style: decode each batch in Python, then call the step. (s, decode s, loss)."""
    import tensorflow as tf

    step = tf.function(make_train_step(fresh_model(args.image_size, classes)))
    options = prefetch.DecodeOptions((args.image_size, args.image_size))
    order = np.random.default_rng(0).permutation(len(folder.paths))
    position = 0

    def next_batch() -> tuple[np.ndarray, np.ndarray]:
        nonlocal position
        rows = [order[(position + i) % len(order)] for i in range(args.batch_size)]
        position += args.batch_size
        images = np.stack([prefetch.decode_image(str(folder.paths[r]), options) for r in rows])
        return images, folder.labels[rows].astype(np.int32)

    for _ in range(args.warmup):
        step(*next_batch())
    decode_s = 0.0
    start = time.perf_counter()
    for _ in range(args.steps):
        loaded = time.perf_counter()
        batch = next_batch()
        decode_s += time.perf_counter() - loaded
        loss = step(*batch)
    float(loss)  # wait for the last step (on a GPU, calls return before the step is done)
    return time.perf_counter() - start, decode_s, float(loss)


def run_queue(
    folder: prefetch.ImageFolder, args: argparse.Namespace, classes: int
) -> tuple[float, float]:
    """Queue style: a Loader feeds a QueueRunner; the step dequeues its batch. (s, loss)."""
    import tensorflow as tf

    train_step = make_train_step(fresh_model(args.image_size, classes))
    loader = prefetch.Loader(
        folder,
        batch_size=args.batch_size,
        image_size=(args.image_size, args.image_size),
        workers=args.workers,
        seed=0,
    )
    runner = prefetch.tf.QueueRunner(loader, capacity=QUEUE_BATCHES * args.batch_size)

    @tf.function
    def step() -> Any:
        return train_step(*runner.dequeue_many(args.batch_size))

    coord = prefetch.Coordinator()
    with loader, coord:  # leaving: stop the feeder (wakes it if blocked), join, close
        runner.create_threads(coord=coord, start=True)
        for _ in range(args.warmup):
            step()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        float(loss)  # wait for the last step
        elapsed = time.perf_counter() - start
    return elapsed, float(loss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="timed steps per stage")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64, help="square side fed to the CNN")
    parser.add_argument("--workers", type=int, default=1, help="loader threads (queue stage)")
    parser.add_argument("--per-class", type=int, default=100, help="generated images per class")
    parser.add_argument("--folder", type=Path, help="use this root/<class>/<image> folder")
    args = parser.parse_args()
    for name in ("steps", "warmup", "batch_size", "image_size", "workers", "per_class"):
        least = 0 if name == "warmup" else 1
        if getattr(args, name) < least:
            parser.error(
                f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}"
            )

    with tempfile.TemporaryDirectory() as tmp:
        if args.folder is None:
            root = write_image_folder(
                Path(tmp), class_names=CLASSES, per_class=args.per_class, size=SOURCE_SIZE
            )
            where = (
                f"{len(CLASSES) * args.per_class} generated {SOURCE_SIZE[0]}x{SOURCE_SIZE[1]} JPEGs"
            )
        else:
            root, where = args.folder, str(args.folder)
        folder = prefetch.ImageFolder(root)
        classes = len(folder.class_names)
        feed_s, decode_s, feed_loss = run_feed(folder, args, classes)
        queue_s, queue_loss = run_queue(folder, args, classes)

    print(
        f"small_cnn on {where}: {args.steps} timed steps of {args.batch_size} images at "
        f"{args.image_size}x{args.image_size}, {args.warmup} warm-up steps untimed; "
        f"queue stage with {args.workers} loader thread(s); {os.cpu_count()} CPU cores"
    )
    images = args.steps * args.batch_size
    print(f"\n{'stage':34s} {'time/step (ms)':>15s} {'images/s':>10s} {'last loss':>10s}")
    for name, seconds, loss in (
        ("feed (decode in Python, then step)", feed_s, feed_loss),
        ("queue (QueueRunner, dequeue_many)", queue_s, queue_loss),
    ):
        print(
            f"{name:34s} {seconds / args.steps * 1000:15.1f} {images / seconds:10.1f} {loss:10.3f}"
        )
    print(
        f"\nqueue vs feed: time per step {(queue_s - feed_s) / feed_s * 100:+.1f}%, "
        f"images/s {(feed_s / queue_s - 1) * 100:+.1f}% (the classic report: 36.8% faster)"
    )
    load_ms = decode_s / args.steps * 1000
    step_ms = (feed_s - decode_s) / args.steps * 1000
    ahead = QUEUE_BATCHES + 3
    print(
        f"feed run: decode P = {load_ms:.1f} ms/batch, step C = {step_ms:.1f} ms/batch; "
        f"full overlap would give max(P / {args.workers} thread(s), C) = "
        f"{max(load_ms / args.workers, step_ms):.1f} ms/step, if the threads had cores to spare."
    )
    print(
        f"The queue stage may begin its timed steps up to {ahead} batches ahead "
        f"({ahead / args.steps:.0%} of {args.steps} steps); raise --steps to shrink that."
    )


if __name__ == "__main__":
    main()
