"""Checks and a model for tests: a small Keras CNN, equal batches, the live worker processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def small_cnn(size: int, classes: int) -> Any:
    """A compiled Keras CNN (3 conv layers) that learns the shape classes in a few epochs.

    Takes uint8 images (size, size, 3); imports Keras when called.
    """
    import keras

    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def assert_same_batches(
    got: Sequence[tuple[np.ndarray, np.ndarray]], expected: Sequence[tuple[np.ndarray, np.ndarray]]
) -> None:
    """Assert two runs gave the same number of batches with equal images and labels, in order."""
    assert len(got) == len(expected), f"{len(got)} batches, expected {len(expected)}"
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def worker_processes(pid: int | None = None) -> list[Any]:
    """The live worker processes (psutil.Process) of process `pid` (default: this one).

    Spawned workers are its children; forkserver workers are children of its forkserver. The
    multiprocessing helpers themselves (resource tracker, forkserver) are left out.
    """
    import psutil  # type: ignore[import-untyped]  # a test dependency, not prefetch's

    parent = psutil.Process(pid)
    workers = []
    for child in parent.children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(child.cmdline())
            if "resource_tracker" in command:
                continue
            if "forkserver" in command and child.ppid() == parent.pid:
                continue
        except psutil.NoSuchProcess:
            continue
        workers.append(child)
    return workers
