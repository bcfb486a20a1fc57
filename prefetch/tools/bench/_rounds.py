"""The rounds of `prefetch.tools.bench.run` and the report they make.

`measure(plan, progress, on_measured)` runs `plan`'s rounds: each round the single-core rate
of every decoder, the entropy floor's single-core rate (`_floor`), then every loader at
steady state (`_steady.measure_row`), the rows' order reversed every other round; a row
that fails is dropped with its one-line reason. `report(plan, runs)` turns them into the
`BenchReport`: medians, ranges and ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prefetch.decode import DecodeOptions, Decoder
from prefetch.runtime import usable_cores
from prefetch.tools.bench._floor import EntropyDecoder, FloorSample, floor_rate
from prefetch.tools.bench._hint import fast_hint
from prefetch.tools.bench._loaders import LOADER_NAMES, Setup
from prefetch.tools.bench._machine import machine_info
from prefetch.tools.bench._report import (
    FLOOR_KEY,
    FLOOR_NAME,
    BenchConfig,
    BenchReport,
    DecoderRate,
    LoaderResult,
    Measurement,
)
from prefetch.tools.bench._steady import RowFailed, RowResult, Span, alternated, measure_row
from prefetch.tools.bench._timeline import record_setup_timeline
from prefetch.tools.timeline import Timeline

Progress = Callable[[int, int, str], None]
"""`progress(done, total, label)`: called as work advances (units: batches of images)."""
OnMeasured = Callable[[Measurement], None]
"""`on_measured(measurement)`: called with each round's figure as soon as it is measured."""


