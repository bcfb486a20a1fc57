"""The report of `prefetch.tools.tune.tune`: the trials, the candidate, and whether the figures
are steady enough to recommend it.

`TuneReport` prints as the table `prefetch tune` shows (`format_table`), converts to JSON-ready
data (`as_dict`) and draws throughput against workers (`figure`, `plot`; matplotlib is imported
when called). The candidate is always recommended, as the best answer the data supports; it is
`uncertain` when `noise` is not empty (the load average before the search was above the usable
cores, or a configuration that could be chosen spread over `spread_limit` between its rounds,
see `SPREAD_PER_TOLERANCE`): the report then names the configurations the data cannot tell
from it and what would sharpen the answer. Plain data: no thread, no file is held.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from prefetch.tools.tune._chart import tune_figure

# Batches timed per trial, after one warm-up batch.
TRIAL_BATCHES = 12
# The default largest spread of a configuration's rounds, in tolerances: the median of 3
# rounds is uncertain by about 0.4 times their range (0.40 for normal noise, 0.45 for uniform),
# so a spread of 2 tolerances leaves each median about one tolerance uncertain: beyond that,
# noise decides which configurations lie within the tolerance of the best.
SPREAD_PER_TOLERANCE = 2.0
# How to measure a training step, for users who ran without one.
STEP_HOW_TO = (
    "time a few hundred steps of model.train_on_batch on one batch held in memory (or read "
    "Keras's ms/step from a fit on data already in memory) and pass it as --step-ms"
)
# Rounds suggested to sharpen an uncertain answer: a median of 5 survives 2 disturbed rounds.
SHARPER_REPEATS = 5
# A consumer waiting less than this share of the time in every round kept up with the step.
KEPT_UP = 0.05


@dataclass(frozen=True)
class Trial:
    """One measured configuration: the medians over its rounds, and each round's figures.

    `images_per_s_runs` and `wait_fraction_runs` hold one value per round (empty for a trial
    built by hand: then `spread` is 0).
    """

    backend: str
    workers: int
    depth: int
    images_per_s: float
    consumer_wait_fraction: float
    images_per_s_runs: tuple[float, ...] = ()
    wait_fraction_runs: tuple[float, ...] = ()

    @property
    def size(self) -> tuple[int, int, int]:
        """What "smaller" means: fewer workers, then a smaller depth, then threads."""
        return (self.workers, self.depth, 0 if self.backend == "thread" else 1)

    @property
    def spread(self) -> float:
        """(max - min) / median of the rounds' images/s; 0 with fewer than 2 rounds."""
        runs = self.images_per_s_runs
        if len(runs) < 2 or self.images_per_s <= 0:
            return 0.0
        return (max(runs) - min(runs)) / self.images_per_s

    @property
    def highest(self) -> float:
        """The best round's images/s (the median when there are no rounds)."""
        return max(self.images_per_s_runs, default=self.images_per_s)

    @property
    def lowest(self) -> float:
        """The worst round's images/s (the median when there are no rounds)."""
        return min(self.images_per_s_runs, default=self.images_per_s)

    def describe(self) -> str:
        """ "thread, 2 workers, depth 1"."""
        workers = f"{self.workers} {'worker' if self.workers == 1 else 'workers'}"
        return f"{self.backend}, {workers}, depth {self.depth}"


