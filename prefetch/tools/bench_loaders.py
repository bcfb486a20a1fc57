"""The loaders `prefetch bench` compares, one class per row, each yielding batch sizes.

A python loop and a thread pool written by hand, `prefetch.Loader` (as a user gets it, and with
threads and processes), and, where installed, tf.data AUTOTUNE, Keras
`image_dataset_from_directory` and torch's `DataLoader`. `make_contender(key, setup)` builds
one; `open(stack)` enters what it owns into the caller's ExitStack, so everything it starts is
closed with the stack; `stream()` is then one long-lived pipeline, as a training job iterates
it (tf.data and Keras: `.repeat()` and one iterator; prefetch: one open Loader, epoch after
epoch). TensorFlow, Keras and torch are imported only in `open`.
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

from prefetch import storage
from prefetch.augment import Augment, CenterCrop, Crop
from prefetch.autoscale import available_memory_bytes
from prefetch.decode import DecodeOptions, Decoder
from prefetch.loader import Loader
from prefetch.plan import epoch_order
from prefetch.sources import ImageFolder
from prefetch.window_decode import decode_window, flip_left_right

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
    decodes the same windows. Picklable; `engine` as in `prefetch.window_decode`."""

    def __init__(self, crop: Crop, engine: str = "turbo") -> None:
        self.crop, self.engine = crop, engine
        self.augment = Augment(crop, flip=not isinstance(crop, CenterCrop))
        self.name = f"{engine} window"

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        rng = Augment.rng(0, 0, zlib.crc32(path.encode()))
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


class _PrefetchLoader:
    """`prefetch.Loader`, owned for all rounds (`with loader:`): with the bench's settings and
    `backend`, or (`backend=None`) as a user gets it, with no tuning arguments."""

    def __init__(self, setup: Setup, backend: str | None) -> None:
        s = setup
        self.setup = setup
        tuning: dict[str, Any] = {}
        if s.crop is not None:
            tuning.update(crop=s.crop, flip=not isinstance(s.crop, CenterCrop))
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

    def open(self, stack: contextlib.ExitStack) -> None:
        stack.enter_context(self.loader)

    def stream(self) -> Generator[int, None, None]:
        while True:
            yield from batch_sizes(self.loader)

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


class _TfData:
    """The tf.data pipeline as TensorFlow's guides write it, AUTOTUNE everywhere.

    Files (the same listing as ImageFolder) -> shuffle -> read -> decode -> resize (bilinear,
    float32 like Keras) -> batch -> prefetch, then `.repeat()` and one iterator. With a crop,
    Model Garden's recipe, which reads JPEG only: the row then runs on the folder's JPEGs and
    says how many files it left out (`note`).
    """

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.dataset: Any = None
        self.note = ""

    def open(self, stack: contextlib.ExitStack) -> None:
        tf = importlib.import_module("tensorflow")
        s = self.setup
        autotune = tf.data.AUTOTUNE
        channels = s.options.channels

        def load(path: Any, label: Any) -> tuple[Any, Any]:
            data = tf.io.read_file(path)
            if s.crop is not None:
                return model_garden_crop(tf, data, s.crop, s.options), label
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
            return tf.image.resize(image, s.options.image_size), label

        paths, labels = [str(p) for p in s.folder.paths], s.folder.labels
        if s.crop is not None:
            jpeg = [is_jpeg(path) for path in paths]
            if not all(jpeg):
                left_out = len(paths) - sum(jpeg)
                paths = [path for path, keep in zip(paths, jpeg, strict=True) if keep]
                labels = labels[np.asarray(jpeg, dtype=bool)]
                self.note = (
                    f"ran on the {len(paths)} JPEGs only: decode_and_crop_jpeg cannot read the "
                    f"other {left_out} files"
                )
                if not paths:
                    raise ValueError(f"no JPEG under {str(s.folder.root)!r}")
        dataset = tf.data.Dataset.from_tensor_slices((paths, labels))
        dataset = dataset.shuffle(len(paths), seed=s.seed, reshuffle_each_iteration=True)
        dataset = dataset.map(load, num_parallel_calls=autotune)
        self.dataset = dataset.batch(s.batch_size).prefetch(autotune)

    def stream(self) -> Generator[int, None, None]:
        for images, _labels in self.dataset.repeat():  # one iterator, as a training job
            count = int(images.shape[0])
            del images, _labels
            yield count

    def describe(self) -> dict[str, Any]:
        # tf.image.resize's default, and Keras's
        return {"decoder": None, "antialias": False, "note": self.note}


def is_jpeg(path: str) -> bool:
    """Whether the file at `path` is a JPEG (what `decode_and_crop_jpeg` reads): a local file
    by its first bytes, a URL by its extension (not read twice)."""
    if storage.is_url(path):
        return path.lower().endswith((".jpg", ".jpeg"))
    with open(storage.local_path(path), "rb") as file:
        return file.read(3) == b"\xff\xd8\xff"


