"""The Loader's options as frozen, keyword-only dataclasses; every check is written once here.

`LoaderOptions` is `loader.options`: everything a `Loader` was made with, normalized (a string
`on_error` as an `ErrorPolicy`, `workers="auto"` as `Autotune()`, `backend=ProcessOptions(...)`
as "process" and `backend=RayOptions(...)` as "ray", with their options, the drawn seed) and its
host split (`Loader.shard`). The option groups a `Loader` takes beside its flat keywords:
`ErrorPolicy` (what a failing sample does), `Autotune` (a tuned worker count), `ProcessOptions`
and `RayOptions` (prefetch.backends), `RemoteOptions` (prefetch.io), `Augment` (prefetch.plan).
A bad value raises ValueError naming the option, the value and what would be accepted.
"""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from prefetch._checks import one_of, positive
from prefetch._messages import suggest_keywords
from prefetch.backends import ProcessOptions, RayOptions
from prefetch.decode import COLOR_MODES, DecodeOptions, Decoder, check_max_pixels
from prefetch.io import DEFAULT_MAX_PIXELS, RemoteOptions
from prefetch.plan import Augment
from prefetch.sources import (
    LABEL_MODES,
    SUBSETS,
    ImageFolder,
    Source,
    as_source,
    is_file_source,
    split_files,
)
from prefetch.sources.shards import ShardSource

ON_ERROR = ("raise", "skip")
# Thread workers per core that a loader of remote URLs starts with (then tuned): enough requests
# in flight to cover tens of milliseconds of latency at a few hundred images per second.
REMOTE_READER_THREADS = 8
# Worker processes per core that a loader of remote URLs starts with (then tuned).
REMOTE_PROCESSES_PER_CORE = 2
BACKENDS = ("thread", "process", "ray", "auto")
# The keywords a Loader no longer takes, and their spelling now (CHANGELOG.md).
MOVED = {
    "max_restarts": "backend=ProcessOptions(max_restarts=...)",
    "start_method": "backend=ProcessOptions(start_method=...)",
    "num_shards": "loader.shard(num_shards, shard_index) after making the Loader",
    "shard_index": "loader.shard(num_shards, shard_index) after making the Loader",
    "max_skipped": 'on_error=ErrorPolicy("skip", max_skipped=...)',
    "sample_timeout_s": "on_error=ErrorPolicy(sample_timeout_s=...)",
    "memory_budget": "workers=Autotune(memory_budget=...)",
    "cache_dir": "remote=RemoteOptions(cache_dir=...)",
    "cache_limit": "remote=RemoteOptions(cache_dir=..., cache_limit=...)",
    "crop": "augment=Augment(crop=...)",
    "flip": "augment=Augment(flip=True)",
    "transform": "augment=Augment(transform=...)",
    "ranks_per_host": (
        "the ranks on this host in the environment, where launchers put it and every loader of "
        "the process reads it: PREFETCH_RANKS_PER_HOST=N (os.environ before the Loader is made; "
        "torchrun's LOCAL_WORLD_SIZE and SLURM are read without it)"
    ),
    "copy": "nothing: a batch you keep is never overwritten; batch.images.copy() makes a copy",
}


@suggest_keywords
@dataclass(frozen=True)
class ErrorPolicy:
    """What a sample that fails to load does: `Loader(on_error=ErrorPolicy("skip", ...))`.

    The bounds on failure travel with the choice they qualify: `on_error="skip"` is
    `ErrorPolicy("skip")`, and a cap or a time limit is added here rather than as more
    keywords of the Loader.

    - `action`: `"raise"` (a sample that fails raises at its batch, with a note naming it) or
      `"skip"` (it is dropped, logged and counted in `stats()`).
    - `max_skipped`: with "skip", the most distinct files that may fail before
      `TooManySkippedError`; None for no cap.
    - `sample_timeout_s`: a time limit per sample, in seconds, past which it raises
      `SampleTimeoutError` (with "skip" and the process backend, it is skipped); None for none.
    - `max_pixels`: the most pixels (width x height, from the file's header) of an image the
      built-in decoders decode; a larger one fails before any pixel is allocated
      (`PIL.Image.DecompressionBombError` naming the file and the limit; skipped with
      "skip"). Default `prefetch.io.DEFAULT_MAX_PIXELS` (64 megapixels, about 0.7 GB to
      decode); None for no limit of prefetch's (Pillow's own stays).
    """

    action: str = "raise"
    _: KW_ONLY
    max_skipped: int | None = None
    sample_timeout_s: float | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        one_of("on_error", self.action, ON_ERROR)
        if self.max_skipped is not None and self.max_skipped < 0:
            raise ValueError(f"max_skipped must be >= 0 or None, got {self.max_skipped}")
        check_max_pixels(self.max_pixels)
        timeout = self.sample_timeout_s
        number = isinstance(timeout, (int, float, np.integer, np.floating))
        if timeout is not None and (isinstance(timeout, bool) or not number or not timeout > 0):
            raise ValueError(
                f"sample_timeout_s must be a number of seconds > 0 or None, got {timeout!r}"
            )

    @property
    def skip(self) -> bool:
        """Whether failing samples are skipped."""
        return self.action == "skip"


