"""prefetch bench: the Python API, the JSON report, the CLI, the progress bar and the timeline.

Measurements run on tiny generated folders with one round; timing values are only checked for
sanity (positive rates, wait fractions within 0..1), never for speed, nor for which of two
decoders came out faster.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefetch.cli import main
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.decode._turbo import fast_available
from prefetch.plan._crops import CenterCrop, RandomResizedCrop
from prefetch.runtime import usable_cores
from prefetch.testing import FailingDecoder, SlowDecoder, serve_folder
from prefetch.tools import bench
from prefetch.tools import timeline as tools_timeline
from prefetch.tools._command_args import ProgressBar
from prefetch.tools.bench import _loaders as bench_loaders
from prefetch.tools.bench import local_sample
from prefetch.tools.timeline import Timeline

pytestmark = pytest.mark.timeout(60)

TINY = {"batch_size": 4, "image_size": (16, 16), "repeats": 1, "decode_sample": 8, "workers": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 small JPEGs in 2 classes: 4 batches of 4."""
    return bench.write_sample_folder(tmp_path_factory.mktemp("bench") / "images", 16, size=(40, 30))


# Importing TensorFlow and Keras and spawning worker processes takes this test 5 s on a quiet
# 2-core machine and 22-34 s with four busy loops beside it: past the module's 60 s when CI
# runs several jobs at once.
@pytest.mark.timeout(240)
def test_run_measures_every_available_loader_with_sane_figures(folder: Path) -> None:
    calls: list[tuple[int, int, str]] = []
    report = bench.run(folder, progress=lambda *call: calls.append(call), **TINY)

    available = [key for key in bench.LOADER_NAMES if bench.missing_requirement(key) is None]
    assert [row.key for row in report.loaders] == available
    assert {"loop", "pool", "default", "threads", "processes"} <= set(available)
    assert set(report.skipped) == set(bench.LOADER_NAMES) - set(available)
    assert all("pip install" in reason for reason in report.skipped.values())
    assert report.config.images == 16 and report.config.classes == 2
    assert [rate.name for rate in report.decoders] == list(bench.available_decoders())
    assert all(rate.images_per_s > 0 for rate in report.decoders)
    best = max(report.decoders, key=lambda rate: rate.images_per_s)
    assert report.limit_decoder == best.name
    assert report.decode_limit == pytest.approx(best.images_per_s * usable_cores())
    # The rows decode with the Loader's default decoder, whichever decoder timed fastest.
    default = bench.decoder_name(bench.default_decoder(), {})
    assert report.config.loader_decoder == default in bench.available_decoders()
    for key in ("loop", "pool", "default", "threads", "processes"):
        assert report.loader(key).decoder == default, key
    assert report.loader("threads").backend == "thread"
    assert report.loader("processes").backend == "process"
    chosen = report.loader("default")
    assert chosen.backend in ("thread", "process") and chosen.backend_reason
    assert chosen.antialias == report.config.antialias
    table = report.format_table()
    assert f"prefetch default: {chosen.backend_reason}" in table
    assert f"{default}, {chosen.backend}" in table
    tf_rate = report.loader("tf.data").images_per_s if "tf.data" in available else None
    for row in report.loaders:
        assert row.images_per_s > 0 and row.cold_images_per_s > 0, row
        assert row.consumer_wait_fraction is None, row  # no step: no wait to speak of
        assert row.ratio_to_limit == pytest.approx(row.images_per_s / report.decode_limit)
        if tf_rate is None:
            assert row.ratio_to_tf_data is None
        else:
            assert row.ratio_to_tf_data == pytest.approx(row.images_per_s / tf_rate)
        if report.floor_limit is None:
            assert row.ratio_to_floor is None
        else:
            assert row.ratio_to_floor == pytest.approx(row.images_per_s / report.floor_limit)
        assert len(row.images_per_s_runs) == 1 and row.wait_fraction_runs == ()
    # Each row ran as a training job runs it: one epoch untimed, three timed, its own process.
    assert (report.config.warmup_images, report.config.timed_images) == (16, 48)
    assert report.config.isolated
    assert "one pipeline in a fresh process, 1 epoch untimed, then 3 epochs timed" in table
    assert "no wait column without a step" in table
    assert calls[-1] == (calls[-1][1], calls[-1][1], "done")
    assert [done for done, _, _ in calls] == sorted(done for done, _, _ in calls)


