"""`prefetch shards write` and `write_shards`: real image files in, shards that independent
readers (Python's tarfile, TensorFlow's TFRecordDataset) read back exactly."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefetch.cli import main
from prefetch.sources._folders import ImageFolder
from prefetch.sources.shards import TarSource
from prefetch.sources.shards._index import INDEX_SUFFIX, IndexSpec, ShardIndex, build_index
from prefetch.tools.shards import FORMATS, add_shards_parser, write_shards
from prefetch.tools.shards import _samples as shard_samples
from prefetch.tools.shards._listing_digest import ListingDigest

SubParsers = argparse._SubParsersAction

CLASSES = ("cat", "dog", "emu")
# Images per class: 25 in all, so shards of 10 are 10, 10 and 5 samples.
COUNTS = (9, 8, 8)
# File extensions the images cycle through (saved as JPEG or PNG to match).
EXTENSIONS = (".jpg", ".png", ".JPEG", ".jpeg", ".PNG")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A class folder of 25 real JPEG and PNG files of odd sizes, in 3 classes."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(7)
    number = 0
    for name, count in zip(CLASSES, COUNTS, strict=True):
        (root / name).mkdir()
        for _ in range(count):
            extension = EXTENSIONS[number % len(EXTENSIONS)]
            size = (5 + 3 * number, 7 + (number * 5) % 11)
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            kind = "JPEG" if extension.lower() in (".jpg", ".jpeg") else "PNG"
            Image.fromarray(pixels).save(root / name / f"img_{number:02d}{extension}", kind)
            number += 1
    return root


def source_files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each image's path relative to `folder` -> (its bytes, its label), as ImageFolder lists."""
    listing = ImageFolder(folder)
    return {
        os.path.relpath(path, folder).replace(os.sep, "/"): (Path(path).read_bytes(), int(label))
        for path, label in zip(listing.paths, listing.labels, strict=True)
    }


def read_tar_shards(out: Path) -> list[tuple[str, bytes, int]]:
    """(image member name, image bytes, label) of every sample of OUT's tar shards, in order,
    read with Python's tarfile; checks each sample is an image member then its .cls member."""
    samples = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as archive:
            members = archive.getmembers()
            assert len(members) % 2 == 0
            for image, cls in zip(members[::2], members[1::2], strict=True):
                key = image.name.split(".")[0]
                assert cls.name == f"{key}.cls"
                assert image.mtime == 0 and image.isfile()
                image_file = archive.extractfile(image)
                cls_file = archive.extractfile(cls)
                assert image_file is not None and cls_file is not None
                samples.append((image.name, image_file.read(), int(cls_file.read().decode())))
    return samples


def written_files(out: Path) -> list[str]:
    """The names in `out`, less the offset indexes that `prefetch.sources.shards._index` may write
    next to each shard (when it is installed); asserts nothing hidden is left but the progress
    journals, marked complete (no temporary file, no journal of an unfinished write)."""
    names = sorted(os.listdir(out))
    hidden = [name for name in names if name.startswith(".")]
    assert [name for name in hidden if not name.endswith(".progress.jsonl")] == []
    assert all(b'"complete": true' in (out / name).read_bytes() for name in hidden)
    return [name for name in names if name.endswith((".tar", ".tfrecord", ".txt"))]


def files_of(out: Path) -> dict[str, bytes]:
    """Every file in `out` (hidden ones included) by name, with its bytes, less the offset
    indexes (they record the shard file's identity: its inode and time)."""
    names = [name for name in sorted(os.listdir(out)) if not name.endswith(INDEX_SUFFIX)]
    return {name: (out / name).read_bytes() for name in names}


def write(folder: Path, out: Path, *options: str) -> int:
    """Run `prefetch shards write FOLDER OUT OPTIONS...` in this process."""
    return main(["shards", "write", str(folder), str(out), *options])


