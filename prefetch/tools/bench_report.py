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

from prefetch import storage
from prefetch.tools.bench_hint import FastHint
from prefetch.tools.bench_loaders import LOADER_NAMES
from prefetch.tools.timeline import Timeline, import_matplotlib

# The step ceiling is drawn as a line when it is at most this many times the chart's right
# edge (the axis is then stretched to it); further off, the axis label names it instead.
CEILING_ON_AXIS = 2.0
# Version of the JSON written by `BenchReport.to_json` (bumped when a field changes meaning).
SCHEMA_VERSION = 2


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


@dataclass(frozen=True)
class DecoderRate:
    """A decoder's single-core decode + resize rate: the median and each round's value."""

    name: str
    images_per_s: float
    runs: tuple[float, ...]


@dataclass(frozen=True)
class Measurement:
    """One figure as it is measured: a decoder's single-core rate (`wait_fraction` None) or a
    loader's epoch, in round `round` (from 1) of `rounds`. `run(on_measured=...)` passes each
    one on at once; `prefetch bench` prints them when its output is not a terminal."""

    round: int
    rounds: int
    key: str  # the decoder's name, or the loader's key ("threads", "tf.data", ...)
    name: str  # as the table names it
    images_per_s: float
    wait_fraction: float | None = None

    def text(self) -> str:
        """The measurement as one line, in the table's columns."""
        name = f"decode {self.name} (1 core)" if self.wait_fraction is None else self.name
        line = f"round {self.round}/{self.rounds}: {name:36s} {self.images_per_s:9.0f} images/s"
        if self.wait_fraction is not None:
            line += f", wait {self.wait_fraction:.1%}"
        return line


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

        Schema `SCHEMA_VERSION` (2); times in seconds, rates in images/s. Version 2 added the
        loaders' `decoder`, `backend`, `backend_reason` and `antialias`, the config's
        `antialias` and `fast_hint`:

        ```text
        {
          "schema": 2,
          "config":  {"root", "images", "classes", "image_size": [h, w], "batch_size",
                      "workers", "depth", "step_ms", "repeats", "seed", "decode_sample",
                      "loader_decoder", "timeline_batches", "timeline_backend", "antialias"},
          "machine": {"cpu", "usable_cores", "cpu_count", "platform", "python",
                      "versions": {"numpy", "pillow", "tensorflow", "keras", "torch"}
                      (null: absent)},
          "decoders": [{"name", "images_per_s", "runs": [per round]}],
          "decode_limit": {"images_per_s", "decoder", "cores"},
          "loaders": [{"key", "name", "images_per_s", "consumer_wait_fraction",
                       "ratio_to_limit", "ratio_to_tf_data" (null without tf.data),
                       "images_per_s_runs", "wait_fraction_runs", "decoder" (null:
                       TensorFlow's), "backend" (null: not prefetch), "backend_reason",
                       "antialias"}],
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
            + ("" if c.antialias else ", resizing without antialiasing like tf.data")
            + (f"; each image cropped: {c.crop}" if c.crop else ""),
            f"machine: {m['cpu']}, {m['usable_cores']} usable cores ({m['cpu_count']} in all); "
            f"Python {m['python']}, {m['platform']}",
            "",
            f"{'single-core decode + resize':36s} {'images/s':>9s}"
            + ("  (local copies of the sample)" if storage.is_url(c.root) else ""),
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
            lines += ["", f"timeline: {self.timeline_title()}"]
            lines.append(self.timeline.render_text())
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw `figure()` into `path` (PNG).

        Needs matplotlib; raises ImportError saying how to install it when it is missing.
        """
        self.figure().savefig(os.fspath(path), dpi=110)

    def figure(self) -> Any:
        """A matplotlib `Figure` of images/s per loader (wait % on each bar), the decode limit
        and, with a step, the step ceiling. A ceiling far beyond every bar (over
        `CEILING_ON_AXIS` times the chart's width) is named under the axis instead of a line
        off it. Needs matplotlib (ImportError saying how to install it).
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
        right = max([*rates, self.decode_limit]) * 1.35
        ceiling = self.step_ceiling
        if math.isfinite(ceiling) and ceiling <= right * CEILING_ON_AXIS:
            right = max(right, ceiling * 1.05)
            axes.axvline(
                ceiling, color="tab:orange", linestyle=":", label=f"step ceiling {ceiling:.0f}/s"
            )
        axes.legend(loc="lower right", fontsize="small")
        axes.invert_yaxis()
        axes.set_xlim(0, right)
        far = math.isfinite(ceiling) and ceiling > right
        axes.set_xlabel(
            f"images/s (step ceiling {ceiling:.0f}/s is beyond this chart: the step limits no row)"
            if far
            else "images/s"
        )
        axes.set_title(
            f"{c.images} images -> {c.image_size[0]}x{c.image_size[1]}, batch {c.batch_size}, "
            f"{c.workers} workers, step {c.step_ms:g} ms, "
            f"{self.machine['usable_cores']} cores; median of {c.repeats} round(s)"
        )
        figure.tight_layout()
        return figure


def _how(row: LoaderResult, antialias: bool) -> str:
    """The table's "decoder, backend" cell: "turbo, thread"; TensorFlow's rows say "tf"."""
    parts = [row.decoder or "tf"]
    if row.backend is not None:
        parts.append(row.backend)
    if row.antialias != antialias and row.decoder is not None:
        parts.append("antialias" if row.antialias else "no antialias")
    return ", ".join(parts)
