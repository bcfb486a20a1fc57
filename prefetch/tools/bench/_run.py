"""`run`: one measurement of `prefetch bench`, from its arguments to its `BenchReport`.

The package docstring (`prefetch.tools.bench`) states what is measured and the contract: runs
in the calling thread, closes every loader and row process it starts before it returns.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Collection, Mapping, Sequence

from prefetch._checks import positive
from prefetch.decode import DecodeOptions, Decoder, compiled_available, fast_available
from prefetch.plan import Crop
from prefetch.runtime import Loader, usable_cores
from prefetch.sources import ImageFolder
from prefetch.tools.bench._floor import (
    NO_ENTROPY_DECODER,
    entropy_decoder,
    floor_sample,
)
from prefetch.tools.bench._loaders import (
    LOADER_NAMES,
    CroppingDecoder,
    Setup,
    unavailable,
)
from prefetch.tools.bench._machine import (
    available_decoders,
    decoder_name,
    default_decoder,
    local_sample,
)
from prefetch.tools.bench._report import (
    BenchReport,
)
from prefetch.tools.bench._rounds import OnMeasured, Plan, Progress, measure, report
from prefetch.tools.bench._steady import Span

# Images per single-core decode measurement (fewer when the folder is smaller).
DECODE_SAMPLE = 200


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
    crop: Crop | None = None,
    on_measured: OnMeasured | None = None,
    warmup_images: int | None = None,
    timed_images: int | None = None,
    isolate: bool = True,
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
    - Each loader is measured as a training job runs it (`measure_row`): in each of
      `repeats` rounds, one long-lived pipeline per loader (tf.data and Keras with `.repeat()`
      and one iterator, prefetch one open Loader), in a fresh process (`isolate=False`: in
      this one), `warmup_images` untimed, then `timed_images` timed (rounded up to whole
      batches; defaults `Span.default`: one epoch, then three, at most `SPAN_EPOCH_CAP`
      images per epoch's worth). The rows' order alternates from round to round;
      medians over the rounds are reported, with each round's value. After each batch the
      consumer sleeps `step_ms` (a simulated training step). A row that fails is reported in
      `skipped` with its one-line reason, and the others are still measured.
    - The entropy floor (`floor_rate`): when this build has the entropy-only decoder, the
      single-core rate of entropy decoding alone of the rows each sample needs, on the decode
      sample's JPEGs and the same crop windows, x usable cores; every row's
      `ratio_to_floor` is its share of it.
    - `decode_sample`: images per single-core decode measurement (at most the folder's).
    - `timeline_batches` > 0: afterwards, record a `Timeline` of the first that many batches of
      a prefetch loader (`timeline_backend` "thread" or "process") into `report.timeline`.
    - `progress(done, total, label)` is called after every batch; `on_measured(measurement)`
      with each round's decoder rate and loader epoch (a `Measurement`) as soon as it is
      measured, so that a caller can show rows before the medians are known.
    - `antialias=False` resizes like tf.data and Keras (bilinear, no antialiasing, at full
      decoded size), so every loader does the same work per image; None means the Loader's
      default.
    - `root` may be an fsspec URL: the decode sample is copied to a temporary folder first
      (`local_sample`), and "tf.data" and "keras" are skipped where TensorFlow cannot read
      the URL (`tensorflow_cannot_read`).
    - `crop`: the training (`RandomResizedCrop`, with a random flip) or evaluation
      (`CenterCrop`) shape of the work: every row decodes a window per image (the hand-written
      rows and the decode limit through `CroppingDecoder`), tf.data runs TF Model Garden's
      recipe (`decode_and_crop_jpeg`), and "keras" is skipped (it has no such crop).
    """
    batch_size = positive("batch_size", batch_size)
    repeats = positive("repeats", repeats)
    depth = positive("depth", depth)
    decode_sample = positive("decode_sample", decode_sample)
    workers = positive("workers", workers if workers is not None else usable_cores())
    keys = _checked_keys(loaders, step_ms, timeline_batches, timeline_backend)
    folder = _checked_folder(root, batch_size)
    decoders = _checked_decoders(decoders)
    options = _decode_options(image_size, antialias)
    decoder = decoder if decoder is not None else default_decoder()
    default = Span.default(len(folder))
    span = Span(
        _whole_batches("warmup_images", _or(warmup_images, default.warmup), batch_size),
        _whole_batches("timed_images", _or(timed_images, default.timed), batch_size),
    )
    if crop is not None:
        decoders = {name: CroppingDecoder(crop, engine) for name, engine in _crop_engines()}
        decoder = decoders["turbo"] if "turbo" in decoders else decoders["pillow"]
    with tempfile.TemporaryDirectory(prefix="prefetch-bench-sample-") as copies:
        sample = local_sample(folder.paths[: min(decode_sample, len(folder))], copies)
        _warm(sample, {*decoders.values(), decoder}, options)
        name = decoder_name(decoder, decoders)
        setup = Setup(folder, options, batch_size, workers, depth, seed, decoder, name, crop)
        skipped = unavailable(keys, setup, step_ms)
        keys = [key for key in keys if key not in skipped]
        entropy = entropy_decoder()
        floor, floor_note = None, NO_ENTROPY_DECODER
        if entropy is not None:
            floor = floor_sample(sample, crop, options)
            floor_note = (
                f"on the sample's {len(floor.data)} JPEGs; {floor.left_out} other files left out"
                if floor.left_out
                else ""
            )
            if not floor.data:
                floor, floor_note = None, "the decode sample holds no JPEG"
        plan = Plan(
            setup,
            decoders,
            sample,
            keys,
            skipped,
            repeats,
            step_ms,
            timeline_batches,
            timeline_backend,
            span,
            isolate,
            floor,
            floor_note,
            entropy,
        )
        return report(plan, measure(plan, progress, on_measured))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _whole_batches(name: str, images: int, batch_size: int) -> int:
    """`images` rounded up to whole batches; ValueError naming `name` when not positive."""
    return -(-positive(name, images) // batch_size) * batch_size


def _checked_keys(
    loaders: Sequence[str] | None, step_ms: float, timeline_batches: int, timeline_backend: str
) -> list[str]:
    """The loader keys asked for, deduplicated; ValueError on a bad step, timeline or key."""
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
    return keys


def _checked_folder(root: str | os.PathLike[str], batch_size: int) -> ImageFolder:
    """The image folder `root`; ValueError when it holds fewer than 2 batches."""
    folder = ImageFolder(root)
    if len(folder) < 2 * batch_size:
        raise ValueError(
            f"{str(folder.root)!r} has {len(folder)} images, fewer than 2 batches of {batch_size}: "
            "every epoch needs a warm-up batch and a measured one; lower batch_size or add images"
        )
    return folder


def _checked_decoders(decoders: Mapping[str, Decoder] | None) -> dict[str, Decoder]:
    """`decoders` as a dict (default `available_decoders()`); ValueError when empty."""
    decoders = dict(decoders) if decoders is not None else available_decoders()
    if not decoders:
        raise ValueError("decoders is empty: give at least one name -> decoder")
    return decoders


def _crop_engines() -> list[tuple[str, str]]:
    """(name, window_decode engine) of the window decoders this machine has."""
    fast = compiled_available() or fast_available()
    return [("pillow", "pillow"), *([("turbo", "turbo")] if fast else [])]


def _decode_options(image_size: tuple[int, int], antialias: bool | None) -> DecodeOptions:
    """What every loader decodes to; `antialias` None means the Loader's default."""
    if antialias is None:
        antialias = bool(inspect.signature(Loader).parameters["antialias"].default)
    return DecodeOptions((int(image_size[0]), int(image_size[1])), antialias=antialias)


def _warm(sample: Sequence[str], decoders: Collection[Decoder], options: DecodeOptions) -> None:
    """Decode `sample` with every decoder once: the page cache and decoders warm before timing."""
    for path in sample:
        for candidate in decoders:
            candidate(path, options)
