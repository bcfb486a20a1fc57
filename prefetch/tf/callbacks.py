"""InputStatsCallback: report per epoch how long Keras waited for input, and the image rate."""

from __future__ import annotations

from typing import Any

import keras

from prefetch.runtime import Loader, LoaderStats


class InputStatsCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Adds `input_wait_fraction` and `images_per_s` for the epoch to Keras `logs`.

    `input_wait_fraction` is the share of the epoch's iteration time that training spent
    blocked waiting for the loader: near 0 means compute-bound, large means input-bound.

    Parameters:

    - `loader`: the `Loader` that feeds the training (through `prefetch.tf.dataset`); its
      `stats()` are read at the start and the end of each epoch.
    """

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self.loader = loader
        self._start: LoaderStats | None = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = self.loader.stats()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None or self._start is None:
            return
        end = self.loader.stats()
        elapsed = end.elapsed_s - self._start.elapsed_s
        if elapsed <= 0:
            return
        logs["input_wait_fraction"] = (end.consumer_wait_s - self._start.consumer_wait_s) / elapsed
        logs["images_per_s"] = (end.images - self._start.images) / elapsed
