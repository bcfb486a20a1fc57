"""The loaders `prefetch bench` compares, one class per row, each yielding batch sizes.

A python loop and a thread pool written by hand, `prefetch.Loader` (as a user gets it, and with
threads and processes), and, where installed, tf.data AUTOTUNE, Keras
`image_dataset_from_directory` and torch's `DataLoader` (those three in `_frameworks`).
`make_contender(key, setup)` builds
one; `open(stack)` enters what it owns into the caller's ExitStack, so everything it starts is
closed with the stack; `stream()` is then one long-lived pipeline, as a training job iterates
it (tf.data and Keras: `.repeat()` and one iterator; prefetch: one open Loader, epoch after
epoch). TensorFlow, Keras and torch are imported only in `open`. `OpenLoader` is the prefetch
rows' contender, which a benchmark script subclasses for a Loader of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import math
import zlib
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from prefetch.decode import DecodeOptions, Decoder, decode_window, flip_left_right
from prefetch.io import Location, is_url
from prefetch.plan import Augment, CenterCrop, Crop, epoch_order
from prefetch.runtime import Loader, available_memory_bytes
from prefetch.sources import ImageFolder
from prefetch.tools.bench._frameworks import (
    KerasContender,
    TfDataContender,
    TorchContender,
    tensorflow_cannot_read,
)

# Loader keys in the order they run in each round, with their display names.
LOADER_NAMES: dict[str, str] = {
    "loop": "python loop (1 core)",
    "pool": "thread pool (15 lines)",
    "default": "prefetch default",
    "threads": "prefetch threads",
    "processes": "prefetch processes",
    "tf.data": "tf.data AUTOTUNE",
    "keras": "keras image_dataset_from_directory",
    "torch": "torch DataLoader",
}
# Modules a loader needs, and how to install them.
_REQUIREMENTS: dict[str, tuple[tuple[str, ...], str]] = {
    "tf.data": (("tensorflow",), "pip install tensorflow"),
    "keras": (("keras", "tensorflow"), "pip install tensorflow keras"),
    "torch": (("torch",), "pip install torch"),
}


class Contender(Protocol):
    """A loader under test: opened once, then `stream()` yields batch sizes without end, epoch
    after epoch; `describe()` gives its row's decoder, backend, backend_reason and antialias
    (after it ran: an automatic choice is made when a loader starts) and a `note` on what it
    measured when that differs from the folder ("" otherwise)."""

    def open(self, stack: contextlib.ExitStack) -> None: ...

    def stream(self) -> Generator[int, None, None]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Setup:
    folder: ImageFolder
    options: DecodeOptions
    batch_size: int
    workers: int
    depth: int
    seed: int
    decoder: Decoder
    decoder_name: str = ""
    crop: Crop | None = None  # the training or evaluation shape of the work (`--crop`)


class CroppingDecoder:
    """A `Decoder` that decodes the window `crop` draws (and flips it like `flip=True`), for the
    rows a user writes by hand and for the decode limit of the training shape of the work.
    Each path draws from its own generator (seeded by the path), so every row and every round
    decodes the same windows. Picklable; `engine` as in `prefetch.decode._window`."""

    def __init__(self, crop: Crop, engine: str = "turbo") -> None:
        self.crop, self.engine = crop, engine
        self.augment = Augment(crop, flip=not isinstance(crop, CenterCrop))
        self.name = f"{engine} window"

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        rng = Augment.rng(0, 0, zlib.crc32(str(path).encode()))
        image = decode_window(path, self.crop, rng, options, self.engine)
        return flip_left_right(image) if self.augment.flipped(rng) else image


def python_loop_batches(
    paths: Sequence[str], decode: Callable[[str], np.ndarray], batch_size: int
) -> Generator[np.ndarray, None, None]:
    """Decode one image after another in the consumer's thread; no overlap at all."""
    for first in range(0, len(paths), batch_size):
        yield np.stack([decode(path) for path in paths[first : first + batch_size]])


def thread_pool_batches(
    paths: Sequence[str], decode: Callable[[str], np.ndarray], batch_size: int, workers: int
) -> Generator[np.ndarray, None, None]:
    """The loader a user writes in 15 lines: a thread pool maps `decode` over the files, and
    each `batch_size` results in a row are stacked into one array.

    `Executor.map` submits every file at once, so decoded images pile up in memory when the
    consumer is slower than the decoding (prefetch's window bounds that).
    """
    pool = ThreadPoolExecutor(workers)
    try:
        images = pool.map(decode, paths)  # in order, decoded ahead by every worker
        for first in range(0, len(paths), batch_size):
            yield np.stack([next(images) for _ in paths[first : first + batch_size]])
    finally:
        pool.shutdown(cancel_futures=True)  # a consumer that stops early drops the rest


