"""`prefetch shards write` on real datasets: worker processes (the same bytes for any count),
a resumable write (a real Ctrl-C, then the same command), one writer per folder, and the
progress line (in a pseudo-terminal, and as plain lines)."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image
from test_shard_sets import hidden as unfinished  # temporary files, an unfinished journal

import prefetch
from prefetch.cli import main
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.tools.shards import (
    FolderBusyError,
    OutFolder,
    Progress,
    ProgressLine,
    describe,
    write_shards,
)
from prefetch.tools.shards import _samples as shard_samples
from prefetch.tools.shards._listing_digest import ListingDigest
from prefetch.tools.shards._out_folder import LOCK_NAME

# 48 photos-like JPEGs of 320x240: each is re-encoded by --fit-crop 64 (so decoded once).
CLASSES = ("cat", "dog", "emu")
PER_CLASS = 16
COUNT = len(CLASSES) * PER_CLASS
PROGRESS = ".shard-tar.progress.jsonl"


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 real JPEGs (noise, 320x240) and a PNG, an empty file and a text file named .jpg."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(3)
    for name in CLASSES:
        (root / name).mkdir()
        for number in range(PER_CLASS):
            pixels = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{number:02d}.jpg", "JPEG", quality=85)
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(
        root / "cat" / "wide.png", "PNG"
    )
    (root / "dog" / "empty.jpg").write_bytes(b"")
    (root / "emu" / "notes.jpg").write_text("not an image")
    return root


def files_of(out: Path) -> dict[str, bytes]:
    """The files of `out` by name with their bytes, offset indexes left out (they record the
    shard file's inode and time)."""
    return {
        name: (out / name).read_bytes()
        for name in sorted(os.listdir(out))
        if not name.endswith(INDEX_SUFFIX)
    }


@pytest.mark.timeout(120)  # worker processes start
@pytest.mark.parametrize(
    ("format", "fit_crop", "shard_size"),
    [("tar", 64, 3), ("tfrecord", None, 3), ("tar", 64, 30), ("tfrecord", None, 30)],
    # 17 shards: each worker writes whole shards; 2 shards: the workers share each one's samples
    ids=[
        "tar-fit-crop-by-shard",
        "tfrecord-by-shard",
        "tar-fit-crop-by-sample",
        "tfrecord-by-sample",
    ],
)
def test_one_worker_and_three_write_the_same_bytes(
    photos: Path, tmp_path: Path, format: str, fit_crop: int | None, shard_size: int
) -> None:
    options = {"format": format, "shard_size": shard_size, "fit_crop": fit_crop, "seed": 5}
    one = write_shards(photos, tmp_path / "one", workers=1, **options)  # type: ignore[arg-type]
    three = write_shards(photos, tmp_path / "three", workers=3, **options)  # type: ignore[arg-type]
    assert [Path(path).name for path in one] == [Path(path).name for path in three]
    assert files_of(tmp_path / "one") == files_of(tmp_path / "three")
    manifest = json.loads(
        (tmp_path / "three" / f"shard-{format}.manifest.json").read_text(encoding="utf-8")
    )
    assert len(manifest["skipped"]) == 2  # the empty file and the text file, named
    if fit_crop is not None:
        assert manifest["options"]["fit_crop"]["resized"] == COUNT + 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shard_size", [1, 20], ids=["by-shard", "by-sample"])
def test_a_worker_that_fails_reaches_the_writer_with_its_type_and_file(
    photos: Path, tmp_path: Path, shard_size: int
) -> None:
    unreadable = tmp_path / "unreadable"
    (unreadable / "a").mkdir(parents=True)
    for number in range(9):  # 10 shards of 1 for 2 workers: whole shards
        source = photos / "cat" / f"{number:02d}.jpg"
        (unreadable / "a" / source.name).write_bytes(source.read_bytes())
    (unreadable / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(FileNotFoundError, match=r"gone\.jpg"):
        write_shards(unreadable, tmp_path / "out", format="tar", shard_size=shard_size, workers=2)


# ---------------------------------------------------------------- resume after a real Ctrl-C

# Loaded by every Python process of the write (the command and its spawned workers): counts each
# real decode (Pillow's `load` of an image not loaded yet) in a shared file, slowed down so a
# Ctrl-C lands mid-way.
COUNTING_SITE = """
import os, time
from PIL import ImageFile

_load = ImageFile.ImageFile.load


def load(self):
    if getattr(self, "tile", None):
        with open(os.environ["DECODE_LOG"], "a") as log:
            log.write("decode\\n")
        time.sleep(float(os.environ.get("DECODE_SLEEP_S", "0")))
    return _load(self)


ImageFile.ImageFile.load = load
"""


def decodes(log: Path) -> int:
    return log.read_text().count("decode\n") if log.exists() else 0


def logged_decodes(tmp_path: Path, site: str = COUNTING_SITE) -> tuple[dict[str, str], Path]:
    """The environment in which every Python process of a write loads `site` (a
    sitecustomize that logs each decode, `COUNTING_SITE`), and the log it writes."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(site)
    log = tmp_path / "decodes.log"
    return {**os.environ, "PYTHONPATH": str(folder), "DECODE_LOG": str(log)}, log


def start_write(
    arguments: list[str], environment: dict[str, str], sleep_s: float, output: bool = True
) -> subprocess.Popen[str]:
    """`prefetch shards write ARGUMENTS` started in `environment`, each decode slowed by
    `sleep_s` (`logged_decodes`); its output read as text, or dropped."""
    pipe = subprocess.PIPE if output else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "prefetch", "shards", "write", *arguments],
        env={**environment, "DECODE_SLEEP_S": str(sleep_s)},
        stdout=pipe,
        stderr=pipe,
        text=True,
    )


@pytest.mark.timeout(120)
def test_a_worker_terminated_mid_shard_as_the_write_is_interrupted_removes_its_shard(
    photos: Path, tmp_path: Path
) -> None:
    """A Ctrl-C while each worker decodes for 30 s (longer than the 2 s a worker has to stop):
    the workers are sent SIGTERM, remove the shards they were writing, and the folders made
    for OUT go too."""
    environment, log = logged_decodes(tmp_path)
    out = tmp_path / "new" / "out"
    arguments = [str(photos), str(out), "--shard-size", "4", "--fit-crop", "64", "--workers", "2"]
    child = start_write(arguments, environment, sleep_s=30)
    deadline = time.monotonic() + 60
    while decodes(log) < 2 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # both workers are in a decode, each with its shard open
    assert len([n for n in os.listdir(out) if n.endswith(".partial")]) == 2
    child.send_signal(signal.SIGINT)
    _, errors = child.communicate(timeout=60)
    assert child.returncode == 130, errors
    assert not (tmp_path / "new").exists()


@pytest.mark.timeout(240)  # three runs of the command, with worker processes
def test_a_write_interrupted_halfway_resumes_decoding_only_the_rest_into_the_same_bytes(
    photos: Path, tmp_path: Path
) -> None:
    environment, log = logged_decodes(tmp_path)
    out = tmp_path / "out"
    arguments = [str(photos), str(out), "--shard-size", "4", "--fit-crop", "64", "--workers", "2"]
    command = [sys.executable, "-m", "prefetch", "shards", "write", *arguments]
    child = start_write(arguments, environment, sleep_s=0.1)
    deadline = time.monotonic() + 120
    while decodes(log) < COUNT // 2 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    _, errors = child.communicate(timeout=60)
    assert child.returncode == 130, errors
    assert "run the same command again to continue" in errors and "Traceback" not in errors
    lines = (out / PROGRESS).read_text().splitlines()
    kept = [json.loads(line) for line in lines[1:]]
    resumed = sum(shard["samples"] + len(shard["skipped"]) for shard in kept)
    resized = sum(shard["resized"] for shard in kept)
    assert 0 < resumed < COUNT + 3, "the Ctrl-C did not land mid-way"
    with pytest.raises(FileNotFoundError):
        prefetch.TarSource(out)  # readers see nothing of a set not yet whole

    log.unlink()
    rerun = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming: the interrupted run wrote {len(kept)} shard" in rerun.stdout
    assert decodes(log) == COUNT + 1 - resized  # only the images not written yet
    assert unfinished(out) == []

    whole = tmp_path / "whole"
    assert main(["shards", "write", str(photos), str(whole), *command[-6:], "--quiet"]) == 0
    assert files_of(out) == files_of(whole)


def interrupt_at_read(monkeypatch: pytest.MonkeyPatch, number: int) -> None:
    """Make the `number`-th image read raise KeyboardInterrupt (a Ctrl-C), in this process."""
    real = shard_samples.read_location
    reads: list[str] = []

    def read(path: str) -> bytes:
        reads.append(path)
        if len(reads) == number:
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(shard_samples, "read_location", read)
    # the listing's fingerprint (4 threads beside the writing) is ready once a shard is done,
    # as on any machine that is not this busy: each shard is journaled once it is finished
    monkeypatch.setattr(ListingDigest, "ready", lambda digest, wait_s=0.0: bool(digest.result()))


def test_other_options_or_a_changed_folder_start_over_saying_why(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in CLASSES:
        (folder / name).mkdir()
        for number in range(3):
            source = photos / name / f"{number:02d}.jpg"
            (folder / name / source.name).write_bytes(source.read_bytes())
    out = tmp_path / "out"
    for change, why in (
        (lambda: {"seed": 1}, "the options changed (seed 0 -> 1)"),
        (lambda: (folder / "cat" / "00.jpg").unlink() or {}, "(9 files then, 8 now)"),
        (lambda: os.utime(folder / "dog" / "01.jpg", (1, 1)) or {}, "modification time"),
    ):
        with monkeypatch.context() as patch:
            interrupt_at_read(patch, 6)
            with pytest.raises(KeyboardInterrupt):
                write_shards(folder, out, format="tar", shard_size=2)
        assert PROGRESS in os.listdir(out)
        notes: list[str] = []
        write_shards(folder, out, format="tar", shard_size=2, on_note=notes.append, **change())
        assert len(notes) == 1 and notes[0].startswith("starting over: ") and why in notes[0]
        assert unfinished(out) == []
        for name in os.listdir(out):
            os.remove(out / name)


def test_a_finished_shard_changed_since_the_interruption_is_written_again_the_others_kept(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_at_read(patch, 30)
        with pytest.raises(KeyboardInterrupt):
            write_shards(photos, out, format="tar", shard_size=8)
    shards = sorted(name for name in os.listdir(out) if name.endswith(".partial"))
    assert len(shards) == 3
    with open(out / shards[1], "r+b") as file:  # the second shard's bytes, changed in place
        file.seek(600)
        file.write(b"\x00" * 16)
    notes: list[str] = []
    write_shards(photos, out, format="tar", shard_size=8, on_note=notes.append)
    assert notes == [
        f"resuming: the interrupted run wrote 2 shards of 7 (16 of {COUNT + 3} images), "
        "checked against the plan"
    ]
    whole = tmp_path / "whole"
    write_shards(photos, whole, format="tar", shard_size=8)
    assert files_of(out) == files_of(whole)


# ---------------------------------------------------------------- one writer at a time


@pytest.mark.timeout(60)
def test_a_second_writer_into_the_same_folder_fails_at_once_with_a_clear_message(
    photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with OutFolder(str(out)) as holder:
        holder.lock()  # the first writer, at work
        with pytest.raises(FolderBusyError, match="is being written by another"):
            write_shards(photos, out, format="tar", shard_size=8)
        second = subprocess.run(
            [sys.executable, "-m", "prefetch", "shards", "write", str(photos), str(out)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2
        assert f"{str(out)!r} is being written by another `prefetch shards write`" in (
            second.stderr
        )
        assert "Traceback" not in second.stderr
        assert os.listdir(out) == [LOCK_NAME]  # the holder's lock file, nothing else
    assert os.listdir(out) == []  # its holder removed it
    write_shards(photos, out, format="tar", shard_size=8)  # the lock went with its holder
    assert LOCK_NAME not in os.listdir(out)


HOLD_FOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.timeout(60)
def test_a_neighbour_holding_a_lock_of_the_output_folder_itself_does_not_block_a_write(
    photos: Path, tmp_path: Path
) -> None:
    # Anyone who may read a 0755 folder may flock it: the writers' lock is a 0600 file in it.
    out = tmp_path / "out"
    out.mkdir()
    neighbour = subprocess.Popen(
        [sys.executable, "-c", HOLD_FOLDER, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert neighbour.stdout is not None and neighbour.stdout.readline() == "held\n"
        paths = write_shards(photos, out, format="tar", shard_size=8)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert paths and LOCK_NAME not in os.listdir(out)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_a_lock_file_another_user_made_in_the_output_folder_is_refused_naming_it(
    photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    planted = out / LOCK_NAME
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(PermissionError, match=r"prefetch-write.lock', the lock of .* is not a"):
        write_shards(photos, out, format="tar", shard_size=8)
    assert os.listdir(out) == [LOCK_NAME]  # nothing written, theirs left alone


# ---------------------------------------------------------------- progress


@pytest.mark.timeout(60)
def test_on_a_terminal_the_progress_is_one_line_redrawn_with_the_count_rate_and_time_left(
    photos: Path, tmp_path: Path
) -> None:
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "prefetch", "shards", "write", str(photos)]
    command += [str(tmp_path / "out"), "--workers", "1", "--shard-size", "8"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                break
            try:
                data = os.read(leader, 4096)
            except OSError:  # the child closed the terminal (EIO)
                break
            if not data:
                break
            seen += data
        output, _ = child.communicate(timeout=30)
    finally:
        os.close(leader)
    assert child.returncode == 0
    text = seen.decode()
    listing, counted, progress = text.split("\r\n", 2)  # the planning's lines, then the line
    assert listing == f"listing {photos} (one subfolder per class) ..."
    assert counted.startswith(f"{COUNT + 3} files in 3 classes: checking each one's header ")
    assert progress.startswith("\r") and progress.endswith("\r\n")  # redrawn, ended once
    last = text.rstrip().split("\r")[-1]
    total = COUNT + 3
    assert last.startswith(f"{total}/{total} images (100%)  "), last
    for part in ("images/s", "MB/s", "skipped 2", "elapsed 0:00:", "left 0:00:00"):
        assert part in last, last
    assert output.startswith(f"wrote {COUNT + 1} samples in 7 tar shards")


def test_elsewhere_the_progress_is_a_plain_line_every_few_seconds_and_quiet_has_none(
    photos: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = [0.0]
    stream = io.StringIO()
    line = ProgressLine(stream, clock=lambda: now[0])
    assert not line.terminal
    for done in range(1, 11):
        now[0] = done * 1.0
        line.update(Progress(done * 10, 100, 0, 1, done * 1_000_000, now[0]))
    line.finish()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "50/100 images (50%)  10.0 images/s  1.0 MB/s  skipped 1  elapsed 0:00:05  left 0:00:05",
        "100/100 images (100%)  10.0 images/s  1.0 MB/s  skipped 1  elapsed 0:00:10  left 0:00:00",
    ]
    resumed = describe(Progress(60, 100, 40, 0, 0, 2.0))
    assert resumed.startswith("60/100 images (60%) (40 resumed)  10.0 images/s")  # this run's rate
    assert "left 0:00:04" in resumed
    assert main(["shards", "write", str(photos), str(tmp_path / "out"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("wrote ")


@pytest.mark.timeout(120)
def test_a_worker_that_dies_stops_the_write_naming_its_exit_code_and_keeps_the_finished_shards(
    photos: Path, tmp_path: Path
) -> None:
    killed: list[int] = []

    def kill_a_worker(progress: Progress) -> None:
        if killed:
            return
        for child in psutil.Process().children():
            if "--multiprocessing-fork" in child.cmdline() and "resource_tracker" not in str(
                child.cmdline()
            ):
                killed.append(child.pid)
                child.kill()  # as the kernel's out-of-memory killer would
                return

    out = tmp_path / "out"
    with pytest.raises(ChildProcessError, match=r"died with exit code -9 .* fewer --workers"):
        write_shards(photos, out, format="tar", shard_size=4, workers=2, on_progress=kill_a_worker)
    assert killed
    write_shards(photos, out, format="tar", shard_size=4, workers=2)  # resumes, completes
    assert len(prefetch.TarSource(out)) == COUNT + 1


@pytest.mark.timeout(60)
def test_strict_refuses_a_file_that_is_not_an_image_with_workers_writing_whole_shards(
    photos: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"(empty|notes)\.jpg'?: .* without --strict"):
        write_shards(photos, tmp_path / "out", format="tar", shard_size=4, workers=2, strict=True)
    assert not [name for name in os.listdir(tmp_path / "out") if not name.startswith(".")]


def test_a_commit_interrupted_after_shards_finished_in_any_order_is_finished_by_the_same_command(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    real = OutFolder.replace
    renames: list[str] = []

    def failing(self: OutFolder, source: str, target: str) -> None:
        renames.append(target)
        if len(renames) == 3:  # the progress journal, the commit journal, then the first shard
            raise OSError(28, "No space left on device")
        real(self, source, target)

    with monkeypatch.context() as patch:
        patch.setattr(OutFolder, "replace", failing)
        with pytest.raises(OSError, match="No space left"):
            write_shards(photos, out, format="tar", shard_size=8)
    lines = (out / PROGRESS).read_text().splitlines()
    # workers that write whole shards finish them in any order: so may the journal's lines be
    (out / PROGRESS).write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    notes: list[str] = []
    write_shards(photos, out, format="tar", shard_size=8, on_note=notes.append)
    assert notes == ["the interrupted run had written every shard: its set is now in place"]
    assert unfinished(out) == []
    assert len(prefetch.TarSource(out)) == COUNT + 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shard_size", [2, 100], ids=["by-shard", "by-sample"])
def test_the_workers_exit_when_the_writer_is_killed(
    photos: Path, tmp_path: Path, shard_size: int
) -> None:
    environment, log = logged_decodes(tmp_path)
    arguments = [str(photos), str(tmp_path / "out"), "--fit-crop", "64", "--workers", "2"]
    arguments += ["--quiet", "--shard-size", str(shard_size)]
    child = start_write(arguments, environment, sleep_s=0.2, output=False)
    deadline = time.monotonic() + 60
    while decodes(log) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = psutil.Process(child.pid).children()
    assert len([w for w in workers if "resource_tracker" not in " ".join(w.cmdline())]) == 2
    child.kill()  # no cleanup in the writer: the workers must notice on their own
    child.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [process.pid for process in alive]


def test_a_tfrecord_write_that_starts_over_with_another_shard_count_leaves_no_temporary_file(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        interrupt_at_read(patch, 20)
        with pytest.raises(KeyboardInterrupt):
            write_shards(photos, out, format="tfrecord", shard_size=8)  # of 7 shards
    assert any(name.endswith("-of-00007.tfrecord") for name in os.listdir(out)) is False
    assert any("-of-00007.tfrecord." in name for name in os.listdir(out))
    notes: list[str] = []
    write_shards(photos, out, format="tfrecord", shard_size=10, on_note=notes.append)  # of 6
    assert notes and notes[0].startswith("starting over: the options changed (shard_size 8 -> 10")
    assert unfinished(out) == []
