"""What the package prints for a user: the `prefetch` command's options, version and output as
it is measured, and the statistics line of `loader.stats()`.

Measurements run on a tiny generated folder with one or two rounds; no timing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

import prefetch
from prefetch.cli import build_parser, main
from prefetch.runtime._stats import LoaderStats
from prefetch.tools import bench, tune

pytestmark = pytest.mark.timeout(60)

TINY = ["--batch-size", "4", "--image-size", "16", "--decode-sample", "8", "--workers", "2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 small JPEGs in 2 classes: 4 batches of 4."""
    return bench.write_sample_folder(tmp_path_factory.mktemp("cli") / "images", 16, size=(40, 30))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options (not its positionals), less --help and --version."""
    return [
        action
        for action in parser._actions
        if action.option_strings
        and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
    ]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands' parsers by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])

    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"prefetch {prefetch.__version__}"


def test_every_option_has_a_help_text_that_states_its_default() -> None:
    commands = subparsers(build_parser())
    assert set(commands) == {"bench", "tune", "shards"}
    for name, parser in commands.items():
        for action in options(parser):
            flag = f"prefetch {name} {action.option_strings[0]}"
            assert action.help, flag
            if isinstance(action, argparse._StoreTrueAction):
                continue  # a switch: off unless given
            assert "default" in action.help, flag
            if isinstance(action.default, int) and not isinstance(action.default, bool):
                assert str(action.default) in action.help, flag


def test_tune_without_a_step_measures_the_loader_alone_and_says_how_to_measure_a_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = bench.write_sample_folder(tmp_path / "images", 12, size=(40, 30))
    args = ["tune", str(root), "--batch-size", "4", "--image-size", "16", "--backends", "thread"]
    args += ["--depths", "1", "--max-workers", "1", "--trial-batches", "2", "--repeats", "1"]

    assert main(args) == 0

    out, err = capsys.readouterr()
    assert "no --step-ms: measuring the loader alone" in err
    assert "model.train_on_batch" in err
    assert "no training step (the loader alone)" in out
    assert "measured without a training step" in out and "model.train_on_batch" in out


def test_bench_prints_each_round_as_measured_when_stdout_is_not_a_terminal(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(folder), "--loaders", "loop,threads", "--repeats", "2", *TINY]

    assert main(args) == 0  # captured: stdout is not a terminal

    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("round ")]
    decoders = len(bench.available_decoders())
    floor = 0 if bench.entropy_decoder() is None else 1
    assert len(rows) == 2 * (decoders + floor + 2)  # two rounds of every decoder and loader
    assert rows[0].startswith("round 1/2: decode ")
    assert any(row.startswith("round 2/2: prefetch threads") and "images/s" in row for row in rows)
    table = lines.index(next(line for line in lines if line.startswith("prefetch bench: ")))
    assert lines.index(rows[-1]) < table  # the rows come first, the table after them


def test_bench_quiet_prints_the_table_only(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(folder), "--loaders", "loop", "--repeats", "1", "--quiet", *TINY]

    assert main(args) == 0

    out, err = capsys.readouterr()
    assert out.startswith("prefetch bench: ")
    assert not any(line.startswith("round ") for line in out.splitlines())
    assert err == ""


def test_each_round_is_passed_on_right_after_it_is_measured(folder: Path) -> None:
    events: list[tuple[str, object]] = []
    report = bench.run(
        folder,
        loaders=["loop", "threads"],
        repeats=2,
        batch_size=4,
        image_size=(16, 16),
        decode_sample=8,
        workers=2,
        progress=lambda done, total, label: events.append(("tick", label)),
        on_measured=lambda measurement: events.append(("row", measurement)),
    )

    rows = [(index, row) for index, (kind, row) in enumerate(events) if kind == "row"]
    assert len(rows) == 2 * (len(report.decoders) + (report.floor is not None) + 2)
    for index, row in rows:
        assert isinstance(row, bench.Measurement)
        kind, label = events[index - 1]
        # Passed on after the last batch of its own measurement, before anything else runs.
        assert kind == "tick" and row.text().startswith(str(label)), (label, row)
    measured = [row for _, row in rows if isinstance(row, bench.Measurement)]
    for result in report.loaders:
        mine = [m for m in measured if m.key == result.key]
        assert [m.round for m in mine] == [1, 2]
        assert tuple(m.images_per_s for m in mine) == result.images_per_s_runs
        assert all(m.wait_fraction is None for m in mine)  # no step: no wait to report
        assert result.wait_fraction_runs == ()
    for rate in report.decoders:
        mine = [m for m in measured if m.key == rate.name]
        assert tuple(m.images_per_s for m in mine) == rate.runs
        assert all(m.wait_fraction is None for m in mine)


def test_tune_rounds_every_configuration_and_keeps_each_rounds_figures(folder: Path) -> None:
    report = tune.tune(
        folder,
        step_ms=1,
        batch_size=4,
        image_size=(16, 16),
        backends=("thread",),
        depths=(1,),
        max_workers=2,
        trial_batches=2,
        repeats=2,
    )

    assert report.repeats == 2 and report.images == 16
    for trial in report.trials:
        assert len(trial.images_per_s_runs) == len(trial.wait_fraction_runs) == 2
        low, high = sorted(trial.images_per_s_runs)
        assert trial.images_per_s == pytest.approx((low + high) / 2)  # the median of two
        assert trial.spread == pytest.approx((high - low) / trial.images_per_s)
    table = report.format_table()
    assert "2 round(s)" in table and "spread" in table
    assert ("recommended: Loader(" in table) == (not report.uncertain)
    assert ("best answer, uncertain: Loader(" in table) == bool(report.noise)


STATS = LoaderStats(
    backend="thread",
    workers=4,
    depth=2,
    epochs=1,
    batches=20,
    images=600,
    elapsed_s=0.07,
    images_per_s=8571.0,
    consumer_wait_s=0.07,
    consumer_wait_fraction=0.998,
    producer_busy_s=0.252,
    mean_ready_batches=1.9,
    skipped=0,
    skipped_paths=(),
    decoder="turbo",
    read_p50_s=0.0003,
    read_p99_s=0.0018,
    in_flight=2,
)


def test_the_statistics_line_says_what_each_figure_means() -> None:
    text = str(STATS)

    assert "600 images in 20 batches, 8571 images/s" in text
    assert "the consumer waited 0.07 s for batches (99.8% of the time)" in text
    assert "thread backend, turbo decoder, 4 workers busy 90% of the time" in text
    assert "when a batch was asked for, 1.9 of the 2 in flight were ready (average)" in text
    assert "typically 0.3 ms (p50), 1 in 100 over 1.8 ms (p99)" in text
    assert text.endswith("0 samples skipped")
    assert " s busy" not in text and "/2 batches" not in text  # the old, puzzling words


def test_reader_threads_read_many_samples_at_once_and_say_so_in_samples_not_seconds() -> None:
    # 4 worker processes with reader threads on remote storage: 506 s of reading in 10 s.
    remote = dataclasses.replace(
        STATS, backend="process", elapsed_s=10.0, producer_busy_s=506.18, in_flight=8
    )

    text = str(remote)

    assert "4 workers with 50.6 samples being read at once on average" in text
    assert "506" not in text
    assert "of the 8 in flight" in text
