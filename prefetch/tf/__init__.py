"""TensorFlow stages for prefetch. Importing this module imports TensorFlow.

The public names are exported here; the modules behind them are private (a leading
underscore), so no public function shadows the module it lives in:

- `_dataset`: `dataset`, `output_signature`, `restore_malloc_thresholds` (a Loader as tf.data)
- `queue_runner`: `QueueRunner`; `callbacks`: `InputStatsCallback`
- `keras_compat`: `image_dataset_from_directory` (Keras's drop-in; its argument checks in
  `_keras_args`)
- `_resident`: `resident`, `ResidentDataset`; `_resident_stream`: `resident_stream`,
  `ResidentStream`; `_device`: `device_memory_budget` and the
  one device-name check
"""

# ruff: noqa: E402  (the framework check comes before the imports that need it)
from prefetch._extras import require

require(
    "tensorflow",
    adapter="prefetch.tf",
    framework="TensorFlow",
    extra="tf",
    alternative="for Keras 3 on any backend, prefetch.keras.dataset(loader)",
)

from prefetch.errors import DoesNotFitError
from prefetch.tf._dataset import dataset, output_signature, restore_malloc_thresholds
from prefetch.tf._device import device_memory_budget
from prefetch.tf._device import resolve_device as resolve_device  # for prefetch.tools, not public
from prefetch.tf._resident import ResidentDataset, resident
from prefetch.tf._resident_stream import ResidentStream, resident_stream
from prefetch.tf.callbacks import InputStatsCallback
from prefetch.tf.keras_compat import image_dataset_from_directory
from prefetch.tf.queue_runner import QueueRunner

__all__ = [
    "DoesNotFitError",
    "InputStatsCallback",
    "QueueRunner",
    "ResidentDataset",
    "ResidentStream",
    "dataset",
    "device_memory_budget",
    "image_dataset_from_directory",
    "output_signature",
    "resident",
    "resident_stream",
    "restore_malloc_thresholds",
]
