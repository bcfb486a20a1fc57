"""DeviceLoader: a Loader's batches as torch tensors on a device, each copied one batch ahead.

Contract:

- Iterating a `DeviceLoader` runs one epoch of its loader and yields `(images, labels)`:
  images `(N, C, H, W)` in the asked `memory_format` and `dtype` on `device`, labels int64
  `(N,)` for `label_mode="int"` (float32 for "categorical" and "binary"), on `device`; the
  images alone with `label_mode=None`. Every tensor is the consumer's own: never a view of a
  loader slot, never overwritten by a later batch.
- On a CUDA device each batch is copied from its slot into one of two pinned host buffers, sent
  with `non_blocking` copies on a side stream and converted there (layout, dtype,
  normalisation), one batch ahead: the copy of batch k+1 runs while step k runs. The
  consumer's stream waits for an event before it uses the batch, and each tensor is recorded on
  that stream for PyTorch's caching allocator. A pinned buffer is refilled only after the copy
  that read it has finished. On a CPU device the same conversion runs one batch ahead in a
  background thread of the epoch (torch's operations release the GIL), without pinning, so it
  overlaps the step; the thread ends with the epoch, or when its iteration is closed.
- Under `torch.distributed` (initialized, world size > 1) the loader is sharded by rank with
  `Loader.shard` when the DeviceLoader is made, as `prefetch.tf.dataset` does for tf.distribute.
- An error of batch k+1, met while reading ahead, is raised when the consumer asks for batch
  k+1. `state_dict()` names the first batch not handed to the consumer (the one read ahead is
  not counted), also once the loop has ended early: a `break`, an exception, `close()`, or the
  iterator collected (`prefetch.plan.Handoff`).
- Not thread-safe: one consumer iterates it.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from prefetch.plan import Handoff
from prefetch.runtime import Batch, Loader

# Pinned host buffers per DeviceLoader: one being copied to the device while the next is filled.
PINNED_BUFFERS = 2


class _Ready(NamedTuple):
    """A batch on the device (or on its way there): its tensors and the event that ends the copy."""

    images: torch.Tensor
    labels: torch.Tensor | None
    event: torch.cuda.Event | None


class _Pinned:
    """One pinned host buffer pair and the event recorded after the copy that read it."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor | None) -> None:
        self.images = images
        self.labels = labels
        self.copied: torch.cuda.Event | None = None


def _labels_dtype(label_mode: str | None) -> torch.dtype | None:
    return None if label_mode is None else torch.int64 if label_mode == "int" else torch.float32


def _channel_values(name: str, value: float | Sequence[float] | None, channels: int) -> Any:
    if value is None:
        return None
    values = [float(value)] * channels if isinstance(value, (int, float)) else list(value)
    if len(values) != channels:
        raise ValueError(
            f"{name} needs one value per channel ({channels} for this loader's color_mode), "
            f"got {len(values)}: {value!r}"
        )
    if name == "std" and any(v <= 0 for v in values):
        raise ValueError(f"std must be > 0 for every channel, got {value!r}")
    return values