def test_tar_shards_hold_every_image_once_with_its_label_and_its_bytes(
    folder: Path, tmp_path: Path
) -> None:
    assert write(folder, tmp_path / "out", "--shard-size", "10") == 0
    samples = read_tar_shards(tmp_path / "out")
    files = source_files(folder)
    assert len(samples) == len(files) == sum(COUNTS)
    by_bytes = {data: (name, label) for name, (data, label) in files.items()}
    assert len(by_bytes) == len(files)  # every file is distinct, so bytes identify it
    seen = set()
    for number, (member, data, label) in enumerate(samples):
        name, expected_label = by_bytes[data]
        assert label == expected_label
        assert member == f"{number:09d}{os.path.splitext(name)[1].lower()}"
        seen.add(name)
    assert seen == set(files)


def test_tar_shards_are_cut_by_shard_size_and_the_last_one_holds_the_rest(
    folder: Path, tmp_path: Path
) -> None:
    paths = write_shards(folder, tmp_path, format="tar", shard_size=10)
    assert [os.path.basename(path) for path in paths] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    for path, expected in zip(paths, (10, 10, 5), strict=True):
        with tarfile.open(path) as archive:
            assert len(archive.getnames()) == 2 * expected


def test_tfrecord_shards_are_named_index_of_count(folder: Path, tmp_path: Path) -> None:
    paths = write_shards(folder, tmp_path, format="tfrecord", shard_size=12, prefix="train")
    assert [os.path.basename(path) for path in paths] == [
        "train-00000-of-00003.tfrecord",
        "train-00001-of-00003.tfrecord",
        "train-00002-of-00003.tfrecord",
    ]


@pytest.mark.tf
def test_tfrecord_shards_read_back_with_tensorflow(folder: Path, tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    assert write(folder, tmp_path, "--format", "tfrecord", "--shard-size", "10") == 0
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
    }
    shards = sorted(str(path) for path in tmp_path.glob("shard-*-of-00003.tfrecord"))
    assert len(shards) == 3
    counts = []
    read = {}
    for shard in shards:
        records = list(tf.data.TFRecordDataset(shard))
        counts.append(len(records))
        for record in records:
            example = tf.io.parse_single_example(record, features)
            name = example["image/filename"].numpy().decode()
            assert name not in read
            read[name] = (
                example["image/encoded"].numpy(),
                int(example["image/class/label"].numpy()),
                example["image/format"].numpy(),
            )
    assert counts == [10, 10, 5]
    files = source_files(folder)
    assert set(read) == set(files)
    for name, (data, label, image_format) in read.items():
        assert (data, label) == files[name]
        assert image_format == (b"png" if name.lower().endswith(".png") else b"jpeg")


@pytest.mark.tf
def test_tfrecord_images_decode_with_tensorflow_like_the_files(
    folder: Path, tmp_path: Path
) -> None:
    tf = pytest.importorskip("tensorflow")
    write_shards(folder, tmp_path, format="tfrecord", shard_size=100)
    (shard,) = tmp_path.glob("*.tfrecord")
    record = next(iter(tf.data.TFRecordDataset(str(shard))))
    example = tf.io.parse_single_example(
        record,
        {
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/filename": tf.io.FixedLenFeature([], tf.string),
        },
    )
    decoded = tf.io.decode_image(example["image/encoded"]).numpy()
    with Image.open(folder / example["image/filename"].numpy().decode()) as image:
        assert decoded.shape == (image.height, image.width, 3)


def test_the_same_seed_gives_the_same_bytes_and_another_seed_another_order(
    folder: Path, tmp_path: Path
) -> None:
    for format in FORMATS:
        first = write_shards(folder, tmp_path / "a" / format, format=format, shard_size=10)
        again = write_shards(folder, tmp_path / "b" / format, format=format, shard_size=10)
        assert [Path(path).read_bytes() for path in first] == [
            Path(path).read_bytes() for path in again
        ]
    write_shards(folder, tmp_path / "c", format="tar", shard_size=10, seed=1)
    order_0 = [data for _, data, _ in read_tar_shards(tmp_path / "a" / "tar")]
    order_1 = [data for _, data, _ in read_tar_shards(tmp_path / "c")]
    assert order_0 != order_1
    assert sorted(order_0) == sorted(order_1)


