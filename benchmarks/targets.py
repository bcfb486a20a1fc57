"""Benchmark: the performance targets that are not a loader race (prefetch bench does that).

Each row prints the target, the measured figure and whether it was met, on ImageNet-sized JPEGs
(500x375, `--images` generated into a temporary folder) decoded to 224x224, batches of 64.
Rates are measured as a training job runs its loader (`prefetch.tools.bench.measure_row`): one
long-lived pipeline per row (one open Loader; tf.data `.repeat()` and one iterator) in a fresh
spawned process, `--warmup-epochs` (default 2) untimed, then `--epochs` (default 6) timed,
`--rounds` rounds (default 3); medians with their min-max over the rounds.

  python-transform  a transform holding the GIL ~2 ms per image: the process backend vs one
                    worker (and threads), and vs tf.data running the same transform in
                    tf.py_function (AUTOTUNE, shuffled, `.repeat()`); the rows' order reversed
                    every other round; ratios of the medians, with their range over the rounds
  overlap           each round, the default Loader alone gives P (its time per batch at steady
                    state), then a fresh one whose consumer sleeps C = 1.2 P after every batch:
                    the timed span's time vs C x its batches, and the consumer's wait over it
                    (the warm-up, and so the first batch, untimed); P before C in every round
  handoff           process backend: time for next() to return a batch that is already decoded
                    (one open Loader, two epochs; needs 2 batches an epoch, --images >= 128)
  first-batch       process backend in a process that imported TensorFlow: start to first batch
                    (a cold start by definition: a fresh process each round)
  memory            resident memory of the process tree after each of 10 epochs (growth)

    python benchmarks/targets.py [--images 512] [--only overlap,handoff] [--rounds 3]
        [--warmup-epochs 2] [--epochs 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

import prefetch
from prefetch.testing import GilHoldingTransform
from prefetch.tools.bench import (
    Contender,
    OpenLoader,
    RowFailed,
    RowResult,
    Setup,
    Span,
    TfDataContender,
    make_contender,
    measure_rounds,
    measure_row,
    median_range,
    write_sample_folder,
)

IMAGE_SIZE = (224, 224)
BATCH = 64
TRANSFORM_S = 0.002
CORES = len(os.sched_getaffinity(0))
Check = tuple[str, str, str, bool]  # (what, target, measured, met)


@dataclass(frozen=True)
class Run:
    """What every check measures on, and how long."""

    folder: str
    setup: Setup
    span: Span
    rounds: int


class TransformLoader(OpenLoader):
    """`prefetch.Loader` with the GIL-holding transform, on `backend` with `workers`."""

    def __init__(self, setup: Setup, backend: str, workers: int) -> None:
        self.loader = prefetch.Loader(
            setup.folder,
            batch_size=BATCH,
            image_size=IMAGE_SIZE,
            backend=backend,
            workers=workers,
            augment=prefetch.Augment(transform=GilHoldingTransform(TRANSFORM_S)),
            depth=max(2, workers),
            seed=0,
        )


class PyFunctionTfData(TfDataContender):
    """tf.data AUTOTUNE: shuffle, read, decode, resize, the same transform in py_function,
    batch, prefetch; `.repeat()` and one iterator (`TfDataContender.stream`)."""

    def open(self, stack: contextlib.ExitStack) -> None:
        import tensorflow as tf  # only in the row's own process

        transform = GilHoldingTransform(TRANSFORM_S)
        rng = np.random.default_rng(0)

        def python_part(image: tf.Tensor) -> np.ndarray:
            return transform(image.numpy(), rng)

        def load(path: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
            image = tf.cast(tf.image.resize(image, IMAGE_SIZE), tf.uint8)
            image = tf.py_function(python_part, [image], tf.uint8)
            image.set_shape((*IMAGE_SIZE, 3))
            return image, label

        folder = self.setup.folder
        paths = [str(p) for p in folder.paths]
        data = tf.data.Dataset.from_tensor_slices((paths, folder.labels))
        data = data.shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
        data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE)
        self.dataset = data.batch(BATCH).prefetch(tf.data.AUTOTUNE)

    def describe(self) -> dict[str, Any]:
        return {"note": "AUTOTUNE, .repeat(), one iterator"}


def make_row(key: str, setup: Setup) -> Contender:
    """The contender of row `key` (module level: the spawned row unpickles it from here)."""
    rows: dict[str, Callable[[], Contender]] = {
        "1 worker": lambda: TransformLoader(setup, "thread", 1),
        "threads": lambda: TransformLoader(setup, "thread", CORES),
        "processes": lambda: TransformLoader(setup, "process", CORES),
        "tf.data": lambda: PyFunctionTfData(setup),
        "alone": lambda: make_contender("default", setup),  # Loader(folder, batch, size, seed)
    }
    return rows[key]()


def row(run: Run, key: str, step_s: float = 0.0) -> RowResult:
    """Row `key` at steady state in a fresh process; progress on stderr."""
    result = measure_row(key, run.setup, run.span, step_s, lambda: None, make=make_row)
    step = f", step {1000 * step_s:.0f} ms" if step_s else ""
    print(f"  {key}{step}: {result.images_per_s:.0f} images/s", file=sys.stderr, flush=True)
    return result


def python_transform(run: Run) -> list[Check]:
    keys = ["1 worker", "threads", "processes", "tf.data"]
    results, failed = measure_rounds(keys, run.rounds, lambda key: row(run, key))
    rates = {key: [r.images_per_s for r in runs] for key, runs in results.items() if runs}

    def measured(key: str) -> str:
        return f"{median_range(rates[key])} img/s" if key in rates else failed[key]

    def ratio(top: str, bottom: str) -> tuple[float, str]:
        if top not in rates or bottom not in rates:
            return float("nan"), "-"
        pairs = [a / b for a, b in zip(rates[top], rates[bottom], strict=False)]
        value = statistics.median(rates[top]) / statistics.median(rates[bottom])
        within = f", rounds {min(pairs):.2f}x-{max(pairs):.2f}x" if len(pairs) > 1 else ""
        return value, f"{value:.2f}x{within}"

    _, threads_text = ratio("threads", "1 worker")
    processes, processes_text = ratio("processes", "1 worker")
    versus_tf, versus_tf_text = ratio("processes", "tf.data")
    return [
        ("python transform: 1 worker", "", measured("1 worker"), True),
        ("python transform: threads", "", f"{measured('threads')} ({threads_text})", True),
        (
            "python transform: processes vs 1 worker",
            ">= 1.8x",
            f"{measured('processes')} ({processes_text})",
            processes >= 1.8,
        ),
        (
            "python transform: processes vs tf.data py_function",
            ">= 1.7x",
            f"tf.data {measured('tf.data')} ({versus_tf_text})",
            versus_tf >= 1.7,
        ),
    ]


def overlap(run: Run) -> list[Check]:
    # The warm-up ends at an epoch's end, so the timed span is whole epochs of whole batches.
    batches = run.span.timed // len(run.setup.folder) * -(-len(run.setup.folder) // BATCH)
    producer_ms, step_ms, ratios, waits = [], [], [], []
    for _ in range(run.rounds):
        try:
            producer_s = BATCH / row(run, "alone").images_per_s  # P: nothing else running
            stepped = row(run, "alone", 1.2 * producer_s)
        except RowFailed as error:
            return [("overlap", "", f"failed: {error}", False)]
        producer_ms.append(1000 * producer_s)
        step_ms.append(1200 * producer_s)
        ratios.append(run.span.timed / stepped.images_per_s / (1.2 * producer_s * batches))
        waits.append(100 * (stepped.wait_fraction or 0.0))
    return [
        (
            "overlap: timed span / (C x batches), C = 1.2 P",
            "<= 1.05",
            f"{median_range(ratios, 3)} (P {median_range(producer_ms)} ms, "
            f"C {statistics.median(step_ms):.0f} ms, {batches} batches)",
            statistics.median(ratios) <= 1.05,
        ),
        (
            "overlap: consumer wait at steady state",
            "< 3%",
            f"{median_range(waits, 1)} %",
            statistics.median(waits) < 3,
        ),
    ]


def handoff(run: Run) -> list[Check]:
    loader = prefetch.Loader(
        run.folder,
        batch_size=BATCH,
        image_size=IMAGE_SIZE,
        backend="process",
        workers=CORES,
        seed=0,
    )
    if len(loader) < 2:
        return [
            ("process handoff", "", f"needs 2 batches an epoch: --images >= {2 * BATCH}", False)
        ]
    times = []
    with loader:
        for _ in range(2):
            iterator = iter(loader)
            next(iterator)
            for _ in range(len(loader) - 1):
                time.sleep(0.5)  # long enough that the next batch is decoded and waiting
                asked = time.perf_counter()
                batch = next(iterator)
                times.append(time.perf_counter() - asked)
                del batch
            del iterator
    median_ms = 1000 * statistics.median(times)
    return [
        (
            "process handoff per 64x224x224x3 batch (median)",
            "< 0.5 ms",
            f"{median_ms:.3f} ms (max {1000 * max(times):.3f} ms, {len(times)} batches)",
            median_ms < 0.5,
        )
    ]


FIRST_BATCH_SCRIPT = """
import sys, time
import tensorflow  # noqa: F401  a training process has TensorFlow loaded
import prefetch
if __name__ == "__main__":
    loader = prefetch.Loader(sys.argv[1], batch_size=64, image_size=(224, 224),
                             backend="process", seed=0)
    began = time.perf_counter()
    with loader:
        next(iter(loader))
        print(time.perf_counter() - began)
