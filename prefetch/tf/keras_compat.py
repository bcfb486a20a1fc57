"""prefetch.tf.image_dataset_from_directory: a drop-in for Keras's function of that name.

Same arguments, defaults, class names, file list and train/validation split as
`keras.utils.image_dataset_from_directory` (Keras 3): files are listed by
`prefetch.sources._listing.index_directory` (Keras's rules, order and path strings), then shuffled
once
with `np.random.RandomState(seed)` and split by taking the last `int(validation_split * n)` files
for validation, exactly as Keras does, by `prefetch.sources._folders.keras_split` (the split a
`Loader`'s
`validation_split` makes too). A bad argument raises what Keras raises, in Keras's order: the
same exception type, with Keras's message as the start of ours (the fix follows it, or is a note
on errors that come from the OS, numpy or TensorFlow, which are Keras's own). Pixels come from a
prefetch `Loader` decoding with Keras-parity resizing (`DecodeOptions(antialias=False)`), so
they equal Keras's up to rounding and small JPEG decoder differences; the dtype is Keras's
(float32, or uint8 for "nearest").

Lifetime: each returned dataset is `prefetch.tf.dataset(loader)` of its own Loader, kept as
`ds.loader`. Nothing owns that loader, so each iteration of the dataset (each Keras epoch) starts
the workers at its first batch and stops them at the epoch's end, or when the iterator is dropped
(as after `ds.take(1)`). `with ds.loader:` keeps the workers across epochs, and on leaving
re-raises a worker error that TensorFlow wrapped as the original.

The argument checks, with Keras's texts, are in _keras_args.py; this module lists, splits and
builds the datasets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prefetch._messages import suggest_keywords
from prefetch.decode import decode_image, decode_turbo, fast_available
from prefetch.io import PathArray, RemoteOptions
from prefetch.runtime import Loader
from prefetch.sources import (
    IMAGE_EXTENSIONS,
    SUBSETS,
    FileList,
    index_directory,
    keras_split,
)
from prefetch.tf import _keras_args as keras_args
from prefetch.tf._dataset import dataset

log = logging.getLogger(__name__)

# With batch_size=None the loader still decodes in batches of this many; the dataset unbatches.
UNBATCHED_LOADER_BATCH = 32


@suggest_keywords
def image_dataset_from_directory(
    directory: str | os.PathLike[str],
    labels: str | Sequence[int] | None = "inferred",
    label_mode: str | None = "int",
    class_names: Sequence[str] | None = None,
    color_mode: str = "rgb",
    batch_size: int | None = 32,
    image_size: int | tuple[int, int] | list[int] = (256, 256),
    shuffle: bool = True,
    seed: int | None = None,
    validation_split: float | None = None,
    subset: str | None = None,
    interpolation: str = "bilinear",
    follow_links: bool = False,
    crop_to_aspect_ratio: bool = False,
    pad_to_aspect_ratio: bool = False,
    data_format: str | None = None,
    format: str = "tf",
    verbose: bool = True,
    *,
    workers: int | None = None,
    backend: str = "thread",
    remote: RemoteOptions | None = None,
) -> Any:
    """A `tf.data.Dataset` of the images in `directory`, as Keras's function of this name.

    Takes every argument of `keras.utils.image_dataset_from_directory` with the same defaults
    and meaning, plus `workers`, `backend` and `remote` for the `prefetch.Loader` behind each
    dataset.
    Returns one dataset, or a list of two (training, validation) with `subset="both"`. Each
    has `class_names` (None without labels), `file_paths` (a list equal to Keras's for the same
    arguments and seed) and `loader`. Each iteration is one epoch, reshuffled when `shuffle`
    (the validation set of `subset="both"` is not shuffled, as in Keras). A bad argument raises
    Keras's exception with Keras's message first. See docs/tensorflow.md for the lifetime of
    the workers and for errors.

    Parameters:

    - `directory`: the folder of images, one subfolder per class with labels inferred. It may
      be an fsspec URL (`gs://`, `s3://`, `http(s)://`, `memory://`; the `remote` extra), as
      Keras reads `gs://` paths through `tf.io.gfile`: listed with Keras's rules by one bulk
      listing, read one object per image (docs/remote.md); `file_paths` are then URLs.
    - `labels`: `"inferred"` (from the subfolders), None (no labels), or a list or tuple of
      int labels, one per image file in sorted path order.
    - `label_mode`: `"int"`, `"categorical"` (one-hot), `"binary"` (float32 `(N, 1)`, two
      classes) or None (no labels: the images alone).
    - `class_names`: with `labels="inferred"`, the subfolders to use, in this order.
    - `color_mode`: `"rgb"`, `"grayscale"` or `"rgba"`.
    - `batch_size`: images per batch; None for a dataset of single images.
    - `image_size`: `(height, width)` the images are resized to, or an int for a square.
    - `shuffle`: shuffle the files (once, for the split) and every epoch; False keeps sorted
      order.
    - `seed`: the seed of the shuffles and of the split; needed with `validation_split` and
      `shuffle`.
    - `validation_split`: the fraction of the files held out for validation, in (0, 1).
    - `subset`: `"training"`, `"validation"` or `"both"` (a list of the two datasets), with
      `validation_split`.
    - `interpolation`: the resize filter by Keras name (`"bilinear"`, `"nearest"`,
      `"bicubic"`, `"area"`, `"lanczos3"`, `"lanczos5"`, `"gaussian"`, `"mitchellcubic"`).
    - `follow_links`: also walk into subfolders that are symbolic links.
    - `crop_to_aspect_ratio`: crop the largest centred region with the aspect ratio of
      `image_size` before resizing, instead of stretching.
    - `pad_to_aspect_ratio`: instead resize the whole image to fit and pad with zeros.
    - `data_format`: `"channels_last"` or `"channels_first"`; None for Keras's setting.
    - `format`: `"tf"` (a `tf.data.Dataset`); Keras's `"grain"` is refused.
    - `verbose`: print Keras's messages (files found, files used for each subset).
    - `workers`: the worker count of the loader behind each dataset (`None`: one per usable
      core, less one from 4 cores on).
    - `backend`: the loader's backend: `"thread"` (the default here), `"process"` or
      `"auto"`.
    - `remote`: for an fsspec URL, the `prefetch.RemoteOptions` of the listing and the reads
      (deadlines, size and listing caps, redirects); None for the defaults.
    """
    # Keras's checks, in Keras's order (the first bad argument is the one reported).
    keras_args.check_labels(labels, class_names)
    keras_args.check_label_mode(label_mode)
    if labels is None or label_mode is None:
        labels = label_mode = None
    keras_args.check_color_mode(color_mode)
    image_size = keras_args.image_size(image_size)
    interpolation = keras_args.interpolation(interpolation)
    keras_args.check_format(format)
    keras_args.check_validation_split(validation_split, subset, shuffle, seed)
    if seed is None:  # randint(1e6) from numpy's global generator, as Keras draws it
        seed = int(np.random.randint(1_000_000))
    paths, label_array, class_names = _index(
        directory, labels, class_names, follow_links, verbose, remote
    )
    keras_args.check_binary_classes(label_mode, class_names)
    data_format = keras_args.data_format(data_format)
    buffer_size = batch_size * 8 if batch_size is not None else 1024  # Keras's shuffle buffer
    split_seed = seed if shuffle else None  # Keras shuffles its listing only when shuffling
    parts = [
        _split(paths, label_array, validation_split, name, split_seed)
        for name in (SUBSETS if subset == "both" else [subset])
    ]
    for name, (part, _) in zip(SUBSETS if subset == "both" else [""], parts, strict=True):
        if not len(part):
            raise ValueError(
                f"No {name + ' ' if name else ''}images found in directory {directory}. "
                f"Allowed formats: {IMAGE_EXTENSIONS}. Put the images of each class in a "
                "subfolder of it (with validation_split, enough for both subsets)"
            )
    keras_args.check_dataset_arguments(
        batch_size, buffer_size, shuffle, seed, crop_to_aspect_ratio, pad_to_aspect_ratio
    )
    datasets = [
        _make_dataset(
            part_paths,
            part_labels,
            class_names=class_names,
            label_mode=label_mode,
            color_mode=color_mode,
            batch_size=batch_size,
            image_size=image_size,
            shuffle=shuffle and number == 0,  # Keras does not shuffle the validation set
            seed=seed,
            interpolation=interpolation,
            crop_to_aspect_ratio=bool(crop_to_aspect_ratio),
            pad_to_aspect_ratio=bool(pad_to_aspect_ratio),
            data_format=data_format,
            workers=workers,
            backend=backend,
            remote=remote,
        )
        for number, (part_paths, part_labels) in enumerate(parts)
    ]
    return datasets if subset == "both" else datasets[0]


def _print(message: str) -> None:
    """Print as Keras does: to stdout, or to the log when interactive logging is off."""
    if keras.config.is_interactive_logging_enabled():
        print(message, flush=True)
    else:
        log.info(message)


def _index(
    directory: str | os.PathLike[str],
    labels: Any,
    class_names: Sequence[str] | None,
    follow_links: bool,
    verbose: bool,
    remote: RemoteOptions | None,
) -> tuple[PathArray, np.ndarray | None, Sequence[str] | None]:
    """Keras's index_directory: the files, their labels (int32, or None) and the class names,
    in the listing's order (`_split` shuffles them as Keras does); Keras's errors and
    messages."""
    inferred = labels is not None and not isinstance(labels, (list, tuple))
    if not inferred and class_names is not None:
        if labels is None:
            raise ValueError(
                "When `labels=None` (no labels), argument `class_names` cannot be specified. "
                'Remove class_names, or ask for labels (labels="inferred" and a label_mode)'
            )
        raise ValueError(
            "When argument `labels` is specified, argument `class_names` cannot be specified "
            "(the `class_names` will be the sorted list of labels). Remove class_names"
        )
    with keras_args.noted(
        "prefetch: directory must be an existing folder; with labels inferred, one subfolder "
        f"per class; got {os.fspath(directory)!r}"
    ):
        paths, found, names = index_directory(
            directory,
            infer_labels=inferred,
            class_names=class_names,
            follow_links=follow_links,
            remote=remote,
        )
    label_array: np.ndarray | None = found
    # Keras returns the class_names object it was given (in its order), else the subfolders.
    result_names: Sequence[str] | None = names if class_names is None else class_names
    if labels is None:
        label_array, result_names = None, None
    elif not inferred:
        if len(labels) != len(paths):
            raise ValueError(
                "Expected the lengths of `labels` to match the number of files in the target "
                f"directory. len(labels) is {len(labels)} while we found {len(paths)} files in "
                f"directory {directory}. Give one label per image file, in sorted path order"
            )
        label_array = np.asarray(labels, dtype=np.int32)
        result_names = [str(label) for label in sorted(set(labels))]
    if verbose:
        if result_names is None:
            _print(f"Found {len(paths)} files.")
        else:
            _print(f"Found {len(paths)} files belonging to {len(result_names)} classes.")
    return paths, label_array, result_names


def _split(
    paths: PathArray,
    labels: np.ndarray | None,
    validation_split: float | None,
    subset: Any,
    seed: int | None,
) -> tuple[PathArray, np.ndarray | None]:
    """Keras's files and labels for `subset`, in Keras's order: its shuffle (with `seed`, None
    when not shuffling) and split (dataset_utils.get_training_or_validation_split: the last
    files validate), by `keras_split`, with Keras's messages."""
    if validation_split:
        held_out = int(validation_split * len(paths))
        count = len(paths) - held_out if subset == "training" else held_out
        _print(f"Using {count} files for {subset}.")
    order = keras_split(len(paths), validation_split=validation_split, subset=subset, seed=seed)
    return paths[order], None if labels is None else labels[order]


