"""`prefetch shards write` as a new user meets it (issue 42): each friction, through the command
itself (`python -m prefetch shards ...` in a child process, real folders, real signals).

It speaks at once (what it lists, then how many files it checks), refuses in one line, fails a
folder whose every file is skipped and leaves nothing, says a complete set is complete, shows
the read-back at the size --fit-crop fitted, names a skipped file, says how to repair a set
`verify` finds damaged, prints one line for a Ctrl-C at any moment, and readers check each
set's manifest for shards named across folders or prefixes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import prefetch
from prefetch.testing import serve_folder, write_image_folder
from prefetch.tools.shards import OutFolder, Progress, write_shards
from prefetch.tools.shards._out_folder import LOCK_NAME

MANIFEST = "shard-tar.manifest.json"
# The most a child command may take (a busy 2-core machine: start-up alone can take seconds).
RUN_S = 120


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("photos"), per_class=4, size=(40, 30))


def shards(*arguments: str) -> subprocess.CompletedProcess[str]:
    """`python -m prefetch shards ARGUMENTS`, its output captured (stderr a pipe)."""
    command = [sys.executable, "-m", "prefetch", "shards", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_S, check=False)


def test_it_says_what_it_lists_then_how_many_files_on_stderr_also_to_a_pipe(
    photos: Path, tmp_path: Path
) -> None:
    run = shards("write", str(photos), str(tmp_path / "out"), "--workers", "1")
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert lines[0] == f"listing {photos} (one subfolder per class) ..."
    assert lines[1] == (
        f"12 files in 3 classes: checking each one's header and writing them into 1 tar shard "
        f"in {tmp_path / 'out'} (1 worker)"
    )
    quiet = shards("write", str(photos), str(tmp_path / "quiet"), "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_folder_whose_every_file_is_skipped_fails_naming_them_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "photos" / "cat").mkdir(parents=True)
    (tmp_path / "photos" / "dog").mkdir()
    (tmp_path / "photos" / "cat" / "notes.jpg").write_text("not an image")
    (tmp_path / "photos" / "dog" / "empty.png").write_bytes(b"")
    out = tmp_path / "new" / "out"
    run = shards("write", str(tmp_path / "photos"), str(out), "--workers", "1")
    assert run.returncode == 2, run.stdout
    error = run.stderr.splitlines()[-1]
    assert error.startswith("prefetch shards write: error: every one of the 2 files of ")
    assert "cat/notes.jpg: not an image" in error and "dog/empty.png: empty file" in error
    assert "usage:" not in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "new").exists()  # the folders it created are gone with the set


def test_strict_refusing_a_file_leaves_no_folder_it_created_and_keeps_one_it_did_not(
    tmp_path: Path,
) -> None:
    images = write_image_folder(tmp_path / "photos", per_class=2, size=(20, 20))
    (images / "circle" / "zz_notes.jpg").write_text("not an image")
    created = tmp_path / "a" / "b" / "out"
    run = shards("write", str(images), str(created), "--strict", "--workers", "1")
    assert run.returncode == 2 and "zz_notes.jpg" in run.stderr and "usage:" not in run.stderr
    assert not (tmp_path / "a").exists()
    (tmp_path / "mine").mkdir()
    run = shards("write", str(images), str(tmp_path / "mine"), "--strict", "--workers", "1")
    assert run.returncode == 2 and os.listdir(tmp_path / "mine") == []  # kept, empty


@pytest.mark.timeout(RUN_S)  # the example's loader starts worker processes
def test_after_fit_crop_the_read_back_example_reads_at_that_size(
    photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = shards("write", str(photos), str(out), "--fit-crop", "24", "--workers", "1")
    assert run.returncode == 0, run.stderr
    code = run.stdout.split("read them back with:\n", 1)[1]
    assert "image_size=(24, 24)" in code and "RandomResizedCrop()" in code
    assert "(224, 224)" not in code
    scope: dict[str, object] = {}
    exec(textwrap.dedent(code), scope)  # the lines as printed, run as written
    loader = scope["loader"]
    assert isinstance(loader, prefetch.Loader)
    with loader:
        images, _ = next(iter(loader))
    assert images.shape[1:] == (24, 24, 3)


def test_runtime_refusals_are_one_line_without_usage_nor_errno(
    photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert shards("write", str(photos), str(out), "--workers", "1").returncode == 0
    taken = shards("write", str(photos), str(out), "--seed", "1", "--workers", "1")
    assert taken.returncode == 2
    assert taken.stderr.splitlines()[-1] == (
        f"prefetch shards write: error: {str(out)!r} already holds shards with these names "
        "(shard-000000.tar): choose an empty folder or another prefix, or pass overwrite=True "
        "(--overwrite) to replace them"
    )
    assert "usage:" not in taken.stderr
    with OutFolder(str(out)) as held:
        held.lock()  # as another `prefetch shards write` holds it
        busy = shards("write", str(photos), str(out), "--overwrite", "--workers", "1")
    assert busy.returncode == 2
    last = busy.stderr.splitlines()[-1]
    assert last.startswith(f"prefetch shards write: error: {str(out)!r} is being written by ")
    assert "[Errno" not in busy.stderr and "usage:" not in busy.stderr


def test_a_complete_write_run_again_says_so_and_exits_0_until_a_file_changes(
    photos: Path, tmp_path: Path
) -> None:
    images = tmp_path / "photos"
    images.mkdir()
    for path in photos.rglob("*.jpg"):
        (images / path.parent.name).mkdir(exist_ok=True)
        (images / path.parent.name / path.name).write_bytes(path.read_bytes())
    out = tmp_path / "out"
    assert shards("write", str(images), str(out), "--workers", "1").returncode == 0
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    again = shards("write", str(images), str(out), "--workers", "1")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"already complete: {str(out)!r} holds the set of these 12 ")
    assert "wrote " not in again.stdout and "read them back with:" in again.stdout
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    os.utime(next(images.rglob("*.jpg")), (1, 1))  # a file changed since the set was written
    changed = shards("write", str(images), str(out), "--workers", "1")
    assert changed.returncode == 2 and "already holds shards" in changed.stderr
    assert shards("write", str(images), str(out), "--overwrite").returncode == 0


def test_a_skipped_file_is_named_by_its_path_and_its_reason_by_its_name(
    tmp_path: Path,
) -> None:
    images = write_image_folder(tmp_path / "photos", per_class=2, size=(20, 20))
    (images / "square" / "notes.jpg").write_text("not an image")
    run = shards("write", str(images), str(tmp_path / "out"), "--workers", "1")
    assert run.returncode == 0, run.stderr
    assert (
        f"  skipped {images / 'square' / 'notes.jpg'}: not an image (UnidentifiedImageError: "
        "cannot identify image file 'notes.jpg')"
    ) in run.stdout.splitlines()
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert "the file's bytes" not in json.dumps(manifest["skipped"])


def test_verify_names_the_shard_both_hashes_and_how_to_repair_it(
    photos: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    options = ("--shard-size", "5", "--seed", "3", "--workers", "1")
    assert shards("write", str(photos), str(out), *options).returncode == 0
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # a flipped byte inside the first image: same size, another hash
    shard.write_bytes(bytes(data))
    run = shards("verify", str(out))
    assert run.returncode == 1
    problem, repair = run.stdout.splitlines()
    assert re.fullmatch(
        rf"{re.escape(str(shard))}: SHA-256 [0-9a-f]{{64}}, the manifest says "
        r"[0-9a-f]{64}",
        problem,
    ), problem
    assert repair == (
        "  to repair it: copy the files named above again from a good copy of the set, or "
        f"write the set again from its image folder: prefetch shards write FOLDER {out} "
        "--overwrite --format tar --prefix shard --shard-size 5 --seed 3"
    )
    command = repair.split(": ", 2)[2].split()  # the command as printed, FOLDER filled in
    rewrite = shards(*command[2:3], str(photos), *command[4:])
    assert rewrite.returncode == 0, rewrite.stderr
    assert shards("verify", str(out)).returncode == 0


@pytest.mark.timeout(RUN_S)
def test_ctrl_c_while_the_command_still_imports_prints_one_line_not_a_traceback(
    photos: Path, tmp_path: Path
) -> None:
    command = [sys.executable, "-X", "importtime", "-m", "prefetch", "shards", "write"]
    child = subprocess.Popen(
        [*command, str(photos), str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    for line in child.stderr:  # Python reports each import as it completes
        if line.rsplit("|", 1)[-1].strip() == "prefetch.io":  # while `prefetch` still imports
            child.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail("prefetch.io was never imported")
    _, rest = child.communicate(timeout=RUN_S)
    said = [line for line in rest.splitlines() if line and not line.startswith("import time:")]
    assert said == ["prefetch: interrupted"], rest
    assert child.returncode in (130, -signal.SIGINT)  # a shell shows both as 130
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(RUN_S)
def test_ctrl_c_before_a_shard_is_finished_exits_130_and_leaves_nothing(
    photos: Path, tmp_path: Path
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    out = tmp_path / "new" / "out"
    with serve_folder(photos, latency_s=0.2) as url:  # 12 reads of 0.2 s: one shard of 12
        child = subprocess.Popen(
            [sys.executable, "-m", "prefetch", "shards", "write", url, str(out), "--workers", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stderr is not None
        said = [child.stderr.readline(), child.stderr.readline()]  # listing, then the count
        assert said[1].startswith("12 files in 3 classes: "), said
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=RUN_S)
    assert child.returncode == 130, rest
    assert rest.strip() == "prefetch shards: interrupted" and "Traceback" not in rest
    assert not (tmp_path / "new").exists()


@pytest.mark.timeout(RUN_S)
@pytest.mark.skipif(sys.platform != "linux", reason="names a descriptor's file through /proc")
@pytest.mark.parametrize("where", ["makedirs", "flock"])
def test_ctrl_c_as_the_folders_are_made_or_locked_leaves_no_folder(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A Ctrl-C lands anywhere: here just after OUT and its parents were made (inside
    `OutFolder`, before the writer holds it), or just after the lock file was made."""
    module = os if where == "makedirs" else __import__("fcntl")
    real = getattr(module, where)
    hits = []

    def interrupted(first: object, *rest: object, **keywords: object) -> None:
        real(first, *rest, **keywords)
        named = str(first) if where == "makedirs" else os.readlink(f"/proc/self/fd/{first}")
        if not hits and named.endswith(("/out", "/" + LOCK_NAME)):
            hits.append(named)
            raise KeyboardInterrupt

    for out in (tmp_path / "new" / "out", tmp_path / "mine" / "out"):
        (tmp_path / "mine").mkdir(exist_ok=True)  # a folder it did not make stays
        hits.clear()
        monkeypatch.setattr(module, where, interrupted)
        with pytest.raises(KeyboardInterrupt):
            write_shards(photos, out, format="tar", shard_size=4, workers=1)
        monkeypatch.undo()
        assert hits and os.listdir(tmp_path) == ["mine"] and os.listdir(tmp_path / "mine") == []