class DeviceLoader:
    """A `Loader`'s epochs as `(images, labels)` torch tensors on a device, copied ahead.

    Each iteration is the loader's next epoch. Images come as `(N, C, H, W)` tensors, the
    PyTorch convention, in `memory_format` (`torch.channels_last`, the default, costs no
    transpose: it is the loader's NHWC bytes; `torch.contiguous_format` is plain NCHW). Labels
    come as int64 for `label_mode="int"`, what `nn.CrossEntropyLoss` takes. Only uint8 pixels
    cross to the device: the float conversion and `mean`/`std` normalisation run there. On a
    CUDA device the copy of the next batch (pinned memory, `non_blocking`, a side stream)
    overlaps the current step. `len()` is the loader's batches per epoch.

    The DeviceLoader does not own the loader: use `with loader:` around training, which keeps
    the workers across epochs and closes them at the end.

    Parameters:

    - `loader`: the `Loader` to read.
    - `device`: where the tensors go: `"cpu"`, `"cuda"`, `"cuda:1"`, or a `torch.device`.
    - `dtype`: of the images: `torch.uint8` (pixels as they are), or a floating dtype
      (`torch.float32`, `torch.float16`, `torch.bfloat16`): pixels scaled to [0, 1], then
      normalised with `mean` and `std` when given. With `torch.autocast`, float32 is right
      (autocast casts inside the model); without it, the model's own dtype.
    - `memory_format`: `torch.channels_last` or `torch.contiguous_format`.
    - `mean`, `std`: per-channel values in [0, 1] units, as torchvision's `Normalize` after
      `ToTensor` (ImageNet: `(0.485, 0.456, 0.406)`, `(0.229, 0.224, 0.225)`); one float for
      every channel. Floating `dtype` only.
    - `distributed`: shard the loader by this process's rank: `None` (the default) does when
      `torch.distributed` is initialized with a world size above 1, `True` requires it, `False`
      never. The loader then yields shard `rank` of `world_size` (`Loader.shard`), so each rank
      reads its own disjoint share of every epoch; give every rank the same `seed`.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.channels_last,
        mean: float | Sequence[float] | None = None,
        std: float | Sequence[float] | None = None,
        distributed: bool | None = None,
    ) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"DeviceLoader reads a prefetch.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())  # type: ignore[unreachable]
        if dtype != torch.uint8 and not dtype.is_floating_point:
            raise ValueError(f"dtype must be torch.uint8 or a floating dtype, got {dtype}")
        if dtype == torch.uint8 and (mean is not None or std is not None):
            raise ValueError("mean and std normalise floats: pass a floating dtype with them")
        if memory_format not in (torch.channels_last, torch.contiguous_format):
            raise ValueError(
                "memory_format must be torch.channels_last or torch.contiguous_format, "
                f"got {memory_format}"
            )
        self.dtype = dtype
        self.memory_format = memory_format
        channels = loader.image_shape[2]
        mean_values = _channel_values("mean", mean, channels) or [0.0] * channels
        std_values = _channel_values("std", std, channels) or [1.0] * channels
        # x / 255 then (x - mean) / std, as one multiply-add on the device, per channel of the
        # loader's NHWC pixels: x * scale + bias.
        pairs = zip(mean_values, std_values, strict=True)
        self._scale = torch.tensor([1 / (s * 255) for s in std_values]).to(self.device)
        self._bias = torch.tensor([-m / s for m, s in pairs]).to(self.device)
        self._cuda = self.device.type == "cuda"
        self._side = torch.cuda.Stream(self.device) if self._cuda else None  # type: ignore[no-untyped-call]
        self._pinned: list[_Pinned] = []
        self._turn = 0
        self._handoff = Handoff(loader.state_dict)  # the first batch not handed out
        self._shard(distributed)

    def _shard(self, distributed: bool | None) -> None:
        ready = dist.is_available() and dist.is_initialized()
        if distributed is None:
            distributed = ready and dist.get_world_size() > 1
        if not distributed:
            return
        if not ready:
            raise RuntimeError(
                "distributed=True needs torch.distributed.init_process_group() first (or pass "
                "distributed=None to shard only when it is initialized)"
            )
        self.loader.shard(dist.get_world_size(), dist.get_rank())

    def __len__(self) -> int:
        """Batches per epoch (of this rank's share under torch.distributed)."""
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        """One epoch of the loader, on the device, one batch copied ahead."""
        return self._epoch()

    def dataset(self) -> LoaderDataset:
        """This DeviceLoader as a `torch.utils.data.IterableDataset` (see `LoaderDataset`)."""
        return LoaderDataset(self)

    def state_dict(self) -> dict[str, int]:
        """The loader's `state_dict()`, naming the first batch not handed out: the batch read
        ahead is not counted, during the loop or after it ended (a `break`, an exception,
        `close()`). Take it between steps, on the thread that iterates."""
        return self._handoff.state()

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The loader's `load_state_dict(state)`: the next iteration resumes there."""
        self.loader.load_state_dict(state)
        self._handoff.begin()  # what the last iteration was handed is no longer the state

    # ---- the epoch ---------------------------------------------------------------------

    def _epoch(self) -> Generator[Any, None, None]:
        stream = iter(self.loader)
        run = self._handoff.begin()
        converter = None
        if not self._cuda:
            converter = ThreadPoolExecutor(1, thread_name_prefix="prefetch-torch-convert")
        try:
            ahead = self._read(stream, converter, run)
            while ahead is not None:
                if isinstance(ahead, BaseException):
                    raise ahead
                current = ahead
                ahead = self._read(stream, converter, run)  # the next copy, before this step
                batch = self._hand_out(current)
                self._handoff.handed()
                yield batch
        finally:
            if converter is not None:
                converter.shutdown(wait=True, cancel_futures=True)
            stream.close()
            self._handoff.end(run)

    def _read(
        self, stream: Iterator[Batch], converter: ThreadPoolExecutor | None, run: int
    ) -> _Ready | Future[_Ready] | BaseException | None:
        """The next batch sent towards the device (on a CPU device, a future of it being
        converted in `converter`), the error reading it raised, or None."""
        self._handoff.asking(run)
        try:
            batch = next(stream)
        except StopIteration:
            return None
        except Exception as error:  # raised when the consumer asks for this batch
            return error
        if converter is not None:
            ready: _Ready | Future[_Ready] = converter.submit(self._convert_cpu, batch)
        else:
            ready = self._send_cuda(batch)
        return ready

    def _hand_out(self, ready: _Ready | Future[_Ready]) -> Any:
        if isinstance(ready, Future):
            ready = ready.result()  # a conversion error is raised here, at its own batch
        if ready.event is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_event(ready.event)
            ready.images.record_stream(consumer)
            if ready.labels is not None:
                ready.labels.record_stream(consumer)
        if ready.labels is None:
            return ready.images
        return ready.images, ready.labels

    def _convert(self, nhwc: torch.Tensor) -> torch.Tensor:
        """uint8 NHWC -> (N, C, H, W) in the asked dtype and memory format. The arithmetic runs
        on the contiguous NHWC tensor (channel last, the fast layout for a per-channel
        broadcast): one pass to float32, one fused multiply-add in place. On one core of the
        2-core VM, 0.71-0.78 ms per 224x224 image against 0.95-0.99 for a subtract and a
        multiply on the permuted view (alternated, medians of 15). The permute at the end is a
        view with channels_last strides."""
        images = nhwc
        if self.dtype != torch.uint8:
            images = images.to(torch.float32)
            torch.addcmul(self._bias, images, self._scale, out=images)
            images = images.to(self.dtype)
        return images.permute(0, 3, 1, 2).contiguous(memory_format=self.memory_format)

    def _convert_cpu(self, batch: Batch) -> _Ready:
        host = torch.from_numpy(batch.images)
        images = self._convert(host)
        if images.untyped_storage().data_ptr() == host.untyped_storage().data_ptr():
            images = images.clone(memory_format=self.memory_format)  # never a view of a slot
        return _Ready(images.to(self.device), self._labels(batch.labels), None)

    def _labels(self, labels: np.ndarray | None) -> torch.Tensor | None:
        dtype = _labels_dtype(self.loader.options.label_mode)
        if labels is None or dtype is None:
            return None
        return torch.from_numpy(labels).to(dtype, copy=True)

    def _buffer(self, batch: Batch) -> _Pinned:
        """The next pinned buffer pair, once the copy that last read it has finished."""
        if not self._pinned:
            full = (self.loader.options.batch_size, *self.loader.image_shape)
            labels_dtype = _labels_dtype(self.loader.options.label_mode)
            for _ in range(PINNED_BUFFERS):
                images = torch.empty(full, dtype=torch.uint8, pin_memory=True)
                labels = None
                if batch.labels is not None and labels_dtype is not None:
                    shape = (self.loader.options.batch_size, *batch.labels.shape[1:])
                    labels = torch.empty(shape, dtype=labels_dtype, pin_memory=True)
                self._pinned.append(_Pinned(images, labels))
        pinned = self._pinned[self._turn]
        self._turn = (self._turn + 1) % len(self._pinned)
        if pinned.copied is not None:
            pinned.copied.synchronize()
        return pinned

    def _send_cuda(self, batch: Batch) -> _Ready:
        pinned = self._buffer(batch)
        count = len(batch.images)
        host_images = pinned.images[:count]
        host_images.copy_(torch.from_numpy(batch.images))  # the slot is free after this
        host_labels = None
        if pinned.labels is not None and batch.labels is not None:
            host_labels = pinned.labels[:count]
            host_labels.copy_(torch.from_numpy(batch.labels))
        assert self._side is not None
        with torch.cuda.stream(self._side):
            images = host_images.to(self.device, non_blocking=True)
            labels = None
            if host_labels is not None:
                labels = host_labels.to(self.device, non_blocking=True)
            pinned.copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            pinned.copied.record(self._side)
            images = self._convert(images)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(self._side)
        return _Ready(images, labels, event)


class LoaderDataset(torch.utils.data.IterableDataset[Any]):
    """A `DeviceLoader` as a `torch.utils.data.IterableDataset`, for code that expects one.

    Wrap it as `torch.utils.data.DataLoader(dataset, batch_size=None)`: the batches are
    already made, so the DataLoader must not batch them again, and the workers are the
    loader's own, so it must start none (`num_workers=0`, the default; iterating it in a
    DataLoader worker raises RuntimeError). `len()` is the batches per epoch.
    """

    def __init__(self, device_loader: DeviceLoader) -> None:
        self.device_loader = device_loader

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "prefetch's LoaderDataset runs in a DataLoader worker process: prefetch decodes "
                "in its own workers, so make the DataLoader with num_workers=0 (and "
                "batch_size=None); set the Loader's workers= instead"
            )
        return iter(self.device_loader)

    def __len__(self) -> int:
        return len(self.device_loader)

    def state_dict(self) -> dict[str, int]:
        """The DeviceLoader's `state_dict()`."""
        return self.device_loader.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The DeviceLoader's `load_state_dict(state)`."""
        self.device_loader.load_state_dict(state)
