"""The chart of a `TuneReport` (`TuneReport.figure`, `plot`): images/s against workers;
matplotlib is imported when a chart is drawn."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from prefetch.tools.timeline import import_matplotlib

if TYPE_CHECKING:
    from prefetch.tools.tune._report import Trial, TuneReport

# One colour per depth in the chart (the backend sets the line style and marker).
SERIES_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
# A chart line (the step ceiling) is drawn when it lies within this many times the data's
# top; further off, the axis label names it instead of stretching the axis.
CEILING_ON_AXIS = 2.0


def tune_figure(report: TuneReport) -> Any:
    """A matplotlib `Figure` of images/s against workers, one line per (backend, depth).

    Points are medians, bars the lowest to highest round; threads solid with circles,
    processes dashed with squares, one colour per depth, each series shifted a little
    along workers so that none hides another; the workers axis has whole numbers only;
    the recommendation is starred (the title says when it is uncertain); a step
    ceiling far above the data is named in the axis label instead of a line. Needs
    matplotlib (ImportError saying how to install it).
    """
    figure_class, _ = import_matplotlib("TuneReport.plot")
    figure = figure_class(figsize=(7, 4.5))
    axes = figure.subplots()
    series: dict[tuple[str, int], list[Trial]] = {}
    for t in report.trials:
        series.setdefault((t.backend, t.depth), []).append(t)
    depths = sorted({depth for _, depth in series})
    # Threads solid with circles, processes dashed with squares, a colour per depth, and
    # each series shifted a little along workers, so that no series hides another.
    shift = 0.08
    offsets = {}
    for number, ((backend, depth), trials) in enumerate(sorted(series.items())):
        trials.sort(key=lambda t: t.workers)
        offset = offsets[backend, depth] = (number - (len(series) - 1) / 2) * shift
        axes.errorbar(
            [t.workers + offset for t in trials],
            [t.images_per_s for t in trials],
            yerr=[
                [t.images_per_s - t.lowest for t in trials],
                [t.highest - t.images_per_s for t in trials],
            ],
            marker="o" if backend == "thread" else "s",
            linestyle="-" if backend == "thread" else "--",
            color=SERIES_COLOURS[depths.index(depth) % len(SERIES_COLOURS)],
            capsize=3,
            label=f"{backend}, depth {depth}",
        )
    recommended = report.recommended
    axes.plot(
        [recommended.workers + offsets[recommended.backend, recommended.depth]],
        [recommended.images_per_s],
        "*",
        color="tab:red",
        markersize=16,
        label="best answer (uncertain)" if report.uncertain else "recommended",
        zorder=5,
    )
    top = max(t.highest for t in report.trials)
    if math.isfinite(report.step_ceiling) and report.step_ceiling <= CEILING_ON_AXIS * top:
        axes.axhline(
            report.step_ceiling,
            color="gray",
            linestyle=":",
            label=f"step ceiling {report.step_ceiling:.0f}/s",
        )
        top = max(top, report.step_ceiling)
    axes.set_xticks(sorted({t.workers for t in report.trials}))
    axes.set_ylim(0, top * 1.1)
    far = math.isfinite(report.step_ceiling) and report.step_ceiling > top
    axes.set_xlabel(
        f"workers (step ceiling {report.step_ceiling:.0f}/s is far above: the step limits "
        "no configuration)"
        if far
        else "workers"
    )
    axes.set_ylabel("images/s (median; bars: its rounds)")
    step = f"step {report.step_ms:g} ms" if report.step_ms > 0 else "no step"
    verdict = "\nuncertain: noise could decide it (see the table)" if report.uncertain else ""
    axes.set_title(
        f"prefetch tune: {step}, batch {report.batch_size}, {report.repeats} round(s){verdict}"
    )
    axes.legend(fontsize="small", loc="lower right", ncol=2 if len(series) > 3 else 1)
    figure.tight_layout()
    return figure
