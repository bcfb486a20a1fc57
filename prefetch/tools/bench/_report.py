"""The report of `prefetch.tools.bench.run`: settings, machine, decoder rates and loader rows.

`BenchReport` prints as the table `prefetch bench` shows (`format_table`), writes JSON
(`to_json`, schema `SCHEMA_VERSION`, described in `BenchReport.as_dict`) and draws a bar chart
(`plot`, imports matplotlib when called). Plain data: no thread, no file is held.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefetch.io import is_url
from prefetch.tools.bench._chart import bench_figure, ratio_text
from prefetch.tools.bench._hint import FastHint
from prefetch.tools.bench._loaders import LOADER_NAMES
from prefetch.tools.timeline import Timeline

# Version of the JSON written by `BenchReport.to_json` (bumped when a field changes meaning).
SCHEMA_VERSION = 3
# The entropy floor's key in a `Measurement`, and its name in the table.
FLOOR_KEY = "floor"
FLOOR_NAME = "entropy decode only"


@dataclass(frozen=True)
class BenchConfig:
    """What was measured: the folder, the batch shape, the workers and the simulated step;
    `crop` is the crop every row decodes ("" for whole images resized; `prefetch bench --crop`)."""

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
    crop: str = ""
    warmup_images: int = 0
    timed_images: int = 0
    isolated: bool = True


@dataclass(frozen=True)
class DecoderRate:
    """A decoder's single-core decode + resize rate: the median and each round's value."""

    name: str
    images_per_s: float
    runs: tuple[float, ...]


@dataclass(frozen=True)
class Measurement:
    """One figure as it is measured: a decoder's (or the entropy floor's) single-core rate, or
    (`loader`) a loader's steady-state rate, in round `round` (from 1) of `rounds`.
    `wait_fraction` is a loader's wait (None without a step). `run(on_measured=...)` passes
    each one on at once; `prefetch bench` prints them when its output is not a terminal."""

    round: int
    rounds: int
    key: str  # the decoder's name, FLOOR_KEY, or the loader's key ("threads", "tf.data", ...)
    name: str  # as the table names it
    images_per_s: float
    wait_fraction: float | None = None
    loader: bool = False

    def text(self) -> str:
        """The measurement as one line, in the table's columns."""
        name = self.name if self.loader else f"{self.name} (1 core)"
        if not self.loader and self.key != FLOOR_KEY:
            name = f"decode {name}"
        line = f"round {self.round}/{self.rounds}: {name:36s} {self.images_per_s:9.0f} images/s"
        if self.wait_fraction is not None:
            line += f", wait {self.wait_fraction:.1%}"
        return line


