"""The device side of a resident dataset: its variables, and batches taken from them.

`DeviceStorage` holds the two `tf.Variable`s (images, labels) that a `ResidentDataset` and all
its views share, and counts uploads. `take_rows` reads a batch (a slice when the rows are
consecutive, else a gather, on the device); `GatherRows` is the same gather as a Keras layer, so
that `fit` gathers inside the compiled step.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prefetch.tf._device import upload


class DeviceStorage:
    """The device variables that a dataset and all its views share, and the upload count."""

    def __init__(self, images: Any, labels: Any | None, device: str) -> None:
        self.device = device
        self.uploads = 0
        self.images = upload(images, device)
        self.uploads += 1
        self.host_labels = None if labels is None else np.asarray(labels)
        self.labels = None if labels is None else upload(self.host_labels, device, strict=False)
        self.rows = int(self.images.shape[0])


def take_rows(storage: DeviceStorage, rows: np.ndarray) -> tuple[Any, Any]:
    """The batch at `rows`: a slice when they are consecutive, else a gather (on the device)."""
    first = int(rows[0])
    if int(rows[-1]) - first == len(rows) - 1 and np.all(np.diff(rows) == 1):
        images = storage.images[first : first + len(rows)]
        labels = None if storage.labels is None else storage.labels[first : first + len(rows)]
    else:
        indices = tf.constant(rows)
        images = tf.gather(storage.images, indices)
        labels = None if storage.labels is None else tf.gather(storage.labels, indices)
    return images, labels


class GatherRows(keras.layers.Layer):  # type: ignore[misc]
    """Keras layer: int64 rows -> the images at those rows, gathered on the device."""

    def __init__(self, storage: DeviceStorage) -> None:
        super().__init__(trainable=False, name="resident_rows")
        self._storage = storage  # a plain object: Keras does not track the data as a weight

    def call(self, rows: Any) -> Any:
        return tf.gather(self._storage.images, rows)

    def compute_output_spec(self, rows: Any) -> Any:
        return keras.KerasTensor((rows.shape[0], *self._storage.images.shape[1:]), "uint8")