@suggest_keywords
@dataclass(frozen=True, kw_only=True)
class Autotune:
    """A worker count tuned while the loader runs: `Loader(workers=Autotune(...))`;
    `workers="auto"` is `Autotune()`.

    - `memory_budget`: the bytes the workers and batch buffers may use; None for a quarter of
      the memory available at the start, divided among the ranks on the host (from the launcher,
      or `PREFETCH_RANKS_PER_HOST`). The count grows to at most this rank's share of the cores.
    """

    memory_budget: int | None = None

    def __post_init__(self) -> None:
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not budget >= 1):
            raise ValueError(f"memory_budget must be a positive number of bytes, got {budget}")


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """`loader.options`: what a `Loader` was made with, read-only (see `Loader` for each).

    Each field is the `Loader` keyword of its name, normalized:

    - `batch_size`: as given.
    - `image_size`: `(height, width)` (an int given is `(size, size)`).
    - `shuffle`: as given.
    - `seed`: the seed in use (drawn when None was given).
    - `validation_split`: as given.
    - `subset`: as given.
    - `label_mode`: as given.
    - `color_mode`: the name given.
    - `interpolation`: the name given.
    - `crop_to_aspect_ratio`: as given.
    - `pad_to_aspect_ratio`: as given.
    - `drop_remainder`: as given.
    - `antialias`: as given.
    - `augment`: an `Augment` (empty when None was given).
    - `decoder`: the decoder given, by name or as a function.
    - `workers`: an int, None (one per usable core, less one from 4 cores on) or an
      `Autotune` (for "auto").
    - `depth`: the most batches in flight.
    - `backend`: "auto", "thread", "process" or "ray" (a `ProcessOptions` given is "process",
      a `RayOptions` "ray").
    - `process`: the `ProcessOptions` of the process backend.
    - `ray`: the `RayOptions` of the Ray backend (for backend="ray"; else None).
    - `on_error`: an `ErrorPolicy` (a string given is `ErrorPolicy(on_error)`).
    - `remote`: the `RemoteOptions` of its remote reads (given, the source's, or the default).
    - `num_shards`: the number of host shards, set by `Loader.shard`.
    - `shard_index`: this loader's host shard, set by `Loader.shard`.

    `decode` is the `DecodeOptions` of the pixels' options; `memory_budget` and `cache_dir`
    read `workers` and `remote`.
    """

    batch_size: int = 32
    image_size: tuple[int, int] = (256, 256)
    shuffle: bool = True
    seed: int = 0
    validation_split: float | None = None
    subset: str | None = None
    label_mode: str | None = "int"
    color_mode: str = "rgb"
    interpolation: str = "bilinear"
    crop_to_aspect_ratio: bool = False
    pad_to_aspect_ratio: bool = False
    drop_remainder: bool = False
    antialias: bool = False
    augment: Augment = field(default_factory=Augment)
    decoder: Decoder | str | None = "auto"
    workers: int | Autotune | None = None
    depth: int = 2
    backend: str = "auto"
    process: ProcessOptions = field(default_factory=ProcessOptions)
    ray: RayOptions | None = None
    on_error: ErrorPolicy = field(default_factory=ErrorPolicy)
    remote: RemoteOptions = field(default_factory=RemoteOptions)
    num_shards: int = 1
    shard_index: int = 0
    # What a decoder does with one image, made once from the pixels' options above.
    decode: DecodeOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        positive("batch_size", self.batch_size)
        positive("depth", self.depth)
        # With the Ray backend, workers=0 runs no actor on this node: all decode on the others.
        none_here = self.backend == "ray" and self.workers == 0 and self.workers is not False
        if self.workers is not None and not isinstance(self.workers, Autotune) and not none_here:
            positive("workers", self.workers)
        one_of("label_mode", self.label_mode, LABEL_MODES)
        one_of("backend", self.backend, BACKENDS)
        if self.backend == "ray" and isinstance(self.workers, Autotune):
            raise ValueError(
                "workers='auto' tunes the worker count of this host; with backend=RayOptions(...) "
                "the workers are the decode actors on this node, beside the cluster's "
                "(RayOptions.cpus): pass workers=N, or None for one per core of this rank's share"
            )
        decode = decode_options(
            self.image_size,
            self.color_mode,
            self.interpolation,
            self.crop_to_aspect_ratio,
            self.pad_to_aspect_ratio,
            self.antialias,
            max_pixels=self.on_error.max_pixels,
        )
        object.__setattr__(self, "decode", decode)
        if self.augment.crop is not None:
            check_crop(decode, self.decoder)

    @property
    def tuned(self) -> bool:
        """Whether the worker count is tuned as asked (`Autotune`)."""
        return isinstance(self.workers, Autotune)

    @property
    def memory_budget(self) -> int | None:
        """The tuned workers' memory budget (`Autotune.memory_budget`), or None."""
        return self.workers.memory_budget if isinstance(self.workers, Autotune) else None

    @property
    def cache_dir(self) -> str | os.PathLike[str] | None:
        """`remote.cache_dir`: the folder of local copies of remote objects, or None."""
        return self.remote.cache_dir


