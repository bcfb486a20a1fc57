"""The framework rows of `prefetch bench`: tf.data AUTOTUNE, Keras's
`image_dataset_from_directory` and torch's `DataLoader`, each one long-lived pipeline as a
training job runs it. TensorFlow, Keras and torch are imported only in `open`, in the row's
own process; TensorFlow and Keras through `import_quietly`, so that TensorFlow's C++ start-up
lines (absl, the CUDA stub, oneDNN, cuInit) never interleave with the table.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Generator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from prefetch.decode import DecodeOptions, Decoder
from prefetch.io import is_url, local_path
from prefetch.plan import CenterCrop, Crop
from prefetch.sources import ImageFolder

if TYPE_CHECKING:
    from prefetch.tools.bench._loaders import Setup


class TfDataContender:
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
        tf = import_quietly("tensorflow")
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
    if is_url(path):
        return path.lower().endswith((".jpg", ".jpeg"))
    with open(local_path(path), "rb") as file:
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


class KerasContender(TfDataContender):
    """`keras.utils.image_dataset_from_directory` on the folder, with its own defaults."""

    def open(self, stack: contextlib.ExitStack) -> None:
        keras = import_quietly("keras")
        s = self.setup
        self.dataset = keras.utils.image_dataset_from_directory(
            str(s.folder.root),
            batch_size=s.batch_size,
            image_size=s.options.image_size,
            shuffle=True,
            seed=s.seed,
            verbose=False,
        )


class TorchSamples:
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


class TorchContender:
    """torch's `DataLoader` with `workers` spawned worker processes and default prefetching."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.loader: Any = None

    def open(self, stack: contextlib.ExitStack) -> None:
        torch = importlib.import_module("torch")
        data = importlib.import_module("torch.utils.data")
        s = self.setup
        self.loader = data.DataLoader(
            TorchSamples(s.folder, s.decoder, s.options),
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


def import_quietly(name: str) -> ModuleType:
    """`importlib.import_module(name)` (TensorFlow, or Keras on it) without TensorFlow's C++
    log: `TF_CPP_MIN_LOG_LEVEL=3` is set (unless already set) before TensorFlow is imported,
    which silences its errors too (cuInit's on a machine without a GPU); the lines written
    before absl's logging starts (absl's own warning, the CUDA stub's), which no setting
    silences, are sent to /dev/null for the import only. Python's errors still raise."""
    if name in sys.modules:
        return sys.modules[name]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
            return importlib.import_module(name)
        finally:
            os.dup2(saved, 2)
            os.close(null)
    finally:
        os.close(saved)


def tensorflow_cannot_read(url: str) -> str | None:
    """Why TensorFlow's `tf.io.gfile` (what tf.data's `read_file` and Keras's lister use)
    cannot read the folder `url`, or None when it can (`gs://` with TensorFlow's own
    filesystem, `s3://` with tensorflow-io)."""
    tf = import_quietly("tensorflow")  # the TensorFlow rows import it anyway

    try:
        if tf.io.gfile.isdir(url):
            return None
        problem = "it sees no folder there; it has no http(s):// filesystem"
    except Exception as error:  # tf.errors.UnimplementedError for an unknown scheme, ...
        problem = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return f"TensorFlow's tf.io.gfile cannot read {url!r} ({problem})"