def test_progress_elapsed_counts_the_planning_and_the_rate_only_the_writing(
    photos: Path, tmp_path: Path
) -> None:
    seen: list[Progress] = []
    began = time.monotonic()
    write_shards(photos, tmp_path / "out", format="tar", shard_size=4, on_progress=seen.append)
    ended = time.monotonic()
    assert seen
    for progress in seen:
        assert progress.writing_s is not None
        assert 0 < progress.writing_s < progress.elapsed_s <= ended - began


def test_shards_named_across_folders_are_checked_against_each_sets_manifest(
    photos: Path, tmp_path: Path
) -> None:
    for name in ("a", "b"):
        run = shards("write", str(photos), str(tmp_path / name), "--shard-size", "5")
        assert run.returncode == 0, run.stderr
    assert len(prefetch.TarSource(str(tmp_path / "*" / "shard-*.tar"))) == 24
    damaged = tmp_path / "b" / "shard-000001.tar"
    damaged.write_bytes(damaged.read_bytes() + b"\0" * 512)  # another size than its manifest's
    for files in (
        str(tmp_path / "*" / "shard-*.tar"),  # a pattern across folders
        [str(tmp_path / "a" / "shard-000000.tar"), str(damaged)],  # a list
    ):
        with pytest.raises(ValueError, match=r"shard-000001.tar' is \d+ bytes but .*b/shard-tar"):
            prefetch.TarSource(files)
    (tmp_path / "b" / "shard-000001.tar").unlink()
    other = write_image_folder(tmp_path / "other", per_class=2, class_names=("x", "y"))
    assert shards("write", str(other), str(tmp_path / "c"), "--workers", "1").returncode == 0
    mixed = [str(tmp_path / "a" / "shard-000000.tar"), str(tmp_path / "c" / "shard-000000.tar")]
    with pytest.raises(ValueError, match="name other classes"):
        prefetch.TarSource(mixed)
    assert len(prefetch.TarSource(mixed, class_names=["p", "q", "r"])) == 9
