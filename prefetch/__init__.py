"""prefetch: keep GPUs fed.

Worker threads decode images into preallocated batches while the consumer trains on the
previous one; a bound on the batches in flight gives order and backpressure; a Coordinator
stops it all.
`import prefetch` imports no framework; `prefetch.tf`, `prefetch.keras` and `prefetch.torch`
import theirs, on first use.
"""

from __future__ import annotations

from prefetch._as_command import hush_interrupt

hush_interrupt()  # Ctrl-C while `python -m prefetch` imports: one line, not a traceback

import importlib
from typing import Any

from prefetch.backends import DecodePlace, ProcessOptions, RayOptions
from prefetch.background import Background, background
from prefetch.coordinator import Coordinator
from prefetch.decode import DecodeOptions, decode_image
from prefetch.errors import (
    ClosedError,
    CorruptShardError,
    PrefetchError,
    SampleTimeoutError,
    StopTimeoutError,
    TooManySkippedError,
    TooManyWorkersWarning,
    WorkerCrashedError,
)
from prefetch.io import RemoteOptions
from prefetch.plan import Augment, CenterCrop, RandomResizedCrop
from prefetch.runtime import (
    Autotune,
    Batch,
    ErrorPolicy,
    Loader,
    LoaderOptions,
    LoaderStats,
    Stream,
)
from prefetch.sources import FileList, ImageFolder, Source
from prefetch.sources.shards import TarSource, TFRecordSource

__version__ = "0.1.0"

__all__ = [
    "Augment",
    "Autotune",
    "Background",
    "Batch",
    "CenterCrop",
    "ClosedError",
    "Coordinator",
    "CorruptShardError",
    "DecodeOptions",
    "DecodePlace",
    "ErrorPolicy",
    "FileList",
    "ImageFolder",
    "Loader",
    "LoaderOptions",
    "LoaderStats",
    "PrefetchError",
    "ProcessOptions",
    "RandomResizedCrop",
    "RayOptions",
    "RemoteOptions",
    "SampleTimeoutError",
    "Source",
    "StopTimeoutError",
    "Stream",
    "TFRecordSource",
    "TarSource",
    "TooManySkippedError",
    "TooManyWorkersWarning",
    "WorkerCrashedError",
    "background",
    "decode_image",
]


def __getattr__(name: str) -> Any:
    """Import `prefetch.tf`, `prefetch.keras`, `prefetch.torch` (and so their framework) on
    first use."""
    if name in ("tf", "keras", "torch"):
        return importlib.import_module(f"prefetch.{name}")
    raise AttributeError(f"module 'prefetch' has no attribute {name!r}")
