"""`prefetch tune`: find the smallest loader configuration that keeps up with a training step.

`tune(root, step_ms=...)` runs short trials of the Loader on a folder, with a simulated training
step of `step_ms` per batch (a sleep, like a device step that leaves the CPU free; 0: the
loader alone), over backend x depth x workers, in `repeats` rounds:

- round 1 searches: for each backend and depth, workers go up from 1; the search along workers
  stops early once the consumer no longer waits (`KEPT_UP_WAIT`), or once two more workers in
  a row gained less than `tolerance` over the best so far;
- the other rounds measure the same configurations again, in the same order, so that a machine
  that gets busier for a while slows every configuration alike; each configuration reports
  the median of its rounds and their spread, (max - min) / median;
- each trial takes `trial_batches` batches after one warm-up batch (start-up and the first
  batches in flight are not timed);
- the candidate is the smallest configuration (fewest workers, then the smallest `depth`, then
  threads before processes) within `tolerance` of the best median.

The candidate is always recommended, as the best answer the data supports; it is uncertain
(`TuneReport.uncertain`, the reasons in `noise`) unless the machine's load average before the
search was at most its usable cores and no configuration that could be chosen (one with a
round within `tolerance` of the best median) spread over `max_spread` (default
`SPREAD_PER_TOLERANCE` x `tolerance`: the median of 3 rounds is uncertain by about 0.4 times
their range, so over twice the tolerance, noise could decide what lies within the tolerance).
An uncertain answer comes with its range, the configurations it cannot be told from, and
what would sharpen it. The report prints as a table and draws throughput against workers
(`plot`, needs matplotlib). Runs in the calling thread; every loader is closed before the
trial returns.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefetch._checks import positive
from prefetch.decode import Decoder
from prefetch.runtime import Loader, usable_cores
from prefetch.sources import ImageFolder
from prefetch.tools.tune_report import (
    SPREAD_PER_TOLERANCE,
    STEP_HOW_TO,
    TRIAL_BATCHES,
    Trial,
    TuneReport,
)

__all__ = [
    "KEPT_UP_WAIT",
    "REPEATS",
    "SPREAD_PER_TOLERANCE",
    "STEP_HOW_TO",
    "TOLERANCE",
    "TRIAL_BATCHES",
    "Trial",
    "TuneReport",
    "load_average",
    "tune",
]

# The consumer waiting less than this share of the time means the loader keeps up.
KEPT_UP_WAIT = 0.01
# Share of the best throughput within which the smallest configuration is chosen.
TOLERANCE = 0.05
# Rounds per configuration: a median of 3 survives one disturbed round, and their spread
# shows whether the machine was steady.
REPEATS = 3


def load_average() -> float | None:
    """The machine's load average over the last minute, or None where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not on Unix
        return None


@dataclass(frozen=True)
class _Config:
    """What one trial runs, and how."""

    folder: ImageFolder
    batch_size: int
    image_size: tuple[int, int]
    step_s: float
    batches: int
    decoder: Decoder | None


def _trial(config: _Config, backend: str, workers: int, depth: int) -> tuple[float, float]:
    """(images/s, consumer wait fraction) of one trial: a fresh Loader, one warm-up batch,
    then `config.batches` timed batches, each followed by a step of `config.step_s`."""
    loader = Loader(
        config.folder,
        batch_size=config.batch_size,
        image_size=config.image_size,
        workers=workers,
        depth=depth,
        backend=backend,
        decoder=config.decoder,
        seed=0,
    )
    images = 0
    waited = 0.0
    with loader:
        iterator = iter(loader)
        next(iterator)  # warm-up: workers start, `depth` batches go in flight
        time.sleep(config.step_s)
        began = time.perf_counter()
        for _ in range(config.batches):
            asked = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                iterator = iter(loader)
                batch = next(iterator)
            waited += time.perf_counter() - asked
            images += len(batch[0])
            del batch
            time.sleep(config.step_s)
        elapsed = time.perf_counter() - began
        del iterator
    return images / elapsed, waited / elapsed


