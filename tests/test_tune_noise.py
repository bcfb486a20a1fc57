"""prefetch tune on a noisy machine: rounds, their spread, and an uncertain best answer from noise.

The judgement is tested on reports built by hand (figures chosen, no timing); the command
and the load reading run real trials on a tiny folder, with the load average replaced where
the outcome must not depend on this machine's load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from prefetch.cli import main
from prefetch.testing import write_image_folder
from prefetch.tools.tune import Trial, TuneReport, _tune, tune

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("tune"), per_class=4, size=(32, 32))


def trial(workers: int, *rates: float, backend: str = "thread", depth: int = 2) -> Trial:
    """A trial measured in len(rates) rounds (median of the rounds, as `tune` reports it)."""
    ordered = sorted(rates)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else sum(ordered[-2:]) / 2
    return Trial(backend, workers, depth, median, 0.5, tuple(rates), (0.5,) * len(rates))


def report(*trials: Trial, load: float | None = 0.5, **settings: float) -> TuneReport:
    """A report of `trials` in 3 rounds on a 2-core machine with load average `load`."""
    return TuneReport(
        "root",
        100.0,
        32,
        (224, 224),
        settings.get("tolerance", 0.05),
        list(trials),
        repeats=3,
        usable_cores=2,
        load_average=load,
        max_spread=settings.get("max_spread"),
    )


def test_steady_rounds_on_a_quiet_machine_recommend_the_smallest_near_the_best() -> None:
    steady = report(trial(1, 500, 510, 505), trial(2, 980, 1000, 990), trial(3, 1000, 1010, 1005))

    assert steady.noise == []
    assert steady.recommended == steady.candidate == steady.trials[1]
    assert steady.trials[1].spread == pytest.approx(20 / 990)
    table = steady.format_table()
    assert "recommended: Loader(..., backend='thread', workers=2, depth=2)" in table
    assert "980-1000" in table and "2%" in table  # each configuration's rounds and spread


def test_the_issues_420_and_231_images_per_s_give_an_uncertain_best_answer() -> None:
    noisy = report(trial(1, 420, 231, 400), trial(2, 410, 300, 415))

    assert noisy.uncertain
    assert noisy.recommended == noisy.candidate == noisy.trials[0]  # the best answer there is
    assert noisy.alternatives == [noisy.trials[1]]  # what the data cannot tell it from
    [reason] = noisy.noise
    assert "varied by more than 10% between rounds" in reason
    assert "thread, 1 worker, depth 2 gave 231 to 420 images/s (47%)" in reason
    table = noisy.format_table()
    assert (
        "best answer, uncertain: Loader(..., backend='thread', workers=1, depth=2): "
        "400 images/s (rounds 231-420)" in table
    )
    assert "the data cannot tell it from: thread, 2 workers, depth 2 (300-415 images/s)" in table
    assert "to sharpen it: --repeats 5" in table and "--trial-batches 48" in table
    assert "<- best answer (uncertain)" in table and "recommended: Loader(" not in table
    data = json.loads(json.dumps(noisy.as_dict()))
    assert data["recommended"] == data["candidate"] and data["uncertain"] is True
    assert data["noise"] == noisy.noise and data["candidate"]["workers"] == 1
    assert [t["workers"] for t in data["alternatives"]] == [2]
    assert [row["spread"] for row in data["trials"]] == [t.spread for t in noisy.trials]


def test_noise_in_a_configuration_that_cannot_be_chosen_does_not_block_the_choice() -> None:
    # One worker is far below the best in every round: its noise cannot change the choice.
    mixed = report(trial(1, 300, 500, 400), trial(2, 990, 1000, 995), trial(3, 1000, 1005, 1002))

    assert mixed.trials[0].spread > mixed.spread_limit
    assert mixed.noisy_trials == []
    assert mixed.recommended == mixed.trials[1] and not mixed.uncertain


def test_a_round_within_the_tolerance_makes_a_noisy_configuration_count() -> None:
    # Its median is out of the tolerance, one round is in it: it might be the smaller choice.
    close = report(trial(1, 800, 960, 900), trial(2, 995, 1000, 1000))

    assert close.noisy_trials == [close.trials[0]]
    assert close.uncertain


def test_a_load_above_the_usable_cores_is_noise_even_when_the_rounds_agree() -> None:
    busy = report(trial(1, 500, 505, 502), trial(2, 990, 1000, 995), load=3.4)

    assert busy.busy and busy.uncertain and busy.recommended == busy.trials[1]
    [reason] = busy.noise
    assert "load average 3.4" in reason and "above its 2 usable cores" in reason
    table = busy.format_table()
    assert "load average 3.4 before the search" in table
    assert "to sharpen it: run it when the load average is at most 2 (it was 3.4)" in table
    at_the_cores = report(trial(1, 500, 505, 502), trial(2, 990, 1000, 995), load=2.0)
    assert not at_the_cores.busy and not at_the_cores.uncertain
    unknown = report(trial(2, 990, 1000, 995), load=None)
    assert not unknown.busy and "load average unknown" in unknown.format_table()


def test_the_spread_limit_follows_the_tolerance_unless_given() -> None:
    rounds = (trial(1, 900, 1000, 950), trial(2, 940, 1000, 990))  # spreads 11% and 6%

    assert report(*rounds).spread_limit == pytest.approx(2 * 0.05)
    assert report(*rounds).uncertain
    loose = report(*rounds, tolerance=0.1)
    assert loose.spread_limit == pytest.approx(0.2) and not loose.uncertain
    assert not report(*rounds, max_spread=math.inf).uncertain
    assert report(*rounds, max_spread=0.01).spread_limit == 0.01


def test_a_hand_built_report_of_single_measurements_still_recommends() -> None:
    # Trials without rounds (as older callers build them) have no spread to judge.
    single = TuneReport("root", 10.0, 32, (224, 224), 0.05, [Trial("thread", 1, 2, 100.0, 0.0)])

    assert single.trials[0].spread == 0.0 and single.noise == []
    assert single.recommended == single.trials[0]
    assert "one round: the spread between rounds is unknown" in single.format_table()


def test_the_load_average_is_read_before_the_first_trial(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trials_run: list[str] = []
    real_trial = _tune._trial

    def counted(*args: object) -> tuple[float, float]:
        trials_run.append("trial")
        return real_trial(*args)  # type: ignore[arg-type]

    def load() -> float:
        assert trials_run == []  # other jobs' load, not the trials' own
        return 99.0

    monkeypatch.setattr(_tune, "load_average", load)
    monkeypatch.setattr(_tune, "_trial", counted)
    busy = tune(
        folder, step_ms=1, batch_size=4, image_size=(16, 16), backends=("thread",), depths=(1,),
        max_workers=1, trial_batches=1, repeats=2,
    )  # fmt: skip

    assert trials_run == ["trial", "trial"]  # one configuration, two rounds
    assert busy.load_average == 99.0 and busy.busy and busy.uncertain


def test_the_command_gives_its_best_answer_and_its_uncertainty_on_a_busy_machine(
    folder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(_tune, "load_average", lambda: 99.0)
    out = tmp_path / "tune.json"
    args = ["tune", str(folder), "--step-ms", "1", "--batch-size", "4", "--image-size", "16"]
    args += ["--backends", "thread", "--depths", "1", "--max-workers", "1"]
    args += ["--trial-batches", "1", "--repeats", "2", "--json", str(out), "--quiet"]

    assert main(args) == 0

    text = capsys.readouterr().out
    assert "best answer, uncertain: Loader(..., backend='thread', workers=1, depth=1)" in text
    assert "the machine was busy: load average 99.0" in text
    assert "to sharpen it: run it when the load average is at most" in text
    data = json.loads(out.read_text())
    assert data["uncertain"] is True and data["recommended"]["backend"] == "thread"
    assert data["repeats"] == 2 and len(data["trials"][0]["images_per_s_runs"]) == 2


def test_bad_rounds_and_spreads_name_the_argument(folder: Path) -> None:
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        tune(folder, repeats=0)
    with pytest.raises(ValueError, match="max_spread must be > 0"):
        tune(folder, max_spread=0)
    with pytest.raises(ValueError, match="trial_batches must be an int >= 1, got 0"):
        tune(folder, trial_batches=0)


def test_the_chart_has_whole_worker_ticks_error_bars_and_says_when_its_star_is_uncertain() -> None:
    pytest.importorskip("matplotlib")
    steady = report(trial(1, 500, 510, 505), trial(2, 980, 1000, 990), trial(3, 1000, 1010, 1005))
    noisy = report(trial(1, 420, 231, 400), trial(2, 410, 300, 415))

    axes = steady.figure().axes[0]
    assert list(axes.get_xticks()) == [1, 2, 3]
    assert "recommended" in axes.get_legend_handles_labels()[1]
    assert "step ceiling 320/s" in axes.get_legend_handles_labels()[1]  # 32 per 100 ms
    noisy_axes = noisy.figure().axes[0]
    assert list(noisy_axes.get_xticks()) == [1, 2]
    assert "best answer (uncertain)" in noisy_axes.get_legend_handles_labels()[1]
    assert "uncertain: noise could decide it" in noisy_axes.get_title()


def test_the_chart_keeps_every_series_visible() -> None:
    pytest.importorskip("matplotlib")
    # Six series with the same figures: each must still be seen (no line hides another).
    same = [
        Trial(backend, workers, depth, 500.0 * workers, 0.0, (500.0 * workers,) * 3)
        for backend in ("thread", "process")
        for depth in (1, 2, 4)
        for workers in (1, 2)
    ]
    axes = report(*same).figure().axes[0]

    series = {bars.get_label(): bars.lines[0] for bars in axes.containers}  # errorbar's lines
    assert len(series) == 6
    assert len({tuple(line.get_xdata()) for line in series.values()}) == 6  # each shifted
    styles = {
        (line.get_linestyle(), line.get_marker(), line.get_color()) for line in series.values()
    }
    assert len(styles) == 6
    assert {series[f"process, depth {d}"].get_linestyle() for d in (1, 2, 4)} == {"--"}


def test_a_step_ceiling_far_above_the_data_is_named_not_drawn_off_the_axis() -> None:
    pytest.importorskip("matplotlib")
    fast_step = report(trial(1, 500, 510, 505), trial(2, 980, 1000, 990))
    fast_step = TuneReport(**{**fast_step.__dict__, "step_ms": 1.0})  # ceiling 32,000/s

    axes = fast_step.figure().axes[0]

    assert not any("step ceiling" in label for label in axes.get_legend_handles_labels()[1])
    assert "step ceiling 32000/s is far above" in axes.get_xlabel()
    assert axes.get_ylim()[1] < 2 * 1000