def test_samples_are_shuffled_with_the_seeds_permutation(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path, format="tar", shard_size=7, seed=3)
    listing = ImageFolder(folder)
    permutation = np.random.default_rng(3).permutation(len(listing))
    expected = [Path(listing.paths[int(index)]).read_bytes() for index in permutation]
    assert [data for _, data, _ in read_tar_shards(tmp_path)] == expected


def test_no_shuffle_keeps_the_listing_order(folder: Path, tmp_path: Path) -> None:
    assert write(folder, tmp_path, "--no-shuffle", "--shard-size", "4") == 0
    listing = ImageFolder(folder)
    samples = read_tar_shards(tmp_path)
    assert [data for _, data, _ in samples] == [Path(path).read_bytes() for path in listing.paths]
    assert [label for _, _, label in samples] == listing.labels.tolist()
    assert [label for _, _, label in samples] == sorted(label for _, _, label in samples)


def test_classes_txt_names_label_i_on_line_i(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path, format="tfrecord", shard_size=10)
    assert (tmp_path / "classes.txt").read_text().splitlines() == list(CLASSES)


def test_the_output_holds_only_the_shards_and_classes_txt(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path / "new" / "out", format="tar", shard_size=10)
    assert written_files(tmp_path / "new" / "out") == [
        "classes.txt",
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]


def reading_until(reads: list[str], number: int) -> Callable[[str], bytes]:
    """`read_location` that notes each path in `reads` and raises KeyboardInterrupt (a Ctrl-C)
    at the `number`-th read."""
    read_location = shard_samples.read_location

    def read(path: str) -> bytes:
        reads.append(path)
        if len(reads) == number:
            raise KeyboardInterrupt
        return read_location(path)

    return read