class _ByHand:
    """A loader written by hand (`python_loop_batches`, `thread_pool_batches`) over the same
    shuffled files as prefetch's, decoding with the rows' decoder."""

    def __init__(self, setup: Setup, workers: int | None = None) -> None:
        self.setup = setup
        self.workers = workers

    def open(self, stack: contextlib.ExitStack) -> None:
        pass

    def stream(self) -> Generator[int, None, None]:
        for number in itertools.count():
            yield from self.epoch(number)

    def epoch(self, number: int) -> Generator[int, None, None]:
        s = self.setup
        order = epoch_order(len(s.folder), shuffle=True, seed=s.seed, epoch=number)
        paths = [str(s.folder.paths[index]) for index in order]

        def decode(path: str) -> np.ndarray:
            return s.decoder(path, s.options)

        if self.workers is None:
            batches = python_loop_batches(paths, decode, s.batch_size)
        else:
            batches = thread_pool_batches(paths, decode, s.batch_size, self.workers)
        with contextlib.closing(batches):
            for images in batches:
                yield len(images)

    def describe(self) -> dict[str, Any]:
        return {"decoder": self.setup.decoder_name, "antialias": self.setup.options.antialias}


class OpenLoader:
    """A contender that is one `prefetch.Loader` (`self.loader`, set by the subclass), open for
    the whole row (`with loader:`), read epoch after epoch; `describe()` gives its backend and
    workers. Benchmark scripts subclass it for a Loader of their own."""

    loader: Loader

    def open(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(self.loader)

    def stream(self) -> Generator[int, None, None]:
        while True:
            yield from batch_sizes(self.loader)

    def describe(self) -> dict[str, Any]:
        stats = self.loader.stats()
        return {"note": f"{stats.backend}, {stats.workers} workers"}


class _PrefetchLoader(OpenLoader):
    """`prefetch.Loader`, owned for all rounds (`with loader:`): with the bench's settings and
    `backend`, or (`backend=None`) as a user gets it, with no tuning arguments."""

    def __init__(self, setup: Setup, backend: str | None) -> None:
        s = setup
        self.setup = setup
        tuning: dict[str, Any] = {}
        if s.crop is not None:
            tuning.update(augment=Augment(s.crop, flip=not isinstance(s.crop, CenterCrop)))
        if backend is not None:
            tuning.update(workers=s.workers, depth=s.depth, backend=backend)
            tuning.update(antialias=s.options.antialias)
            if s.crop is None:  # crops are decoded by the loader's own window decoder
                tuning.update(decoder=s.decoder)
        self.loader = Loader(
            s.folder,
            batch_size=s.batch_size,
            image_size=s.options.image_size,
            seed=s.seed,
            **tuning,
        )
        self.by_default = backend is None

    def describe(self) -> dict[str, Any]:
        stats = self.loader.stats()
        # With a crop, every prefetch row runs the loader's own window decoder.
        own = self.by_default or self.setup.crop is not None
        return {
            "decoder": stats.decoder if own else self.setup.decoder_name,
            "backend": stats.backend,
            "backend_reason": stats.backend_reason,
            "antialias": self.loader.options.antialias,
        }


def make_contender(key: str, setup: Setup) -> Contender:
    makers: dict[str, Callable[[], Contender]] = {
        "loop": lambda: _ByHand(setup),
        "pool": lambda: _ByHand(setup, setup.workers),
        "default": lambda: _PrefetchLoader(setup, None),
        "threads": lambda: _PrefetchLoader(setup, "thread"),
        "processes": lambda: _PrefetchLoader(setup, "process"),
        "tf.data": lambda: TfDataContender(setup),
        "keras": lambda: KerasContender(setup),
    }
    return makers.get(key, lambda: TorchContender(setup))()


def missing_requirement(key: str) -> str | None:
    """Why loader `key` cannot run here ("torch not installed: pip install torch"), or None."""
    modules, install = _REQUIREMENTS.get(key, ((), ""))
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: {install}"
    return None


def batch_sizes(loader: Loader) -> Generator[int, None, None]:
    """One epoch of `loader`, as batch sizes (holding no view of a batch between yields)."""
    for batch in loader:
        count = len(batch.images)
        del batch  # a held view would keep its slot from being reused
        yield count


def unavailable(keys: Sequence[str], setup: Setup, step_ms: float) -> dict[str, str]:
    """Loader key -> why it cannot be measured here: a missing package, a URL that TensorFlow
    cannot read (the "tf.data" and "keras" rows), or, when a step is simulated (`step_ms`),
    "pool" when its unbounded read-ahead would not fit in half the available memory."""
    skipped = {key: reason for key in keys if (reason := missing_requirement(key)) is not None}
    if setup.crop is not None and "keras" in keys:
        skipped["keras"] = "image_dataset_from_directory has no crop of the original image"
    root = str(setup.folder.root)
    tensorflow_rows = [key for key in ("tf.data", "keras") if key in keys and key not in skipped]
    if tensorflow_rows and is_url(root):
        reason = tensorflow_cannot_read(root)
        if reason is not None:
            skipped.update(dict.fromkeys(tensorflow_rows, reason))
    if "pool" in keys and step_ms > 0:
        decoded = len(setup.folder) * math.prod(setup.options.shape)
        memory = available_memory_bytes()
        if decoded > memory // 2:
            skipped["pool"] = (
                f"its map decodes ahead without bound: {decoded / 2**30:.1f} GiB of decoded "
                f"images, over half of the {memory / 2**30:.1f} GiB available"
            )
    return skipped
