"""Device-resident datasets: upload once, then only batch indices cross the bus.

Contract:
- `resident(images, labels)` (or `resident(loader)`) checks the memory budget (else
  `DoesNotFitError`, before decoding a loader's epoch), then copies the data to the device
  once, into two `tf.Variable`s. Each epoch takes a shuffled batch order derived from
  (seed, epoch) only; batches are sliced (contiguous rows) or gathered on the device.
  `subset()` and `folds()` return views that gather from the same variables: no copy.
- Iterating a `ResidentDataset` yields device tensors (custom loops) in the caller's thread; the
  epoch counter is taken under a lock, so two iterators get two epochs. Keras `fit` trains
  `dataset.keras_model(model)` (gathers inside the step) on `dataset.index_dataset()`.
- Epoch planning (`batch_indices`: order, batches) repeats the Loader's; it is to move to the
  shared epoch plan (prefetch/plan/_epochs.py, DESIGN.md section 3) in a later step.
The device variables are in _resident_storage.py, macro-batch streaming in _resident_stream.py.
Rationale and examples: docs/tensorflow.md, section "Device-resident data".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prefetch._checks import positive
from prefetch._messages import counted, suggest_keywords
from prefetch.plan import EpochPlan, fixed_grouping
from prefetch.runtime import Loader
from prefetch.tf._budget import check_budget, does_not_fit, nbytes, sample_bytes
from prefetch.tf._device import resolve_device
from prefetch.tf._resident_storage import DeviceStorage, GatherRows, take_rows

SHUFFLE_MODES = ("batches", "samples", False)


def _check_shuffle(shuffle: Any) -> str | bool:
    if shuffle is True:
        return "batches"
    if shuffle is False or (isinstance(shuffle, str) and shuffle in SHUFFLE_MODES):
        return shuffle
    raise ValueError(f"shuffle must be 'batches', 'samples' or False, got {shuffle!r}")


class ResidentDataset:
    """A dataset in device memory; each epoch a shuffled order of batches sliced there.

    Made by `resident()`, `subset()` or `folds()`, not by hand. Iterating runs one epoch and
    yields `(images, labels)` tensors on `device` (images alone without labels); the next
    iteration is the next epoch. For Keras `fit`, train `keras_model(model)` on
    `index_dataset()`.

    Parameters (given by those functions):

    - `storage`: the device variables that the dataset and all its views share.
    - `rows`: the row of those variables that holds each sample of this dataset.
    - `batch_size`: samples per batch, an int >= 1.
    - `shuffle`: `"batches"` (fixed groups of samples, their order shuffled each epoch),
      `"samples"` (a new permutation of the samples each epoch) or `False` (in order).
    - `seed`: the seed of the epoch orders, which derive from `(seed, epoch)` only.
    - `drop_remainder`: leave out the last batch of an epoch when it is short.
    """

    def __init__(
        self,
        storage: DeviceStorage,
        rows: np.ndarray,
        *,
        batch_size: int,
        shuffle: str | bool,
        seed: int,
        drop_remainder: bool,
    ) -> None:
        self._storage = storage
        self._rows = rows  # sample i of this dataset is row rows[i] of the device variables
        self._plan = EpochPlan(
            size=len(rows),
            batch_size=batch_size,
            seed=int(seed),
            shuffle=_check_shuffle(shuffle),
            drop_remainder=bool(drop_remainder),
        )
        self.batch_size = self._plan.batch_size
        self.shuffle = self._plan.shuffle
        self.seed = self._plan.seed
        self.drop_remainder = self._plan.drop_remainder
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
        return len(self._plan)

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
        return self._plan.batches(epoch)

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
                images, labels = take_rows(storage, rows)
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
        trainer = keras.Model(rows, model(GatherRows(self._storage)(rows)), name=model.name)
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
        k = positive("k", k)
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
            f"ResidentDataset({counted(self.num_samples, 'sample')} on {self.device}, batch_size="
            f"{self.batch_size}, shuffle={self.shuffle!r}, uploads={self.uploads})"
        )


def _read_all(loader: Loader) -> tuple[np.ndarray, np.ndarray | None]:
    """One epoch of `loader` as host arrays, in the order the loader delivers it."""
    capacity = sum(len(batch) for batch in loader.batch_indices(loader.epoch))
    images = np.empty((capacity, *loader.image_shape), np.uint8)
    labels: np.ndarray | None = None
    filled = 0
    for batch in loader:
        x, y = batch
        images[filled : filled + len(x)] = x
        if y is not None:
            if labels is None:
                labels = np.empty((capacity, *y.shape[1:]), y.dtype)
            labels[filled : filled + len(y)] = y
        filled += len(x)
    return images[:filled], None if labels is None else labels[:filled]


@suggest_keywords
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

    Raises `DoesNotFitError` when the data exceed `memory_budget`, before decoding a loader's
    epoch.

    Parameters:

    - `images`: an array of N samples (uint8 NHWC, or any dtype and shape TensorFlow holds),
      or a `prefetch.Loader`, of which one epoch is decoded (in the loader's order: pass
      `shuffle=False` to it to keep source order) and uploaded.
    - `labels`: the samples' labels, shape `(N, ...)`, or None (then batches are the images
      alone); None with a loader, which has its own.
    - `batch_size`: samples per batch; default the loader's, else 32.
    - `shuffle`: `"batches"` (the default, also `True`: fixed groups of samples stored
      contiguously, their order shuffled each epoch, so a batch is a slice), `"samples"` (a
      new permutation of the samples each epoch, gathered) or `False` (in order).
    - `seed`: the seed of the epoch orders; default the loader's, else a random one.
    - `drop_remainder`: leave out the last batch of an epoch when it is short.
    - `device`: where the data go, such as `"/gpu:0"`; None for GPU:0 if there is one, else
      CPU:0.
    - `memory_budget`: the bytes the data may take on the device; default
      `device_memory_budget(device)`.
    """
    name = resolve_device(device)
    budget = check_budget(memory_budget, name)
    shuffle = _check_shuffle(shuffle)
    if isinstance(images, Loader):
        loader = images
        if labels is not None:
            raise ValueError("labels must be None when images is a Loader (it has its own)")
        batch_size = loader.options.batch_size if batch_size is None else batch_size
        seed = loader.options.seed if seed is None else seed
        sample = sample_bytes(loader)
        count = sum(len(batch) for batch in loader.batch_indices(loader.epoch))
        needed = count * sample
        if needed > budget:
            batch_bytes = positive("batch_size", batch_size) * sample
            raise does_not_fit(f"the dataset ({count} images)", needed, budget, batch_bytes)
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
        needed = nbytes(images) + (0 if labels is None else labels.nbytes)
        if needed > budget:
            batch_bytes = positive("batch_size", batch_size) * max(needed // count, 1)
            raise does_not_fit(f"the dataset ({count} samples)", needed, budget, batch_bytes)
    if seed is None:
        seed = int(np.random.default_rng().integers(2**63))
    if shuffle == "batches":
        # Store the samples in their fixed grouping, so that each batch is a contiguous slice.
        grouping = fixed_grouping(count, seed)
        images = tf.gather(images, grouping) if isinstance(images, tf.Tensor) else images[grouping]
        labels = None if labels is None else labels[grouping]
        rows = np.empty(count, np.int64)
        rows[grouping] = np.arange(count)
    else:
        rows = np.arange(count, dtype=np.int64)
    storage = DeviceStorage(images, labels, name)
    return ResidentDataset(
        storage,
        rows,
        batch_size=positive("batch_size", batch_size),
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
    )