def test_an_interrupted_first_run_shows_readers_nothing_and_the_rerun_continues_from_its_shards(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_location = shard_samples.read_location
    reads: list[str] = []
    failing_read = reading_until(reads, 15)  # the 5th sample of the second shard

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(shard_samples, "read_location", failing_read)
        # the listing's fingerprint (4 threads beside the writing) is ready when shard 0 is
        # done, as on any machine that is not this busy: a shard is journaled once it is
        patch.setattr(ListingDigest, "ready", lambda digest, wait_s=0.0: bool(digest.result()))
        with pytest.raises(KeyboardInterrupt):
            write_shards(folder, out, format="tar", shard_size=10)
    # shard 0 was whole: kept, hidden, for the rerun; a set is put in place only when whole
    hidden = sorted(os.listdir(out))
    assert hidden[1] == ".shard-tar.progress.jsonl" and len(hidden) == 2, hidden
    assert hidden[0].startswith(".shard-000000.tar.") and hidden[0].endswith(".partial")
    with pytest.raises(FileNotFoundError):
        TarSource(out)
    reads.clear()
    with monkeypatch.context() as patch:
        patch.setattr(
            shard_samples, "read_location", lambda path: reads.append(path) or read_location(path)
        )
        write_shards(folder, out, format="tar", shard_size=10)
    assert len(reads) == 15  # shards 1 and 2 only
    whole = tmp_path / "whole"
    write_shards(folder, whole, format="tar", shard_size=10)
    assert files_of(out) == files_of(whole)
    written_files(out)  # nothing hidden is left


def test_shards_with_the_same_names_are_refused_unless_overwrite(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert write(folder, tmp_path, "--shard-size", "10") == 0
    before = (tmp_path / "shard-000000.tar").read_bytes()
    capsys.readouterr()
    assert write(folder, tmp_path, "--shard-size", "10", "--seed", "1") == 2
    error = capsys.readouterr().err
    assert error.splitlines()[-1].startswith("prefetch shards write: error: ")  # one line
    assert "usage:" not in error
    assert "already holds shards" in error and "--overwrite" in error
    assert (tmp_path / "shard-000000.tar").read_bytes() == before
    assert write(folder, tmp_path, "--shard-size", "10", "--seed", "1", "--overwrite") == 0
    assert (tmp_path / "shard-000000.tar").read_bytes() != before


def test_overwrite_removes_the_earlier_runs_extra_shards(folder: Path, tmp_path: Path) -> None:
    write_shards(folder, tmp_path, format="tfrecord", shard_size=5)
    write_shards(folder, tmp_path, format="tfrecord", shard_size=10, overwrite=True)
    assert written_files(tmp_path) == [
        "classes.txt",
        "shard-00000-of-00003.tfrecord",
        "shard-00001-of-00003.tfrecord",
        "shard-00002-of-00003.tfrecord",
    ]


def test_another_prefix_or_format_in_the_same_folder_is_not_refused(
    folder: Path, tmp_path: Path
) -> None:
    write_shards(folder, tmp_path, format="tar", shard_size=10)
    write_shards(folder, tmp_path, format="tar", shard_size=10, prefix="copy")
    write_shards(folder, tmp_path, format="tfrecord", shard_size=10)
    assert len(list(tmp_path.glob("shard-*.tar"))) == 3
    assert len(list(tmp_path.glob("copy-*.tar"))) == 3
    assert len(list(tmp_path.glob("*.tfrecord"))) == 3


def test_a_classes_txt_of_other_classes_is_refused(folder: Path, tmp_path: Path) -> None:
    (tmp_path / "classes.txt").write_text("other\n")
    with pytest.raises(FileExistsError, match="other classes"):
        write_shards(folder, tmp_path, format="tar", shard_size=10)
    assert not list(tmp_path.glob("*.tar"))


def test_each_shard_gets_its_offset_index_beside_it(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(tmp_path / "cache"))
    for format in ("tar", "tfrecord"):
        paths = write_shards(folder, tmp_path / format, format=format, shard_size=10)
        for path in paths:
            spec = IndexSpec(format)
            kept = ShardIndex.from_bytes(Path(path + INDEX_SUFFIX).read_bytes(), spec)
            assert kept is not None
            assert len(kept) == len(build_index(path, spec))
        kept_sizes = [
            len(ShardIndex.from_bytes(Path(p + INDEX_SUFFIX).read_bytes(), IndexSpec(format)) or [])
            for p in paths
        ]
        assert kept_sizes == [10, 10, 5]
    assert not (tmp_path / "cache" / "shard-index").exists()  # nothing went to the index folder


@pytest.mark.parametrize(
    ("arguments", "message", "usage"),
    [
        (["shards", "write", "{missing}", "{out}"], "does not exist", False),
        (["shards", "write", "{empty}", "{out}"], "no class folders", False),
        (["shards", "write", "{no_images}", "{out}"], "no images found", False),
        (
            ["shards", "write", "{folder}", "{out}", "--shard-size", "0"],
            "must be an int >= 1",
            True,
        ),
        (["shards", "write", "{folder}", "{out}", "--format", "zip"], "invalid choice", True),
        (["shards", "write", "{folder}", "{out}", "--prefix", "a/b"], "path separator", True),
        (["shards", "write", "{folder}", "{file}"], "is a file", False),
        (["shards"], "required", True),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(
    folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    message: str,
    usage: bool,
) -> None:
    """A mistake in the command line gets argparse's usage; a folder or files that refuse get
    one line (the command line was right)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_images" / "cat").mkdir(parents=True)
    (tmp_path / "no_images" / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "file").write_text("")
    places = {
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
        "no_images": tmp_path / "no_images",
        "folder": folder,
        "out": tmp_path / "out",
        "file": tmp_path / "file",
    }
    command = [argument.format(**places) for argument in arguments]
    if usage:
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 2
    else:
        assert main(command) == 2
    error = capsys.readouterr().err
    assert "error:" in error and message in error
    assert error.startswith("usage: prefetch shards") == usage
    if not usage:  # after the planning's lines (what it lists, how many files)
        assert error.splitlines()[-1].startswith("prefetch shards write: error: ")
    assert "Traceback" not in error
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def test_write_shards_checks_its_options(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format must be one of tar, tfrecord"):
        write_shards(folder, tmp_path, format="zip", shard_size=10)
    with pytest.raises(ValueError, match="shard_size must be an int >= 1"):
        write_shards(folder, tmp_path, format="tar", shard_size=0)
    with pytest.raises(ValueError, match="prefix must be"):
        write_shards(folder, tmp_path, format="tar", shard_size=1, prefix=".hidden")
    assert not os.listdir(tmp_path)


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["shards", "--help"], ["shards", "write", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "tar" in text and "1000" in text and "shuffle buffer" in text
    assert "(default shard)" in text and "(default 0)" in text


def test_the_command_prints_each_shard_with_verbose_and_how_to_read_them_back(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ("--format", "tfrecord", "--shard-size", "10", "--workers", "1")
    assert write(folder, tmp_path / "quiet", *options) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("wrote 25 samples in 3 tfrecord shards")  # no line per shard
    assert write(folder, tmp_path, *options, "--verbose") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(str(tmp_path / "shard-00000-of-00003.tfrecord"))
    assert "10 samples" in lines[0] and lines[0].endswith(" MB")
    assert "5 samples" in lines[2]
    assert lines[3].startswith("wrote 25 samples in 3 tfrecord shards")
    assert any("prefetch.TFRecordSource(" in line for line in lines[4:])


def test_python_m_prefetch_shards_write_runs_in_a_subprocess(folder: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "prefetch", "shards", "write", str(folder), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 25 samples in 1 tar shard " in result.stdout
    assert "prefetch.TarSource(" in result.stdout
    assert len(read_tar_shards(tmp_path)) == 25


def test_every_write_option_has_a_help_text_that_states_its_default() -> None:
    parser = argparse.ArgumentParser(prog="prefetch")
    add_shards_parser(parser.add_subparsers())
    (shards,) = (action for action in parser._actions if isinstance(action, SubParsers))
    (actions,) = (a for a in shards.choices["shards"]._actions if isinstance(a, SubParsers))
    for action in actions.choices["write"]._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = f"prefetch shards write {action.option_strings[0]}"
        assert action.help, flag
        if isinstance(action, argparse._StoreTrueAction):
            continue  # a switch: off unless given
        assert "default" in action.help, flag
        if isinstance(action.default, int) and not isinstance(action.default, bool):
            assert str(action.default) in action.help, flag


def test_a_write_interrupted_before_the_listings_fingerprint_was_ready_journals_its_shards(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a busy machine the fingerprint's threads may not be done when shard 0 is: the shard
    # waits in memory, and a Ctrl-C then waits (briefly) for them to journal it.
    ready = ListingDigest.ready
    failing_read = reading_until([], 15)  # the 5th sample of the second shard

    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(shard_samples, "read_location", failing_read)
        patch.setattr(ListingDigest, "ready", lambda d, wait_s=0.0: wait_s > 0 and ready(d, wait_s))
        with pytest.raises(KeyboardInterrupt):
            write_shards(folder, out, format="tar", shard_size=10)
    assert sorted(os.listdir(out))[1:] == [".shard-tar.progress.jsonl"]
    notes: list[str] = []
    write_shards(folder, out, format="tar", shard_size=10, on_note=notes.append)
    assert notes and notes[0].startswith("resuming: the interrupted run wrote 1 shard of 3")
