"""A measurement tool, not part of the data path: three ways of feeding a compiled train step.

`feeding_benchmark` times one epoch of a small compiled train step (softmax regression, SGD)
fed from the host, from the whole dataset uploaded once, and from macro-batches uploaded one
after the other; `benchmarks/feeding_strategies.py` prints its rows. Importing it imports
TensorFlow. It runs in the caller's thread and leaves nothing behind but the rows.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from prefetch._checks import positive
from prefetch.tf import resolve_device


@dataclass(frozen=True)
class FeedingRow:
    """One measurement of `feeding_benchmark` (which makes them; its fields, by name):

    - `strategy`: "input", "shared all" or "shared batched".
    - `micro_batch_size`: samples per train step.
    - `macro_batch_size`: samples per upload with "shared batched" (None where it does not
      apply).
    - `setup_s`: the one-time upload, in seconds.
    - `epoch_s`: the median epoch, in seconds.
    - `images_per_s`: images trained on per second in that epoch.
    - `bytes_per_epoch`: what crossed from host to device in an epoch, besides indices.
    - `device`: where the step ran.
    """

    strategy: str
    micro_batch_size: int
    macro_batch_size: int | None
    setup_s: float
    epoch_s: float
    images_per_s: float
    bytes_per_epoch: int
    device: str


def _train_steps(
    image_shape: tuple[int, ...], classes: int, micro: int, device: str
) -> tuple[Any, Any]:
    """A small compiled train step (softmax regression, SGD) in two feeding forms.

    `step(images, labels)` takes the batch; `step_at(images, labels, start)` slices the batch
    `[start, start + micro)` out of tensors that are already on the device.
    """
    features = int(np.prod(image_shape))
    with tf.device(device):
        weights = tf.Variable(tf.zeros((features, classes)))
        bias = tf.Variable(tf.zeros((classes,)))
    optimizer_rate = 0.01

    def train(images: Any, labels: Any) -> Any:
        x = tf.reshape(tf.cast(images, tf.float32) / 255.0, (-1, features))
        with tf.GradientTape() as tape:
            logits = x @ weights + bias
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
        grad_w, grad_b = tape.gradient(loss, [weights, bias])
        weights.assign_sub(optimizer_rate * grad_w)
        bias.assign_sub(optimizer_rate * grad_b)
        return loss

    batch_spec = tf.TensorSpec((None, *image_shape), tf.uint8)
    labels_spec = tf.TensorSpec((None,), tf.int32)
    step = tf.function(train, input_signature=[batch_spec, labels_spec])

    def train_at(images: Any, labels: Any, start: Any) -> Any:
        return train(images[start : start + micro], labels[start : start + micro])

    step_at = tf.function(
        train_at, input_signature=[batch_spec, labels_spec, tf.TensorSpec((), tf.int32)]
    )
    return step, step_at


def feeding_benchmark(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    micro_batch_sizes: Sequence[int] = (32, 128),
    macro_batch_sizes: Sequence[int] = (512, 2048),
    epochs: int = 3,
    device: str | None = None,
) -> list[FeedingRow]:
    """Time one epoch of a small compiled train step under three ways of feeding it.

    - "input": every micro-batch is passed in from host memory (a host-to-device copy each).
    - "shared all": the whole dataset is uploaded once; the step slices its batch by index.
    - "shared batched": macro-batches of `macro_batch_size` samples are uploaded one after
      the other; the step slices micro-batches out of the current one by index.

    Each configuration runs one warm-up epoch (tracing) and `epochs` timed ones; rows report
    the median. Every strategy runs the same floor(N / micro) full micro-batches. Returns the
    `FeedingRow`s in order.

    Parameters:

    - `images`: the samples, uint8 of shape `(N, ...)`.
    - `labels`: their int class indices, shape `(N,)`, in `[0, classes)`.
    - `micro_batch_sizes`: the train-step batch sizes to measure, each an int >= 1.
    - `macro_batch_sizes`: the upload sizes (in samples) to measure with "shared batched".
    - `epochs`: timed epochs per configuration, after one warm-up epoch.
    - `device`: where the step runs, such as `"/gpu:0"`; `None` for TensorFlow's default
      device (the first GPU, else the CPU).
    """
    images = np.asarray(images)
    labels = np.asarray(labels, np.int32)
    if images.dtype != np.uint8 or len(images) != len(labels) or len(images) == 0:
        raise ValueError(
            f"images must be uint8 with one label each, got {images.dtype} {images.shape} "
            f"and {labels.shape[0]} labels"
        )
    positive("epochs", epochs)
    name = resolve_device(device)
    classes = int(labels.max()) + 1
    sample_bytes = int(np.prod(images.shape[1:])) + labels.itemsize
    rows: list[FeedingRow] = []
    for micro in (positive("micro_batch_size", m) for m in micro_batch_sizes):
        count = len(images) // micro * micro
        if count == 0:
            raise ValueError(f"micro_batch_size {micro} is larger than the {len(images)} images")
        x, y = images[:count], labels[:count]
        step, step_at = _train_steps(images.shape[1:], classes, micro, name)
        every_batch = count * sample_bytes
        run = functools.partial(_input_epoch, step, x, y, micro)
        rows.append(_measure("input", micro, None, 0.0, run, epochs, count, every_batch, name))

        began = time.perf_counter()
        with tf.device(name):
            all_x, all_y = tf.identity(x), tf.identity(y)
        all_x[:1].numpy()  # waits for the upload to finish
        setup_s = time.perf_counter() - began
        run = functools.partial(_shared_epoch, step_at, all_x, all_y, micro)
        rows.append(_measure("shared all", micro, None, setup_s, run, epochs, count, 0, name))
        del all_x, all_y, run

        for macro in (positive("macro_batch_size", m) for m in macro_batch_sizes):
            macro = max(macro // micro, 1) * micro  # whole micro-batches per macro-batch
            run = functools.partial(_batched_epoch, step_at, x, y, micro, macro, name)
            rows.append(
                _measure("shared batched", micro, macro, 0.0, run, epochs, count, every_batch, name)
            )
    return rows


def _input_epoch(step: Any, x: np.ndarray, y: np.ndarray, micro: int) -> Any:
    loss = None
    for start in range(0, len(x), micro):
        loss = step(x[start : start + micro], y[start : start + micro])
    return loss


def _shared_epoch(step_at: Any, all_x: Any, all_y: Any, micro: int) -> Any:
    loss = None
    for start in range(0, int(all_x.shape[0]), micro):
        loss = step_at(all_x, all_y, tf.constant(start, tf.int32))
    return loss


def _batched_epoch(
    step_at: Any, x: np.ndarray, y: np.ndarray, micro: int, macro: int, device: str
) -> Any:
    loss = None
    for first in range(0, len(x), macro):
        with tf.device(device):
            part_x = tf.identity(x[first : first + macro])
            part_y = tf.identity(y[first : first + macro])
        for start in range(0, int(part_x.shape[0]), micro):
            loss = step_at(part_x, part_y, tf.constant(start, tf.int32))
    return loss


def _measure(
    strategy: str,
    micro: int,
    macro: int | None,
    setup_s: float,
    run_epoch: Callable[[], Any],
    epochs: int,
    count: int,
    bytes_per_epoch: int,
    device: str,
) -> FeedingRow:
    run_epoch().numpy()  # warm-up: traces the step; .numpy() waits for the device
    times = []
    for _ in range(epochs):
        began = time.perf_counter()
        run_epoch().numpy()
        times.append(time.perf_counter() - began)
    epoch_s = statistics.median(times)
    return FeedingRow(
        strategy, micro, macro, setup_s, epoch_s, count / epoch_s, bytes_per_epoch, device
    )
