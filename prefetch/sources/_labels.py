"""Label modes, written once: how a batch's raw int32 class indices become its `labels`.

- "int": the class indices, int32 (N,);
- "categorical": one-hot float32 (N, num_classes);
- "binary": float32 (N, 1), for two classes;
- None: no labels (`Batch.labels` is None).

`label_spec` gives the shape tail and dtype of each, so the TensorFlow stages declare the same
structure that `encode_labels` produces. `check_label` refuses a class index a source returned
outside [0, num_classes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABEL_MODES = ("int", "categorical", "binary", None)


def encode_labels(raw: np.ndarray, label_mode: str | None, num_classes: int) -> np.ndarray | None:
    """The labels of a batch in `label_mode` from its raw class indices `raw` (int32)."""
    if label_mode is None:
        return None
    if label_mode == "int":
        return raw
    if label_mode == "binary":
        return raw.astype(np.float32).reshape(-1, 1)
    one_hot: np.ndarray = np.eye(num_classes, dtype=np.float32)[raw]
    return one_hot


def label_spec(label_mode: str | None, num_classes: int) -> tuple[tuple[int, ...], str] | None:
    """(shape after the batch dimension, numpy dtype name) of one batch's labels, or None."""
    if label_mode is None:
        return None
    if label_mode == "int":
        return (), "int32"
    if label_mode == "binary":
        return (1,), "float32"
    return (num_classes,), "float32"


def label_bytes(label_mode: str | None, num_classes: int) -> int:
    """Bytes of one sample's label in `label_mode`."""
    spec = label_spec(label_mode, num_classes)
    if spec is None:
        return 0
    shape, dtype = spec
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def check_label(label: Any, num_classes: int | None) -> int:
    """`label` as an int class index, or ValueError when it is not one of `num_classes`.

    With `num_classes` None (a source without `class_names`) the index only has to be an int
    >= 0 that fits int32.
    """
    try:
        index = int(label)
    except (TypeError, ValueError):
        raise ValueError(f"label {label!r} is not an int class index") from None
    if index != label:
        raise ValueError(f"label {label!r} is not a whole number: labels are class indices")
    limit = num_classes if num_classes is not None else 2**31
    if not 0 <= index < limit:
        classes = f"{num_classes} classes" if num_classes is not None else "int32 class indices"
        raise ValueError(
            f"label {index} is outside [0, {limit}) for {classes}: a source's labels "
            "must be class indices (0 for class_names[0], 1 for the next, ...)"
        )
    return index


def check_label_mode(source: object, label_mode: str | None, class_names: list[str]) -> None:
    """ValueError when `source` cannot give labels in `label_mode` (none, or too few classes)."""
    if label_mode is None:
        return
    if getattr(source, "has_labels", True) is False:
        raise ValueError("this source has no labels: pass label_mode=None")
    if label_mode == "categorical" and not class_names:
        raise ValueError(
            "label_mode='categorical' needs the number of classes: give the source a "
            "class_names attribute, or use label_mode='int'"
        )
    if label_mode == "binary" and len(class_names) not in (0, 2):
        raise ValueError(
            f"label_mode='binary' needs exactly 2 classes, found {len(class_names)}: "
            f"{class_names}; use 'int' or 'categorical'"
        )
