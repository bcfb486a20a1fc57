"""TensorFlow stages for prefetch. Importing this module imports TensorFlow."""

from prefetch.tf._dataset import dataset, output_signature, restore_malloc_thresholds
from prefetch.tf._resident import (
    DoesNotFitError,
    FeedingRow,
    ResidentDataset,
    ResidentStream,
    device_memory_budget,
    feeding_benchmark,
    resident,
    resident_stream,
)
from prefetch.tf.callbacks import InputStatsCallback
from prefetch.tf.keras_compat import image_dataset_from_directory
from prefetch.tf.queue_runner import QueueRunner

__all__ = [
    "DoesNotFitError",
    "FeedingRow",
    "InputStatsCallback",
    "QueueRunner",
    "ResidentDataset",
    "ResidentStream",
    "dataset",
    "device_memory_budget",
    "feeding_benchmark",
    "image_dataset_from_directory",
    "output_signature",
    "resident",
    "resident_stream",
    "restore_malloc_thresholds",
]
