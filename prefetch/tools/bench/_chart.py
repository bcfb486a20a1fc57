"""The bar chart of a `BenchReport` (`BenchReport.figure`, `plot`); matplotlib is imported
when a chart is drawn."""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any

from prefetch.tools.timeline import import_matplotlib

if TYPE_CHECKING:
    from prefetch.tools.bench._report import BenchReport

# The step ceiling is drawn as a line when it is at most this many times the chart's right
# edge (the axis is then stretched to it); further off, the axis label names it instead.
CEILING_ON_AXIS = 2.0


def ratio_text(ratio: float | None) -> str:
    """A ratio as every report writes it: "1.12x" ("-" for None)."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def bench_figure(report: BenchReport) -> Any:
    """A matplotlib `Figure` of images/s per loader (each bar labelled with its rate and its
    ratio to tf.data), the decode limit, the entropy floor when measured and, with a step,
    the step ceiling. A label that a line would cross is moved past the line. A ceiling far
    beyond every bar (over `CEILING_ON_AXIS` times the chart's width) is named under the
    axis instead of a line off it. Needs matplotlib (ImportError saying how to install it).
    """
    figure_class, _ = import_matplotlib("BenchReport.plot")
    agg = importlib.import_module("matplotlib.backends.backend_agg")
    c = report.config
    figure = figure_class(figsize=(9, 2.4 + 0.5 * len(report.loaders)))
    agg.FigureCanvasAgg(figure)  # a renderer, to measure the labels
    axes = figure.subplots()
    names = [row.name for row in report.loaders]
    rates = [row.images_per_s for row in report.loaders]
    bars = axes.barh(names, rates, color="tab:blue")
    lines = [(report.decode_limit, "tab:red", "--", f"decode limit {report.decode_limit:.0f}/s")]
    if report.floor_limit is not None:
        floor = report.floor_limit
        lines.append((floor, "tab:purple", "-.", f"entropy floor {floor:.0f}/s"))
    right = max([*rates, *(x for x, *_ in lines)]) * 1.45
    ceiling = report.step_ceiling
    if math.isfinite(ceiling) and ceiling <= right * CEILING_ON_AXIS:
        right = max(right, ceiling * 1.05)
        lines.append((ceiling, "tab:orange", ":", f"step ceiling {ceiling:.0f}/s"))
    for x, color, style, label in lines:
        axes.axvline(x, color=color, linestyle=style, label=label)
    axes.set_xlim(0, right)
    # Under the axis, where no bar label can be: one row of the lines' names.
    axes.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncol=len(lines),
        fontsize="small",
        frameon=False,
    )
    axes.invert_yaxis()
    far = math.isfinite(ceiling) and ceiling > right
    axes.set_xlabel(
        f"images/s (step ceiling {ceiling:.0f}/s is beyond this chart: the step limits no row)"
        if far
        else "images/s, steady state (median of the rounds)"
    )
    axes.set_title(
        f"{c.images} images -> {c.image_size[0]}x{c.image_size[1]}, batch {c.batch_size}, "
        f"{c.workers} workers, "
        + (f"step {c.step_ms:g} ms" if c.step_ms > 0 else "no step")
        + f"\n{report.machine['usable_cores']} cores; median of {c.repeats} round(s)"
        + (f"; crop {c.crop.split('(')[0]}" if c.crop else ""),
        fontsize="medium",
    )
    figure.tight_layout()
    labels = []
    for bar, row in zip(bars, report.loaders, strict=True):
        text = f" {row.images_per_s:.0f}/s"
        if row.ratio_to_tf_data is not None and row.key != "tf.data":
            text += f", {ratio_text(row.ratio_to_tf_data)} tf.data"
        labels.append(
            axes.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                text,
                va="center",
                fontsize="small",
            )
        )
    _clear_of_lines(figure, axes, labels, [x for x, *_ in lines])
    return figure


def _clear_of_lines(figure: Any, axes: Any, labels: list[Any], xs: list[float]) -> None:
    """Move each bar label that a vertical line at one of `xs` would cross to just past the
    line (repeatedly, so that it lands clear of them all), and widen the axis to fit."""
    renderer = figure.canvas.get_renderer()
    to_data = axes.transData.inverted()
    gap = axes.get_xlim()[1] * 0.005
    right = axes.get_xlim()[1]
    for label in labels:
        for _ in range(len(xs) + 1):
            box = label.get_window_extent(renderer).transformed(to_data)
            crossing = [x for x in xs if box.x0 - gap <= x <= box.x1 + gap]
            if not crossing:
                break
            label.set_x(max(crossing) + gap)
        right = max(right, label.get_window_extent(renderer).transformed(to_data).x1 * 1.02)
    axes.set_xlim(0, right)
