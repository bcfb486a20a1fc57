"""Device-resident datasets: upload once, then only batch indices cross the bus.

Contract:
- `resident(images, labels)` (or `resident(loader)`) copies the data to the device once, into
  two `tf.Variable`s, after a memory-budget check. Each epoch takes a shuffled batch order
  derived from (seed, epoch) only; batches are sliced (contiguous rows) or gathered on the
  device. `subset()` and `folds()` return views that gather from the same variables: no copy.
- Iterating a `ResidentDataset` yields device tensors (custom loops). Keras `fit` trains
  `dataset.keras_model(model)` (gathers inside the step) on `dataset.index_dataset()`.
- `resident_stream(loader, macro_batches=K)` uploads K loader batches at a time in a background
  thread, at most two macro-batches on the device (double buffer), and yields micro-batches
  sliced there. The thread lives for one epoch; a loader error reaches the consumer as itself.
- `feeding_benchmark` times a train step fed from the host, from a resident dataset and from
  resident macro-batches (benchmarks/feeding_strategies.py prints its rows).
Rationale and examples: docs/tensorflow.md, section "Device-resident data".
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prefetch.autotune import available_memory_bytes
from prefetch.background import Background
from prefetch.errors import PrefetchError
from prefetch.loader import Loader
from prefetch.sources import epoch_order

# The share of a device's free memory that the budget check allows by default; the rest is
# left for the model, its activations and TensorFlow's own buffers.
BUDGET_FRACTION = 0.8
# Macro-batches of a stream on the device at once: the one being consumed, the next uploading.
STREAM_BUFFERS = 2
# How often the upload thread, waiting for a free buffer, wakes to check for a stop.
POLL_S = 0.1
SHUFFLE_MODES = ("batches", "samples", False)
# Appended to the seed to derive the fixed sample grouping of shuffle="batches".
_GROUPING_KEY = (0, 1)


class DoesNotFitError(PrefetchError, MemoryError):
    """The data would not fit in the memory budget; the message says what would.

    `needed_bytes` and `budget_bytes` are the two sides of the check; `max_macro_batches` is
    the largest `macro_batches` that `resident_stream` could use within the budget (0: none).
    """

    def __init__(self, message: str, needed_bytes: int, budget_bytes: int, max_macro_batches: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes
        self.max_macro_batches = max_macro_batches


# ---- devices and memory -------------------------------------------------------------------


def resolve_device(device: str | None = None) -> str:
    """The full name of `device` ("/device:GPU:0"); None means GPU:0 if there is one, else CPU:0.

    Raises ValueError naming the devices TensorFlow sees when `device` is not one of them.
    """
    logical: list[str] = [d.name for d in tf.config.list_logical_devices()]
    if device is None:
        gpus = [name for name in logical if tf.DeviceSpec.from_string(name).device_type == "GPU"]
        return gpus[0] if gpus else "/device:CPU:0"
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError) as error:
        raise ValueError(f"device {device!r} is not a device name such as 'GPU:0'") from error
    wanted = (str(spec.device_type).upper(), spec.device_index or 0)
    for name in logical:
        found = tf.DeviceSpec.from_string(name)
        if (found.device_type, found.device_index) == wanted:
            return name
    raise ValueError(f"device {device!r} not found; TensorFlow sees {logical}")


def device_memory_budget(device: str | None = None, *, fraction: float = BUDGET_FRACTION) -> int:
    """Bytes that may be placed on `device`: `fraction` of its free memory now.

    A GPU's free memory is TensorFlow's allocator limit for it less what TensorFlow holds there
    (`tf.config.experimental.get_memory_info`). The CPU's is the RAM the kernel reports as
    available (`MemAvailable`, or free pages where that is missing).
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    name = resolve_device(device)
    if tf.DeviceSpec.from_string(name).device_type == "CPU":
        free = available_memory_bytes()
    else:
        used = int(tf.config.experimental.get_memory_info(name)["current"])
        free = max(_allocator_limit(name) - used, 0)
    return int(free * fraction)


