"""Keras's argument checks for `image_dataset_from_directory`, with Keras's error texts.

Contract: each function checks one argument (or one of Keras's groups of conditions) as
`keras.utils.image_dataset_from_directory` (Keras 3) does, and raises the exception type Keras
raises with Keras's message first and prefetch's fix after it (or, for errors that come from
the OS, numpy or TensorFlow, as a note). The caller calls them in Keras's order, so the first
bad argument is the one reported. Functions that normalise return the value to use. Pure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

from prefetch.decode import METHODS, image_size_pair
from prefetch.errors import add_note

# Keras's interpolation names (all of tf.image.resize's methods, reproduced by
# prefetch.decode._resize),
# in Keras's order, as its error message prints them.
INTERPOLATIONS = METHODS
# Keras's text for labels that are neither "inferred", None nor a list/tuple.
KERAS_LABELS = (
    "`labels` argument should be a list/tuple of integer labels, of the same size as the number "
    "of image files in the target directory. If you wish to infer the labels from the "
    'subdirectory names in the target directory, pass `labels="inferred"`. If you wish to get a '
    "dataset that only contains images (no labels), pass `labels=None`. Received: labels="
)


def check_label_mode(label_mode: Any) -> None:
    """Keras's label_mode values: "int", "categorical", "binary" or None."""
    if label_mode not in {"int", "categorical", "binary", None}:
        raise ValueError(
            '`label_mode` argument must be one of "int", "categorical", "binary", or None. '
            f"Received: label_mode={label_mode}. Use label_mode=None for images without labels"
        )


def check_color_mode(color_mode: Any) -> None:
    """Keras's color_mode values: "grayscale", "rgb" or "rgba"."""
    if color_mode not in ("grayscale", "rgb", "rgba"):
        raise ValueError(
            '`color_mode` must be one of {"rgb", "rgba", "grayscale"}. '
            f"Received: color_mode={color_mode}. Use one of those three"
        )


def check_binary_classes(label_mode: Any, class_names: Sequence[str] | None) -> None:
    """label_mode="binary" needs exactly two classes (checked once the files are listed)."""
    if label_mode == "binary" and len(class_names or []) != 2:
        raise ValueError(
            'When passing `label_mode="binary"`, there must be exactly 2 class_names. '
            f'Received: class_names={class_names}. Use label_mode="int" or "categorical" for '
            "more classes"
        )


def check_labels(labels: Any, class_names: Any) -> None:
    """Keras's first checks (image_dataset_from_directory), Keras's messages with the fix."""
    try:
        given = labels not in ("inferred", None)
    except ValueError as error:  # a numpy array compares element-wise, as in Keras
        raise ValueError(
            f"{error}. prefetch: labels must be a list or tuple (labels=array.tolist()), "
            '"inferred" or None'
        ) from error
    if given:
        if not isinstance(labels, (list, tuple)):
            raise ValueError(
                f"{KERAS_LABELS}{labels}. prefetch: pass a list of ints, one per image file in "
                'sorted path order, or "inferred", or None'
            )
        if class_names:
            raise ValueError(
                'You can only pass `class_names` if `labels="inferred"`. Received: '
                f"labels={labels}, and class_names={class_names}. With a list of labels the "
                "class names are the sorted labels: remove class_names"
            )


def image_size(image_size: Any) -> tuple[int, int]:
    """Keras's image_size: an int (a square) or two ints, checked by the Loader's own rule
    (`prefetch.decode._decoders.image_size_pair`) and refused with Keras's message first."""
    try:
        return image_size_pair(image_size)
    except ValueError:
        raise ValueError(
            "Invalid `image_size` value. Expected a tuple of 2 integers. "
            f"Received: image_size={image_size}. prefetch: pass (height, width), two ints >= 1, "
            "or one int for a square"
        ) from None


def interpolation(interpolation: str) -> str:
    name = interpolation.lower()  # a non-str raises AttributeError here, as in Keras
    if name not in INTERPOLATIONS:
        raise ValueError(
            f"Argument `interpolation` should be one of {INTERPOLATIONS}. "
            f"Received: interpolation={name}. Use one of those names"
        )
    return str(name)


def check_format(format: str) -> None:
    if format not in ("tf", "grain"):
        raise ValueError(
            f'`format` should be either "tf" or "grain". Received: format={format}. prefetch '
            'returns tf.data datasets: use format="tf"'
        )
    if format != "tf":
        raise ValueError(
            f'format must be "tf" (prefetch returns tf.data datasets), got format={format!r}; '
            'for format="grain" use keras.utils.image_dataset_from_directory'
        )


def check_validation_split(
    validation_split: float | None, subset: str | None, shuffle: bool, seed: int | None
) -> None:
    """Keras's dataset_utils.check_validation_split_arg: its conditions, its messages first."""
    if validation_split and not 0 < validation_split < 1:
        raise ValueError(
            f"`validation_split` must be between 0 and 1, received: {validation_split}. "
            "Pass the fraction of the files to hold out, e.g. 0.2"
        )
    if (validation_split or subset) and not (validation_split and subset):
        raise ValueError(
            "If `subset` is set, `validation_split` must be set, and inversely. Pass both "
            f'(e.g. validation_split=0.2, subset="training") or neither; got validation_split='
            f"{validation_split}, subset={subset!r}"
        )
    if subset not in ("training", "validation", "both", None):
        raise ValueError(
            '`subset` must be either "training", "validation" or "both", received: '
            f"{subset}. Use one of those, or None without validation_split"
        )
    if validation_split and shuffle and seed is None:
        raise ValueError(
            "If using `validation_split` and shuffling the data, you must provide a `seed` "
            "argument, to make sure that there is no overlap between the training and "
            "validation subset. Pass the same seed= to the training and the validation call"
        )


def data_format(data_format: str | None) -> str:
    """Keras's standardize_data_format: None is Keras's setting; any case is accepted."""
    if data_format is None:
        return str(keras.config.image_data_format())
    name = str(data_format).lower()
    if name not in {"channels_first", "channels_last"}:
        raise ValueError(
            "The `data_format` argument must be one of {'channels_first', 'channels_last'}. "
            f"Received: data_format={name}. Use None for Keras's setting "
            f"({keras.config.image_data_format()!r})"
        )
    return name


def check_dataset_arguments(
    batch_size: Any, buffer_size: Any, shuffle: bool, seed: int, crop: bool, pad: bool
) -> None:
    """What Keras's dataset construction refuses, in its order: TensorFlow's own errors for the
    shuffle buffer and the batch size (with the fix as a note), then the crop/pad conflict."""
    fix = f"prefetch: batch_size must be an int >= 1 or None, got batch_size={batch_size!r}"
    probe = tf.data.Dataset.range(1)
    if shuffle:
        with noted(fix):
            probe = probe.shuffle(buffer_size=buffer_size or 1024, seed=seed)
    if pad and crop:
        raise ValueError(
            "Only one of `pad_to_aspect_ratio`, `crop_to_aspect_ratio` can be set to `True`. "
            "Set at most one of them"
        )
    if batch_size is not None:
        with noted(fix):
            probe.batch(batch_size)


@contextlib.contextmanager
def noted(note: str) -> Iterator[None]:
    """Re-raise any error of the block as itself, with `note` added (shown under it)."""
    try:
        yield
    except Exception as error:
        add_note(error, note)
        raise
