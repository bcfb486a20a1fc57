"""The steady-state harness (`prefetch.tools.bench.measure_row`) and the benchmark scripts
that publish rates through it: each script's smallest configuration runs end to end and
prints its rows."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from prefetch.decode import DecodeOptions, decode_image
from prefetch.sources import ImageFolder
from prefetch.tools import bench
from prefetch.tools.bench import (
    RowFailed,
    RowResult,
    Setup,
    Span,
    alternated,
    measure_rounds,
    measure_row,
    median_range,
)

ROOT = Path(__file__).resolve().parents[1]


class Fours:
    """A contender whose every batch holds 4 images, named by its row's key."""

    def __init__(self, key: str) -> None:
        self.key = key

    def open(self, stack: contextlib.ExitStack) -> None:
        pass

    def stream(self) -> Generator[int, None, None]:
        while True:
            yield 4

    def describe(self) -> dict[str, Any]:
        return {"note": f"row {self.key}"}


def make_fours(key: str, setup: Setup) -> Fours:
    return Fours(key)


def test_a_scripts_own_contender_is_measured_over_the_warm_up_and_the_timed_span(
    tmp_path: Path,
) -> None:
    folder = ImageFolder(bench.write_sample_folder(tmp_path / "images", 4, size=(40, 30)))
    setup = Setup(folder, DecodeOptions((16, 16)), 4, 1, 2, 0, decode_image)
    ticks: list[None] = []

    result = measure_row(
        "x", setup, Span(8, 16), 0.0, lambda: ticks.append(None), isolate=False, make=make_fours
    )

    assert len(ticks) == 2 + 4  # every batch of the warm-up and of the timed span
    assert result.described == {"note": "row x"}
    assert result.images_per_s > 0 and result.cold_images_per_s > 0
    assert result.wait_fraction is None  # no step simulated


def test_rounds_alternate_the_rows_and_a_failed_row_is_left_out_of_later_rounds() -> None:
    order: list[tuple[int, str]] = []
    count = 0

    def measure(key: str) -> RowResult:
        nonlocal count
        count += 1
        if key == "b" and count > 3:  # b fails in round 2
            raise RowFailed("ValueError: broken")
        return RowResult(float(count), None, 1.0, {})

    results, failed = measure_rounds(
        ["a", "b", "c"], 3, measure, lambda number, key, _: order.append((number, key))
    )

    assert order == [(1, "a"), (1, "b"), (1, "c"), (2, "c"), (2, "b"), (2, "a"), (3, "a"), (3, "c")]
    assert failed == {"b": "failed in round 2: ValueError: broken"}
    assert [r.images_per_s for r in results["b"]] == [2.0]
    assert len(results["a"]) == len(results["c"]) == 3
    assert alternated(["a", "b"], 0) == ["a", "b"] and alternated(["a", "b"], 1) == ["b", "a"]


def test_a_rows_rounds_print_as_their_median_and_range() -> None:
    assert median_range([3.0, 1.0, 2.0]) == "2 (1-3)"
    assert median_range([1.234], 2) == "1.23"


def run_script(name: str, args: list[str], tmp_path: Path, timeout: float) -> str:
    """Run benchmarks/`name` with this checkout's prefetch; its temporary files in tmp_path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


SMALLEST = ["--images", "64", "--rounds", "1", "--warmup-epochs", "1", "--epochs", "1"]


# Two spawned rows (no TensorFlow) of one 64-image batch each: a few seconds on 2 cores.
@pytest.mark.timeout(120)
def test_targets_smallest_run_prints_its_overlap_rows(tmp_path: Path) -> None:
    out = run_script("targets.py", [*SMALLEST, "--only", "overlap,handoff"], tmp_path, 110)

    lines = out.splitlines()
    assert any(line.startswith("overlap: timed span / (C x batches)") for line in lines)
    assert any(line.startswith("overlap: consumer wait at steady state") for line in lines)
    assert any("needs 2 batches an epoch: --images >= 128" in line for line in lines)
    assert "1 epoch(s) untimed, then 1 timed" in out


# Two rows, each a spawned process that imports TensorFlow (5-20 s each on a busy 2-core VM).
@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_keras_dropin_smallest_run_prints_its_rows_and_the_ratio(tmp_path: Path) -> None:
    pytest.importorskip("keras")
    args = [*SMALLEST, "--repeats", "1", "--rows", "keras,with"]
    out = run_script("keras_dropin.py", args, tmp_path, 230)

    lines = [line.strip() for line in out.splitlines()]
    assert any(line.startswith("Keras-parity numpy resize") for line in lines)
    assert any(line.startswith("keras.utils.image_dataset_from_directory") for line in lines)
    assert any(line.startswith("the same, inside `with ds.loader:`") for line in lines)
    assert any(line.startswith("drop-in / Keras, inside `with ds.loader:`:") for line in lines)
    assert "failed" not in out
