"""prefetch.tf.image_dataset_from_directory: a drop-in for Keras's function of that name.

Same arguments, defaults, argument errors, class names, file list and train/validation split
as `keras.utils.image_dataset_from_directory` (Keras 3): files are listed with Keras's rules,
shuffled once with `np.random.RandomState(seed)` and split by taking the last
`int(validation_split * n)` files for validation, exactly as Keras does. Pixels come from a
prefetch `Loader` decoding with Keras-parity resizing (`DecodeOptions(antialias=False)`), so
they equal Keras's up to rounding and small JPEG decoder differences; the dtype is Keras's
(float32, or uint8 for "nearest").

Lifetime: each returned dataset is `prefetch.tf.dataset(loader)` of its own Loader, kept as
`ds.loader`. Nothing owns that loader, so each iteration of the dataset (each Keras epoch) starts
the workers at its first batch and stops them at the epoch's end, or when the iterator is dropped
(as after `ds.take(1)`). `with ds.loader:` keeps the workers across epochs, and on leaving
re-raises a worker error that TensorFlow wrapped as the original.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from prefetch.decode import decode_image
from prefetch.fast_decode import decode_turbo, fast_available
from prefetch.loader import Loader
from prefetch.resize import METHODS
from prefetch.sources import IMAGE_EXTENSIONS, FileList, index_directory
from prefetch.tf.dataset import dataset

log = logging.getLogger(__name__)

# Keras's interpolation names (all of tf.image.resize's methods, reproduced by prefetch.resize).
INTERPOLATIONS = METHODS
# With batch_size=None the loader still decodes in batches of this many; the dataset unbatches.
UNBATCHED_LOADER_BATCH = 32


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
) -> Any:
    """A `tf.data.Dataset` of the images in `directory`, as Keras's function of this name.

    Takes every argument of `keras.utils.image_dataset_from_directory` with the same defaults
    and meaning, plus `workers` and `backend` for the `prefetch.Loader` behind each dataset.
    Returns one dataset, or a list of two (training, validation) with `subset="both"`. Each
    has `class_names` (None without labels), `file_paths` (equal to Keras's for the same
    arguments and seed) and `loader`. Each iteration is one epoch, reshuffled when `shuffle`
    (the validation set of `subset="both"` is not shuffled, as in Keras). `format="grain"` is
    refused. See docs/tensorflow.md for the lifetime of the workers and for errors.
    """
    labels, label_mode = _check_labels(labels, label_mode, class_names)
    channels = _channels(color_mode)
    image_size = _image_size(image_size)
    interpolation = _interpolation(interpolation)
    if format != "tf":
        raise ValueError(
            f'format must be "tf" (prefetch returns tf.data datasets), got format={format!r}; '
            'for format="grain" use keras.utils.image_dataset_from_directory'
        )
    _check_validation_split(validation_split, subset, shuffle, seed)
    if crop_to_aspect_ratio and pad_to_aspect_ratio:
        raise ValueError(
            "crop_to_aspect_ratio and pad_to_aspect_ratio are both True; set at most one"
        )
    data_format = _data_format(data_format)
    if seed is None:
        seed = int(np.random.randint(1_000_000))  # as Keras does, from numpy's global generator
    paths, label_list, class_names = _index(directory, labels, class_names, follow_links, verbose)
    if shuffle:
        # Keras shuffles the list of paths and, separately, the labels (an int32 array when
        # inferred, the caller's list otherwise) with the same seed; so do we, with the same
        # container types, so that the permutation is Keras's.
        np.random.RandomState(seed).shuffle(paths)
        if label_list is not None:
            np.random.RandomState(seed).shuffle(label_list)
    label_array = None if label_list is None else np.asarray(label_list, dtype=np.int32)
    if label_mode == "binary" and len(class_names or []) != 2:
        raise ValueError(
            f'label_mode="binary" needs exactly 2 classes, got class_names={class_names}; '
            'use label_mode="int" or "categorical"'
        )
    make_dataset = functools.partial(
        _make_dataset,
        class_names=class_names,
        label_mode=label_mode,
        channels=channels,
        batch_size=batch_size,
        image_size=image_size,
        seed=seed,
        interpolation=interpolation,
        crop_to_aspect_ratio=bool(crop_to_aspect_ratio),
        pad_to_aspect_ratio=bool(pad_to_aspect_ratio),
        data_format=data_format,
        workers=workers,
        backend=backend,
    )
    if subset == "both":
        train_paths, train_labels = _split(paths, label_array, validation_split, "training")
        val_paths, val_labels = _split(paths, label_array, validation_split, "validation")
        for name, part in (("training", train_paths), ("validation", val_paths)):
            if not part:
                raise ValueError(
                    f"no {name} images in {os.fspath(directory)!r} (validation_split="
                    f"{validation_split} of {len(paths)} files); add images (allowed "
                    f"extensions: {', '.join(IMAGE_EXTENSIONS)}) or change validation_split"
                )
        return [
            make_dataset(train_paths, train_labels, shuffle=shuffle),
            make_dataset(val_paths, val_labels, shuffle=False),
        ]
    paths, label_array = _split(paths, label_array, validation_split, subset)
    if not paths:
        raise ValueError(
            f"no images found in {os.fspath(directory)!r}; allowed extensions are "
            f"{', '.join(IMAGE_EXTENSIONS)} (and with validation_split, the subset must not "
            "be empty)"
        )
    return make_dataset(paths, label_array, shuffle=shuffle)


def _check_labels(
    labels: Any, label_mode: str | None, class_names: Sequence[str] | None
) -> tuple[Any, str | None]:
    inferred = isinstance(labels, str) and labels == "inferred"
    if not inferred and labels is not None:
        if not isinstance(labels, (list, tuple)):
            raise ValueError(
                "labels must be 'inferred' (from the subfolder names), None (no labels) or a "
                "list/tuple of integer labels, one per image file in sorted path order; got "
                f"labels={labels!r}"
            )
        if class_names:
            raise ValueError(
                "class_names can only be given with labels='inferred' (with a list of labels, "
                f"the class names are the sorted labels); got class_names={class_names!r}"
            )
    if label_mode not in ("int", "categorical", "binary", None):
        raise ValueError(
            f'label_mode must be "int", "categorical", "binary" or None, got {label_mode!r}'
        )
    if labels is None or label_mode is None:
        if class_names is not None:
            raise ValueError(
                "class_names cannot be given without labels (labels=None or label_mode=None); "
                "remove class_names or ask for labels"
            )
        return None, None
    return labels, label_mode


def _channels(color_mode: str) -> int:
    channels = {"grayscale": 1, "rgb": 3, "rgba": 4}.get(color_mode)
    if channels is None:
        raise ValueError(
            f'color_mode must be one of "rgb", "rgba", "grayscale", got {color_mode!r}'
        )
    return channels


def _image_size(image_size: Any) -> tuple[int, int]:
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    if (
        not isinstance(image_size, (list, tuple))
        or len(image_size) != 2
        or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in image_size)
    ):
        raise ValueError(
            f"image_size must be (height, width), two positive ints (or one int for a "
            f"square), got image_size={image_size!r}"
        )
    return int(image_size[0]), int(image_size[1])


def _interpolation(interpolation: str) -> str:
    name = interpolation.lower() if isinstance(interpolation, str) else interpolation
    if name not in INTERPOLATIONS:
        raise ValueError(
            f"interpolation must be one of {INTERPOLATIONS}, got interpolation={interpolation!r}"
        )
    return str(name)


def _check_validation_split(
    validation_split: float | None, subset: str | None, shuffle: bool, seed: int | None
) -> None:
    """Keras's conditions (dataset_utils.check_validation_split_arg), our messages."""
    if validation_split and not 0 < validation_split < 1:
        raise ValueError(
            f"validation_split must be between 0 and 1 (exclusive), got {validation_split}"
        )
    if (validation_split or subset) and not (validation_split and subset):
        raise ValueError(
            "validation_split and subset go together: pass both (e.g. validation_split=0.2, "
            f'subset="training"), or neither; got validation_split={validation_split}, '
            f"subset={subset!r}"
        )
    if subset not in ("training", "validation", "both", None):
        raise ValueError(f'subset must be "training", "validation" or "both", got {subset!r}')
    if validation_split and shuffle and seed is None:
        raise ValueError(
            "validation_split with shuffle=True needs a seed: pass the same seed= to the "
            "training and the validation call so that the two subsets do not overlap"
        )