def _make_dataset(
    paths: PathArray,
    labels: np.ndarray | None,
    *,
    class_names: Sequence[str] | None,
    label_mode: str | None,
    color_mode: str,
    batch_size: int | None,
    image_size: tuple[int, int],
    shuffle: bool,
    seed: int,
    interpolation: str,
    crop_to_aspect_ratio: bool,
    pad_to_aspect_ratio: bool,
    data_format: str,
    workers: int | None,
    backend: str,
    remote: RemoteOptions | None,
) -> tf.data.Dataset:
    source = FileList(paths, labels, _loader_class_names(labels, class_names, label_mode))
    loader = Loader(
        source,
        batch_size=UNBATCHED_LOADER_BATCH if batch_size is None else batch_size,
        image_size=image_size,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        label_mode=label_mode,
        color_mode=color_mode,
        interpolation=interpolation,
        crop_to_aspect_ratio=crop_to_aspect_ratio,
        pad_to_aspect_ratio=pad_to_aspect_ratio,
        antialias=False,
        backend=backend,
        remote=remote,
        # libjpeg-turbo at full size with OpenCV's bilinear is Keras's resize, at about 1.1 ms
        # per ImageNet JPEG against Pillow's 2.1 ms (docs/decoders.md).
        decoder=decode_turbo if fast_available() else decode_image,
    )
    ds = dataset(loader)
    # Keras's images are float32 (tf.image.resize's output), or uint8 for "nearest".
    to_float = interpolation != "nearest"
    to_channels_first = data_format == "channels_first"
    if to_float or to_channels_first:

        def convert(images: tf.Tensor) -> tf.Tensor:
            if to_float:
                images = tf.cast(images, tf.float32)
            if to_channels_first:
                images = tf.transpose(images, (0, 3, 1, 2))
            return images

        def convert_images(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return convert(images), labels

        # Plain Python branches on constants: autograph's conversion would only add 0.3 s.
        plain = tf.autograph.experimental.do_not_convert
        ds = ds.map(plain(convert if label_mode is None else convert_images))
        ds = ds.prefetch(1)  # converts the next batch while the consumer works on this one
    if batch_size is None:
        ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(len(paths)))
    ds.class_names = class_names
    ds.file_paths = paths.tolist()  # a list, as Keras's
    ds.loader = loader
    return ds


def _loader_class_names(
    labels: np.ndarray | None, class_names: Sequence[str] | None, label_mode: str | None
) -> Sequence[str] | None:
    """Class names that cover every label, for the FileList behind the loader.

    Keras names the classes of a list of labels after the distinct labels, so labels [3, 7]
    give class_names ["3", "7"] and int labels 3 and 7. The loader needs each label to be a
    class index: that holds for "int" labels with placeholder names, but one-hot and binary
    labels outside [0, classes) would not mean what Keras makes of them, so they are refused.
    """
    if labels is None or class_names is None:
        return class_names
    if len(labels) and labels.min() < 0:
        raise ValueError(f"labels must be >= 0, got {int(labels.min())}")
    top = int(labels.max()) + 1 if len(labels) else 0
    if top <= len(class_names):
        return class_names
    if label_mode != "int":
        raise ValueError(
            f"label_mode={label_mode!r} needs labels in [0, {len(class_names)}) (one per "
            f"distinct label), got a label {top - 1}; renumber the labels 0, 1, ..."
        )
    return [str(i) for i in range(top)]
