"""The steady-state harness (`prefetch.tools.bench.measure_row`) and the benchmark scripts
that publish rates through it: each script's smallest configuration runs end to end and
prints its rows; docs/performance.md lists every program in benchmarks/, and no page names one
that is gone (a retired one is in benchmarks/results/README.md, with the commit that has it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Generator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest

from prefetch.decode import DecodeOptions, decode_image
from prefetch.sources import ImageFolder
from prefetch.testing import write_image_folder
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


# Five cells (prefetch and the DataLoader on the training crop and on 2 ranks, prefetch on
# fit-crop shards), each in spawned processes that import torch: 30-90 s on a busy 2-core VM.
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_current_smallest_run_prints_the_pages_table_and_draws_its_chart(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    photos = write_image_folder(tmp_path / "photos", per_class=4, size=(96, 72))
    large = write_image_folder(tmp_path / "large", per_class=2, size=(640, 480))
    chart, report = tmp_path / "current.png", tmp_path / "current.json"
    args = ["--photos", str(photos), "--large", str(large), "--rows", "train,fit-crop,ranks"]
    args += ["--loaders", "prefetch,DataLoader", "--rounds", "1", "--warmup-epochs", "1"]
    args += ["--epochs", "1", "--floor-passes", "1", "--markdown", "--plot", str(chart)]
    out = run_script("current.py", [*args, "--json", str(report)], tmp_path, 290)

    lines = {
        (line["row"], line["loader"]): line for line in json.loads(report.read_text())["lines"]
    }
    assert list(lines) == [
        ("training crop", "prefetch"),
        ("training crop", "DataLoader"),
        ("fit-crop shards of the 2 MP photos", "prefetch"),
        ("2 ranks, training crop", "prefetch"),
        ("2 ranks, training crop", "DataLoader"),
    ]
    assert all(line["images/s"] != "failed" for line in lines.values())
    assert lines[("training crop", "prefetch")]["vs DataLoader"].endswith("x")
    assert lines[("training crop", "DataLoader")]["vs DataLoader"] == "1.00x"
    assert lines[("training crop", "prefetch")]["wait"].endswith("%")  # the 14 ms step
    assert float(lines[("2 ranks, training crop", "prefetch")]["CPU ms/image"]) > 0
    header = "| row | loader | images/s | vs tf.data | vs DataLoader | wait | CPU ms/image |"
    assert header + " of floor |" in out
    assert "Command: `python benchmarks/current.py --photos" in out
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_the_performance_page_lists_every_benchmark_and_the_docs_name_none_that_is_gone() -> None:
    programs = {path.name for path in (ROOT / "benchmarks").glob("*.py")}
    page = (ROOT / "docs" / "performance.md").read_text()
    section = page.split("## The benchmarks: one program per question", 1)[-1].split("\n## ")[0]
    listed = set(re.findall(r"`(?:benchmarks/)?([a-z_]+\.py)`", section))
    patterns = re.findall(r"`benchmarks/([a-z_]*\*[a-z_.*]*)`", section)  # benchmarks/ray_*.py
    unlisted = {p for p in programs - listed if not any(fnmatch(p, g) for g in patterns)}
    assert not unlisted, f"benchmarks not on docs/performance.md's list: {sorted(unlisted)}"
    assert listed <= programs, f"listed but not in benchmarks/: {sorted(listed - programs)}"

    index = (ROOT / "benchmarks" / "results" / "README.md").read_text()
    retired = set(re.findall(r"^\| `([a-z_]+\.py)` \|", index, re.MULTILINE))
    assert retired and not retired & programs
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        named = set(re.findall(r"benchmarks/([a-z_]+\.py)", doc.read_text()))
        unknown = named - programs - retired
        assert not unknown, f"{doc.relative_to(ROOT)} names {sorted(unknown)}: not in benchmarks/"