@dataclass(frozen=True)
class TuneReport:
    """The trials in the order run, the best throughput, the candidate and whether the
    figures are steady enough to recommend it.

    `load_average` is the machine's 1-minute load average before the search (None when the
    system does not tell); `usable_cores` the cores this process may use (0: not recorded);
    `max_spread` the largest spread allowed (None: `SPREAD_PER_TOLERANCE` x `tolerance`).
    """

    root: str
    step_ms: float
    batch_size: int
    image_size: tuple[int, int]
    tolerance: float
    trials: list[Trial] = field(default_factory=list)
    repeats: int = 1
    trial_batches: int = TRIAL_BATCHES
    images: int = 0
    usable_cores: int = 0
    load_average: float | None = None
    max_spread: float | None = None

    @property
    def best(self) -> Trial:
        """The trial with the highest median throughput."""
        return max(self.trials, key=lambda t: t.images_per_s)

    @property
    def candidate(self) -> Trial:
        """The smallest trial within `tolerance` of the best median, steady or not."""
        floor = (1 - self.tolerance) * self.best.images_per_s
        return min((t for t in self.trials if t.images_per_s >= floor), key=lambda t: t.size)

    @property
    def recommended(self) -> Trial:
        """The best answer the data supports: `candidate`, steady or not (see `uncertain`)."""
        return self.candidate

    @property
    def uncertain(self) -> bool:
        """Whether noise could have decided the recommendation (`noise` is not empty)."""
        return bool(self.noise)

    @property
    def alternatives(self) -> list[Trial]:
        """The other trials the data cannot tell from the candidate: a round within
        `tolerance` of the best median (empty when the answer is not uncertain)."""
        if not self.uncertain:
            return []
        floor = (1 - self.tolerance) * self.best.images_per_s
        return [t for t in self.trials if t.highest >= floor and t != self.candidate]

    @property
    def kept_up(self) -> bool:
        """Whether, with a step, the candidate's consumer waited under `KEPT_UP` of the time in
        every round: it keeps up, however busy the machine was."""
        waits = self.candidate.wait_fraction_runs or (self.candidate.consumer_wait_fraction,)
        return self.step_ms > 0 and max(waits) < KEPT_UP

    @property
    def spread_limit(self) -> float:
        """The largest spread of a configuration's rounds that still counts as steady."""
        if self.max_spread is not None:
            return self.max_spread
        return SPREAD_PER_TOLERANCE * self.tolerance

    @property
    def noisy_trials(self) -> list[Trial]:
        """Trials that could be chosen (a round within `tolerance` of the best median) whose
        rounds spread over `spread_limit`: their medians cannot be trusted to `tolerance`."""
        floor = (1 - self.tolerance) * self.best.images_per_s
        return [t for t in self.trials if t.highest >= floor and t.spread > self.spread_limit]

    @property
    def busy(self) -> bool:
        """Whether the load average before the search was above the usable cores."""
        return (
            self.load_average is not None
            and self.usable_cores > 0
            and self.load_average > self.usable_cores
        )

    @property
    def noise(self) -> list[str]:
        """Why the figures are noise, in words (empty: the candidate is recommended)."""
        reasons = []
        if self.busy:
            reasons.append(
                f"the machine was busy: load average {self.load_average:.1f} over the minute "
                f"before the search, above its {self.usable_cores} usable cores (other jobs "
                "took CPU time from the trials)"
            )
        noisy = self.noisy_trials
        if noisy:
            worst = max(noisy, key=lambda t: t.spread)
            some = "1 configuration" if len(noisy) == 1 else f"{len(noisy)} configurations"
            reasons.append(
                f"{some} that could be chosen (a round within {self.tolerance:.0%} of the best) "
                f"varied by more than {self.spread_limit:.0%} between rounds, too much to tell "
                f"configurations {self.tolerance:.0%} apart: {worst.describe()} gave "
                f"{worst.lowest:.0f} to {worst.highest:.0f} images/s ({worst.spread:.0%})"
            )
        return reasons

    @property
    def step_ceiling(self) -> float:
        """Images/s a consumer taking `step_ms` per batch cannot exceed (inf for no step)."""
        return self.batch_size / (self.step_ms / 1000) if self.step_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """Everything as plain data (JSON-ready): the settings, the trials (with each round's
        figures and their `spread`), `candidate`, `recommended` (the same, always),
        `uncertain`, `alternatives` (the trials the data cannot tell from it), `noise` (why it
        is uncertain) and `spread_limit`."""
        data = asdict(self)
        for trial, row in zip(self.trials, data["trials"], strict=True):
            row["spread"] = trial.spread
        data["candidate"] = asdict(self.candidate)
        data["recommended"] = asdict(self.recommended)
        data["uncertain"] = self.uncertain
        data["alternatives"] = [asdict(t) for t in self.alternatives]
        data["noise"] = self.noise
        data["spread_limit"] = self.spread_limit
        return data

    def format_table(self) -> str:
        """The settings, the trials as a text table, then the recommendation or why there is
        none."""
        best = self.best.images_per_s
        recommended = self.recommended
        noisy = self.noisy_trials
        lines = self._header()
        lines.append(
            f"{'backend':<8} {'workers':>7} {'depth':>5} {'images/s':>9} {'rounds':>13} "
            f"{'spread':>6} {'wait':>6} {'of best':>7}"
        )
        for t in self.trials:
            runs = t.images_per_s_runs
            low_high = f"{t.lowest:.0f}-{t.highest:.0f}" if len(runs) > 1 else "-"
            spread = f"{t.spread:.0%}" if len(runs) > 1 else "-"
            mark = ""
            if t == recommended:
                mark = "  <- best answer (uncertain)" if self.uncertain else "  <- recommended"
            mark += "  noisy" if t in noisy else ""
            lines.append(
                f"{t.backend:<8} {t.workers:>7} {t.depth:>5} {t.images_per_s:>9.0f} "
                f"{low_high:>13} {spread:>6} {t.consumer_wait_fraction:>6.1%} "
                f"{t.images_per_s / best:>6.2f}x{mark}"
            )
        lines.append(
            "images/s and wait: medians of the rounds; rounds: the lowest and highest images/s; "
            "spread: (highest - lowest) / median"
        )
        lines.append("")
        lines += self._verdict()
        return "\n".join(lines)

    def _header(self) -> list[str]:
        """The first lines of the table: what was measured, and on what machine."""
        height, width = self.image_size
        images = f"{self.images} images under " if self.images else ""
        step = (
            f"step {self.step_ms:g} ms"
            if self.step_ms > 0
            else "no training step (the loader alone)"
        )
        load = f"{self.load_average:.1f}" if self.load_average is not None else "unknown"
        cores = f"{self.usable_cores} usable cores" if self.usable_cores else "cores not recorded"
        return [
            f"prefetch tune: {images}{self.root} -> {height}x{width}, batch {self.batch_size}, "
            f"{step}; {self.trial_batches} batches per trial, {self.repeats} round(s)",
            f"machine: {cores}, load average {load} before the search",
            "",
        ]

    def _verdict(self) -> list[str]:
        """The recommendation, or why there is none; then what to do next."""
        lines = []
        candidate, best = self.candidate, self.best.images_per_s
        config = (
            f"Loader(..., backend={candidate.backend!r}, workers={candidate.workers}, "
            f"depth={candidate.depth})"
        )
        if self.noise:
            lines += self._uncertain(config)
        else:
            wait = (
                f", expected consumer wait {candidate.consumer_wait_fraction:.1%} with a "
                f"{self.step_ms:g} ms step"
                if self.step_ms > 0
                else ""
            )
            lines.append(
                f"recommended: {config}: {candidate.images_per_s:.0f} images/s "
                f"({candidate.images_per_s / best:.2f}x the best){wait}"
            )
            if self.step_ms > 0 and candidate.consumer_wait_fraction > 0.05:
                lines.append(
                    "the consumer still waits: training is input-bound on this machine; a "
                    "cheaper decode (smaller image_size, the fast decoder) or more cores would help"
                )
            if self.repeats < 2:
                lines.append(
                    "one round: the spread between rounds is unknown; --repeats 3 checks it"
                )
        if self.step_ms <= 0:
            lines.append(
                "measured without a training step: the loader alone, as fast as it goes. A "
                "step that takes time needs fewer workers; to size them for yours, " + STEP_HOW_TO
            )
        return lines

    def _uncertain(self, config: str) -> list[str]:
        """The best answer when noise could decide it: with its range, why it is uncertain,
        what it cannot be told from, and what would sharpen it."""
        candidate = self.candidate
        lines = [
            f"best answer, uncertain: {config}: {candidate.images_per_s:.0f} images/s (rounds "
            f"{candidate.lowest:.0f}-{candidate.highest:.0f}); noise could decide it:"
        ]
        lines += [f"- {reason}" for reason in self.noise]
        if self.kept_up:
            lines.append(
                f"- but it kept up with the {self.step_ms:g} ms step in every round (the "
                f"consumer waited under {KEPT_UP:.0%} of the time), busy machine or not: "
                "enough for this step"
            )
        others = self.alternatives
        if others:
            lines.append(
                "the data cannot tell it from: "
                + "; ".join(
                    f"{t.describe()} ({t.lowest:.0f}-{t.highest:.0f} images/s)" for t in others
                )
            )
        sharpen = []
        if self.busy:
            sharpen.append(
                f"run it when the load average is at most {self.usable_cores} (it was "
                f"{self.load_average:.1f})"
            )
        if self.repeats < SHARPER_REPEATS:
            sharpen.append(
                f"--repeats {SHARPER_REPEATS} (a median of {SHARPER_REPEATS} rounds survives "
                f"{(SHARPER_REPEATS - 1) // 2} disturbed ones)"
            )
        sharpen.append(
            f"--trial-batches {4 * self.trial_batches} (longer trials average other jobs' "
            "bursts out)"
        )
        lines.append("to sharpen it: " + ", or ".join(sharpen))
        return lines

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draw `figure()` into `path` (PNG); needs matplotlib."""
        self.figure().savefig(os.fspath(path), dpi=110)

    def figure(self) -> Any:
        """A matplotlib `Figure` of images/s against workers (`_chart.tune_figure`). Needs
        matplotlib (ImportError saying how to install it)."""
        return tune_figure(self)
