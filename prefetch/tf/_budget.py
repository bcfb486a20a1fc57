"""The memory-budget check that `resident` and `resident_stream` make before any upload.

Contract: `check_budget(memory_budget, device)` is the budget in bytes (the argument, checked,
or `device_memory_budget(device)`); when the data need more, the caller raises
`does_not_fit(...)`, a `DoesNotFitError` whose message says what would fit (how many
macro-batches a stream could use, a smaller size, or `prefetch.tf.dataset`). Pure functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from prefetch.errors import DoesNotFitError
from prefetch.runtime import Loader
from prefetch.sources import label_bytes
from prefetch.tf._device import device_memory_budget

# Macro-batches of a stream on the device at once: the one being consumed, the next uploading.
STREAM_BUFFERS = 2


def format_bytes(count: float) -> str:
    """`count` bytes in the largest binary unit that keeps it >= 1 ("3.1 GiB")."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def does_not_fit(what: str, needed: int, budget: int, batch_bytes: int) -> DoesNotFitError:
    """The error for `what` needing `needed` bytes over `budget`, with the advice that fits."""
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


def check_budget(memory_budget: int | None, device: str) -> int:
    """The budget in bytes: `memory_budget` checked, or None for `device_memory_budget`."""
    if memory_budget is None:
        return device_memory_budget(device)
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
        raise ValueError(f"memory_budget must be an int number of bytes, got {memory_budget!r}")
    if memory_budget < 0:
        raise ValueError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
    return int(memory_budget)


def sample_bytes(loader: Loader) -> int:
    """Bytes of one decoded sample of `loader`: its uint8 image and its label."""
    height, width, channels = loader.image_shape
    return height * width * channels + label_bytes(
        loader.options.label_mode, len(loader.class_names)
    )


def nbytes(array: Any) -> int:
    """Bytes of a numpy array or tensor (a tensor has no `nbytes`)."""
    return int(np.prod(array.shape)) * int(tf.as_dtype(array.dtype).size)