def test_every_registered_decoder_is_measured_and_the_best_sets_the_limit(folder: Path) -> None:
    decoders = {"pillow": decode_image, "slow": SlowDecoder(0.02)}
    report = bench.run(folder, loaders=["loop"], decoders=decoders, **TINY)

    assert [rate.name for rate in report.decoders] == ["pillow", "slow"]
    assert report.limit_decoder == "pillow"  # 20 ms per image against well under 1
    assert report.config.loader_decoder == bench.decoder_name(bench.default_decoder(), {})
    assert "slow" in report.format_table()
    explicit = bench.run(
        folder, loaders=["loop", "pool"], decoders=decoders, decoder=SlowDecoder(0), **TINY
    )
    assert explicit.config.loader_decoder == "SlowDecoder"
    assert [row.decoder for row in explicit.loaders] == ["SlowDecoder", "SlowDecoder"]
    assert bench.available_decoders()["pillow"] is decode_image


def test_json_report_follows_the_documented_schema(folder: Path, tmp_path: Path) -> None:
    report = bench.run(folder, loaders=["loop", "threads"], timeline_batches=2, **TINY)
    path = tmp_path / "report.json"
    report.to_json(path)
    data = json.loads(path.read_text())

    assert data["schema"] == bench.SCHEMA_VERSION == 3
    assert set(data) == {
        "schema", "config", "machine", "decoders", "decode_limit", "floor", "loaders",
        "skipped", "timeline", "fast_hint",
    }  # fmt: skip
    assert data["config"]["timed_images"] == 48 and data["config"]["isolated"] is True
    assert data["config"]["image_size"] == [16, 16] and data["config"]["batch_size"] == 4
    assert data["machine"]["usable_cores"] == usable_cores()
    assert data["decoders"][0]["name"] == "pillow" and len(data["decoders"][0]["runs"]) == 1
    assert data["decode_limit"]["decoder"] in bench.available_decoders()
    assert data["config"]["loader_decoder"] in bench.available_decoders()
    assert data["decode_limit"]["images_per_s"] == pytest.approx(report.decode_limit)
    keys = [row["key"] for row in data["loaders"]]
    assert keys == ["loop", "threads"]
    assert set(data["loaders"][0]) == {
        "key", "name", "images_per_s", "consumer_wait_fraction", "ratio_to_limit",
        "ratio_to_tf_data", "images_per_s_runs", "wait_fraction_runs", "decoder", "backend",
        "backend_reason", "antialias", "ratio_to_floor", "cold_images_per_s", "note",
    }  # fmt: skip
    if data["floor"] is not None:
        assert data["floor"]["images_per_s"] == pytest.approx(report.floor_limit)
    loop, threads = data["loaders"]
    assert loop["decoder"] == threads["decoder"] == data["config"]["loader_decoder"]
    assert (loop["backend"], threads["backend"]) == (None, "thread")
    assert data["skipped"] == {}
    assert data["fast_hint"] is None if fast_available() else data["fast_hint"]["speedup"] > 0
    spans = data["timeline"]
    assert {span["kind"] for span in spans} == {"decode", "produce", "wait", "step"}
    assert min(span["start_s"] for span in spans) == 0.0
    assert all(span["end_s"] >= span["start_s"] for span in spans)