def _allocator_limit(name: str) -> int:
    """TensorFlow's memory limit for a GPU (its allocator's size), in bytes."""
    from tensorflow.python.client import device_lib  # no public API gives the total

    wanted = tf.DeviceSpec.from_string(name)
    for attributes in device_lib.list_local_devices():
        found = tf.DeviceSpec.from_string(attributes.name)
        if (found.device_type, found.device_index) == (wanted.device_type, wanted.device_index):
            return int(attributes.memory_limit)
    raise ValueError(f"TensorFlow reports no memory limit for {name}")


def format_bytes(count: float) -> str:
    """`count` bytes in the largest binary unit that keeps it >= 1 ("3.1 GiB")."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _does_not_fit(what: str, needed: int, budget: int, batch_bytes: int) -> DoesNotFitError:
    max_k = budget // (STREAM_BUFFERS * batch_bytes)
    if max_k >= 1:
        advice = (
            f"use prefetch.tf.resident_stream(loader, macro_batches=K) with K <= {max_k}, "
            "or a smaller image_size, or prefetch.tf.dataset(loader)"
        )
    else:
        advice = (
            "not even two batches fit: use a smaller batch_size or image_size, or "
            "prefetch.tf.dataset(loader)"
        )
    message = (
        f"{what} needs {format_bytes(needed)}, budget {format_bytes(budget)}: {advice}; "
        "or pass memory_budget= (bytes) to allow more"
    )
    return DoesNotFitError(message, needed, budget, max_k)


def _budget(memory_budget: int | None, device: str) -> int:
    if memory_budget is None:
        return device_memory_budget(device)
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
        raise ValueError(f"memory_budget must be an int number of bytes, got {memory_budget!r}")
    if memory_budget < 0:
        raise ValueError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
    return int(memory_budget)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _upload(array: Any, device: str, *, strict: bool = True) -> tf.Variable:
    """Copy `array` into a new non-trainable variable on `device` (one host-to-device copy).

    With `strict`, a variable that TensorFlow placed elsewhere (it has no kernel for that
    dtype on the device) raises RuntimeError. Labels are not strict: TensorFlow has no GPU
    kernel for int32 variables, so they stay in host memory; a batch of labels is a few bytes.
    """
    with tf.device(device):
        variable = tf.Variable(array, trainable=False)
    placed = tf.DeviceSpec.from_string(variable.device)
    wanted = tf.DeviceSpec.from_string(device)
    if strict and (placed.device_type, placed.device_index) != (
        wanted.device_type,
        wanted.device_index,
    ):
        raise RuntimeError(
            f"TensorFlow placed a {variable.dtype.name} variable on {variable.device}, not on "
            f"{device}; this device cannot hold that dtype: use uint8 or float images"
        )
    return variable


# ---- the resident dataset ----------------------------------------------------------------


class _Storage:
    """The device variables that a dataset and all its views share, and the upload count."""

    def __init__(self, images: Any, labels: Any | None, device: str) -> None:
        self.device = device
        self.uploads = 0
        self.images = _upload(images, device)
        self.uploads += 1
        self.host_labels = None if labels is None else np.asarray(labels)
        self.labels = None if labels is None else _upload(self.host_labels, device, strict=False)
        self.rows = int(self.images.shape[0])


def _check_shuffle(shuffle: Any) -> str | bool:
    if shuffle is True:
        return "batches"
    if shuffle is False or (isinstance(shuffle, str) and shuffle in SHUFFLE_MODES):
        return shuffle
    raise ValueError(f"shuffle must be 'batches', 'samples' or False, got {shuffle!r}")


def _grouping(size: int, seed: int) -> np.ndarray:
    """The fixed sample order of shuffle="batches": one permutation derived from the seed."""
    return np.random.default_rng([seed, *_GROUPING_KEY]).permutation(size).astype(np.int64)


class ResidentDataset:
    """A dataset in device memory; each epoch a shuffled order of batches sliced there.

    Made by `resident()`, `subset()` or `folds()`. Iterating runs one epoch and yields
    `(images, labels)` tensors on `device` (images alone without labels); the next iteration is
    the next epoch. For Keras `fit`, train `keras_model(model)` on `index_dataset()`.
    """

    def __init__(
        self,
        storage: _Storage,
        rows: np.ndarray,
        *,
        batch_size: int,
        shuffle: str | bool,
        seed: int,
        drop_remainder: bool,
    ) -> None:
        self._storage = storage
        self._rows = rows  # sample i of this dataset is row rows[i] of the device variables
        self.batch_size = _positive("batch_size", batch_size)
        self.shuffle = _check_shuffle(shuffle)
        self.seed = int(seed)
        self.drop_remainder = bool(drop_remainder)
        if len(self) == 0:
            raise ValueError(
                f"{len(rows)} samples with batch_size {self.batch_size} and "
                "drop_remainder=True leave no batch; lower batch_size"
            )
        self._lock = threading.Lock()
        self._next_epoch = 0

    # ---- sizes and properties ------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self._rows), self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    @property
    def num_samples(self) -> int:
        """Samples in this dataset (a view has fewer than the upload)."""
        return len(self._rows)

    @property
    def device(self) -> str:
        """The full name of the device that holds the data, such as "/device:GPU:0"."""
        return self._storage.device

    @property
    def images(self) -> tf.Variable:
        """The uploaded images: one variable shared by this dataset and all its views."""
        return self._storage.images

    @property
    def labels(self) -> tf.Variable | None:
        """The uploaded labels (shared like `images`), or None for unlabelled data."""
        return self._storage.labels

    @property
    def uploads(self) -> int:
        """How many times the images were copied to the device: 1 for a dataset and its views."""
        return self._storage.uploads

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce (0 for the first)."""
        return self._next_epoch

    @property
    def rows(self) -> np.ndarray:
        """The row of the device variables that holds each sample of this dataset (a copy)."""
        return self._rows.copy()

    # ---- epochs ------------------------------------------------------------------------

    def batch_indices(self, epoch: int) -> list[np.ndarray]:
        """The samples (numbered 0..num_samples-1) of each batch of `epoch`, in order.

        Derived from (seed, epoch) only. shuffle="batches": fixed groups, their order shuffled
        each epoch; "samples": a new permutation of the samples each epoch; False: in order.
        """
        size, batch = len(self._rows), self.batch_size
        if self.shuffle == "samples":
            order = epoch_order(size, shuffle=True, seed=self.seed, epoch=epoch)
        elif self.shuffle == "batches":
            order = _grouping(size, self.seed)
        else:
            order = np.arange(size, dtype=np.int64)
        batches = [order[i : i + batch] for i in range(0, len(self) * batch, batch)]
        if self.shuffle == "batches":
            turn = epoch_order(len(batches), shuffle=True, seed=self.seed, epoch=epoch)
            batches = [batches[i] for i in turn]
        return batches

    def _take_epoch(self) -> int:
        with self._lock:
            epoch = self._next_epoch
            self._next_epoch += 1
            return epoch

    def __iter__(self) -> Iterator[Any]:
        """One epoch of device tensors; it takes its epoch number at the first next()."""
        return self._run_epoch()

    def _run_epoch(self) -> Iterator[Any]:
        epoch = self._take_epoch()
        storage = self._storage
        for samples in self.batch_indices(epoch):
            rows = self._rows[samples]
            with tf.device(storage.device):
                images, labels = _take_rows(storage, rows)
            yield images if labels is None else (images, labels)

    # ---- Keras ---------------------------------------------------------------------------

    def index_dataset(self) -> tf.data.Dataset:
        """A `tf.data.Dataset` of `(rows, labels)` per batch, for `keras_model(model).fit`.

        `rows` are int64 rows of the device variables (so any view of the same upload can
        feed a model made by any of them); `labels` come from a host copy (a few bytes per
        sample). Each iteration takes the next epoch (one Python call makes the epoch's whole
        order; the batches are cut in tf.data) in the order of `batch_indices`.
        """
        batch = self.batch_size

        def epoch_rows(_: Any) -> tuple[np.ndarray, np.ndarray]:
            batches = [self._rows[samples] for samples in self.batch_indices(self._take_epoch())]
            padded = np.zeros((len(batches), batch), np.int64)
            for i, rows in enumerate(batches):
                padded[i, : len(rows)] = rows
            return padded, np.array([len(rows) for rows in batches], np.int64)

        def take_epoch(_: Any) -> Any:
            padded, lengths = tf.numpy_function(epoch_rows, [_], (tf.int64, tf.int64))
            padded.set_shape((None, batch))
            lengths.set_shape((None,))
            return tf.data.Dataset.from_tensor_slices((padded, lengths))

        host_labels = self._storage.host_labels
        with tf.device("/CPU:0"):  # tf.data runs on the host; keep the labels there
            labels = None if host_labels is None else tf.constant(host_labels)
        fixed = batch if self.drop_remainder else None

        def cut(padded: Any, length: Any) -> Any:
            rows = tf.ensure_shape(padded[:length], (fixed,))
            return rows if labels is None else (rows, tf.gather(labels, rows))

        ds = tf.data.Dataset.range(1).flat_map(take_epoch).map(cut)
        ds = ds.apply(tf.data.experimental.assert_cardinality(len(self)))
        return ds.prefetch(1)  # the next rows are ready while the step runs

    def keras_model(self, model: Any) -> Any:
        """A Keras model that takes `rows` (int64), gathers those images on the device, and
        runs `model` on them. It shares `model`'s layers and weights, so training it trains
        `model`; it is compiled from `model.get_compile_config()` when `model` is compiled.
        Fit it on `index_dataset()` of this dataset or of any view of the same upload; save
        `model`, not this wrapper (its gather layer holds the data and is not serializable).
        """
        rows = keras.Input(shape=(), dtype="int64", name="rows")
        trainer = keras.Model(rows, model(_GatherRows(self._storage)(rows)), name=model.name)
        if getattr(model, "compiled", False):
            trainer.compile_from_config(model.get_compile_config())
        return trainer

    # ---- views ---------------------------------------------------------------------------

    def subset(
        self,
        indices: Sequence[int] | np.ndarray,
        *,
        batch_size: int | None = None,
        shuffle: str | bool | None = None,
        seed: int | None = None,
        drop_remainder: bool | None = None,
    ) -> ResidentDataset:
        """A view of the samples at `indices` (numbered as in this dataset), on the same device
        variables: nothing is uploaded. Options default to this dataset's."""
        picked = np.asarray(indices)
        if picked.ndim != 1 or not (np.issubdtype(picked.dtype, np.integer) or picked.size == 0):
            raise ValueError(f"indices must be a 1-D sequence of ints, got shape {picked.shape}")
        picked = picked.astype(np.int64)
        if picked.size == 0:
            raise ValueError("indices is empty: a subset needs at least one sample")
        if picked.min() < 0 or picked.max() >= len(self._rows):
            raise ValueError(
                f"indices must be in [0, {len(self._rows)}), got values from {picked.min()} "
                f"to {picked.max()}"
            )
        return ResidentDataset(
            self._storage,
            self._rows[picked],
            batch_size=self.batch_size if batch_size is None else batch_size,
            shuffle=self.shuffle if shuffle is None else shuffle,
            seed=self.seed if seed is None else seed,
            drop_remainder=self.drop_remainder if drop_remainder is None else drop_remainder,
        )

    def folds(self, k: int) -> list[tuple[ResidentDataset, ResidentDataset]]:
        """`k` (train, validation) view pairs for k-fold cross-validation, on one upload.

        The samples are permuted once (from the seed) and cut into `k` near-equal folds;
        validation set i is fold i, its training set the other folds. Validation views keep
        the samples in order (shuffle=False); training views use this dataset's shuffle.
        """
        k = _positive("k", k)
        if not 2 <= k <= len(self._rows):
            raise ValueError(f"k must be in [2, {len(self._rows)}] (the samples), got {k}")
        order = np.random.default_rng([self.seed, k]).permutation(len(self._rows))
        parts = np.array_split(order, k)
        pairs = []
        for i, held_out in enumerate(parts):
            train = np.concatenate([part for j, part in enumerate(parts) if j != i])
            pairs.append((self.subset(np.sort(train)), self.subset(held_out, shuffle=False)))
        return pairs

    def __repr__(self) -> str:
        return (
            f"ResidentDataset({self.num_samples} samples on {self.device}, batch_size="
            f"{self.batch_size}, shuffle={self.shuffle!r}, uploads={self.uploads})"
        )


