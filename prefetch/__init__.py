"""prefetch: keep GPUs fed.

Worker threads decode images into preallocated batches while the consumer trains on the
previous one; a bound on the batches in flight gives order and backpressure; a Coordinator
stops it all.

`import prefetch` has no side effect and imports no layer (no numpy, no Pillow): each public
name of a layer (`prefetch.Loader`, ...) is imported on first use, and `prefetch.tf`,
`prefetch.keras` and `prefetch.torch` import their framework on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The bottom layer (the standard library only: no side effect, nothing slow), imported now:
# `prefetch.background` is a module and its function both, and a module imported later would
# take the function's name.
from prefetch.background import Background, background
from prefetch.coordinator import Coordinator
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

if TYPE_CHECKING:  # for type checkers and the reference; at run time, on first use
    from prefetch.backends import DecodePlace, ProcessOptions, RayOptions
    from prefetch.decode import DecodeOptions, decode_image
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


# Where each public name lives (the layer that defines it), for `__getattr__`.
_HOMES: dict[str, str] = {
    "DecodePlace": "prefetch.backends",
    "ProcessOptions": "prefetch.backends",
    "RayOptions": "prefetch.backends",
    "DecodeOptions": "prefetch.decode",
    "decode_image": "prefetch.decode",
    "RemoteOptions": "prefetch.io",
    "Augment": "prefetch.plan",
    "CenterCrop": "prefetch.plan",
    "RandomResizedCrop": "prefetch.plan",
    "Autotune": "prefetch.runtime",
    "Batch": "prefetch.runtime",
    "ErrorPolicy": "prefetch.runtime",
    "Loader": "prefetch.runtime",
    "LoaderOptions": "prefetch.runtime",
    "LoaderStats": "prefetch.runtime",
    "Stream": "prefetch.runtime",
    "FileList": "prefetch.sources",
    "ImageFolder": "prefetch.sources",
    "Source": "prefetch.sources",
    "TarSource": "prefetch.sources.shards",
    "TFRecordSource": "prefetch.sources.shards",
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its layer on first use (and kept); a subpackage
    (`prefetch.tf`, `prefetch.keras`, `prefetch.torch`, which import their framework, or any
    other) imported on first use."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