@dataclass(frozen=True)
class LoaderResult:
    """One loader's medians over the rounds, and its ratios to the decode limit, the entropy
    floor and tf.data (plain ratios: 1.12 reads "1.12x").

    `consumer_wait_fraction` is the share of the timed span the consumer spent waiting for a
    batch (0 to 1) while a simulated step ran between batches; None without a step (a consumer
    that does nothing but take batches always waits). `ratio_to_tf_data` is None when tf.data
    was not measured, `ratio_to_floor` when the floor was not. `cold_images_per_s` is the
    median rate over the warm-up, counted from the pipeline's construction: the cold start a
    short job pays. `decoder` names the decoder the row ran ("turbo", "pillow", "libjpeg-turbo
    window"; None for TensorFlow's own), `backend` the prefetch backend ("thread", "process";
    None for other loaders) and `backend_reason` why it was chosen; `antialias` whether the
    row's resize antialiases; `note` what the row measured when it differs from the folder
    (tf.data's crop recipe reads JPEG only).
    """

    key: str
    name: str
    images_per_s: float
    consumer_wait_fraction: float | None
    ratio_to_limit: float
    ratio_to_tf_data: float | None
    images_per_s_runs: tuple[float, ...]
    wait_fraction_runs: tuple[float, ...]
    decoder: str | None = None
    backend: str | None = None
    backend_reason: str = ""
    antialias: bool = True
    ratio_to_floor: float | None = None
    cold_images_per_s: float = 0.0
    note: str = ""


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
    floor: DecoderRate | None = None
    floor_note: str = ""

    @property
    def floor_limit(self) -> float | None:
        """The entropy floor's images/s: its single-core rate x usable cores (None: not
        measured)."""
        if self.floor is None:
            return None
        return self.floor.images_per_s * int(self.machine["usable_cores"])

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

    def timeline_title(self) -> str:
        """The loader the timeline recorded, and its settings: the timeline chart's title."""
        c = self.config
        backend = "threads" if c.timeline_backend == "thread" else "processes"
        return (
            f"prefetch {backend} ({c.workers} workers, depth {c.depth}): the first "
            f"{c.timeline_batches} batches of {c.batch_size} from {c.root} -> "
            f"{c.image_size[0]}x{c.image_size[1]}, step {c.step_ms:g} ms"
        )

    def as_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data; `to_json` writes it.

        Schema `SCHEMA_VERSION` (3); times in seconds, rates in images/s, ratios plain (1.12
        for "1.12x"). Version 2 added the loaders' `decoder`, `backend`, `backend_reason` and
        `antialias`, the config's `antialias` and `fast_hint`; version 3 measures each row at
        steady state (the config's `warmup_images`, `timed_images`, `isolated`), adds the
        entropy floor (`floor`), the loaders' `ratio_to_floor`, `cold_images_per_s` and
        `note`, and makes `consumer_wait_fraction` null without a step:

        ```text
        {
          "schema": 3,
          "config":  {"root", "images", "classes", "image_size": [h, w], "batch_size",
                      "workers", "depth", "step_ms", "repeats", "seed", "decode_sample",
                      "loader_decoder", "timeline_batches", "timeline_backend", "antialias",
                      "crop", "warmup_images", "timed_images", "isolated"},
          "machine": {"cpu", "usable_cores", "cpu_count", "platform", "python",
                      "versions": {"numpy", "pillow", "tensorflow", "keras", "torch"}
                      (null: absent)},
          "decoders": [{"name", "images_per_s", "runs": [per round]}],
          "decode_limit": {"images_per_s", "decoder", "cores"},
          "floor": null | {"images_per_s" (x cores), "single_core", "runs", "cores", "note"},
          "loaders": [{"key", "name", "images_per_s", "consumer_wait_fraction" (null: no
                       step), "ratio_to_limit", "ratio_to_tf_data" (null without tf.data),
                       "images_per_s_runs", "wait_fraction_runs", "decoder" (null:
                       TensorFlow's), "backend" (null: not prefetch), "backend_reason",
                       "antialias", "ratio_to_floor" (null without the floor),
                       "cold_images_per_s", "note"}],
          "skipped": {loader key: reason},
          "timeline": null | [{"lane", "kind", "start_s", "end_s", "batch"}]  (start_s from 0),
          "fast_hint": null | {"pillow_images_per_s", "speedup", "speedup_other_antialias",
                               "photo_pixels", "antialias", "cores"}
        }
        ```
        """
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
            "floor": None
            if self.floor is None
            else {
                "images_per_s": self.floor_limit,
                "single_core": self.floor.images_per_s,
                "runs": list(self.floor.runs),
                "cores": self.machine["usable_cores"],
                "note": self.floor_note,
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
        step = f"step {c.step_ms:g} ms" if c.step_ms > 0 else "no step"
        span = _span_words(c)
        lines = [
            f"prefetch bench: {c.images} images in {c.classes} classes under {c.root}",
            f"  -> {height}x{width}, batch {c.batch_size}, {c.workers} workers, depth {c.depth}, "
            f"{step}; loaders decode with {c.loader_decoder}"
            + ("" if c.antialias else ", resizing without antialiasing like tf.data")
            + (f"; each image cropped: {c.crop}" if c.crop else ""),
            f"  each row as a training job runs it: {span}; median of {c.repeats} round(s) "
            "(min-max), rows alternating",
            f"machine: {m['cpu']}, {m['usable_cores']} usable cores ({m['cpu_count']} in all); "
            f"Python {m['python']}, {m['platform']}",
            "",
            f"{'single-core rate (1 core)':36s} {'images/s':>9s}"
            + ("  (local copies of the sample)" if is_url(c.root) else ""),
        ]
        lines += [f"decode + resize, {r.name:20s} {r.images_per_s:9.0f}" for r in self.decoders]
        if self.floor is not None:
            lines.append(f"{FLOOR_NAME:36s} {self.floor.images_per_s:9.0f}")
        limit_name = f"decode limit ({m['usable_cores']} cores x {self.limit_decoder})"
        lines.append(f"{limit_name:36s} {self.decode_limit:9.0f}")
        floor = self.floor_limit
        if floor is not None:
            floor_name = f"entropy floor ({m['usable_cores']} cores x entropy)"
            lines.append(f"{floor_name:36s} {floor:9.0f}")
        if c.step_ms > 0:
            ceiling = f"step ceiling (batch / {c.step_ms:g} ms step)"
            lines.append(f"{ceiling:36s} {self.step_ceiling:9.0f}")
        lines.append("")
        of = "of floor" if floor is not None else "of limit"
        wait = f" {'wait':>6s}" if c.step_ms > 0 else ""
        lines.append(
            f"{'loader':36s} {'images/s':>9s} {'(min-max)':>13s} {'vs tf.data':>10s} {of:>8s}"
            f"{wait} {'cold':>6s}  decoder, backend"
        )
        for row in self.loaders:
            share = row.ratio_to_floor if floor is not None else row.ratio_to_limit
            runs = row.images_per_s_runs
            spread = f"({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""
            waited = ""
            if c.step_ms > 0:
                waited = f" {_percent(row.consumer_wait_fraction):>6s}"
            lines.append(
                f"{row.name:36s} {row.images_per_s:9.0f} {spread:>13s} "
                f"{ratio_text(row.ratio_to_tf_data):>10s} {ratio_text(share):>8s}{waited} "
                f"{row.cold_images_per_s:6.0f}  {_how(row, c.antialias)}"
            )
        lines += self._notes(of)
        if self.fast_hint is not None:
            lines += ["", self.fast_hint.text()]
        if self.timeline is not None:
            lines += ["", f"timeline: {self.timeline_title()}"]
            lines.append(self.timeline.render_text())
        return "\n".join(lines)

    def _notes(self, of: str) -> list[str]:
        """The lines under the table: why the default chose its backend, what a row left
        out, what was skipped, and what each column means."""
        c = self.config
        lines = [
            f"{row.name}: {row.backend_reason}" for row in self.loaders if row.key == "default"
        ]
        lines += [f"{row.name}: {row.note}" for row in self.loaders if row.note]
        for key, reason in self.skipped.items():
            lines.append(f"skipped {LOADER_NAMES.get(key, key)}: {reason}")
        if self.floor is None:
            lines.append(f"entropy floor not measured: {self.floor_note}")
        elif self.floor_note:
            lines.append(f"entropy floor: {self.floor_note}")
        lines.append(
            f"vs tf.data, {of}: the row's images/s over tf.data's, over the "
            + (
                "entropy floor (entropy decoding alone of the rows each sample needs, the "
                "limit of any libjpeg-turbo loader here)"
                if of == "of floor"
                else "decode limit"
            )
        )
        if c.step_ms > 0:
            lines.append(
                f"wait: share of the timed span the consumer waited for a batch between its "
                f"{c.step_ms:g} ms steps (0% = the loader kept up)"
            )
        else:
            lines.append(
                "no wait column without a step (a consumer that only takes batches always "
                "waits): --step-ms N simulates a training step"
            )
        lines.append(
            "cold: images/s of the warm-up from the pipeline's construction, what a short job or "
            "one that rebuilds its pipeline every epoch pays; a long training job sees images/s"
        )
        lines.append("timings are noisy on a busy machine: compare rows of one run")
        return lines

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw `figure()` into `path` (PNG).

        Needs matplotlib; raises ImportError saying how to install it when it is missing.
        """
        self.figure().savefig(os.fspath(path), dpi=110)

    def figure(self) -> Any:
        """A matplotlib `Figure` of images/s per loader (`_chart.bench_figure`: each bar
        labelled with its rate and its ratio to tf.data, the decode limit, the entropy floor
        when measured and, with a step, the step ceiling). Needs matplotlib (ImportError
        saying how to install it)."""
        return bench_figure(self)


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def _span_words(c: BenchConfig) -> str:
    """How each row was timed, in words."""
    where = "in a fresh process" if c.isolated else "in this process"

    def amount(images: int) -> str:
        epochs = images / c.images
        if abs(epochs - round(epochs)) * c.images < c.batch_size and round(epochs) >= 1:
            return f"{round(epochs)} epoch" + ("s" if round(epochs) != 1 else "")
        return f"{images} images"

    return (
        f"one pipeline {where}, {amount(c.warmup_images)} untimed, "
        f"then {amount(c.timed_images)} timed"
    )


def _how(row: LoaderResult, antialias: bool) -> str:
    """The table's "decoder, backend" cell: "turbo, thread"; TensorFlow's rows say "tf"."""
    parts = [row.decoder or "tf"]
    if row.backend is not None:
        parts.append(row.backend)
    if row.antialias != antialias and row.decoder is not None:
        parts.append("antialias" if row.antialias else "no antialias")
    return ", ".join(parts)