def _take_rows(storage: _Storage, rows: np.ndarray) -> tuple[Any, Any]:
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


class _GatherRows(keras.layers.Layer):  # type: ignore[misc]
    """Keras layer: int64 rows -> the images at those rows, gathered on the device."""

    def __init__(self, storage: _Storage) -> None:
        super().__init__(trainable=False, name="resident_rows")
        self._storage = storage  # a plain object: Keras does not track the data as a weight

    def call(self, rows: Any) -> Any:
        return tf.gather(self._storage.images, rows)

    def compute_output_spec(self, rows: Any) -> Any:
        return keras.KerasTensor((rows.shape[0], *self._storage.images.shape[1:]), "uint8")


def _read_all(loader: Loader) -> tuple[np.ndarray, np.ndarray | None]:
    """One epoch of `loader` as host arrays, in the order the loader delivers it."""
    capacity = sum(len(batch) for batch in loader.batch_indices(loader.epoch))
    images = np.empty((capacity, *loader.image_shape), np.uint8)
    labels: np.ndarray | None = None
    filled = 0
    for batch in loader:
        x, y = (batch, None) if loader.label_mode is None else batch
        images[filled : filled + len(x)] = x
        if y is not None:
            if labels is None:
                labels = np.empty((capacity, *y.shape[1:]), y.dtype)
            labels[filled : filled + len(y)] = y
        filled += len(x)
    return images[:filled], None if labels is None else labels[:filled]