def decode_rate(
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


@dataclass(frozen=True)
class Plan:
    """What one `run` measures, its arguments checked and its decoders warmed."""

    setup: Setup
    decoders: dict[str, Decoder]
    sample: list[str]  # the images of each single-core decode measurement
    keys: list[str]  # the loaders measured, in order
    skipped: dict[str, str]  # loader key -> why it is not measured
    repeats: int
    step_ms: float
    timeline_batches: int
    timeline_backend: str
    span: Span
    isolate: bool
    floor: FloorSample | None  # the entropy floor's sample; None: not measured
    floor_note: str  # why the floor is not measured, or what it left out
    entropy: EntropyDecoder | None


@dataclass(frozen=True)
class Runs:
    """What the rounds measured: per-round figures, the rows that failed, the timeline."""

    decode: dict[str, list[float]]  # decoder name -> images/s per round
    floor: list[float]  # single-core entropy-decode rate per round (empty: not measured)
    load: dict[str, list[RowResult]]  # key -> one result per round
    failed: dict[str, str]  # key -> why the row could not be measured
    timeline: Timeline | None


def measure(plan: Plan, progress: Progress | None, on_measured: OnMeasured | None) -> Runs:
    """Run the rounds, then the timeline, calling `progress` after every batch and
    `on_measured` after every decoder rate, floor rate and loader row."""
    setup, repeats, span = plan.setup, plan.repeats, plan.span
    row_batches = -(-span.warmup // setup.batch_size) + -(-span.timed // setup.batch_size)
    decode_ticks = len(plan.sample) // setup.batch_size
    floor_ticks = 1 if plan.floor is not None else 0
    per_round = len(plan.decoders) * decode_ticks + floor_ticks + len(plan.keys) * row_batches
    total = repeats * per_round + min(plan.timeline_batches, len(setup.folder))
    done = 0
    label = "starting"

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, label)

    def measured(number: int, key: str, name: str, rate: float, **more: Any) -> None:
        if on_measured is not None:
            on_measured(Measurement(number, repeats, key, name, rate, **more))

    decode_runs: dict[str, list[float]] = {name: [] for name in plan.decoders}
    floor_runs: list[float] = []
    load_runs: dict[str, list[RowResult]] = {key: [] for key in plan.keys}
    failed: dict[str, str] = {}
    for round_index in range(repeats):
        number = round_index + 1
        for name, candidate in plan.decoders.items():
            label = f"round {number}/{repeats}: decode {name}"
            rate = decode_rate(candidate, plan.sample, setup.options, tick, setup.batch_size)
            decode_runs[name].append(rate)
            measured(number, name, name, rate)
        if plan.floor is not None:
            label = f"round {number}/{repeats}: {FLOOR_NAME}"
            rate = floor_rate(plan.floor, plan.entropy)  # type: ignore[arg-type]
            floor_runs.append(rate)
            tick()
            measured(number, FLOOR_KEY, FLOOR_NAME, rate)
        # Alternate the order of the rows from round to round: no row always runs first.
        keys = [key for key in plan.keys if key not in failed]
        for key in alternated(keys, round_index):
            label = f"round {number}/{repeats}: {LOADER_NAMES[key]}"
            step_s = plan.step_ms / 1000
            try:
                result = measure_row(key, setup, span, step_s, tick, isolate=plan.isolate)
            except RowFailed as error:
                failed[key] = f"failed in round {number}: {error}"
                continue
            load_runs[key].append(result)
            measured(
                number,
                key,
                LOADER_NAMES[key],
                result.images_per_s,
                wait_fraction=result.wait_fraction,
                loader=True,
            )
    timeline = None
    if plan.timeline_batches:
        label = "timeline"
        step_s, backend = plan.step_ms / 1000, plan.timeline_backend
        timeline = record_setup_timeline(setup, plan.timeline_batches, step_s, backend, tick)
    if progress is not None:
        progress(total, total, "done")
    load_runs = {key: runs for key, runs in load_runs.items() if key not in failed}
    return Runs(decode_runs, floor_runs, load_runs, failed, timeline)


def report(plan: Plan, runs: Runs) -> BenchReport:
    """The report of `plan`'s measured `runs`: medians, ratios, the config and the hint."""
    rates = [DecoderRate(n, statistics.median(r), tuple(r)) for n, r in runs.decode.items()]
    best = max(rates, key=lambda rate: rate.images_per_s)
    limit = best.images_per_s * usable_cores()
    floor = None
    if runs.floor:
        floor = DecoderRate(FLOOR_NAME, statistics.median(runs.floor), tuple(runs.floor))
    return BenchReport(
        _config(plan),
        machine_info(),
        rates,
        limit,
        best.name,
        _rows(runs, limit, floor.images_per_s * usable_cores() if floor else None),
        {**plan.skipped, **runs.failed},
        runs.timeline,
        fast_hint(rates, plan.sample, plan.setup.options.antialias),
        floor=floor,
        floor_note=plan.floor_note,
    )


def _rows(runs: Runs, limit: float, floor: float | None) -> list[LoaderResult]:
    """One row per measured loader: median images/s and wait, and their ratios."""
    medians = {
        key: statistics.median(result.images_per_s for result in results)
        for key, results in runs.load.items()
    }
    tf_rate = medians.get("tf.data")
    rows = []
    for key, rate in medians.items():
        results = runs.load[key]
        waits = [r.wait_fraction for r in results if r.wait_fraction is not None]
        rows.append(
            LoaderResult(
                key=key,
                name=LOADER_NAMES[key],
                images_per_s=rate,
                consumer_wait_fraction=statistics.median(waits) if waits else None,
                ratio_to_limit=rate / limit,
                ratio_to_tf_data=rate / tf_rate if tf_rate else None,
                images_per_s_runs=tuple(r.images_per_s for r in results),
                wait_fraction_runs=tuple(waits),
                ratio_to_floor=rate / floor if floor else None,
                cold_images_per_s=statistics.median(r.cold_images_per_s for r in results),
                **{"note": "", **results[-1].described},
            )
        )
    return rows


def _config(plan: Plan) -> BenchConfig:
    """The `BenchConfig` of `plan`: what was measured, and how."""
    setup = plan.setup
    return BenchConfig(
        root=str(setup.folder.root),
        images=len(setup.folder),
        classes=len(setup.folder.class_names),
        image_size=setup.options.image_size,
        batch_size=setup.batch_size,
        workers=setup.workers,
        depth=setup.depth,
        step_ms=float(plan.step_ms),
        repeats=plan.repeats,
        seed=setup.seed,
        decode_sample=len(plan.sample),
        loader_decoder=setup.decoder_name,
        timeline_batches=plan.timeline_batches,
        timeline_backend=plan.timeline_backend,
        antialias=setup.options.antialias,
        crop=repr(setup.crop) if setup.crop is not None else "",
        warmup_images=plan.span.warmup,
        timed_images=plan.span.timed,
        isolated=plan.isolate,
    )
