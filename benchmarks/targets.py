"""Benchmark: the performance targets that are not a loader race (prefetch bench does that).

Each row prints the target, the measured figure and whether it was met, on ImageNet-sized JPEGs
(500x375) decoded to 224x224, batches of 64, in one run:

  python-transform  a transform holding the GIL ~2 ms per image: process backend vs one worker,
                    and vs tf.data running the same transform in tf.py_function (AUTOTUNE)
  overlap           consumer step C = 1.2 x producer time P per batch: epoch time vs C x batches,
                    consumer wait after the first batch
  handoff           process backend: time for next() to return a batch that is already decoded
  first-batch       process backend in a process that imported TensorFlow: start to first batch
  memory            resident memory of the process tree after each of 10 epochs (growth)

    python benchmarks/targets.py [--images 512] [--only overlap,handoff]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil

import prefetch
from prefetch.testing import GilHoldingTransform
from prefetch.tools.bench import write_sample_folder

IMAGE_SIZE = (224, 224)
BATCH = 64
TRANSFORM_S = 0.002
CORES = len(os.sched_getaffinity(0))


def epoch_rate(loader: prefetch.Loader, epochs: int = 2) -> float:
    """Images/s over `epochs` epochs after one warm-up epoch, in a `with` block."""
    with loader:
        for _ in loader:
            pass
        began = time.perf_counter()
        images = sum(len(b.images) for _ in range(epochs) for b in loader)
    return images / (time.perf_counter() - began)


def tf_py_function_rate(folder: str, epochs: int = 2) -> float:
    """tf.data AUTOTUNE: read, decode, resize, the same transform in py_function, batch."""
    import tensorflow as tf

    transform = GilHoldingTransform(TRANSFORM_S)
    rng = np.random.default_rng(0)

    def python_part(image: tf.Tensor) -> np.ndarray:
        return transform(image.numpy(), rng)

    def load(path: tf.Tensor) -> tf.Tensor:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        image = tf.cast(tf.image.resize(image, IMAGE_SIZE), tf.uint8)
        image = tf.py_function(python_part, [image], tf.uint8)
        image.set_shape((*IMAGE_SIZE, 3))
        return image

    paths = [str(p) for p in prefetch.ImageFolder(folder).paths]
    data = tf.data.Dataset.from_tensor_slices(paths).map(load, num_parallel_calls=tf.data.AUTOTUNE)
    data = data.batch(BATCH).prefetch(tf.data.AUTOTUNE)
    for _ in data:
        pass
    began = time.perf_counter()
    images = sum(int(b.shape[0]) for _ in range(epochs) for b in data)
    return images / (time.perf_counter() - began)


def python_transform(folder: str) -> list[tuple[str, str, str, bool]]:
    transform = GilHoldingTransform(TRANSFORM_S)

    def loader(backend: str, workers: int) -> prefetch.Loader:
        return prefetch.Loader(
            folder,
            batch_size=BATCH,
            image_size=IMAGE_SIZE,
            backend=backend,
            workers=workers,
            augment=prefetch.Augment(transform=transform),
            depth=max(2, workers),
            seed=0,
        )

    single = epoch_rate(loader("thread", 1))
    threads = epoch_rate(loader("thread", CORES))
    processes = epoch_rate(loader("process", CORES))
    tf_rate = tf_py_function_rate(folder)
    return [
        ("python transform: 1 worker", "", f"{single:.0f} img/s", True),
        ("python transform: threads", "", f"{threads:.0f} img/s ({threads / single:.2f}x)", True),
        (
            "python transform: processes vs 1 worker",
            ">= 1.8x",
            f"{processes:.0f} img/s ({processes / single:.2f}x)",
            processes / single >= 1.8,
        ),
        (
            "python transform: processes vs tf.data py_function",
            ">= 1.7x",
            f"tf.data {tf_rate:.0f} img/s ({processes / tf_rate:.2f}x)",
            processes / tf_rate >= 1.7,
        ),
    ]


def overlap(folder: str) -> list[tuple[str, str, str, bool]]:
    loader = prefetch.Loader(folder, batch_size=BATCH, image_size=IMAGE_SIZE, seed=0)
    producer_s = BATCH / epoch_rate(loader)  # P: the loader's time per batch, nothing else running
    step_s = 1.2 * producer_s
    waits = []
    with loader:
        batches = len(loader)
        began = time.perf_counter()
        asked = began
        for batch in loader:
            waits.append(time.perf_counter() - asked)
            del batch
            time.sleep(step_s)
            asked = time.perf_counter()
        epoch_s = time.perf_counter() - began
    ideal = step_s * batches
    wait_after_first = sum(waits[1:]) / (epoch_s - waits[0])
    return [
        (
            "overlap: epoch time / (C x batches), C = 1.2 P",
            "<= 1.05",
            f"{epoch_s / ideal:.3f} (P {1000 * producer_s:.0f} ms, C {1000 * step_s:.0f} ms, "
            f"{batches} batches)",
            epoch_s / ideal <= 1.05,
        ),
        (
            "overlap: consumer wait after the first batch",
            "< 3%",
            f"{wait_after_first:.1%}",
            wait_after_first < 0.03,
        ),
    ]


def handoff(folder: str) -> list[tuple[str, str, str, bool]]:
    loader = prefetch.Loader(
        folder, batch_size=BATCH, image_size=IMAGE_SIZE, backend="process", workers=CORES, seed=0
    )
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


def first_batch(folder: str) -> list[tuple[str, str, str, bool]]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "first_batch.py"
        script.write_text(FIRST_BATCH_SCRIPT)
        runs = []
        for _ in range(3):
            done = subprocess.run(
                [sys.executable, str(script), folder], capture_output=True, text=True, check=True
            )
            runs.append(float(done.stdout.split()[-1]))
    median = statistics.median(runs)
    return [
        (
            "first batch with spawned workers (TF imported)",
            "< 1.5 s",
            f"{median:.2f} s (median of 3: {', '.join(f'{r:.2f}' for r in runs)})",
            median < 1.5,
        )
    ]


def tree_rss() -> int:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])


def memory(folder: str) -> list[tuple[str, str, str, bool]]:
    rows = []
    for backend in ("thread", "process"):
        loader = prefetch.Loader(
            folder, batch_size=BATCH, image_size=IMAGE_SIZE, backend=backend, seed=0
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
                f"memory, {backend}s: RSS growth epochs 3 -> 10",
                "flat (< 5 MiB)",
                f"{growth:+.1f} MiB (epoch 3: {samples[2] / 2**20:.0f} MiB)",
                abs(growth) < 5,
            )
        )
    return rows


CHECKS: dict[str, Callable[[str], list[tuple[str, str, str, bool]]]] = {
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
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(write_sample_folder(Path(tmp) / "photos", args.images))
        print(f"{CORES} cores; {args.images} JPEGs 500x375 -> 224x224; batch {BATCH}\n")
        print(f"{'check':<52} {'target':<15} {'measured':<s}")
        for name in args.only.split(","):
            for check, target, measured, met in CHECKS[name.strip()](folder):
                verdict = "" if not target else ("  met" if met else "  NOT MET")
                print(f"{check:<52} {target:<15} {measured}{verdict}", flush=True)


if __name__ == "__main__":
    main()
