"""TensorFlow stages for prefetch. Importing this module imports TensorFlow."""

from prefetch.tf.callbacks import InputStatsCallback
from prefetch.tf.dataset import dataset, output_signature, restore_malloc_thresholds
from prefetch.tf.queue_runner import QueueRunner

__all__ = [
    "InputStatsCallback",
    "QueueRunner",
    "dataset",
    "output_signature",
    "restore_malloc_thresholds",
]
