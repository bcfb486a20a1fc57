"""prefetch.tf.dataset(loader): a Loader as a tf.data.Dataset of (images, labels).

Each iteration of the dataset is a new epoch of the loader, so `model.fit(ds, epochs=N)` works.
The loader already runs ahead of the consumer, so tf.data's autotuning is off and only a
one-batch prefetch is added, which moves the numpy-to-tensor handoff off the training step.

TensorFlow wraps Python errors raised in a generator in its own error types; the original is
recorded on the loader and re-raised when `with loader:` exits (or by `loader.close()`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from prefetch.loader import Loader

log = logging.getLogger(__name__)

# glibc's own ceiling for its dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX),
# and the trim threshold it pairs with it (twice the mmap threshold).
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def restore_malloc_thresholds() -> bool:
    """Undo TensorFlow's process-wide `M_TRIM_THRESHOLD=128 kb` malloc patch (glibc only).

    A running `from_generator` dataset sets glibc's trim threshold to 128 KiB, which also pins
    the mmap threshold at 128 KiB: every later image-sized malloc becomes mmap + munmap with
    fresh page faults, and Pillow decode in threads slows by about a quarter. This sets the
    thresholds to where glibc's dynamic tuning would have taken them (32 MiB mmap, 64 MiB trim).
    Returns True if it applied them.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    applied &= libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    return bool(applied)


def output_signature(loader: Loader) -> Any:
    """The `tf.TensorSpec` structure of the loader's batches."""
    height, width, channels = loader.image_shape
    fixed = loader.drop_remainder and loader.on_error == "raise"
    batch = loader.batch_size if fixed else None
    images = tf.TensorSpec((batch, height, width, channels), tf.uint8, name="images")
    if loader.label_mode is None:
        return images
    if loader.label_mode == "int":
        labels = tf.TensorSpec((batch,), tf.int32, name="labels")
    elif loader.label_mode == "binary":
        labels = tf.TensorSpec((batch, 1), tf.float32, name="labels")
    else:
        labels = tf.TensorSpec((batch, len(loader.class_names)), tf.float32, name="labels")
    return (images, labels)


def dataset(loader: Loader, *, malloc_fix: bool = True) -> tf.data.Dataset:
    """A `tf.data.Dataset` of the loader's batches, with a static `output_signature`.

    Each iteration runs one epoch of `loader`. When the loader raises on every bad file
    (`on_error="raise"`), the dataset knows its length, so Keras shows epoch progress.
    `malloc_fix` applies `restore_malloc_thresholds()` as each epoch starts (after TensorFlow
    has applied its patch).
    """

    def batches() -> Iterator[Any]:
        if malloc_fix:
            restore_malloc_thresholds()
        try:
            for batch in loader:
                yield tuple(batch) if loader.label_mode is not None else batch
        except Exception as error:
            loader.record_undelivered_error(error)
            raise

    ds = tf.data.Dataset.from_generator(batches, output_signature=output_signature(loader))
    if loader.on_error == "raise":
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(loader)))
    ds = ds.prefetch(1)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.threading.private_threadpool_size = 1
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)
