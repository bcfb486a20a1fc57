"""TensorFlow stages for prefetch. Importing this module imports TensorFlow."""

from prefetch.tf.callbacks import InputStatsCallback
from prefetch.tf.dataset import dataset, output_signature, restore_malloc_thresholds

__all__ = ["InputStatsCallback", "dataset", "output_signature", "restore_malloc_thresholds"]