def _sample_bytes(loader: Loader) -> int:
    height, width, channels = loader.image_shape
    label_bytes = {"int": 4, "binary": 4, None: 0}.get(
        loader.label_mode, 4 * len(loader.class_names)
    )
    return height * width * channels + label_bytes


def resident(
    images: Any,
    labels: Any = None,
    *,
    batch_size: int | None = None,
    shuffle: str | bool = "batches",
    seed: int | None = None,
    drop_remainder: bool = False,
    device: str | None = None,
    memory_budget: int | None = None,
) -> ResidentDataset:
    """Upload a dataset to `device` once and return it as a `ResidentDataset`.

    `images` is an array of N samples (uint8 NHWC, or any dtype and shape TensorFlow holds)
    with `labels` (N, ...) or None; or a `prefetch.Loader`, of which one epoch is decoded (in
    the loader's order: pass shuffle=False to keep source order) and uploaded, checking the
    budget before decoding. `batch_size` defaults to the loader's, else 32; `seed` to the
    loader's, else a random one. `device` None means GPU:0 if there is one, else CPU:0.
    Raises `DoesNotFitError` when the data exceed `memory_budget` (bytes; default
    `device_memory_budget(device)`).
    """
    name = resolve_device(device)
    budget = _budget(memory_budget, name)
    shuffle = _check_shuffle(shuffle)
    if isinstance(images, Loader):
        loader = images
        if labels is not None:
            raise ValueError("labels must be None when images is a Loader (it has its own)")
        batch_size = loader.batch_size if batch_size is None else batch_size
        seed = loader.seed if seed is None else seed
        sample = _sample_bytes(loader)
        count = sum(len(batch) for batch in loader.batch_indices(loader.epoch))
        needed = count * sample
        if needed > budget:
            batch_bytes = _positive("batch_size", batch_size) * sample
            raise _does_not_fit(f"the dataset ({count} images)", needed, budget, batch_bytes)
        images, labels = _read_all(loader)
    else:
        images = images if isinstance(images, (np.ndarray, tf.Tensor)) else np.asarray(images)
        if images.ndim < 1 or images.shape[0] == 0:
            raise ValueError(f"images must hold at least one sample, got shape {images.shape}")
        if labels is not None:
            labels = labels if isinstance(labels, (np.ndarray, tf.Tensor)) else np.asarray(labels)
            if labels.shape[0] != images.shape[0]:
                raise ValueError(
                    f"labels must have one entry per image: got {labels.shape[0]} labels for "
                    f"{images.shape[0]} images"
                )
            labels = np.asarray(labels)
        batch_size = 32 if batch_size is None else batch_size
        count = int(images.shape[0])
        needed = _nbytes(images) + (0 if labels is None else labels.nbytes)
        if needed > budget:
            batch_bytes = _positive("batch_size", batch_size) * max(needed // count, 1)
            raise _does_not_fit(f"the dataset ({count} samples)", needed, budget, batch_bytes)
    if seed is None:
        seed = int(np.random.default_rng().integers(2**63))
    if shuffle == "batches":
        # Store the samples in their fixed grouping, so that each batch is a contiguous slice.
        grouping = _grouping(count, seed)
        images = tf.gather(images, grouping) if isinstance(images, tf.Tensor) else images[grouping]
        labels = None if labels is None else labels[grouping]
        rows = np.empty(count, np.int64)
        rows[grouping] = np.arange(count)
    else:
        rows = np.arange(count, dtype=np.int64)
    storage = _Storage(images, labels, name)
    return ResidentDataset(
        storage,
        rows,
        batch_size=_positive("batch_size", batch_size),
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
    )


def _nbytes(array: Any) -> int:
    return int(np.prod(array.shape)) * int(tf.as_dtype(array.dtype).size)


# ---- streaming macro-batches -------------------------------------------------------------


class ResidentStream:
    """A loader's epochs, uploaded `macro_batches` loader batches at a time, served as
    micro-batches sliced on the device. Made by `resident_stream()`.

    Iterating runs one epoch of the loader and yields `(images, labels)` tensors on `device`
    (images alone with `label_mode=None`), in the loader's order. A background thread
    assembles and uploads the next macro-batch while the current one is consumed; at most
    `STREAM_BUFFERS` (2) macro-batches are on the device at once, not counting tensors you keep.
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
                if self.loader.label_mode is None:
                    images, labels = np.concatenate(batches), None
                else:
                    images = np.concatenate([x for x, _ in batches])
                    labels = np.concatenate([y for _, y in batches])
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
            epoch.close()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return (
            f"ResidentStream({self.loader!r}, macro_batches={self.macro_batches}, "
            f"micro_batch_size={self.micro_batch_size}, device={self.device!r})"
        )


def resident_stream(
    loader: Loader,
    *,
    macro_batches: int,
    micro_batch_size: int | None = None,
    device: str | None = None,
    memory_budget: int | None = None,
) -> ResidentStream:
    """Stream `loader` to `device` in macro-batches of `macro_batches` loader batches, double
    buffered, and serve micro-batches of `micro_batch_size` samples (default: the loader's
    batch_size) sliced there. Micro-batches do not straddle macro-batches, so a macro-batch's
    last one is shorter when `micro_batch_size` does not divide it. Raises `DoesNotFitError`
    when two macro-batches exceed `memory_budget` (bytes; default `device_memory_budget`).
    """
    if not isinstance(loader, Loader):
        raise TypeError(f"loader must be a prefetch.Loader, got {type(loader).__name__}")
    k = _positive("macro_batches", macro_batches)
    micro = loader.batch_size if micro_batch_size is None else micro_batch_size
    micro = _positive("micro_batch_size", micro)
    name = resolve_device(device)
    budget = _budget(memory_budget, name)
    batch_bytes = loader.batch_size * _sample_bytes(loader)
    needed = STREAM_BUFFERS * k * batch_bytes
    if needed > budget:
        what = f"macro_batches={k} ({STREAM_BUFFERS} buffers of {k} batches of {loader.batch_size})"
        raise _does_not_fit(what, needed, budget, batch_bytes)
    return ResidentStream(loader, k, micro, name)


# ---- feeding strategies benchmark ----------------------------------------------------------


@dataclass(frozen=True)
class FeedingRow:
    """One measurement of `feeding_benchmark`.

    `strategy` is "input", "shared all" or "shared batched"; `macro_batch_size` is in samples
    (None where it does not apply); `setup_s` the one-time upload; `epoch_s` the median epoch;
    `bytes_per_epoch` what crossed from host to device in an epoch, besides indices;
    `device` where the step ran.
    """

    strategy: str
    micro_batch_size: int
    macro_batch_size: int | None
    setup_s: float
    epoch_s: float
    images_per_s: float
    bytes_per_epoch: int
    device: str


def _train_steps(
    image_shape: tuple[int, ...], classes: int, micro: int, device: str
) -> tuple[Any, Any]:
    """A small compiled train step (softmax regression, SGD) in two feeding forms.

    `step(images, labels)` takes the batch; `step_at(images, labels, start)` slices the batch
    `[start, start + micro)` out of tensors that are already on the device.
    """
    features = int(np.prod(image_shape))
    with tf.device(device):
        weights = tf.Variable(tf.zeros((features, classes)))
        bias = tf.Variable(tf.zeros((classes,)))
    optimizer_rate = 0.01

    def train(images: Any, labels: Any) -> Any:
        x = tf.reshape(tf.cast(images, tf.float32) / 255.0, (-1, features))
        with tf.GradientTape() as tape:
            logits = x @ weights + bias
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
        grad_w, grad_b = tape.gradient(loss, [weights, bias])
        weights.assign_sub(optimizer_rate * grad_w)
        bias.assign_sub(optimizer_rate * grad_b)
        return loss

    batch_spec = tf.TensorSpec((None, *image_shape), tf.uint8)
    labels_spec = tf.TensorSpec((None,), tf.int32)
    step = tf.function(train, input_signature=[batch_spec, labels_spec])

    def train_at(images: Any, labels: Any, start: Any) -> Any:
        return train(images[start : start + micro], labels[start : start + micro])

    step_at = tf.function(
        train_at, input_signature=[batch_spec, labels_spec, tf.TensorSpec((), tf.int32)]
    )
    return step, step_at


def feeding_benchmark(
    images: np.ndarray,
    labels: np.ndarray,
    *,
    micro_batch_sizes: Sequence[int] = (32, 128),
    macro_batch_sizes: Sequence[int] = (512, 2048),
    epochs: int = 3,
    device: str | None = None,
) -> list[FeedingRow]:
    """Time one epoch of a small compiled train step under three ways of feeding it.

    - "input": every micro-batch is passed in from host memory (a host-to-device copy each).
    - "shared all": the whole dataset is uploaded once; the step slices its batch by index.
    - "shared batched": macro-batches of `macro_batch_size` samples are uploaded one after
      the other; the step slices micro-batches out of the current one by index.

    `images` is uint8 (N, ...) and `labels` int (N,) in [0, classes). Each configuration runs
    one warm-up epoch (tracing) and `epochs` timed ones; rows report the median. Every
    strategy runs the same floor(N / micro) full micro-batches. Returns the rows in order.
    """
    images = np.asarray(images)
    labels = np.asarray(labels, np.int32)
    if images.dtype != np.uint8 or len(images) != len(labels) or len(images) == 0:
        raise ValueError(
            f"images must be uint8 with one label each, got {images.dtype} {images.shape} "
            f"and {labels.shape[0]} labels"
        )
    _positive("epochs", epochs)
    name = resolve_device(device)
    classes = int(labels.max()) + 1
    sample_bytes = int(np.prod(images.shape[1:])) + labels.itemsize
    rows: list[FeedingRow] = []
    for micro in (_positive("micro_batch_size", m) for m in micro_batch_sizes):
        count = len(images) // micro * micro
        if count == 0:
            raise ValueError(f"micro_batch_size {micro} is larger than the {len(images)} images")
        x, y = images[:count], labels[:count]
        step, step_at = _train_steps(images.shape[1:], classes, micro, name)
        every_batch = count * sample_bytes
        run = functools.partial(_input_epoch, step, x, y, micro)
        rows.append(_measure("input", micro, None, 0.0, run, epochs, count, every_batch, name))

        began = time.perf_counter()
        with tf.device(name):
            all_x, all_y = tf.identity(x), tf.identity(y)
        all_x[:1].numpy()  # waits for the upload to finish
        setup_s = time.perf_counter() - began
        run = functools.partial(_shared_epoch, step_at, all_x, all_y, micro)
        rows.append(_measure("shared all", micro, None, setup_s, run, epochs, count, 0, name))
        del all_x, all_y, run

        for macro in (_positive("macro_batch_size", m) for m in macro_batch_sizes):
            macro = max(macro // micro, 1) * micro  # whole micro-batches per macro-batch
            run = functools.partial(_batched_epoch, step_at, x, y, micro, macro, name)
            rows.append(
                _measure("shared batched", micro, macro, 0.0, run, epochs, count, every_batch, name)
            )
    return rows


def _input_epoch(step: Any, x: np.ndarray, y: np.ndarray, micro: int) -> Any:
    loss = None
    for start in range(0, len(x), micro):
        loss = step(x[start : start + micro], y[start : start + micro])
    return loss


def _shared_epoch(step_at: Any, all_x: Any, all_y: Any, micro: int) -> Any:
    loss = None
    for start in range(0, int(all_x.shape[0]), micro):
        loss = step_at(all_x, all_y, tf.constant(start, tf.int32))
    return loss


def _batched_epoch(
    step_at: Any, x: np.ndarray, y: np.ndarray, micro: int, macro: int, device: str
) -> Any:
    loss = None
    for first in range(0, len(x), macro):
        with tf.device(device):
            part_x = tf.identity(x[first : first + macro])
            part_y = tf.identity(y[first : first + macro])
        for start in range(0, int(part_x.shape[0]), micro):
            loss = step_at(part_x, part_y, tf.constant(start, tf.int32))
    return loss


def _measure(
    strategy: str,
    micro: int,
    macro: int | None,
    setup_s: float,
    run_epoch: Callable[[], Any],
    epochs: int,
    count: int,
    bytes_per_epoch: int,
    device: str,
) -> FeedingRow:
    run_epoch().numpy()  # warm-up: traces the step; .numpy() waits for the device
    times = []
    for _ in range(epochs):
        began = time.perf_counter()
        run_epoch().numpy()
        times.append(time.perf_counter() - began)
    epoch_s = statistics.median(times)
    return FeedingRow(
        strategy, micro, macro, setup_s, epoch_s, count / epoch_s, bytes_per_epoch, device
    )