def test_bad_arguments_name_the_problem_and_the_fix(folder: Path) -> None:
    with pytest.raises(ValueError, match=r"fewer than 2 batches of 16.*lower batch_size"):
        bench.run(folder, batch_size=16)
    with pytest.raises(ValueError, match=r"unknown loaders \['dali'\]"):
        bench.run(folder, loaders=["loop", "dali"])
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        bench.run(folder, repeats=0)
    with pytest.raises(ValueError, match="step_ms must be >= 0"):
        bench.run(folder, step_ms=-1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        bench.run(folder / "missing")


def test_write_sample_folder_writes_exactly_n_images_and_refuses_a_used_folder(
    tmp_path: Path,
) -> None:
    root = bench.write_sample_folder(tmp_path / "sample", 7, classes=3, size=(50, 20))
    files = sorted(root.rglob("*.jpg"))
    assert len(files) == 7 and len({f.parent for f in files}) == 3
    with pytest.raises(FileExistsError, match="not an empty folder"):
        bench.write_sample_folder(root, 4)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefetch", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_generates_a_sample_folder_benches_it_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = run_cli(
        str(tmp_path / "generated"),
        "--generate", "12",
        "--loaders", "loop,pool,default,threads",
        "--batch-size", "4", "--image-size", "16x24", "--repeats", "1", "--decode-sample", "4",
        "--json", str(out), "--timeline-text", "--timeline-batches", "2",
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("loader") and "images/s" in line and "vs tf.data" in line for line in lines
    )
    assert any(line.startswith("python loop (1 core)") for line in lines)
    assert any(line.startswith("prefetch threads") for line in lines)
    assert any(line.startswith("thread pool (15 lines)") for line in lines)
    assert any(line.startswith("prefetch default") and "images/s" not in line for line in lines)
    assert any(line.startswith("prefetch default: auto") for line in lines)  # why that backend
    assert any(line.startswith("decode limit") for line in lines)
    assert any(line.strip().startswith("consumer |") for line in lines)  # the text timeline
    assert "writing 12 sample JPEGs of 500x375" in result.stderr
    assert len(list((tmp_path / "generated").rglob("*.jpg"))) == 12
    data = json.loads(out.read_text())
    assert data["config"]["image_size"] == [16, 24]
    assert [row["key"] for row in data["loaders"]] == ["loop", "pool", "default", "threads"]
    assert all(row["decoder"] for row in data["loaders"])
    assert data["loaders"][2]["backend"] in ("thread", "process")


def test_thread_pool_batches_stacks_every_file_in_order_and_stops_early_cleanly(
    folder: Path,
) -> None:
    paths = sorted(str(path) for path in folder.rglob("*.jpg"))[:10]
    options = DecodeOptions((16, 16))

    def decode(path: str) -> np.ndarray:
        return decode_image(path, options)

    batches = list(bench.thread_pool_batches(paths, decode, 4, workers=2))
    loop = list(bench.python_loop_batches(paths, decode, 4))

    assert [len(batch) for batch in batches] == [len(batch) for batch in loop] == [4, 4, 2]
    for pooled, looped in zip(batches, loop, strict=True):
        np.testing.assert_array_equal(pooled, looped)
    before = threading.active_count()
    early = bench.thread_pool_batches(paths, decode, 4, workers=2)
    next(early)
    early.close()  # cancels the files not yet decoded; the pool's threads are joined
    assert threading.active_count() <= before


def test_pool_row_is_skipped_when_its_unbounded_read_ahead_would_not_fit(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_loaders, "available_memory_bytes", lambda: 1000)
    report = bench.run(folder, loaders=["loop", "pool"], step_ms=1, **TINY)

    assert [row.key for row in report.loaders] == ["loop"]
    wait = report.loader("loop").consumer_wait_fraction  # with a step, the wait is measured
    assert wait is not None and 0.0 <= wait <= 1.0
    assert "wait: share of the timed span the consumer waited" in report.format_table()
    assert "decodes ahead without bound" in report.skipped["pool"]
    assert "skipped thread pool (15 lines): its map decodes ahead" in report.format_table()


@pytest.fixture(scope="module")  # module scope: set up before each test's leak check
def fsspec_io_thread() -> None:
    """fsspec's HTTP filesystem runs on one daemon event-loop thread per process, started once
    and kept: start it before the leak check looks."""
    asyn = pytest.importorskip("fsspec.asyn", reason="the remote extra is not installed")
    asyn.get_loop()