def tune(
    root: str | os.PathLike[str],
    *,
    step_ms: float = 0.0,
    batch_size: int = 32,
    image_size: tuple[int, int] = (224, 224),
    backends: Sequence[str] = ("thread", "process"),
    depths: Sequence[int] = (1, 2, 4),
    max_workers: int | None = None,
    trial_batches: int = TRIAL_BATCHES,
    tolerance: float = TOLERANCE,
    decoder: Decoder | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    repeats: int = REPEATS,
    max_spread: float | None = None,
) -> TuneReport:
    """Search backend x depth x workers on `root` for a consumer step of `step_ms` per batch.

    `step_ms=0` measures the loader alone (the report then says how to measure a step).
    `max_workers` defaults to twice the usable cores. Each configuration found by the first
    round is measured `repeats` times in all (rounds interleaved); `max_spread` is the
    largest spread of its rounds that counts as steady (None: `SPREAD_PER_TOLERANCE` x
    `tolerance`; `math.inf` never refuses for spread). `progress(done, total, label)` is
    called after each trial (total is the most trials the search could run, exact once the
    first round is done). See the module docstring for the search and when the report
    recommends nothing.

    - `root`: the image folder (`root/<class>/<image>`), as `ImageFolder` reads it.
    - `step_ms`: the consumer's training step per batch, in ms; 0 measures the loader alone.
    - `batch_size`: samples per batch.
    - `image_size`: `(height, width)` of every image.
    - `backends`: the backends tried ("thread", "process").
    - `depths`: the `depth` values tried.
    - `max_workers`: the most workers tried (default twice the usable cores).
    - `trial_batches`: batches timed per trial, after a warm-up.
    - `tolerance`: the share of the best throughput within which the smallest configuration
      is chosen.
    - `decoder`: the decoder every trial uses (None: the Loader's default).
    - `progress`: `progress(done, total, label)`, called after each trial.
    - `repeats`: rounds per configuration (medians over them).
    - `max_spread`: the largest spread of a configuration's rounds that counts as steady.
    """
    if not step_ms >= 0:
        raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}")
    trial_batches = positive("trial_batches", trial_batches)
    repeats = positive("repeats", repeats)
    if max_spread is not None and not max_spread > 0:
        raise ValueError(f"max_spread must be > 0 (or None for the default), got {max_spread!r}")
    folder = ImageFolder(root)
    if len(folder) < 2 * batch_size:
        raise ValueError(
            f"{str(root)!r} has {len(folder)} images, fewer than 2 batches of {batch_size}; "
            "lower batch_size or add images"
        )
    max_workers = max_workers or 2 * usable_cores()
    size = (int(image_size[0]), int(image_size[1]))
    load = load_average()  # before any trial: the load of other jobs
    config = _Config(folder, batch_size, size, step_ms / 1000, trial_batches, decoder)
    runs = _search(config, backends, depths, max_workers, tolerance, repeats, progress)
    _repeat(config, runs, repeats, progress)
    trials = [
        Trial(
            backend,
            workers,
            depth,
            statistics.median(rate for rate, _ in measured),
            statistics.median(wait for _, wait in measured),
            tuple(rate for rate, _ in measured),
            tuple(wait for _, wait in measured),
        )
        for (backend, workers, depth), measured in runs.items()
    ]
    return TuneReport(
        str(root),
        step_ms,
        batch_size,
        size,
        tolerance,
        trials,
        repeats=repeats,
        trial_batches=trial_batches,
        images=len(folder),
        usable_cores=usable_cores(),
        load_average=load,
        max_spread=max_spread,
    )


def _repeat(
    config: _Config,
    runs: dict[tuple[str, int, int], list[tuple[float, float]]],
    repeats: int,
    progress: Callable[[int, int, str], None] | None,
) -> None:
    """Rounds 2 to `repeats`: each configuration of `runs` again, in the same order, its
    (images/s, wait) appended to its list."""
    total = len(runs) * repeats
    done = len(runs)
    for round_number in range(2, repeats + 1):
        for (backend, workers, depth), measured in runs.items():
            measured.append(_trial(config, backend, workers, depth))
            done += 1
            if progress is not None:
                label = f"round {round_number}/{repeats}: {backend} x{workers} depth {depth}"
                progress(done, total, label)


def _search(
    config: _Config,
    backends: Sequence[str],
    depths: Sequence[int],
    max_workers: int,
    tolerance: float,
    repeats: int,
    progress: Callable[[int, int, str], None] | None,
) -> dict[tuple[str, int, int], list[tuple[float, float]]]:
    """Round 1: (backend, workers, depth) -> [(images/s, wait)] for each configuration tried,
    in the order tried, going up in workers until the loader keeps up or gains flatten."""
    runs: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    upper = len(backends) * len(depths) * max_workers * repeats
    for backend in backends:
        for depth in depths:
            best = 0.0
            flat = 0
            for workers in range(1, max_workers + 1):
                rate, wait = _trial(config, backend, workers, depth)
                runs[(backend, workers, depth)] = [(rate, wait)]
                if progress is not None:
                    label = f"round 1/{repeats}: {backend} x{workers} depth {depth}"
                    progress(len(runs), upper, label)
                if wait < KEPT_UP_WAIT:
                    break
                if rate > (1 + tolerance) * best:
                    flat = 0
                else:
                    flat += 1
                    if flat >= 2:
                        break
                best = max(best, rate)
    return runs
