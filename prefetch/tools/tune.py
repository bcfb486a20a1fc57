"""`prefetch tune`: find the smallest loader configuration that keeps up with a training step.

`tune(root, step_ms=...)` runs short trials of the Loader on a folder, with a simulated training
step of `step_ms` per batch (a sleep, like a device step that leaves the CPU free), over
backend x depth x workers:

- for each backend and depth, workers go up from 1; the search along workers stops early once
  the consumer no longer waits (`KEPT_UP_WAIT`), or once two more workers in a row gained less
  than `tolerance` over the best so far;
- each trial takes `trial_batches` batches after one warm-up batch (start-up and the first
  window are not timed);
- the recommendation is the smallest configuration (fewest workers, then the shallowest window,
  then threads before processes) within `tolerance` of the best throughput.

The report prints as a table with the recommendation and its expected consumer wait, and draws
throughput against workers (`plot`, needs matplotlib).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prefetch.autoscale import usable_cores
from prefetch.decode import Decoder
from prefetch.loader import Loader
from prefetch.sources import ImageFolder
from prefetch.tools.timeline import import_matplotlib

# The consumer waiting less than this share of the time means the loader keeps up.
KEPT_UP_WAIT = 0.01
TOLERANCE = 0.05
TRIAL_BATCHES = 12


@dataclass(frozen=True)
class Trial:
    """One measured configuration."""

    backend: str
    workers: int
    depth: int
    images_per_s: float
    consumer_wait_fraction: float

    @property
    def size(self) -> tuple[int, int, int]:
        """What "smaller" means: fewer workers, then a shallower window, then threads."""
        return (self.workers, self.depth, 0 if self.backend == "thread" else 1)


@dataclass(frozen=True)
class TuneReport:
    """The trials in the order run, the best throughput, and the recommended configuration."""

    root: str
    step_ms: float
    batch_size: int
    image_size: tuple[int, int]
    tolerance: float
    trials: list[Trial] = field(default_factory=list)

    @property
    def best(self) -> Trial:
        """The trial with the highest throughput."""
        return max(self.trials, key=lambda t: t.images_per_s)

    @property
    def recommended(self) -> Trial:
        """The smallest trial within `tolerance` of the best throughput."""
        floor = (1 - self.tolerance) * self.best.images_per_s
        return min((t for t in self.trials if t.images_per_s >= floor), key=lambda t: t.size)

    @property
    def step_ceiling(self) -> float:
        """Images/s a consumer taking `step_ms` per batch cannot exceed (inf for no step)."""
        return self.batch_size / (self.step_ms / 1000) if self.step_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """Everything as plain data (JSON-ready)."""
        data = asdict(self)
        data["recommended"] = asdict(self.recommended)
        return data

    def format_table(self) -> str:
        """The trials as a text table, then the recommendation."""
        best = self.best.images_per_s
        lines = [
            f"{'backend':<8} {'workers':>7} {'depth':>5} {'images/s':>9} {'wait':>6} {'of best':>7}"
        ]
        for t in self.trials:
            mark = "  <- recommended" if t == self.recommended else ""
            lines.append(
                f"{t.backend:<8} {t.workers:>7} {t.depth:>5} {t.images_per_s:>9.0f} "
                f"{t.consumer_wait_fraction:>6.1%} {t.images_per_s / best:>7.0%}{mark}"
            )
        r = self.recommended
        lines.append("")
        lines.append(
            f"recommended: Loader(..., backend={r.backend!r}, workers={r.workers}, "
            f"depth={r.depth}): {r.images_per_s:.0f} images/s ({r.images_per_s / best:.0%} of "
            f"the best), expected consumer wait {r.consumer_wait_fraction:.1%} with a "
            f"{self.step_ms:g} ms step"
        )
        if r.consumer_wait_fraction > 0.05:
            lines.append(
                "the consumer still waits: training is input-bound on this machine; a cheaper "
                "decode (smaller image_size, the fast decoder) or more cores would help"
            )
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw images/s against workers, one line per (backend, depth), into `path` (PNG)."""
        figure_class, _ = import_matplotlib("TuneReport.plot")
        figure = figure_class(figsize=(7, 4.5))
        axes = figure.subplots()
        series: dict[tuple[str, int], list[Trial]] = {}
        for t in self.trials:
            series.setdefault((t.backend, t.depth), []).append(t)
        for (backend, depth), trials in sorted(series.items()):
            trials.sort(key=lambda t: t.workers)
            axes.plot(
                [t.workers for t in trials],
                [t.images_per_s for t in trials],
                marker="o",
                label=f"{backend}, depth {depth}",
            )
        r = self.recommended
        axes.plot([r.workers], [r.images_per_s], "r*", markersize=14, label="recommended")
        if self.step_ms > 0:
            axes.axhline(self.step_ceiling, color="gray", linestyle=":", label="step ceiling")
        axes.set_xlabel("workers")
        axes.set_ylabel("images/s")
        axes.set_title(f"prefetch tune: step {self.step_ms:g} ms, batch {self.batch_size}")
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(os.fspath(path), dpi=110)