def model_garden_crop(tf: Any, data: Any, crop: Crop, options: DecodeOptions) -> Any:
    """TF Model Garden's ImageNet input for one JPEG: `tf.io.decode_and_crop_jpeg` of a
    `sample_distorted_bounding_box` window (RandomResizedCrop's area and ratio ranges, 10
    attempts; whole image when none fits) and a random flip, or of the central window
    (CenterCrop: `int(fraction x short side)` for square targets), then a bilinear resize."""
    shape = tf.io.extract_jpeg_shape(data)
    height, width = shape[0], shape[1]
    if isinstance(crop, CenterCrop):
        target_h, target_w = options.image_size
        full_h = tf.minimum(
            tf.cast(height, tf.float32), tf.cast(width * target_h / target_w, tf.float32)
        )
        full_w = tf.minimum(
            tf.cast(width, tf.float32), tf.cast(height * target_w / target_h, tf.float32)
        )
        crop_h = tf.cast(crop.fraction * full_h, tf.int32)
        crop_w = tf.cast(crop.fraction * full_w, tf.int32)
        window = tf.stack([(height - crop_h + 1) // 2, (width - crop_w + 1) // 2, crop_h, crop_w])
    else:
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
            min_object_covered=0.1,  # Model Garden's
            aspect_ratio_range=crop.ratio,
            area_range=crop.scale,
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.io.decode_and_crop_jpeg(data, window, channels=options.channels)
    image = tf.image.resize(image, options.image_size)
    if not isinstance(crop, CenterCrop):
        image = tf.image.random_flip_left_right(image)
    return image


class _Keras(_TfData):
    """`keras.utils.image_dataset_from_directory` on the folder, with its own defaults."""

    def open(self, stack: contextlib.ExitStack) -> None:
        keras = importlib.import_module("keras")
        s = self.setup
        self.dataset = keras.utils.image_dataset_from_directory(
            str(s.folder.root),
            batch_size=s.batch_size,
            image_size=s.options.image_size,
            shuffle=True,
            seed=s.seed,
            verbose=False,
        )


class _TorchSamples:
    """A map-style dataset for torch's `DataLoader`: `(decoded image, label)` per index.

    Picklable (spawned DataLoader workers import it from here); no torch needed to build it.
    """

    def __init__(self, folder: ImageFolder, decoder: Decoder, options: DecodeOptions) -> None:
        self.paths = folder.paths
        self.labels = folder.labels
        self.decoder = decoder
        self.options = options

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.decoder(str(self.paths[index]), self.options), int(self.labels[index])


class _Torch:
    """torch's `DataLoader` with `workers` spawned worker processes and default prefetching."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.loader: Any = None

    def open(self, stack: contextlib.ExitStack) -> None:
        torch = importlib.import_module("torch")
        data = importlib.import_module("torch.utils.data")
        s = self.setup
        self.loader = data.DataLoader(
            _TorchSamples(s.folder, s.decoder, s.options),
            batch_size=s.batch_size,
            shuffle=True,
            num_workers=s.workers,
            multiprocessing_context="spawn",  # never fork a process that may hold TensorFlow
            generator=torch.Generator().manual_seed(s.seed),
            persistent_workers=True,  # one set of workers for the whole job
        )

    def stream(self) -> Generator[int, None, None]:
        while True:
            for images, _labels in self.loader:
                count = int(images.shape[0])
                del images, _labels
                yield count

    def describe(self) -> dict[str, Any]:
        return {"decoder": self.setup.decoder_name, "antialias": self.setup.options.antialias}


def make_contender(key: str, setup: Setup) -> Contender:
    makers: dict[str, Callable[[], Contender]] = {
        "loop": lambda: _ByHand(setup),
        "pool": lambda: _ByHand(setup, setup.workers),
        "default": lambda: _PrefetchLoader(setup, None),
        "threads": lambda: _PrefetchLoader(setup, "thread"),
        "processes": lambda: _PrefetchLoader(setup, "process"),
        "tf.data": lambda: _TfData(setup),
        "keras": lambda: _Keras(setup),
    }
    return makers.get(key, lambda: _Torch(setup))()


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


def tensorflow_cannot_read(url: str) -> str | None:
    """Why TensorFlow's `tf.io.gfile` (what tf.data's `read_file` and Keras's lister use)
    cannot read the folder `url`, or None when it can (`gs://` with TensorFlow's own
    filesystem, `s3://` with tensorflow-io)."""
    import tensorflow as tf  # the TensorFlow rows import it anyway

    try:
        if tf.io.gfile.isdir(url):
            return None
        problem = "it sees no folder there; it has no http(s):// filesystem"
    except Exception as error:  # tf.errors.UnimplementedError for an unknown scheme, ...
        problem = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return f"TensorFlow's tf.io.gfile cannot read {url!r} ({problem})"


def unavailable(keys: Sequence[str], setup: Setup, step_ms: float) -> dict[str, str]:
    """Loader key -> why it cannot be measured here: a missing package, a URL that TensorFlow
    cannot read (the "tf.data" and "keras" rows), or, when a step is simulated (`step_ms`),
    "pool" when its unbounded read-ahead would not fit in half the available memory."""
    skipped = {key: reason for key in keys if (reason := missing_requirement(key)) is not None}
    if setup.crop is not None and "keras" in keys:
        skipped["keras"] = "image_dataset_from_directory has no crop of the original image"
    root = str(setup.folder.root)
    tensorflow_rows = [key for key in ("tf.data", "keras") if key in keys and key not in skipped]
    if tensorflow_rows and storage.is_url(root):
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