def test_a_remote_decode_sample_is_copied_once_to_local_files(
    folder: Path, tmp_path: Path, fsspec_io_thread: None
) -> None:
    local = sorted(str(path) for path in folder.rglob("*.jpg"))[:5]
    assert local_sample(local, str(tmp_path)) == local  # local files stay where they are
    assert list(tmp_path.iterdir()) == []
    with serve_folder(folder) as base:
        urls = [base + Path(path).relative_to(folder).as_posix() for path in local]
        copies = local_sample(urls, str(tmp_path))
    assert [Path(copy).parent for copy in copies] == [tmp_path] * 5
    assert all(copy.endswith(".jpg") for copy in copies)  # decoders may go by the extension
    assert [Path(copy).read_bytes() for copy in copies] == [Path(p).read_bytes() for p in local]


@pytest.mark.timeout(240)  # imports TensorFlow (see the first test)
def test_bench_on_a_url_measures_prefetch_and_skips_what_tensorflow_cannot_read(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsspec_io_thread: None
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the sample is copied
    with serve_folder(folder) as base:
        report = bench.run(base, loaders=["loop", "default", "tf.data", "keras"], **TINY)

    assert [row.key for row in report.loaders] == ["loop", "default"]
    assert all(row.images_per_s > 0 for row in report.loaders)
    assert set(report.skipped) == {"tf.data", "keras"}
    for reason in report.skipped.values():  # TensorFlow has no http filesystem; or no TF here
        assert f"tf.io.gfile cannot read {base!r}" in reason or "pip install" in reason
    assert report.config.root == base and report.config.images == 16
    assert all(rate.images_per_s > 0 for rate in report.decoders)
    assert "(local copies of the sample)" in report.format_table()
    assert list(tmp_path.iterdir()) == []  # the copies are gone with the run


def test_fast_hint_scales_the_measured_pillow_rate_by_the_documented_ratio(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates = [bench.DecoderRate("pillow", 100.0, (100.0,))]
    sample = [str(path) for path in folder.rglob("*.jpg")]  # 40x30: below the smallest size
    monkeypatch.setattr("prefetch.tools.bench._hint.fast_available", lambda: False)

    hint = bench.fast_hint(rates, sample, antialias=False)

    assert hint is not None and hint.photo_pixels == 40 * 30
    (_, pillow_ms, turbo_ms), _ = bench.TURBO_MEASURED[False]
    assert hint.speedup == pytest.approx(pillow_ms / turbo_ms)  # clamped to the measured range
    (_, pillow_ms, turbo_ms), _ = bench.TURBO_MEASURED[True]
    assert hint.speedup_other_antialias == pytest.approx(pillow_ms / turbo_ms)
    assert f"{100 * hint.speedup:.0f} instead of 100 images/s per core" in hint.text()
    assert bench.fast_hint([bench.DecoderRate("slow", 1.0, (1.0,))], sample, True) is None
    monkeypatch.setattr("prefetch.tools.bench._hint.fast_available", lambda: True)
    assert bench.fast_hint(rates, sample, antialias=False) is None


# The fault injected: simplejpeg and OpenCV fail to import in this subprocess only.
WITHOUT_FAST_EXTRA = """
import sys
sys.modules["simplejpeg"] = sys.modules["cv2"] = None
from prefetch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_without_the_fast_extra_estimates_what_installing_it_would_gain(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.json"
    args = ["--loaders", "loop,default", "--batch-size", "4", "--image-size", "16x16"]
    args += ["--repeats", "1", "--decode-sample", "8", "--json", str(out), "--quiet"]
    args += ["--in-process"]  # the fault is injected into this process only
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_FAST_EXTRA, "bench", str(folder), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert (
        'fast extra (libjpeg-turbo + OpenCV) is not installed: pip install "prefetch[fast]"' in text
    )
    assert "images/s per core" in text and "an estimate: Pillow's rate measured" in text
    data = json.loads(out.read_text())
    assert data["config"]["loader_decoder"] == "pillow"
    assert [row["decoder"] for row in data["loaders"]] == ["pillow", "pillow"]
    assert [rate["name"] for rate in data["decoders"]] == ["pillow"]
    hint = data["fast_hint"]
    assert hint["speedup"] > 0 and hint["speedup_other_antialias"] > 0
    assert hint["pillow_images_per_s"] == pytest.approx(data["decoders"][0]["images_per_s"])
    if fast_available():  # with the extra installed, the same command gives no hint
        assert "fast extra" not in run_cli(str(folder), *args).stdout


def test_cli_reports_bad_input_without_a_traceback(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        ([], "give an image folder ROOT, or --generate N"),
        ([str(folder), "--loaders", "loop,dali"], "--loaders: unknown ['dali']"),
        ([str(folder), "--image-size", "big"], "image size must be SIZE or HEIGHTxWIDTH"),
        ([str(folder), "--batch-size", "16", "--loaders", "loop"], "fewer than 2 batches"),
        ([str(folder), "--generate", "4"], "is not an empty folder"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", "--quiet", *args])
        assert exit_info.value.code == 2, args
        error = capsys.readouterr().err
        assert message in error, (args, error)
        assert "Traceback" not in error


def test_progress_bar_draws_in_place_and_erases_itself() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, enabled=True)
    bar(5, 10, "round 1/1: prefetch threads")
    bar(10, 10, "done")
    bar.close()
    text = stream.getvalue()
    assert "\r[###############...............]  50% round 1/1: prefetch threads" in text
    assert "[##############################] 100% done" in text
    assert text.endswith("\r")
    silent = io.StringIO()
    ProgressBar(silent, enabled=False)(1, 2, "x")
    assert silent.getvalue() == ""


def test_text_timeline_draws_each_span_in_its_time_buckets() -> None:
    timeline = Timeline()
    timeline.record("decode", 0.0, 0.5, 0, lane="worker")
    timeline.record("decode", 0.5, 0.75, 1, lane="worker")
    timeline.record("wait", 0.0, 0.5, 0)
    timeline.record("step", 0.5, 1.0, 0)

    lines = timeline.render_text(width=16).splitlines()

    assert lines[1] == "  worker |000000001111    |"
    assert lines[2] == "consumer |........00000000|"
    assert "one character = 62.50 ms" in lines[3]


def test_overlapping_spans_of_a_lane_stack_into_rows() -> None:
    timeline = Timeline()
    timeline.record("produce", 10.0, 10.5, 0, lane="in flight")
    timeline.record("produce", 10.25, 11.0, 1, lane="in flight")
    timeline.record("produce", 10.5, 11.0, 2, lane="in flight")

    rows = timeline.rows()

    assert [name for name, _ in rows] == ["in flight 1", "in flight 2"]  # every row labelled
    assert [[span.batch for span in row] for _, row in rows] == [[0, 2], [1]]
    assert [span["start_s"] for span in timeline.as_dicts()] == [0.0, 0.25, 0.5]
    with pytest.raises(ValueError, match=r"ends .* before it starts"):
        timeline.record("step", 2.0, 1.0, 3)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_recorded_timeline_has_worker_decodes_batches_in_flight_and_consumer_spans(
    folder: Path, backend: str
) -> None:
    timeline = bench.record_timeline(
        folder, batches=3, batch_size=4, image_size=(16, 16), workers=2, backend=backend
    )

    spans = timeline.spans
    decodes = [s for s in spans if s.kind == "decode"]
    workers = {s.lane for s in decodes}
    assert 1 <= len(workers) <= 2 and "consumer" not in workers
    assert {s.batch for s in decodes} >= {0, 1, 2}
    assert sorted(s.batch for s in spans if s.kind == "wait") == [0, 1, 2]
    assert sorted(s.batch for s in spans if s.kind == "step") == [0, 1, 2]
    for produce in (s for s in spans if s.kind == "produce"):
        mine = [s for s in decodes if s.batch == produce.batch]
        assert produce.start_s == min(s.start_s for s in mine)
        assert produce.end_s == max(s.end_s for s in mine)
    text = timeline.render_text()
    assert "in flight" in text and "consumer |" in text
    assert all(name for name, _ in timeline.rows())


def test_plots_are_written_as_png(folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    report = bench.run(folder, loaders=["loop", "threads"], timeline_batches=2, **TINY)
    assert report.timeline is not None
    report.plot(tmp_path / "bench.png")
    report.timeline.plot(tmp_path / "timeline.png")
    for name in ("bench.png", "timeline.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plotting_without_matplotlib_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    timeline = Timeline()
    timeline.record("step", 0.0, 1.0, 0)
    with pytest.raises(
        ImportError, match=r"Timeline\.plot needs matplotlib: pip install matplotlib"
    ):
        timeline.plot(tmp_path / "timeline.png")


def test_cli_asks_for_matplotlib_before_measuring_when_a_chart_is_wanted(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    for option in ("--plot", "--timeline"):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", str(folder), option, "out.png"])
        assert exit_info.value.code == 2
        assert f"{option} needs matplotlib: pip install matplotlib" in capsys.readouterr().err


def hand_built_report(step_ms: float, timeline: Timeline | None = None) -> bench.BenchReport:
    """A report with chosen figures (no timing): two loaders, a 1,500 images/s decode limit."""
    config = bench.BenchConfig(
        root="/data/photos", images=1000, classes=10, image_size=(224, 224), batch_size=64,
        workers=2, depth=2, step_ms=step_ms, repeats=3, seed=0, decode_sample=200,
        loader_decoder="turbo", timeline_batches=8, timeline_backend="process",
    )  # fmt: skip
    rows = [
        bench.LoaderResult(
            key, bench.LOADER_NAMES[key], rate, 0.5, rate / 1500, None, (rate,), (0.5,)
        )
        for key, rate in (("loop", 700.0), ("threads", 1400.0))
    ]
    machine = {"cpu": "test CPU", "usable_cores": 2, "cpu_count": 2, "python": "3", "platform": "x"}
    rate = bench.DecoderRate("turbo", 750.0, (750.0,))
    return bench.BenchReport(config, machine, [rate], 1500.0, "turbo", rows, {}, timeline)


def test_bench_chart_draws_the_step_ceiling_only_where_the_axis_shows_it() -> None:
    pytest.importorskip("matplotlib")
    near = hand_built_report(step_ms=40).figure().axes[0]  # ceiling 1,600/s: on the axis
    far = hand_built_report(step_ms=10).figure().axes[0]  # ceiling 6,400/s: far beyond

    assert "step ceiling 1600/s" in near.get_legend_handles_labels()[1]
    assert near.get_xlim()[1] >= 1600
    assert not any("step ceiling" in label for label in far.get_legend_handles_labels()[1])
    assert "step ceiling 6400/s is beyond this chart" in far.get_xlabel()
    assert far.get_xlim()[1] < 6400
    assert "median of 3 round(s)" in far.get_title()


def test_timeline_chart_names_the_loader_and_labels_every_row_in_its_legends_words() -> None:
    pytest.importorskip("matplotlib")
    timeline = Timeline()
    timeline.record("decode", 0.0, 0.1, 0, lane="prefetch-worker-0")
    timeline.record("produce", 0.0, 0.3, 0, lane="in flight")
    timeline.record("produce", 0.1, 0.4, 1, lane="in flight")
    timeline.record("wait", 0.0, 0.3, 0)
    timeline.record("step", 0.3, 0.5, 0)
    report = hand_built_report(step_ms=100, timeline=timeline)

    title = report.timeline_title()
    axes = timeline.figure(title).axes[0]

    assert title.startswith("prefetch processes (2 workers, depth 2): the first 8 batches of 64")
    assert axes.get_title() == title
    labels = [tick.get_text() for tick in axes.get_yticklabels()]
    assert labels == ["prefetch-worker-0", "in flight 1", "in flight 2", "consumer"]
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == [tools_timeline.KIND_LABELS[kind] for kind in tools_timeline.KIND_LABELS]
    assert legend[1].startswith("in flight")  # the rows' word, not the span kind "produce"
    assert f"timeline: {title}" in report.format_table()


def test_a_row_that_fails_is_named_in_one_line_and_the_other_rows_are_still_measured(
    folder: Path,
) -> None:
    last = sorted(folder.rglob("*.jpg"))[-1].name  # outside the decode sample: rows only
    report = bench.run(folder, loaders=["loop", "default"], decoder=FailingDecoder(last), **TINY)

    assert [row.key for row in report.loaders] == ["default"]
    reason = report.skipped["loop"]
    assert reason.startswith("failed in round 1: ValueError: injected failure for ")
    assert "\n" not in reason and last in reason
    table = report.format_table()
    assert f"skipped python loop (1 core): {reason}" in table
    assert "Traceback" not in table


@pytest.mark.tf
@pytest.mark.timeout(240)  # imports TensorFlow in the tf.data row's process
def test_crop_on_a_folder_with_pngs_runs_tf_data_on_its_jpegs_and_says_so(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    root = bench.write_sample_folder(tmp_path / "mixed", 16, size=(60, 40))
    for index in range(4):
        Image.new("RGB", (60, 40), (index * 60, 90, 30)).save(root / "circle" / f"p{index}.png")

    report = bench.run(
        root, loaders=["threads", "processes", "tf.data"], crop=RandomResizedCrop(), **TINY
    )
    report.plot(tmp_path / "bench-crop.png")

    assert [row.key for row in report.loaders] == ["threads", "processes", "tf.data"]
    note = "ran on the 16 JPEGs only: decode_and_crop_jpeg cannot read the other 4 files"
    assert report.loader("tf.data").note == note
    assert report.format_table().count(note) == 1
    # Every prefetch row names the window decoder it runs under a crop.
    window = window_decode.window_engine_name("turbo")
    assert report.loader("threads").decoder == report.loader("processes").decoder == window
    assert (tmp_path / "bench-crop.png").read_bytes()[:4] == b"\x89PNG"


def test_the_floor_sample_holds_each_jpeg_and_the_rows_its_sample_needs(
    folder: Path, tmp_path: Path
) -> None:
    paths = sorted(str(path) for path in folder.rglob("*.jpg"))[:6]
    png = tmp_path / "flat.png"
    Image.new("RGB", (40, 30)).save(png)
    options = DecodeOptions((16, 16))

    whole = bench.floor_sample([*paths, str(png)], None, options)
    centre = bench.floor_sample(paths, CenterCrop(0.5), options)

    assert whole.left_out == 1 and len(whole.data) == 6
    assert whole.last_rows == (29,) * 6 and whole.rows_fraction == 1.0  # 40x30 images
    assert whole.data[0] == Path(paths[0]).read_bytes()
    box = CenterCrop(0.5).box(30, 40, (16, 16), np.random.default_rng())
    assert centre.last_rows == (box.top + box.height - 1,) * 6
    assert centre.rows_fraction == pytest.approx((box.top + box.height) / 30)


def test_the_table_reports_each_loader_against_the_entropy_floor_or_says_why_not(
    folder: Path,
) -> None:
    report = bench.run(folder, loaders=["loop"], isolate=False, **TINY)

    table = report.format_table()
    row = report.loader("loop")
    if bench.entropy_decoder() is None:
        assert report.floor is None and row.ratio_to_floor is None
        assert f"entropy floor not measured: {bench.NO_ENTROPY_DECODER}" in table
        assert "of limit" in table
    else:
        assert report.floor is not None and report.floor.images_per_s > 0
        assert report.floor_limit == pytest.approx(report.floor.images_per_s * usable_cores())
        assert row.ratio_to_floor == pytest.approx(row.images_per_s / report.floor_limit)
        assert "entropy floor (" in table and "of floor" in table
    assert not report.config.isolated and "in this process" in table
    assert f"{row.ratio_to_limit:.2f}x" in table or f"{row.ratio_to_floor:.2f}x" in table
    assert "%" not in table.split("loader", 1)[1].split("\n")[1]  # one notation: 1.12x


def test_bench_chart_labels_stay_clear_of_the_lines() -> None:
    pytest.importorskip("matplotlib")
    report = hand_built_report(step_ms=0)  # threads at 1,400/s, the decode limit at 1,500/s
    figure = report.figure()
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    to_data = axes.transData.inverted()

    labels = [text for text in axes.texts if "/s" in text.get_text()]
    assert len(labels) == 2
    for label in labels:
        box = label.get_window_extent(renderer).transformed(to_data)
        assert not box.x0 <= report.decode_limit <= box.x1, label.get_text()
        assert box.x1 <= axes.get_xlim()[1]
    assert len(axes.get_title().splitlines()) == 2  # not one line cut at the right