"""


def first_batch(run: Run) -> list[Check]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "first_batch.py"
        script.write_text(FIRST_BATCH_SCRIPT)
        runs = []
        for _ in range(run.rounds):
            done = subprocess.run(
                [sys.executable, str(script), run.folder],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(float(done.stdout.split()[-1]))
    median = statistics.median(runs)
    return [
        (
            "first batch with spawned workers (TF imported)",
            "< 1.5 s",
            f"{median:.2f} s (median of {len(runs)}: {', '.join(f'{r:.2f}' for r in runs)})",
            median < 1.5,
        )
    ]


def tree_rss() -> int:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])


def memory(run: Run) -> list[Check]:
    rows = []
    for backend in ("thread", "process"):
        loader = prefetch.Loader(
            run.folder, batch_size=BATCH, image_size=IMAGE_SIZE, backend=backend, seed=0
        )
        samples = []
        with loader:
            for _ in range(10):
                for _ in loader:
                    pass
                samples.append(tree_rss())
        growth = (samples[-1] - samples[2]) / 2**20
        rows.append(
            (
                f"memory, {backend} backend: RSS growth epochs 3 -> 10",
                "flat (< 5 MiB)",
                f"{growth:+.1f} MiB (epoch 3: {samples[2] / 2**20:.0f} MiB)",
                abs(growth) < 5,
            )
        )
    return rows


CHECKS: dict[str, Callable[[Run], list[Check]]] = {
    "python-transform": python_transform,
    "overlap": overlap,
    "handoff": handoff,
    "first-batch": first_batch,
    "memory": memory,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every rate")
    parser.add_argument("--warmup-epochs", type=int, default=2, help="untimed epochs per row")
    parser.add_argument("--epochs", type=int, default=6, help="timed epochs per row")
    args = parser.parse_args()
    names = [name.strip() for name in args.only.split(",")]
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {list(CHECKS)}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # inherited by the rows' processes
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_sample_folder(Path(tmp) / "photos", args.images))
        setup = Setup(
            prefetch.ImageFolder(folder),
            prefetch.DecodeOptions(IMAGE_SIZE),
            BATCH,
            CORES,
            2,
            0,
            prefetch.decode_image,  # unused: every row decodes with its own
        )
        span = Span(args.warmup_epochs * args.images, args.epochs * args.images)
        run = Run(folder, setup, span, args.rounds)
        print(f"$ python {' '.join(sys.argv)}")
        print(
            f"{CORES} cores; load average (1 min) {os.getloadavg()[0]:.2f}; {args.images} JPEGs "
            f"500x375 -> 224x224; batch {BATCH}; rates: one pipeline per row in a fresh process, "
            f"{args.warmup_epochs} epoch(s) untimed, then {args.epochs} timed; median of "
            f"{args.rounds} round(s) (min-max)\n"
        )
        print(f"{'check':<52} {'target':<15} {'measured':<s}")
        for name in names:
            for check, target, measured, met in CHECKS[name](run):
                verdict = "" if not target else ("  met" if met else "  NOT MET")
                print(f"{check:<52} {target:<15} {measured}{verdict}", flush=True)
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
