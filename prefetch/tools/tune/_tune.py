"""`tune`: the search of `prefetch tune` (trials, rounds, the candidate) and the load average
it is judged by. The package docstring (`prefetch.tools.tune`) states the method and the
contract: runs in the calling thread; every loader is closed before its trial returns.
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
from prefetch.tools.tune._report import (
    TRIAL_BATCHES,
    Trial,
    TuneReport,
)

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
