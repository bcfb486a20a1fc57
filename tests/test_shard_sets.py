"""Sets of shards that a neighbour, a Ctrl-C, a full disk or a crash cannot leave half-written or
mislabelled: `prefetch shards write` (real folders, real shards, real subprocesses and signals)
and what `TarSource` / `TFRecordSource` check against the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import prefetch
from prefetch.cli import main
from prefetch.testing import serve_folder, write_bad_files, write_image_folder
from prefetch.tools.shards import _out_folder as out_folder
from prefetch.tools.shards import write_shards

COUNT = 24  # 3 classes of 8 images
MANIFEST = "shard-tar.manifest.json"
# The address space a child process may take: a runaway read fails fast instead of swapping.
CHILD_MEMORY_BYTES = 3 << 30


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images"), per_class=8)


def files_of(out: Path) -> dict[str, bytes]:
    """Every file of `out` with its bytes (links as their target's name), index files left out."""
    return {
        path.name: (os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        for path in sorted(out.iterdir())
        if not path.name.endswith(".prefetch-index.npz")
    }


def hidden(out: Path) -> list[str]:
    """The hidden files of `out` but a progress journal marked complete (kept beside a set)."""
    return sorted(
        name
        for name in os.listdir(out)
        if name.startswith(".")
        and not (
            name.endswith(".progress.jsonl") and b'"complete": true' in (out / name).read_bytes()
        )
    )


def run_cli(
    *arguments: str, limit: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m prefetch ARGUMENTS` in a child process with a memory limit (and `limit`)."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY_BYTES, CHILD_MEMORY_BYTES))
        if limit is not None:
            limit()

    return subprocess.run(
        [sys.executable, "-m", "prefetch", *arguments],
        capture_output=True,
        text=True,
        timeout=100,
        preexec_fn=limits,
        check=False,
    )


# ---------------------------------------------------------------- a neighbour's links


def test_links_planted_at_any_name_in_out_are_never_written_through(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    old_partials = [".shard-000000.tar.partial", ".classes.txt.partial"]
    finals = ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "classes.txt"]
    for name in old_partials + finals:
        os.symlink(victim, out / name)
    write_shards(folder, out, format="tar", shard_size=10, overwrite=True)
    assert victim.read_bytes() == b"precious"
    for name in os.listdir(out):
        assert (out / name).is_symlink() == (name in old_partials), name
    assert len(prefetch.TarSource(out)) == COUNT


def test_a_link_at_the_manifest_or_out_itself_is_refused_and_not_followed(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / MANIFEST)
    with pytest.raises(OSError, match="is a symbolic link: not read"):
        write_shards(folder, out, format="tar", shard_size=10, overwrite=True)
    assert victim.read_bytes() == b"precious"
    assert os.listdir(out) == [MANIFEST]
    os.symlink(out, tmp_path / "link")
    assert main(["shards", "write", str(folder), str(tmp_path / "link")]) == 2
    assert "is a symbolic link: give the folder it points to" in capsys.readouterr().err


def test_temporary_files_are_created_exclusively_with_unpredictable_names(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, int]] = []
    real_open = os.open

    def recording_open(path: str, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if isinstance(path, str) and path.endswith(".partial"):
            seen.append((path, flags, mode))
        return real_open(path, flags, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(out_folder.os, "open", recording_open)
    write_shards(folder, tmp_path / "a", format="tar", shard_size=10)
    write_shards(folder, tmp_path / "b", format="tar", shard_size=10)
    names = [path for path, _, _ in seen]
    # 3 shards, the progress journal (begun, then marked complete), the commit journal,
    # classes.txt, the manifest: twice
    assert len(names) == 2 * 8
    assert len(set(names)) == len(names)  # a random part: never the same name twice
    required = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    assert all(flags & required == required and mode == 0o644 for _, flags, mode in seen)


# ---------------------------------------------------------------- what OUT holds


def test_classes_txt_that_is_a_link_to_dev_zero_or_a_fifo_is_refused_at_once(
    folder: Path, tmp_path: Path
) -> None:
    for kind in ("zero", "fifo"):
        out = tmp_path / kind
        out.mkdir()
        if kind == "zero":
            os.symlink("/dev/zero", out / "classes.txt")
        else:
            os.mkfifo(out / "classes.txt")
        run = run_cli("shards", "write", str(folder), str(out))
        assert run.returncode == 2, run.stderr
        assert str(out / "classes.txt") in run.stderr
        assert ("symbolic link" if kind == "zero" else "not a regular file") in run.stderr


def test_a_classes_txt_that_is_not_utf8_is_refused_naming_it(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "classes.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(ValueError, match="is not UTF-8 text") as raised:
        write_shards(folder, tmp_path, format="tar", shard_size=10)
    assert str(tmp_path / "classes.txt") in str(raised.value)


def test_the_manifest_lists_each_shard_with_its_size_samples_and_sha256(
    folder: Path, tmp_path: Path
) -> None:
    paths = write_shards(folder, tmp_path, format="tfrecord", shard_size=10, seed=2)
    manifest = json.loads((tmp_path / "shard-tfrecord.manifest.json").read_text("utf-8"))
    assert manifest["prefetch_shards_manifest"] == 1 and manifest["complete"] is True
    assert manifest["format"] == "tfrecord" and manifest["samples"] == COUNT
    assert manifest["class_names"] == ["circle", "square", "triangle"]
    assert manifest["options"] == {"shard_size": 10, "seed": 2, "shuffle": True, "strict": False}
    assert [entry["name"] for entry in manifest["shards"]] == [Path(p).name for p in paths]
    for entry, path in zip(manifest["shards"], paths, strict=True):
        data = Path(path).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert [entry["samples"] for entry in manifest["shards"]] == [10, 10, 4]


# ---------------------------------------------------------------- interrupted and failed writes


def hidden_partials(out: Path) -> int:
    try:
        return sum(name.endswith(".partial") for name in os.listdir(out))
    except FileNotFoundError:
        return 0


@pytest.mark.timeout(150)  # a child process, fed over loopback HTTP at 50 ms an image
@pytest.mark.parametrize("overwrite", [False, True], ids=["first-write", "overwrite"])
def test_ctrl_c_during_a_write_leaves_the_old_set_or_none_and_the_rerun_finishes_it(
    folder: Path, tmp_path: Path, overwrite: bool
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    out = tmp_path / "out"
    if overwrite:
        write_shards(folder, out, format="tar", shard_size=5)
    before = visible(out) if overwrite else {}
    with serve_folder(folder, latency_s=0.05) as url:
        command = ["shards", "write", url, str(out), "--shard-size", "2", "--seed", "1"]
        command += ["--workers", "1", *(["--overwrite"] if overwrite else [])]
        child = subprocess.Popen(
            [sys.executable, "-m", "prefetch", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 100
        while hidden_partials(out) < 3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)  # until 2 of the 12 new shards are written: mid-way, not sooner
        child.send_signal(signal.SIGINT)
        _, errors = child.communicate(timeout=100)
        assert child.returncode == 130, errors
        assert "interrupted" in errors and "Traceback" not in errors
        left = hidden(out)  # the finished shards and the progress journal, for the rerun
        assert left[-1] == ".shard-tar.progress.jsonl", left
        assert len(left) >= 2 and all(name.endswith(".partial") for name in left[:-1]), left
        assert "run the same command again to continue" in errors
        if overwrite:
            assert visible(out) == before
            assert len(prefetch.TarSource(out)) == COUNT
        else:
            assert visible(out) == {}
            with pytest.raises(FileNotFoundError):
                prefetch.TarSource(out)
        rerun = run_cli(*command)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming: the interrupted run wrote" in rerun.stdout
    assert hidden(out) == [] and len(prefetch.TarSource(out)) == COUNT


def visible(out: Path) -> dict[str, bytes]:
    """`files_of(out)` less the hidden files (temporary shards, a progress journal)."""
    return {name: data for name, data in files_of(out).items() if not name.startswith(".")}


def limit_file_size(size: int) -> Callable[[], None]:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


@pytest.mark.timeout(120)  # child processes
def test_a_full_disk_leaves_the_old_set_or_none_and_names_the_shard_and_offset(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    write_shards(folder, out, format="tar", shard_size=2)
    before = files_of(out)
    largest = max(len(data) for data in before.values())
    limit = largest + 4096
    assert sum(len(data) for name, data in before.items() if name.endswith(".tar")) > limit
    overwrite = ["shards", "write", str(folder), str(out), "--shard-size", "100", "--overwrite"]
    run = run_cli(*overwrite, limit=limit_file_size(limit))
    assert run.returncode == 2, run.stderr
    assert f"cannot write shard {str(out / 'shard-000000.tar')!r} at byte" in run.stderr
    assert "is full" in run.stderr and "Traceback" not in run.stderr
    assert files_of(out) == before and hidden(out) == []
    assert len(prefetch.TarSource(out)) == COUNT
    first = tmp_path / "first"
    run = run_cli("shards", "write", str(folder), str(first), limit=limit_file_size(limit))
    assert run.returncode == 2 and "is full" in run.stderr, run.stderr
    assert not first.exists()  # the folder it created is removed: nothing is left


def fail_at_rename(monkeypatch: pytest.MonkeyPatch, number: int) -> None:
    """Make the `number`-th rename in an output folder fail as a full disk would."""
    real = out_folder.OutFolder.replace
    calls = []

    def failing(self: out_folder.OutFolder, source: str, target: str) -> None:
        calls.append(target)
        if len(calls) == number:
            raise OSError(28, "No space left on device")
        real(self, source, target)

    monkeypatch.setattr(out_folder.OutFolder, "replace", failing)


def test_a_write_that_fails_while_put_in_place_is_refused_then_finished_by_the_same_command(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_shards(folder, tmp_path, format="tar", shard_size=5)  # 5 shards
    with monkeypatch.context() as patch:
        fail_at_rename(patch, 4)  # the progress and commit journals, shard 0, then shard 1 fails
        with pytest.raises(OSError, match="No space left"):
            write_shards(folder, tmp_path, format="tar", shard_size=10, seed=1, overwrite=True)
    for reader in (prefetch.TarSource, lambda out: prefetch.TarSource(out / "shard-*.tar")):
        with pytest.raises(ValueError, match="did not finish") as raised:
            reader(tmp_path)
        assert str(tmp_path / MANIFEST) in str(raised.value)
    assert main(["shards", "verify", str(tmp_path)]) == 1
    # a crash in the commit's last steps leaves a class list's or manifest's temporary file
    for name in ("classes.txt", MANIFEST):
        (tmp_path / f".{name}.0123456789abcdef.partial").write_bytes(b"cut short")
    # the same command again finishes the interrupted commit, and that is what it asked for
    notes: list[str] = []
    write_shards(folder, tmp_path, format="tar", shard_size=10, seed=1, on_note=notes.append)
    assert notes == ["the interrupted run had written every shard: its set is now in place"]
    source = prefetch.TarSource(tmp_path)
    assert len(source.shards) == 3 and len(source) == COUNT
    assert hidden(tmp_path) == []
    assert main(["shards", "verify", str(tmp_path)]) == 0


def test_an_interrupted_write_that_cannot_be_finished_says_to_overwrite(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        fail_at_rename(patch, 3)  # the progress and commit journals, then shard 0
        with pytest.raises(OSError):
            write_shards(folder, tmp_path, format="tar", shard_size=10)
    for name in hidden(tmp_path):
        os.remove(tmp_path / name)  # the temporary shards are lost
    with pytest.raises(FileExistsError, match=r"cannot be finished .* --overwrite"):
        write_shards(folder, tmp_path, format="tar", shard_size=10)
    write_shards(folder, tmp_path, format="tar", shard_size=10, overwrite=True)
    assert len(prefetch.TarSource(tmp_path)) == COUNT


# ---------------------------------------------------------------- readers against the manifest


@pytest.fixture
def tar_set(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / "set"
    write_shards(folder, out, format="tar", shard_size=5)  # 5, 5, 5, 5, 4
    return out


def test_a_missing_shard_is_refused_naming_it(tar_set: Path) -> None:
    (tar_set / "shard-000002.tar").unlink()
    for files in (tar_set, tar_set / "shard-*.tar"):
        with pytest.raises(ValueError, match=r"is missing 'shard-000002\.tar'"):
            prefetch.TarSource(files)
    assert len(prefetch.TarSource(tar_set / "shard-00000[01].tar")) == 10  # a chosen part
    assert len(prefetch.TarSource([tar_set / "shard-000000.tar"])) == 5


def test_an_extra_shard_of_the_sets_names_is_refused_naming_it(tar_set: Path) -> None:
    shutil.copy(tar_set / "shard-000001.tar", tar_set / "shard-000007.tar")
    with pytest.raises(ValueError, match=r"'shard-000007\.tar' .* not in the manifest"):
        prefetch.TarSource(tar_set)


def test_a_shard_of_another_size_is_refused_naming_it(tar_set: Path) -> None:
    with open(tar_set / "shard-000003.tar", "ab") as file:
        file.write(bytes(1024))  # still a valid tar of the same samples
    with pytest.raises(ValueError, match="the shard changed") as raised:
        prefetch.TarSource(tar_set)
    assert str(tar_set / "shard-000003.tar") in str(raised.value)


def test_verify_reads_every_byte_and_names_a_changed_shard(
    tar_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["shards", "verify", str(tar_set)]) == 0
    assert "5 shards, 24 samples: OK" in capsys.readouterr().out
    path = tar_set / "shard-000001.tar"
    data = bytearray(path.read_bytes())
    data[700] ^= 0xFF  # inside an image: the same size, the same samples
    path.write_bytes(bytes(data))
    assert len(prefetch.TarSource(tar_set)) == COUNT  # cheap checks at open
    assert main(["shards", "verify", str(tar_set)]) == 1
    assert "shard-000001.tar: SHA-256" in capsys.readouterr().out


# ---------------------------------------------------------------- class names and skipped files


LINE_BREAK_NAMES = ["a", "b\nc", "d", "e\u2028f", "g"]


@pytest.mark.parametrize("format", ["tar", "tfrecord"])
def test_class_names_with_line_breaks_round_trip_exactly(tmp_path: Path, format: str) -> None:
    images = write_image_folder(tmp_path / "images", class_names=LINE_BREAK_NAMES, per_class=2)
    out = tmp_path / "out"
    write_shards(images, out, format=format, shard_size=4)
    assert not (out / "classes.txt").exists()  # it could not say them: the manifest does
    source = (prefetch.TarSource if format == "tar" else prefetch.TFRecordSource)(out)
    assert source.class_names == LINE_BREAK_NAMES
    assert sorted(source.labels.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_classes_txt_is_split_on_newlines_only(tar_set: Path) -> None:
    (tar_set / MANIFEST).unlink()
    (tar_set / "classes.txt").write_bytes("one\ntwo\u2028half\x0bthree\r\nfour\n".encode())
    assert prefetch.TarSource(tar_set).class_names == ["one", "two\u2028half\x0bthree", "four"]
    (tar_set / "classes.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(ValueError, match="is not UTF-8") as raised:
        prefetch.TarSource(tar_set)
    assert str(tar_set / "classes.txt") in str(raised.value)


def test_files_that_are_not_images_are_skipped_and_named_or_refused_with_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = write_image_folder(tmp_path / "images", per_class=8)
    bad = write_bad_files(images / "square", ["zero_byte", "text"])
    out = tmp_path / "out"
    assert main(["shards", "write", str(images), str(out), "--shard-size", "10"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {COUNT} samples in 3 tar shards" in printed and "skipped 2:" in printed
    assert f"skipped {bad['zero_byte']}: empty file (0 bytes)" in printed
    assert f"skipped {bad['text']}: not an image" in printed
    assert len(prefetch.TarSource(out)) == COUNT
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(item["file"] for item in manifest["skipped"]) == [
        "square/bad_text.jpg",
        "square/bad_zero_byte.jpg",
    ]
    strict = tmp_path / "strict"
    assert main(["shards", "write", str(images), str(strict), "--strict"]) == 2
    error = capsys.readouterr().err
    assert "bad_" in error and "without --strict" in error
    assert not strict.exists()  # the folder it created is removed: nothing is left


def test_a_damaged_manifest_is_refused_naming_it_and_replaced_by_overwrite(
    tar_set: Path, folder: Path
) -> None:
    (tar_set / MANIFEST).write_text('{"prefetch_shards_manifest": 1, "shards": 3}')
    for attempt in (
        lambda: prefetch.TarSource(tar_set),
        lambda: write_shards(folder, tar_set, format="tar", shard_size=5),
    ):
        with pytest.raises(ValueError, match="is not a readable shard manifest") as raised:
            attempt()
        assert str(tar_set / MANIFEST) in str(raised.value)
    write_shards(folder, tar_set, format="tar", shard_size=5, overwrite=True)
    assert len(prefetch.TarSource(tar_set)) == COUNT


def test_ctrl_c_while_the_set_is_put_in_place_is_delivered_after_it_is_complete(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = out_folder.OutFolder.replace
    renamed: list[str] = []

    def interrupted(self: out_folder.OutFolder, source: str, target: str) -> None:
        renamed.append(target)
        if target == "shard-000001.tar":
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, mid-way through the renames
        real(self, source, target)

    monkeypatch.setattr(out_folder.OutFolder, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_shards(folder, tmp_path, format="tar", shard_size=10)
    assert renamed[-1] == MANIFEST  # the complete manifest was written before it was raised
    assert main(["shards", "verify", str(tmp_path)]) == 0
    assert len(prefetch.TarSource(tmp_path)) == COUNT


def test_a_shard_of_the_same_size_with_another_sample_count_is_refused(tar_set: Path) -> None:
    path = tar_set / "shard-000002.tar"
    data = bytearray(path.read_bytes())
    name = bytes(data[:100]).rstrip(b"\0")
    assert name.endswith(b".jpg")  # the first member: sample 10's image
    data[:100] = name[:-4].ljust(100, b"\0")[:100]
    data[len(name) - 4 : len(name)] = b".txt"  # no longer an image member: 4 samples, not 5
    data[148:156] = b" " * 8
    data[148:156] = b"%06o\0 " % sum(data[:512])
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="holds 4 samples but") as raised:
        prefetch.TarSource(tar_set)
    assert str(path) in str(raised.value)
    # with .txt as an image extension the shard holds its 5 samples again, as the manifest says
    assert len(prefetch.TarSource(tar_set, image_ext=("jpg", "txt"))) == COUNT