def _trial(
    folder: ImageFolder,
    backend: str,
    workers: int,
    depth: int,
    *,
    batch_size: int,
    image_size: tuple[int, int],
    step_s: float,
    batches: int,
    decoder: Decoder | None,
) -> Trial:
    loader = Loader(
        folder,
        batch_size=batch_size,
        image_size=image_size,
        workers=workers,
        depth=depth,
        backend=backend,
        decoder=decoder,
        seed=0,
    )
    images = 0
    waited = 0.0
    with loader:
        iterator = iter(loader)
        next(iterator)  # warm-up: workers start, the window fills
        time.sleep(step_s)
        began = time.perf_counter()
        for _ in range(batches):
            asked = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                iterator = iter(loader)
                batch = next(iterator)
            waited += time.perf_counter() - asked
            images += len(batch[0])
            del batch
            time.sleep(step_s)
        elapsed = time.perf_counter() - began
        del iterator
    return Trial(backend, workers, depth, images / elapsed, waited / elapsed)


def tune(
    root: str | os.PathLike[str],
    *,
    step_ms: float,
    batch_size: int = 32,
    image_size: tuple[int, int] = (224, 224),
    backends: Sequence[str] = ("thread", "process"),
    depths: Sequence[int] = (1, 2, 4),
    max_workers: int | None = None,
    trial_batches: int = TRIAL_BATCHES,
    tolerance: float = TOLERANCE,
    decoder: Decoder | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> TuneReport:
    """Search backend x depth x workers on `root` for a consumer step of `step_ms` per batch.

    `max_workers` defaults to twice the usable cores. `progress(done, total, label)` is called
    after each trial (total is the most trials the search could run).
    """
    if not step_ms >= 0:
        raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    if trial_batches < 1:
        raise ValueError(f"trial_batches must be >= 1, got {trial_batches}")
    folder = ImageFolder(root)
    if len(folder) < 2 * batch_size:
        raise ValueError(
            f"{str(root)!r} has {len(folder)} images, fewer than 2 batches of {batch_size}; "
            "lower batch_size or add images"
        )
    max_workers = max_workers or 2 * usable_cores()
    size = (int(image_size[0]), int(image_size[1]))
    report = TuneReport(str(root), step_ms, batch_size, size, tolerance)
    total = len(backends) * len(depths) * max_workers
    for backend in backends:
        for depth in depths:
            best = 0.0
            flat = 0
            for workers in range(1, max_workers + 1):
                if backend == "process" and workers > depth:
                    break  # a process worker takes whole batches: more than depth would idle
                trial = _trial(
                    folder,
                    backend,
                    workers,
                    depth,
                    batch_size=batch_size,
                    image_size=size,
                    step_s=step_ms / 1000,
                    batches=trial_batches,
                    decoder=decoder,
                )
                report.trials.append(trial)
                if progress is not None:
                    progress(len(report.trials), total, f"{backend} x{workers} depth {depth}")
                if trial.consumer_wait_fraction < KEPT_UP_WAIT:
                    break
                if trial.images_per_s > (1 + tolerance) * best:
                    flat = 0
                else:
                    flat += 1
                    if flat >= 2:
                        break
                best = max(best, trial.images_per_s)
    return report
