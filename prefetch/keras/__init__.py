"""Keras 3 stages for prefetch, for every Keras backend. Importing this module imports Keras
(and so the backend `KERAS_BACKEND` names), never TensorFlow for another backend.

- `dataset`: a Loader as a `keras.utils.PyDataset` (`LoaderPyDataset`) for `fit`, `evaluate`
  and `predict`, sharded by process in a multi-process JAX job (`jax_processes`).
"""

# ruff: noqa: E402  (the framework check comes before the imports that need it)
from prefetch._extras import require

require(
    "keras",
    adapter="prefetch.keras",
    framework="Keras 3",
    extra="keras",
    alternative="with TensorFlow installed, prefetch.tf.dataset(loader)",
)

from prefetch.keras._dataset import LoaderPyDataset, dataset, jax_processes

__all__ = ["LoaderPyDataset", "dataset", "jax_processes"]
