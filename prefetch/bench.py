"""prefetch.bench: measure loaders on one image folder against the machine's decode limit.

`run(root, ...)` measures, in one process and one run, the single-core decode + resize rate of
every decoder in `available_decoders()` (the decode limit is usable cores x the best rate) and
the images/s and consumer wait of each loader: a plain Python loop, a plain thread pool (the
loop a user writes in 15 lines, `thread_pool_batches`), the `prefetch.Loader` as a user gets it
with no tuning arguments, prefetch threads, prefetch processes, and, where installed, the
tf.data AUTOTUNE pipeline, Keras `image_dataset_from_directory` and a PyTorch `DataLoader`. It
returns a `BenchReport` (table, JSON, chart) that names the decoder and backend of each row, and,
when the `fast` extra is missing, an estimate of what installing it would gain (`FastHint`).
Rounds are interleaved (every loader once per round, medians over rounds) so that a busy machine
slows all rows alike.

Contract: runs in the calling thread; every loader it opens (threads, processes) is closed
before `run` returns or raises. TensorFlow, Keras and torch are imported only to measure their
loaders, matplotlib only to draw. Figures are timings: compare rows of one run, not runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from prefetch.autotune import available_memory_bytes
from prefetch.decode import DecodeOptions, Decoder, decode_image, get_decoder
from prefetch.decode import decoder_name as short_decoder_name
from prefetch.loader import Loader
from prefetch.sources import ImageFolder, epoch_order
from prefetch.testing import SHAPES, write_image_folder
from prefetch.timeline import TimedDecoder, Timeline, import_matplotlib
from prefetch.workers import usable_cores

# Version of the JSON written by `BenchReport.to_json` (bumped when a field changes meaning).
SCHEMA_VERSION = 2
# Images per single-core decode measurement (fewer when the folder is smaller).
DECODE_SAMPLE = 200
# Typical ImageNet photo size, (width, height) in Pillow order, for generated sample folders.
SAMPLE_SIZE = (500, 375)

# The decoders whose single-core rate is measured, by name. Add one here (or to the
# `available_decoders()` of a module in DECODER_PROVIDERS) and it appears in the table.
DECODERS: dict[str, Decoder] = {"pillow": decode_image}
# Modules whose `available_decoders() -> dict[str, Decoder]`, when the module and the function
# exist, adds to DECODERS (a decoder module added later needs no change here).
DECODER_PROVIDERS = ("prefetch.decode", "prefetch.fast_decode")

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

# CPU ms per image decoded and resized to 224x224 by (decode_image, decode_turbo), at two photo
# sizes (width x height pixels), with and without antialiasing: the "Speed" table of
# docs/decoders.md (update both together). `FastHint` scales this machine's Pillow rate by them.
TURBO_MEASURED: dict[bool, tuple[tuple[int, float, float], ...]] = {
    True: ((500 * 375, 2.29, 2.34), (1600 * 1200, 8.87, 6.90)),
    False: ((500 * 375, 2.08, 1.13), (1600 * 1200, 12.49, 7.64)),
}
FAST_INSTALL = 'pip install "prefetch[fast]"'

Progress = Callable[[int, int, str], None]
"""`progress(done, total, label)`: called as work advances (units: batches of images)."""


# ---- the report --------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """What was measured: the folder, the batch shape, the workers and the simulated step."""

    root: str
    images: int
    classes: int
    image_size: tuple[int, int]
    batch_size: int
    workers: int
    depth: int
    step_ms: float
    repeats: int
    seed: int
    decode_sample: int
    loader_decoder: str
    timeline_batches: int
    timeline_backend: str
    antialias: bool = True


@dataclass(frozen=True)
class DecoderRate:
    """A decoder's single-core decode + resize rate: the median and each round's value."""

    name: str
    images_per_s: float
    runs: tuple[float, ...]


@dataclass(frozen=True)
class LoaderResult:
    """One loader's medians over the rounds, and its ratios to the decode limit and tf.data.

    `consumer_wait_fraction` is the share of the measured time the consumer spent waiting for
    a batch (0 to 1). `ratio_to_tf_data` is None when tf.data was not measured. `decoder` names
    the decoder the row ran ("turbo", "pillow"; None for TensorFlow's own), `backend` the
    prefetch backend ("thread", "process"; None for other loaders) and `backend_reason` why
    it was chosen; `antialias` whether the row's resize antialiases.
    """

    key: str
    name: str
    images_per_s: float
    consumer_wait_fraction: float
    ratio_to_limit: float
    ratio_to_tf_data: float | None
    images_per_s_runs: tuple[float, ...]
    wait_fraction_runs: tuple[float, ...]
    decoder: str | None = None
    backend: str | None = None
    backend_reason: str = ""
    antialias: bool = True


@dataclass(frozen=True)
class FastHint:
    """What installing the `fast` extra would gain here: an estimate, not a measurement.

    `pillow_images_per_s` is Pillow's single-core decode + resize rate measured in this run;
    `speedup` the ratio of Pillow's to libjpeg-turbo's CPU time per image measured in
    docs/decoders.md (`TURBO_MEASURED`) for photos of `photo_pixels` (this folder's median,
    interpolated between the measured sizes) and this run's antialias setting;
    `speedup_other_antialias` the same with the other setting.
    """

    pillow_images_per_s: float
    speedup: float
    speedup_other_antialias: float
    photo_pixels: int
    antialias: bool
    cores: int

    def text(self) -> str:
        """The hint `prefetch bench` prints under its table (three lines)."""
        pillow, cores = self.pillow_images_per_s, self.cores
        turbo = pillow * self.speedup
        setting, other = ("with", "without") if self.antialias else ("without", "with")
        return (
            f"hint: the fast extra (libjpeg-turbo + OpenCV) is not installed: {FAST_INSTALL}\n"
            f"  estimated here, {setting} antialiasing as this run: decode + resize "
            f"{self.speedup:.2f}x as fast, {turbo:.0f} instead of {pillow:.0f} images/s per "
            f"core (decode limit {turbo * cores:.0f} instead of {pillow * cores:.0f}); "
            f"{other} antialiasing: {self.speedup_other_antialias:.2f}x\n"
            f"  (an estimate: Pillow's rate measured in this run x the Pillow/turbo CPU-time "
            f"ratio measured in docs/decoders.md for photos of {self.photo_pixels / 1e6:.2f} MP)"
        )


@dataclass
class BenchReport:
    """The result of `run`: settings, machine, decoder rates, decode limit and loader rows.

    `skipped` maps the key of each loader that was asked for but not measured to the reason
    (for example "torch is not installed: pip install torch"). `timeline` is set when `run` was
    asked to record one; `fast_hint` when the `fast` extra is missing (and Pillow was measured).
    """

    config: BenchConfig
    machine: dict[str, Any]
    decoders: list[DecoderRate]
    decode_limit: float
    limit_decoder: str
    loaders: list[LoaderResult]
    skipped: dict[str, str]
    timeline: Timeline | None = None
    fast_hint: FastHint | None = None

    def loader(self, key: str) -> LoaderResult:
        """The row of the loader `key` ("threads", "tf.data", ...); KeyError if not measured."""
        for row in self.loaders:
            if row.key == key:
                return row
        raise KeyError(
            f"loader {key!r} was not measured; measured: {[r.key for r in self.loaders]}"
        )

    @property
    def step_ceiling(self) -> float:
        """The most images/s a consumer with this step can take: batch_size / step (inf at 0)."""
        if self.config.step_ms <= 0:
            return math.inf
        return self.config.batch_size / (self.config.step_ms / 1000)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data (schema in docs/api.md, "prefetch.bench")."""
        return {
            "schema": SCHEMA_VERSION,
            "config": dataclasses.asdict(self.config),
            "machine": dict(self.machine),
            "decoders": [dataclasses.asdict(rate) for rate in self.decoders],
            "decode_limit": {
                "images_per_s": self.decode_limit,
                "decoder": self.limit_decoder,
                "cores": self.machine["usable_cores"],
            },
            "loaders": [dataclasses.asdict(row) for row in self.loaders],
            "skipped": dict(self.skipped),
            "timeline": self.timeline.as_dicts() if self.timeline is not None else None,
            "fast_hint": dataclasses.asdict(self.fast_hint) if self.fast_hint else None,
        }

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write `as_dict()` to `path` as indented JSON."""
        Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")

    def format_table(self) -> str:
        """The report as a text table (what `prefetch bench` prints)."""
        c, m = self.config, self.machine
        height, width = c.image_size
        lines = [
            f"prefetch bench: {c.images} images in {c.classes} classes under {c.root}",
            f"  -> {height}x{width}, batch {c.batch_size}, {c.workers} workers, depth {c.depth}, "
            f"step {c.step_ms:g} ms, median of {c.repeats} round(s); loaders decode with "
            f"{c.loader_decoder}"
            + ("" if c.antialias else ", resizing without antialiasing like tf.data"),
            f"machine: {m['cpu']}, {m['usable_cores']} usable cores ({m['cpu_count']} in all); "
            f"Python {m['python']}, {m['platform']}",
            "",
            f"{'single-core decode + resize':36s} {'images/s':>9s}",
        ]
        lines += [f"{rate.name:36s} {rate.images_per_s:9.0f}" for rate in self.decoders]
        limit_name = f"decode limit ({m['usable_cores']} cores x {self.limit_decoder})"
        lines.append(f"{limit_name:36s} {self.decode_limit:9.0f}")
        if c.step_ms > 0:
            ceiling = f"step ceiling (batch / {c.step_ms:g} ms step)"
            lines.append(f"{ceiling:36s} {self.step_ceiling:9.0f}")
        lines.append("")
        lines.append(
            f"{'loader':36s} {'images/s':>9s} {'wait %':>7s} {'of limit':>9s} {'of tf.data':>11s}"
            "  decoder, backend"
        )
        for row in self.loaders:
            of_tf = f"{row.ratio_to_tf_data:.0%}" if row.ratio_to_tf_data is not None else "-"
            lines.append(
                f"{row.name:36s} {row.images_per_s:9.0f} {row.consumer_wait_fraction:7.1%} "
                f"{row.ratio_to_limit:9.0%} {of_tf:>11s}  {_how(row, c.antialias)}"
            )
        lines += [
            f"{row.name}: {row.backend_reason}" for row in self.loaders if row.key == "default"
        ]
        for key, reason in self.skipped.items():
            lines.append(f"skipped {LOADER_NAMES.get(key, key)}: {reason}")
        lines.append(
            "wait %: share of the consumer's time spent waiting for a batch; timings are noisy "
            "on a busy machine: compare rows of one run"
        )
        if self.fast_hint is not None:
            lines += ["", self.fast_hint.text()]
        if self.timeline is not None:
            backend = "threads" if c.timeline_backend == "thread" else "processes"
            lines += ["", f"timeline: prefetch {backend}, the first {c.timeline_batches} batches"]
            lines.append(self.timeline.render_text())
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw images/s per loader (wait % on each bar) and the decode limit into `path` (PNG).

        Needs matplotlib; raises ImportError saying how to install it when it is missing.
        """
        figure_class, _ = import_matplotlib("BenchReport.plot")
        c = self.config
        figure = figure_class(figsize=(9, 1.5 + 0.5 * len(self.loaders)))
        axes = figure.subplots()
        names = [row.name for row in self.loaders]
        rates = [row.images_per_s for row in self.loaders]
        bars = axes.barh(names, rates, color="tab:blue")
        for bar, row in zip(bars, self.loaders, strict=True):
            axes.annotate(
                f" {row.images_per_s:.0f}/s, wait {row.consumer_wait_fraction:.0%}",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                va="center",
                fontsize="small",
            )
        axes.axvline(
            self.decode_limit,
            color="tab:red",
            linestyle="--",
            label=f"decode limit {self.decode_limit:.0f}/s",
        )
        if math.isfinite(self.step_ceiling):
            axes.axvline(
                self.step_ceiling,
                color="tab:orange",
                linestyle=":",
                label=f"step ceiling {self.step_ceiling:.0f}/s",
            )
        axes.legend(loc="lower right", fontsize="small")
        axes.invert_yaxis()
        axes.set_xlim(0, max([*rates, self.decode_limit]) * 1.35)
        axes.set_xlabel("images/s")
        axes.set_title(
            f"{c.images} images -> {c.image_size[0]}x{c.image_size[1]}, batch {c.batch_size}, "
            f"{c.workers} workers, step {c.step_ms:g} ms, "
            f"{self.machine['usable_cores']} cores"
        )
        figure.tight_layout()
        figure.savefig(os.fspath(path), dpi=110)


def _how(row: LoaderResult, antialias: bool) -> str:
    """The table's "decoder, backend" cell: "turbo, thread"; TensorFlow's rows say "tf"."""
    parts = [row.decoder or "tf"]
    if row.backend is not None:
        parts.append(row.backend)
    if row.antialias != antialias and row.decoder is not None:
        parts.append("antialias" if row.antialias else "no antialias")
    return ", ".join(parts)


# ---- decoders and the machine ------------------------------------------------------------


def available_decoders() -> dict[str, Decoder]:
    """The decoders to measure: `DECODERS`, plus each provider's `available_decoders()`.

    A provider is a module named in `DECODER_PROVIDERS` ("prefetch.decode",
    "prefetch.fast_decode"); one that does not exist, or has no `available_decoders` function,
    adds nothing. So a faster decoder added there appears in the bench without a change here.
    """
    decoders = dict(DECODERS)
    for name in DECODER_PROVIDERS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # a provider whose optional dependencies are missing
            continue
        provider = getattr(module, "available_decoders", None)
        if callable(provider):
            decoders.update(provider())
    return decoders


def decoder_name(decoder: Decoder, decoders: Mapping[str, Decoder]) -> str:
    """`decoder`'s name in `decoders`, else its short name as `LoaderStats.decoder` gives it
    ("pillow", "turbo", or its own name)."""
    for name, candidate in decoders.items():
        if candidate is decoder:
            return name
    return short_decoder_name(decoder)


def default_decoder() -> Decoder:
    """The decoder a `Loader` runs by default (`decoder="auto"`, `get_decoder("auto")`)."""
    return get_decoder("auto")


def fast_hint(
    rates: Sequence[DecoderRate], sample: Sequence[str], antialias: bool
) -> FastHint | None:
    """What installing the `fast` extra would gain (see `FastHint`), or None when it is
    installed or Pillow ("pillow" in `rates`) was not measured."""
    from prefetch.fast_decode import fast_available

    pillow = [rate.images_per_s for rate in rates if rate.name == "pillow"]
    if fast_available() or not pillow or not sample:
        return None
    sizes = []
    for path in sample:
        with contextlib.suppress(OSError), Image.open(path) as image:  # reads the header only
            sizes.append(image.width * image.height)
    pixels = int(statistics.median(sizes)) if sizes else TURBO_MEASURED[True][0][0]

    def speedup(flag: bool) -> float:
        (small, *small_ms), (large, *large_ms) = TURBO_MEASURED[flag]
        where = min(max(math.log(pixels / small) / math.log(large / small), 0.0), 1.0)
        small_ratio, large_ratio = (ms[0] / ms[1] for ms in (small_ms, large_ms))
        return small_ratio + where * (large_ratio - small_ratio)

    return FastHint(
        pillow[0], speedup(antialias), speedup(not antialias), pixels, antialias, usable_cores()
    )


def machine_info() -> dict[str, Any]:
    """The machine and package versions the figures were measured with (JSON-ready)."""
    versions: dict[str, str | None] = {}
    for name in ("numpy", "pillow", "tensorflow", "keras", "torch"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": _cpu_model(),
        "usable_cores": usable_cores(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_sample_folder(
    root: str | os.PathLike[str],
    images: int,
    *,
    classes: int = 2,
    size: tuple[int, int] = SAMPLE_SIZE,
    seed: int = 0,
) -> Path:
    """Write `images` JPEGs of `size` (width, height; default ImageNet's typical 500x375).

    The images (shapes with noise, Pillow's default JPEG quality) are spread over `classes`
    class folders (at most 6) under `root`, which must not exist yet or be empty. Returns root.
    """
    root = Path(root)
    if images < 1:
        raise ValueError(f"images must be >= 1, got {images}")
    if not 1 <= classes <= len(SHAPES):
        raise ValueError(f"classes must be in [1, {len(SHAPES)}], got {classes}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"{str(root)!r} exists and is not an empty folder; pass a new folder to generate into"
        )
    for index in range(classes):
        per_class = images // classes + (1 if index < images % classes else 0)
        if per_class:
            write_image_folder(
                root,
                class_names=(SHAPES[index],),
                per_class=per_class,
                size=size,
                seed=seed + index,
            )
    return root


# ---- measuring ---------------------------------------------------------------------------


class _Contender(Protocol):
    """A loader under test: opened once, then one epoch per round, yielding batch sizes;
    `describe()` gives its row's decoder, backend, backend_reason and antialias (after the
    rounds: an automatic choice is made when a loader starts)."""

    def open(self, stack: contextlib.ExitStack) -> None: ...

    def epoch(self, number: int) -> Generator[int, None, None]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class _Setup:
    folder: ImageFolder
    options: DecodeOptions
    batch_size: int
    workers: int
    depth: int
    seed: int
    decoder: Decoder
    decoder_name: str = ""


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

    def __init__(self, setup: _Setup, workers: int | None = None) -> None:
        self.setup = setup
        self.workers = workers

    def open(self, stack: contextlib.ExitStack) -> None:
        pass

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

    def __init__(self, setup: _Setup, backend: str | None) -> None:
        s = setup
        self.setup = setup
        tuning: dict[str, Any] = {}
        if backend is not None:
            tuning = {"workers": s.workers, "depth": s.depth, "decoder": s.decoder}
            tuning.update(backend=backend, antialias=s.options.antialias)
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

    def epoch(self, number: int) -> Generator[int, None, None]:
        return _batches(self.loader)

    def describe(self) -> dict[str, Any]:
        stats = self.loader.stats()
        return {
            "decoder": stats.decoder if self.by_default else self.setup.decoder_name,
            "backend": stats.backend,
            "backend_reason": stats.backend_reason,
            "antialias": self.loader.options.antialias,
        }


class _TfData:
    """The tf.data pipeline as TensorFlow's guides write it, AUTOTUNE everywhere.

    Files (the same listing as ImageFolder) -> shuffle -> read -> decode -> resize (bilinear,
    float32 like Keras) -> batch -> prefetch.
    """

    def __init__(self, setup: _Setup) -> None:
        self.setup = setup
        self.dataset: Any = None

    def open(self, stack: contextlib.ExitStack) -> None:
        tf = importlib.import_module("tensorflow")
        s = self.setup
        autotune = tf.data.AUTOTUNE
        channels = s.options.channels

        def load(path: Any, label: Any) -> tuple[Any, Any]:
            data = tf.io.read_file(path)
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
            return tf.image.resize(image, s.options.image_size), label

        paths = [str(p) for p in s.folder.paths]
        dataset = tf.data.Dataset.from_tensor_slices((paths, s.folder.labels))
        dataset = dataset.shuffle(len(paths), seed=s.seed, reshuffle_each_iteration=True)
        dataset = dataset.map(load, num_parallel_calls=autotune)
        self.dataset = dataset.batch(s.batch_size).prefetch(autotune)

    def epoch(self, number: int) -> Generator[int, None, None]:
        for images, _labels in self.dataset:
            count = int(images.shape[0])
            del images, _labels
            yield count

    def describe(self) -> dict[str, Any]:
        return {"decoder": None, "antialias": False}  # tf.image.resize's default, and Keras's


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

    def __init__(self, setup: _Setup) -> None:
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
        )

    def epoch(self, number: int) -> Generator[int, None, None]:
        for images, _labels in self.loader:
            count = int(images.shape[0])
            del images, _labels
            yield count

    def describe(self) -> dict[str, Any]:
        return {"decoder": self.setup.decoder_name, "antialias": self.setup.options.antialias}


def _make_contender(key: str, setup: _Setup) -> _Contender:
    makers: dict[str, Callable[[], _Contender]] = {
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


def _measure_epoch(
    batches: Generator[int, None, None], step_s: float, tick: Callable[[], None]
) -> tuple[int, float, float]:
    """(images, seconds, seconds waited) of one epoch, after its first (warm-up) batch.

    The consumer takes a batch, then works on it for `step_s` (a sleep, like a device step).
    """
    with contextlib.closing(batches):
        next(batches)  # the warm-up batch: start-up, tracing and filling the window
        _step(step_s)
        tick()
        images, waited = 0, 0.0
        began = time.perf_counter()
        while True:
            asked = time.perf_counter()
            count = next(batches, None)
            if count is None:
                break
            waited += time.perf_counter() - asked
            images += count
            _step(step_s)
            tick()
        return images, time.perf_counter() - began, waited


def _step(step_s: float) -> None:
    if step_s > 0:
        time.sleep(step_s)


def _decode_rate(
    decoder: Decoder,
    paths: Sequence[str],
    options: DecodeOptions,
    tick: Callable[[], None] = lambda: None,
    every: int = 1,
) -> float:
    """Images/s of `decoder` on `paths`, one after another in this thread; `tick` every `every`."""
    began = time.perf_counter()
    for done, path in enumerate(paths, 1):
        decoder(path, options)
        if done % every == 0:
            tick()
    return len(paths) / (time.perf_counter() - began)


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def run(
    root: str | os.PathLike[str],
    *,
    batch_size: int = 32,
    image_size: tuple[int, int] = (224, 224),
    workers: int | None = None,
    depth: int = 2,
    step_ms: float = 0.0,
    repeats: int = 3,
    loaders: Sequence[str] | None = None,
    decoders: Mapping[str, Decoder] | None = None,
    decoder: Decoder | None = None,
    decode_sample: int = DECODE_SAMPLE,
    seed: int = 0,
    timeline_batches: int = 0,
    timeline_backend: str = "thread",
    progress: Progress | None = None,
    antialias: bool | None = None,
) -> BenchReport:
    """Measure every loader in `loaders` on the image folder `root`; see the module docstring.

    - `loaders`: keys of `LOADER_NAMES` ("loop", "pool", "default", "threads", "processes",
      "tf.data", "keras", "torch"); None means all. A loader whose package is missing is
      skipped (see `BenchReport.skipped`), and so is "pool" when a step is simulated and the
      folder's decoded images would not fit in half the available memory; an unknown key
      raises ValueError.
    - `decoders`: name -> decoder whose single-core rate is measured (default
      `available_decoders()`); the decode limit uses the best. `decoder` is what the loop,
      pool, prefetch threads and processes and torch loaders decode with; None means the
      Loader's default (`default_decoder()`; `report.config.loader_decoder` names the one
      used). The "default" row is `Loader(root, batch_size=, image_size=, seed=)` with
      nothing else: its own decoder, backend, workers, depth and antialias.
    - Each round runs one epoch per loader; the first batch of each epoch is a warm-up and is
      not timed. After each batch the consumer sleeps `step_ms` (a simulated training step).
      Medians over `repeats` rounds are reported.
    - `decode_sample`: images per single-core decode measurement (at most the folder's).
    - `timeline_batches` > 0: afterwards, record a `Timeline` of the first that many batches of
      a prefetch loader (`timeline_backend` "thread" or "process") into `report.timeline`.
    - `progress(done, total, label)` is called after every batch.
    - `antialias=False` resizes like tf.data and Keras (bilinear, no antialiasing, at full
      decoded size), so every loader does the same work per image; None means the Loader's
      default.
    """
    batch_size = _positive("batch_size", batch_size)
    repeats = _positive("repeats", repeats)
    depth = _positive("depth", depth)
    decode_sample = _positive("decode_sample", decode_sample)
    workers = _positive("workers", workers if workers is not None else usable_cores())
    if not step_ms >= 0:
        raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
    if timeline_batches < 0:
        raise ValueError(f"timeline_batches must be >= 0, got {timeline_batches}")
    if timeline_backend not in ("thread", "process"):
        raise ValueError(
            f"timeline_backend must be 'thread' or 'process', got {timeline_backend!r}"
        )
    keys = list(LOADER_NAMES) if loaders is None else list(dict.fromkeys(loaders))
    unknown = [key for key in keys if key not in LOADER_NAMES]
    if unknown:
        raise ValueError(f"unknown loaders {unknown}; choose from {list(LOADER_NAMES)}")
    folder = ImageFolder(root)
    if len(folder) < 2 * batch_size:
        raise ValueError(
            f"{str(folder.root)!r} has {len(folder)} images, fewer than 2 batches of {batch_size}: "
            "every epoch needs a warm-up batch and a measured one; lower batch_size or add images"
        )
    decoders = dict(decoders) if decoders is not None else available_decoders()
    if not decoders:
        raise ValueError("decoders is empty: give at least one name -> decoder")
    if antialias is None:
        antialias = bool(inspect.signature(Loader).parameters["antialias"].default)
    options = DecodeOptions((int(image_size[0]), int(image_size[1])), antialias=antialias)
    sample = [str(p) for p in folder.paths[: min(decode_sample, len(folder))]]
    decoder = decoder if decoder is not None else default_decoder()
    for path in sample:  # warm the page cache and every decoder before any timing
        for candidate in {*decoders.values(), decoder}:
            candidate(path, options)
    rows_decoder = decoder_name(decoder, decoders)
    setup = _Setup(folder, options, batch_size, workers, depth, seed, decoder, rows_decoder)
    skipped = {key: reason for key in keys if (reason := missing_requirement(key)) is not None}
    if "pool" in keys and step_ms > 0:
        decoded, memory = len(folder) * math.prod(options.shape), available_memory_bytes()
        if decoded > memory // 2:
            skipped["pool"] = (
                f"its map decodes ahead without bound: {decoded / 2**30:.1f} GiB of decoded "
                f"images, over half of the {memory / 2**30:.1f} GiB available"
            )
    keys = [key for key in keys if key not in skipped]

    epoch_batches = math.ceil(len(folder) / batch_size)
    decode_ticks = len(sample) // batch_size
    total = repeats * (len(decoders) * decode_ticks + len(keys) * epoch_batches)
    total += min(timeline_batches, epoch_batches)
    done = 0
    label = "starting"

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, label)

    decode_runs: dict[str, list[float]] = {name: [] for name in decoders}
    load_runs: dict[str, list[tuple[float, float]]] = {key: [] for key in keys}
    contenders = {key: _make_contender(key, setup) for key in keys}
    with contextlib.ExitStack() as stack:
        for contender in contenders.values():
            contender.open(stack)
        for round_index in range(repeats):
            for name, candidate in decoders.items():
                label = f"round {round_index + 1}/{repeats}: decode {name}"
                every = batch_size
                decode_runs[name].append(_decode_rate(candidate, sample, options, tick, every))
            for key, contender in contenders.items():
                label = f"round {round_index + 1}/{repeats}: {LOADER_NAMES[key]}"
                images, elapsed, waited = _measure_epoch(
                    contender.epoch(round_index), step_ms / 1000, tick
                )
                load_runs[key].append((images / elapsed, waited / elapsed))
        described = {key: contender.describe() for key, contender in contenders.items()}
    timeline = None
    if timeline_batches:
        label = "timeline"
        timeline = _record_timeline(setup, timeline_batches, step_ms / 1000, timeline_backend, tick)
    if progress is not None:
        progress(total, total, "done")

    rates = [DecoderRate(n, statistics.median(r), tuple(r)) for n, r in decode_runs.items()]
    best = max(rates, key=lambda rate: rate.images_per_s)
    limit = best.images_per_s * usable_cores()
    medians = {
        key: (statistics.median(r for r, _ in runs), statistics.median(w for _, w in runs))
        for key, runs in load_runs.items()
    }
    tf_rate = medians["tf.data"][0] if "tf.data" in medians else None
    rows = [
        LoaderResult(
            key=key,
            name=LOADER_NAMES[key],
            images_per_s=rate,
            consumer_wait_fraction=wait,
            ratio_to_limit=rate / limit,
            ratio_to_tf_data=rate / tf_rate if tf_rate else None,
            images_per_s_runs=tuple(r for r, _ in load_runs[key]),
            wait_fraction_runs=tuple(w for _, w in load_runs[key]),
            **described[key],
        )
        for key, (rate, wait) in medians.items()
    ]
    config = BenchConfig(
        root=str(folder.root),
        images=len(folder),
        classes=len(folder.class_names),
        image_size=options.image_size,
        batch_size=batch_size,
        workers=workers,
        depth=depth,
        step_ms=float(step_ms),
        repeats=repeats,
        seed=seed,
        decode_sample=len(sample),
        loader_decoder=rows_decoder,
        timeline_batches=timeline_batches,
        timeline_backend=timeline_backend,
        antialias=antialias,
    )
    return BenchReport(
        config,
        machine_info(),
        rates,
        limit,
        best.name,
        rows,
        skipped,
        timeline,
        fast_hint(rates, sample, antialias),
    )


# ---- the timeline ------------------------------------------------------------------------


def record_timeline(
    root: str | os.PathLike[str],
    *,
    batches: int = 8,
    batch_size: int = 32,
    image_size: tuple[int, int] = (224, 224),
    workers: int | None = None,
    depth: int = 2,
    step_ms: float = 0.0,
    backend: str = "thread",
    decoder: Decoder | None = None,
    seed: int = 0,
) -> Timeline:
    """The first `batches` batches of one epoch of a fresh prefetch `Loader`, as a Timeline.

    Lanes: each worker thread or process ("decode" spans, one per image, recorded by a
    `TimedDecoder`), "in flight" ("produce" spans: a batch's first decode start to its last
    decode end; stacked rows show how many batches were in flight at once), and "consumer"
    ("wait" for each batch, then "step": a sleep of `step_ms`). Other arguments as in `run`.
    """
    folder = ImageFolder(root)
    options = DecodeOptions((int(image_size[0]), int(image_size[1])))
    workers = _positive("workers", workers if workers is not None else usable_cores())
    setup = _Setup(folder, options, batch_size, workers, depth, seed, decoder or decode_image)
    return _record_timeline(setup, _positive("batches", batches), step_ms / 1000, backend)


def _record_timeline(
    setup: _Setup,
    batches: int,
    step_s: float,
    backend: str,
    tick: Callable[[], None] = lambda: None,
) -> Timeline:
    consumer: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="prefetch-timeline-") as spool:
        timed = TimedDecoder(setup.decoder, spool)
        loader = Loader(
            setup.folder,
            batch_size=setup.batch_size,
            image_size=setup.options.image_size,
            workers=setup.workers,
            depth=setup.depth,
            seed=setup.seed,
            decoder=timed,
            backend=backend,
        )
        batch_of = {
            str(setup.folder.paths[index]): number
            for number, indices in enumerate(loader.batch_indices(0))
            for index in indices
        }
        with loader, contextlib.closing(_batches(loader)) as epoch:
            for number in range(min(batches, len(loader))):
                asked = time.perf_counter()
                next(epoch)
                got = time.perf_counter()
                _step(step_s)
                consumer.append(("wait", asked, got, number))
                consumer.append(("step", got, time.perf_counter(), number))
                tick()
        spans = timed.read_spans()
    timeline = Timeline()
    produced: dict[int, list[float]] = {}
    for span in spans:
        number = batch_of[span.path]
        timeline.record("decode", span.start_s, span.end_s, number, lane=span.worker)
        first_last = produced.setdefault(number, [span.start_s, span.end_s])
        first_last[0] = min(first_last[0], span.start_s)
        first_last[1] = max(first_last[1], span.end_s)
    for number, (first, last) in sorted(produced.items()):
        timeline.record("produce", first, last, number, lane="in flight")
    for kind, start, end, number in consumer:
        timeline.record(kind, start, end, number)
    return timeline


def _batches(loader: Loader) -> Generator[int, None, None]:
    """One epoch of `loader`, as batch sizes (holding no view of a batch between yields)."""
    for batch in loader:
        count = len(batch.images)
        del batch  # a held view would keep its slot from being reused
        yield count
