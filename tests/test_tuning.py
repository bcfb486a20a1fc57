"""prefetch.tools.tune.tune and `prefetch tune`: real trials on a small folder; no timing
asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prefetch.testing import write_image_folder
from prefetch.tools.tune import Trial, TuneReport, _tune, tune


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("tune"), per_class=12, size=(48, 48))


def test_tune_measures_configurations_and_recommends_one_it_measured(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The noise rules (load above the cores, rounds spread apart) are tested on their own;
    # here a quiet machine is given, so that the recommendation does not depend on the load.
    monkeypatch.setattr(_tune, "load_average", lambda: 0.0)
    report = tune(
        folder,
        max_spread=math.inf,
        step_ms=5,
        batch_size=4,
        image_size=(16, 16),
        backends=("thread",),
        depths=(1, 2),
        max_workers=3,
        trial_batches=4,
    )
    assert report.trials
    assert {t.depth for t in report.trials} == {1, 2}
    for trial in report.trials:
        assert trial.backend == "thread"
        assert 1 <= trial.workers <= 3
        assert trial.images_per_s > 0
        assert 0 <= trial.consumer_wait_fraction <= 1
    assert report.recommended in report.trials
    table = report.format_table()
    assert "recommended: Loader(..., backend='thread'" in table
    json.dumps(report.as_dict())


def test_the_recommendation_is_the_smallest_within_tolerance_of_the_best() -> None:
    report = TuneReport("root", 10.0, 32, (224, 224), 0.05)
    report.trials.extend(
        [
            Trial("thread", 1, 2, 500.0, 0.30),
            Trial("thread", 2, 2, 980.0, 0.02),
            Trial("thread", 3, 2, 1000.0, 0.00),
            Trial("process", 2, 2, 990.0, 0.00),
            Trial("thread", 2, 1, 960.0, 0.03),
        ]
    )
    assert report.best == Trial("thread", 3, 2, 1000.0, 0.00)
    assert report.recommended == Trial("thread", 2, 1, 960.0, 0.03)
    assert report.step_ceiling == pytest.approx(3200.0)


def test_bad_arguments_name_the_argument(folder: Path) -> None:
    with pytest.raises(ValueError, match="step_ms"):
        tune(folder, step_ms=-1)
    with pytest.raises(ValueError, match="fewer than 2 batches"):
        tune(folder, step_ms=1, batch_size=64)


def test_the_tune_command_prints_the_table_and_writes_json(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "tune.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefetch",
            "tune",
            str(folder),
            "--step-ms",
            "2",
            "--batch-size",
            "4",
            "--image-size",
            "16",
            "--backends",
            "thread",
            "--depths",
            "2",
            "--max-workers",
            "2",
            "--trial-batches",
            "3",
            "--max-spread",
            "inf",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["candidate"]["backend"] == "thread"
    assert data["trials"]
    # A child process cannot be given a quiet machine: on a loaded one (load average above
    # the cores) the command still answers, and says the answer is uncertain and why.
    assert data["recommended"] == data["candidate"]
    if data["uncertain"]:
        assert "best answer, uncertain: Loader(" in done.stdout and "load" in done.stdout
        assert "to sharpen it:" in done.stdout
    else:
        assert "recommended: Loader(" in done.stdout


def test_the_tune_command_refuses_an_unknown_backend(folder: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefetch",
            "tune",
            str(folder),
            "--step-ms",
            "1",
            "--backends",
            "gpu",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--backends" in done.stderr


def test_the_tune_command_says_where_it_wrote_its_plot_and_report(
    folder: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    plot, report = tmp_path / "tune.png", tmp_path / "tune.json"
    done = subprocess.run(
        [sys.executable, "-m", "prefetch", "tune", str(folder), "--step-ms", "2",
         "--batch-size", "4", "--image-size", "16", "--backends", "thread", "--depths", "2",
         "--max-workers", "1", "--trial-batches", "2", "--repeats", "1", "--max-spread", "inf",
         "--plot", str(plot), "--json", str(report), "--quiet"],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert plot.stat().st_size > 0 and report.stat().st_size > 0
    assert f"wrote the report to {report} and the plot to {plot}" in done.stdout