def _data_format(data_format: str | None) -> str:
    if data_format is None:
        return str(keras.config.image_data_format())
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(
            "data_format must be None, 'channels_last' or 'channels_first', got "
            f"data_format={data_format!r}"
        )
    return data_format


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
) -> tuple[list[str], np.ndarray | list[int] | None, Sequence[str] | None]:
    """Keras's file list, labels (int32 array, or a list for given labels) and class names,
    not yet shuffled."""
    inferred = labels is not None and not isinstance(labels, (list, tuple))
    paths, found_labels, names = index_directory(
        directory, infer_labels=inferred, class_names=class_names, follow_links=follow_links
    )
    label_list: np.ndarray | list[int] | None = found_labels
    # Keras returns the class_names object it was given (in its order), else the subfolders.
    result_names: Sequence[str] | None = names if class_names is None else class_names
    if labels is None:
        label_list, result_names = None, None
    elif not inferred:
        if len(labels) != len(paths):
            raise ValueError(
                f"labels has {len(labels)} entries but {os.fspath(directory)!r} holds "
                f"{len(paths)} image files: give one label per file, in sorted path order"
            )
        label_list = list(labels)
        result_names = [str(label) for label in sorted(set(labels))]
    if verbose:
        if result_names is None:
            _print(f"Found {len(paths)} files.")
        else:
            _print(f"Found {len(paths)} files belonging to {len(result_names)} classes.")
    return paths, label_list, result_names


def _split(
    paths: list[str], labels: np.ndarray | None, validation_split: float | None, subset: Any
) -> tuple[list[str], np.ndarray | None]:
    """Keras's split (dataset_utils.get_training_or_validation_split): the last files validate."""
    if not validation_split:
        return paths, labels
    count = int(validation_split * len(paths))
    if subset == "training":
        _print(f"Using {len(paths) - count} files for training.")
        return paths[:-count], None if labels is None else labels[:-count]
    _print(f"Using {count} files for validation.")
    return paths[-count:], None if labels is None else labels[-count:]


def _make_dataset(
    paths: list[str],
    labels: np.ndarray | None,
    *,
    class_names: Sequence[str] | None,
    label_mode: str | None,
    channels: int,
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
        color_mode={1: "grayscale", 3: "rgb", 4: "rgba"}[channels],
        interpolation=interpolation,
        crop_to_aspect_ratio=crop_to_aspect_ratio,
        pad_to_aspect_ratio=pad_to_aspect_ratio,
        antialias=False,
        backend=backend,
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

        if label_mode is None:
            ds = ds.map(convert)
        else:
            ds = ds.map(lambda images, labels: (convert(images), labels))
        ds = ds.prefetch(1)  # converts the next batch while the consumer works on this one
    if batch_size is None:
        ds = ds.unbatch().apply(tf.data.experimental.assert_cardinality(len(paths)))
    ds.class_names = class_names
    ds.file_paths = paths
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
