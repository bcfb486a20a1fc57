"""Resident macro-batches: a loader's epochs uploaded K batches at a time, sliced on the device.

Contract: `resident_stream(loader, macro_batches=K)` checks that two macro-batches fit the
memory budget (else `DoesNotFitError`). Iterating the `ResidentStream` runs one loader epoch: a
background thread (one per epoch, started at the first next(), ended with the epoch or when the
iterator is closed) concatenates K loader batches and uploads them as one tensor; at most
`STREAM_BUFFERS` (2) macro-batches are on the device at once (double buffer), not counting
tensors the consumer keeps. The consumer's thread slices micro-batches there. A loader error
reaches the consumer as itself. The stream does not own the loader.
Rationale and examples: docs/tensorflow.md, section "Device-resident data".
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from prefetch._checks import positive
from prefetch._messages import suggest_keywords
from prefetch.background import Background
from prefetch.coordinator import POLL_S
from prefetch.runtime import Loader
from prefetch.tf._budget import (
    STREAM_BUFFERS,
    check_budget,
    does_not_fit,
    sample_bytes,
)
from prefetch.tf._device import resolve_device


class ResidentStream:
    """A loader's epochs, uploaded `macro_batches` loader batches at a time, served as
    micro-batches sliced on the device. Made by `resident_stream()`, not by hand.

    Iterating runs one epoch of the loader and yields `(images, labels)` tensors on `device`
    (images alone with `label_mode=None`), in the loader's order. A background thread
    assembles and uploads the next macro-batch while the current one is consumed; at most
    `STREAM_BUFFERS` (2) macro-batches are on the device at once, not counting tensors you keep.

    Parameters (given by `resident_stream`, and kept as attributes of the same names):

    - `loader`: the `Loader` streamed.
    - `macro_batches`: loader batches per upload.
    - `micro_batch_size`: samples per batch served.
    - `device`: the device's full name.
    """

    def __init__(
        self, loader: Loader, macro_batches: int, micro_batch_size: int, device: str
    ) -> None:
        self.loader = loader
        self.macro_batches = macro_batches
        self.micro_batch_size = micro_batch_size
        self.device = device
        self.uploads = 0  # macro-batches uploaded so far, over all epochs

    def __len__(self) -> int:
        """Micro-batches per epoch, if no sample is skipped."""
        sizes = [len(batch) for batch in self.loader.batch_indices(self.loader.epoch)]
        k = self.macro_batches
        macro_sizes = [sum(sizes[i : i + k]) for i in range(0, len(sizes), k)]
        return sum(math.ceil(size / self.micro_batch_size) for size in macro_sizes)

    def __iter__(self) -> Iterator[Any]:
        """One epoch; the upload thread starts at the first next() and ends with the epoch."""
        return self._run_epoch()

    def _run_epoch(self) -> Iterator[Any]:
        buffers = threading.Semaphore(STREAM_BUFFERS)
        stop = threading.Event()
        uploads = Background(self._uploads(buffers, stop), depth=1, name="prefetch-resident-upload")
        micro = self.micro_batch_size
        try:
            for images, labels in uploads:
                for start in range(0, int(images.shape[0]), micro):
                    with tf.device(self.device):
                        x = images[start : start + micro]
                        y = None if labels is None else labels[start : start + micro]
                    yield x if y is None else (x, y)
                del images, labels, x, y
                buffers.release()  # the upload thread may now fill this buffer again
        finally:
            stop.set()
            uploads.close()

    def _uploads(self, buffers: threading.Semaphore, stop: threading.Event) -> Iterator[Any]:
        """Upload thread body: K loader batches -> one host array -> one device tensor."""
        epoch = iter(self.loader)
        try:
            while True:
                batches = list(itertools.islice(epoch, self.macro_batches))
                if not batches:
                    return
                images = np.concatenate([batch.images for batch in batches])
                labels = None
                if self.loader.options.label_mode is not None:
                    labels = np.concatenate([batch.labels for batch in batches])
                del batches  # the loader may reuse those slots now
                while not buffers.acquire(timeout=POLL_S):
                    if stop.is_set():
                        return
                with tf.device(self.device):
                    on_device = tf.identity(images)
                    labels_on_device = None if labels is None else tf.identity(labels)
                self.uploads += 1
                yield on_device, labels_on_device
        finally:
            epoch.close()

    def __repr__(self) -> str:
        return (
            f"ResidentStream({self.loader!r}, macro_batches={self.macro_batches}, "
            f"micro_batch_size={self.micro_batch_size}, device={self.device!r})"
        )


@suggest_keywords
def resident_stream(
    loader: Loader,
    *,
    macro_batches: int,
    micro_batch_size: int | None = None,
    device: str | None = None,
    memory_budget: int | None = None,
) -> ResidentStream:
    """Stream `loader` to `device` in macro-batches of `macro_batches` loader batches, double
    buffered, and serve micro-batches of `micro_batch_size` samples sliced there.

    Micro-batches do not straddle macro-batches, so a macro-batch's last one is shorter when
    `micro_batch_size` does not divide it. Raises `DoesNotFitError` when two macro-batches
    exceed `memory_budget`.

    Parameters:

    - `loader`: the `Loader` to stream; each iteration of the `ResidentStream` is one of its
      epochs.
    - `macro_batches`: loader batches per upload, an int >= 1.
    - `micro_batch_size`: samples per batch served; default the loader's `batch_size`.
    - `device`: where the macro-batches go, such as `"/gpu:0"`; None for GPU:0 if there is
      one, else CPU:0.
    - `memory_budget`: the bytes the two macro-batch buffers may take on the device; default
      `device_memory_budget(device)`.
    """
    if not isinstance(loader, Loader):
        raise TypeError(f"loader must be a prefetch.Loader, got {type(loader).__name__}")
    k = positive("macro_batches", macro_batches)
    micro = loader.options.batch_size if micro_batch_size is None else micro_batch_size
    micro = positive("micro_batch_size", micro)
    name = resolve_device(device)
    budget = check_budget(memory_budget, name)
    batch_bytes = loader.options.batch_size * sample_bytes(loader)
    needed = STREAM_BUFFERS * k * batch_bytes
    if needed > budget:
        size = loader.options.batch_size
        what = f"macro_batches={k} ({STREAM_BUFFERS} buffers of {k} batches of {size})"
        raise does_not_fit(what, needed, budget, batch_bytes)
    return ResidentStream(loader, k, micro, name)
