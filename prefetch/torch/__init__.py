"""PyTorch stages for prefetch. Importing this module imports PyTorch.

- `DeviceLoader`: a Loader's epochs as `(images, labels)` torch tensors on a device, in the
  layout and dtype a model takes, with the host-to-device copy of the next batch overlapped
  with the current step on CUDA; rank-sharded under `torch.distributed`.
- `LoaderDataset`: a DeviceLoader as a `torch.utils.data.IterableDataset`
  (`DataLoader(dataset, batch_size=None)`).
"""

# ruff: noqa: E402  (the framework check comes before the imports that need it)
from prefetch._extras import require

require(
    "torch",
    adapter="prefetch.torch",
    framework="PyTorch",
    extra="torch",
    alternative="iterate the prefetch.Loader itself: its batches are numpy arrays",
)

from prefetch.torch._device_loader import DeviceLoader, LoaderDataset

__all__ = ["DeviceLoader", "LoaderDataset"]