def as_workers(workers: int | str | Autotune | None) -> int | Autotune | None:
    """`workers` with "auto" as `Autotune()`; ValueError for another string."""
    if isinstance(workers, str):
        if workers != "auto":
            raise ValueError(f"workers must be an int >= 1 or 'auto', got {workers!r}")
        return Autotune()
    return workers


def backend_groups(backend: str | ProcessOptions | RayOptions) -> dict[str, Any]:
    """The `backend` keyword as `LoaderOptions`' `backend`, `process` and `ray` fields: an
    option group as its backend's name and itself, "ray" as `RayOptions()`."""
    process = backend if isinstance(backend, ProcessOptions) else ProcessOptions()
    if isinstance(backend, RayOptions) or backend == "ray":
        ray = backend if isinstance(backend, RayOptions) else RayOptions()
        return {"backend": "ray", "process": process, "ray": ray}
    name = "process" if isinstance(backend, ProcessOptions) else backend
    return {"backend": name, "process": process, "ray": None}


def as_error_policy(on_error: str | ErrorPolicy) -> ErrorPolicy:
    """`on_error` as an `ErrorPolicy` ("skip" is `ErrorPolicy("skip")`)."""
    return on_error if isinstance(on_error, ErrorPolicy) else ErrorPolicy(on_error)


def prepared_source(
    source: Any,
    remote: RemoteOptions | None,
    policy: ErrorPolicy,
    validation_split: float | None,
    subset: str | None,
    seed: int | None,
) -> tuple[Source, RemoteOptions]:
    """The Loader's source (`as_source`: a path is an `ImageFolder`; one side of
    `validation_split` when asked) and its `RemoteOptions`: as given, else an
    `ImageFolder(url, remote=...)` source's, else the defaults."""
    check_group("remote", remote, RemoteOptions, "RemoteOptions(...)")
    made = as_source(source, remote=remote, on_error=policy.action)
    listed = made.remote if isinstance(made, ImageFolder) else None
    check_validation_split(validation_split, subset, seed, made)
    if validation_split is not None and subset is not None and is_file_source(made):
        made = split_files(made, validation_split, subset, seed)
    return made, remote or listed or RemoteOptions()


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
    if isinstance(source, ShardSource) and source.streaming:
        raise ValueError(
            "validation_split picks single samples, but this shard source is streamed (whole "
            "shards in sequence): split by shard instead, one source of the training shards "
            "and one of the validation shards, or make it with streaming=False"
        )


def check_crop(options: DecodeOptions, decoder: object) -> None:
    """Refuse what cannot go with `Augment(crop=...)`: Keras's crop or padding (the crop
    replaces them) and a decoder of your own (it decodes whole images; crops are decoded by
    prefetch's own)."""
    if options.crop_to_aspect_ratio or options.pad_to_aspect_ratio:
        raise ValueError(
            "Augment(crop=...) replaces crop_to_aspect_ratio and pad_to_aspect_ratio; leave them "
            "False (CenterCrop keeps the target's aspect ratio)"
        )
    if decoder not in (None, "auto", "pillow", "turbo"):
        raise ValueError(
            "Augment(crop=...) decodes its window with prefetch's own decoders; "
            f"decoder={decoder!r} decodes whole images. "
            'Pass decoder="auto", "turbo" or "pillow", or crop inside your own '
            "Source's __getitem__"
        )


def decode_options(
    image_size: int | tuple[int, int] | list[int],
    color_mode: str,
    interpolation: str,
    crop_to_aspect_ratio: bool,
    pad_to_aspect_ratio: bool,
    antialias: bool,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
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
        max_pixels=max_pixels,
    )


def check_group(name: str, value: object, kind: type, example: str) -> None:
    """TypeError unless `value` is None or an option object of type `kind` (`example` shows
    how to make one)."""
    if value is not None and not isinstance(value, kind):
        raise TypeError(
            f"{name} must be a prefetch.{kind.__name__} or None, got {type(value).__name__}: "
            f"pass {name}=prefetch.{example}"
        )
