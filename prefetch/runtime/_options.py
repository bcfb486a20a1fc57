"""The Loader's options as frozen, keyword-only dataclasses; every check is written once here.

`LoaderOptions` holds what a `Loader` does with batches (size, depth, order, labels, errors,
workers); `ProcessOptions` holds what only the process backend uses (`backend=ProcessOptions(...)`
picks that backend). `DecodeOptions` (prefetch.decode._decoders) holds what a decoder does with one
image.
A bad value raises ValueError naming the option, the value and what would be accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefetch._checks import one_of, positive
from prefetch.backends._options import ProcessOptions
from prefetch.decode._decoders import COLOR_MODES, DecodeOptions
from prefetch.sources._folders import SUBSETS, is_file_source
from prefetch.sources._labels import LABEL_MODES

ON_ERROR = ("raise", "skip")
# Thread workers per core that a loader of remote URLs starts with (then tuned): enough requests
# in flight to cover tens of milliseconds of latency at a few hundred images per second.
REMOTE_READER_THREADS = 8
# Worker processes per core that a loader of remote URLs starts with (then tuned).
REMOTE_PROCESSES_PER_CORE = 2
BACKENDS = ("thread", "process", "auto")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """How a Loader runs; the `Loader` keyword arguments of the same names.

    `workers` is None (one per usable core; on remote URLs, tuned as "auto"), an int, or
    "auto" (tuned while it runs);
    `backend` is "auto", "thread" or "process" (process options in `process`). Which samples
    go in which batch (order, seed, shards, the last batch) is the `EpochPlan`'s part
    (prefetch.plan._epochs). See the `Loader` reference for each option's meaning.
    """

    batch_size: int = 32
    workers: int | str | None = None
    depth: int = 2
    label_mode: str | None = "int"
    on_error: str = "raise"
    max_skipped: int | None = None
    copy: bool = False
    backend: str = "auto"
    process: ProcessOptions = field(default_factory=ProcessOptions)
    memory_budget: int | None = None
    sample_timeout_s: float | None = None

    def __post_init__(self) -> None:
        positive("batch_size", self.batch_size)
        positive("depth", self.depth)
        if isinstance(self.workers, str) and self.workers != "auto":
            raise ValueError(f"workers must be an int >= 1 or 'auto', got {self.workers!r}")
        if self.workers is not None and self.workers != "auto":
            positive("workers", self.workers)
        one_of("label_mode", self.label_mode, LABEL_MODES)
        one_of("on_error", self.on_error, ON_ERROR)
        one_of("backend", self.backend, BACKENDS)
        if self.max_skipped is not None and self.max_skipped < 0:
            raise ValueError(f"max_skipped must be >= 0 or None, got {self.max_skipped}")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise ValueError(
                f"memory_budget must be a positive number of bytes, got {self.memory_budget}"
            )
        timeout = self.sample_timeout_s
        number = isinstance(timeout, (int, float, np.integer, np.floating))
        if timeout is not None and (isinstance(timeout, bool) or not number or not timeout > 0):
            raise ValueError(
                f"sample_timeout_s must be a number of seconds > 0 or None, got {timeout!r}"
            )


def check_validation_split(
    validation_split: Any, subset: Any, seed: int | None, source: object
) -> None:
    """Refuse a `validation_split`/`subset` pair a Loader cannot split by (Keras's rules, with
    the fix): both or neither, a fraction in (0, 1), one side, a seed, a file source."""
    if validation_split is None and subset is None:
        return
    if validation_split is None or subset is None:
        raise ValueError(
            "validation_split and subset go together: pass both (e.g. validation_split=0.2, "
            f'subset="training") or neither; got validation_split={validation_split!r}, '
            f"subset={subset!r}"
        )
    fraction = isinstance(validation_split, (int, float, np.integer, np.floating))
    if isinstance(validation_split, bool) or not fraction or not 0 < validation_split < 1:
        raise ValueError(
            "validation_split must be the fraction of the files to hold out, a number between "
            f"0 and 1 (e.g. 0.2), got {validation_split!r}"
        )
    if subset == "both":
        raise ValueError(
            'subset="both" gives two datasets, but a Loader is one: make two Loaders, one with '
            'subset="training" and one with subset="validation", with the same seed'
        )
    one_of("subset", subset, SUBSETS)
    if seed is None:
        raise ValueError(
            "validation_split needs a seed: the file list is shuffled with it before the split "
            "(as in Keras), and the training and the validation loader must shuffle it the "
            "same way. Pass the same seed= to both"
        )
    if not is_file_source(source):
        raise ValueError(
            "validation_split splits a list of files, but the source is a "
            f"{type(source).__name__}: pass an ImageFolder, a FileList or a folder path, or "
            "split your own source's indices yourself"
        )
    from prefetch.sources.shards._sources import (
        ShardSource,  # it imports prefetch.sources._folders, as this
    )

    if isinstance(source, ShardSource) and source.streaming:
        raise ValueError(
            "validation_split picks single samples, but this shard source is streamed (whole "
            "shards in sequence): split by shard instead, one source of the training shards "
            "and one of the validation shards, or make it with streaming=False"
        )


def process_options(
    backend: str | ProcessOptions, max_restarts: int | None, start_method: str | None
) -> ProcessOptions:
    """The process options from `backend=ProcessOptions(...)` or the older keywords."""
    if isinstance(backend, ProcessOptions):
        if max_restarts is not None or start_method is not None:
            raise ValueError(
                "pass max_restarts and start_method inside ProcessOptions, not beside it"
            )
        return backend
    restarts = 3 if max_restarts is None else max_restarts
    return ProcessOptions(max_restarts=restarts, start_method=start_method)


def check_crop(options: DecodeOptions, decoder: object) -> None:
    """Refuse what cannot go with `crop=`: Keras's crop or padding (the crop replaces them) and
    a decoder of your own (it decodes whole images; crops are decoded by prefetch's own)."""
    if options.crop_to_aspect_ratio or options.pad_to_aspect_ratio:
        raise ValueError(
            "crop= replaces crop_to_aspect_ratio and pad_to_aspect_ratio; leave them False "
            "(CenterCrop keeps the target's aspect ratio)"
        )
    if decoder not in (None, "auto", "pillow", "turbo"):
        raise ValueError(
            f"crop= decodes its window with prefetch's own decoders; decoder={decoder!r} decodes "
            'whole images. Pass decoder="auto", "turbo" or "pillow", or crop inside your own '
            "Source's __getitem__"
        )


def decode_options(
    image_size: int | tuple[int, int] | list[int],
    color_mode: str,
    interpolation: str,
    crop_to_aspect_ratio: bool,
    pad_to_aspect_ratio: bool,
    antialias: bool,
) -> DecodeOptions:
    """The `DecodeOptions` of Keras-style keyword options (`color_mode` by name; `image_size`
    an int for a square, or (height, width))."""
    one_of("color_mode", color_mode, tuple(COLOR_MODES))
    return DecodeOptions(
        image_size,
        COLOR_MODES[color_mode],
        interpolation,
        bool(crop_to_aspect_ratio),
        pad_to_aspect_ratio=bool(pad_to_aspect_ratio),
        antialias=bool(antialias),
    )
