"""A set of shards is read exactly as written (issue 35, item 1): where a folder holds a manifest,
the sources read exactly its shards and check each; other files are named and left alone; two
manifests, a journal, or a `classes.txt` that disagrees with the manifest are refused naming
them; `prefetch shards verify` checks at least what a reader checks, sizes first. Real sets
written by `prefetch shards write` in tmp_path, local and over HTTP."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

import prefetch
from prefetch.cli import main
from prefetch.sources.shards import Manifest
from prefetch.testing import serve_folder, write_bad_files, write_image_folder
from prefetch.testing.shards import write_tar, write_tfrecord
from prefetch.tools.shards import write_shards

COUNT = 24  # 3 classes of 8 images
SOURCES = {"tar": prefetch.TarSource, "tfrecord": prefetch.TFRecordSource}
MANIFESTS = {"tar": "shard-tar.manifest.json", "tfrecord": "shard-tfrecord.manifest.json"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images"), per_class=8)


def write_set(folder: Path, out: Path, format: str = "tar") -> Path:
    write_shards(folder, out, format=format, shard_size=5)  # 5, 5, 5, 5, 4
    return out


def leave_journal(out: Path, format: str = "tar") -> None:
    """Turn the set's manifest into the journal an interrupted commit leaves."""
    path = out / MANIFESTS[format]
    manifest = Manifest.from_bytes(path.read_bytes(), str(path))
    path.write_bytes(dataclasses.replace(manifest, complete=False).to_bytes())


def some_tar(path: Path, count: int = 3) -> None:
    write_tar(path, [(f"x{i}", b"\xff\xd8 not an image", 0) for i in range(count)])


# ---------------------------------------------------------------- the cases


def test_a_journal_beside_an_empty_foreign_tar_is_refused_naming_the_journal(
    folder: Path, tmp_path: Path
) -> None:
    out = write_set(folder, tmp_path / "out")
    leave_journal(out)
    (out / "notes.tar").write_bytes(b"")
    with pytest.raises(ValueError, match="did not finish") as raised:
        prefetch.TarSource(out)
    assert str(out / MANIFESTS["tar"]) in str(raised.value)


def test_a_shard_of_the_wrong_size_beside_an_unrelated_set_is_refused(
    folder: Path, tmp_path: Path
) -> None:
    out = write_set(folder, tmp_path / "out")
    some_tar(out / "x-000000.tar")
    with open(out / "shard-000003.tar", "ab") as file:
        file.write(bytes(1024))  # still a valid tar of the same samples
    with pytest.raises(ValueError, match="the shard changed") as raised:
        prefetch.TarSource(out)
    assert str(out / "shard-000003.tar") in str(raised.value)


def test_a_tfrecord_journal_beside_a_backup_file_is_refused(folder: Path, tmp_path: Path) -> None:
    out = write_set(folder, tmp_path / "out", "tfrecord")
    shutil.copy(out / "shard-00000-of-00005.tfrecord", out / "old.tfrecord.bak")
    leave_journal(out, "tfrecord")
    with pytest.raises(ValueError, match="did not finish") as raised:
        prefetch.TFRecordSource(out)
    assert str(out / MANIFESTS["tfrecord"]) in str(raised.value)


@pytest.mark.parametrize("format", ["tar", "tfrecord"])
def test_foreign_files_are_named_in_one_line_and_left_alone(
    folder: Path, tmp_path: Path, format: str, caplog: pytest.LogCaptureFixture
) -> None:
    out = write_set(folder, tmp_path / "out", format)
    if format == "tar":
        some_tar(out / "notes.tar")
        some_tar(out / "x-000000.tar")
        foreign = ["notes.tar", "x-000000.tar"]
    else:
        shutil.copy(out / "shard-00000-of-00005.tfrecord", out / "old.tfrecord.bak")
        foreign = ["old.tfrecord.bak"]
    with caplog.at_level(logging.WARNING, logger="prefetch.loader"):
        source = SOURCES[format](out)
    assert len(source) == COUNT and len(source.shards) == 5
    assert sorted(source.paths.tolist()) == sorted(set(source.paths.tolist()))  # none twice
    lines = [r.getMessage() for r in caplog.records if "left alone" in r.getMessage()]
    assert len(lines) == 1 and all(repr(name) in lines[0] for name in foreign)
    if format == "tar":  # a pattern that picks the foreign files too reads the same set
        assert len(prefetch.TarSource(out / "*.tar")) == COUNT


def test_two_manifests_of_one_format_are_refused_naming_both(folder: Path, tmp_path: Path) -> None:
    out = write_set(folder, tmp_path / "out")
    write_shards(folder, out, format="tar", shard_size=10, prefix="other")
    with pytest.raises(ValueError, match="holds 2 manifests of tar shards") as raised:
        prefetch.TarSource(out)
    assert "'other-tar.manifest.json'" in str(raised.value)
    assert "'shard-tar.manifest.json'" in str(raised.value)
    assert len(prefetch.TarSource(out / "other-*.tar")) == COUNT  # one set by its pattern
    assert main(["shards", "verify", str(out)]) == 1


def test_a_pattern_of_foreign_files_only_reads_them_without_the_manifest(
    folder: Path, tmp_path: Path
) -> None:
    out = write_set(folder, tmp_path / "out")
    some_tar(out / "x-000000.tar", count=3)
    assert len(prefetch.TarSource(out / "x-*.tar", label_ext="")) == 3


def test_an_edited_class_list_is_refused_naming_the_manifest_and_classes_txt(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_set(folder, tmp_path / "out")
    path = out / MANIFESTS["tar"]
    raw = json.loads(path.read_text())
    raw["class_names"] = raw["class_names"][::-1]
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="one of them was edited") as raised:
        prefetch.TarSource(out)
    assert str(path) in str(raised.value) and str(out / "classes.txt") in str(raised.value)
    assert main(["shards", "verify", str(out)]) == 1
    assert "classes.txt" in capsys.readouterr().out


# ---------------------------------------------------------------- verify


def test_verify_fails_on_an_extra_shard_of_the_sets_names(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_set(folder, tmp_path / "out")
    shutil.copy(out / "shard-000001.tar", out / "shard-000007.tar")
    with pytest.raises(ValueError, match="not in the manifest"):
        prefetch.TarSource(out)
    assert main(["shards", "verify", str(out)]) == 1
    assert "shard-000007.tar: not in the manifest" in capsys.readouterr().out


def test_verify_fails_on_a_changed_sample_count(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_set(folder, tmp_path / "out")
    path = out / MANIFESTS["tar"]
    raw = json.loads(path.read_text())
    raw["shards"][2]["samples"] = 6
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="holds 5 samples but"):
        prefetch.TarSource(out)
    assert main(["shards", "verify", str(out)]) == 1
    assert "shard-000002.tar: 5 samples, the manifest says 6" in capsys.readouterr().out


@pytest.mark.timeout(30)  # hashing 20 GiB would take a minute or more: the size is enough
def test_verify_compares_sizes_before_hashing_a_huge_sparse_shard(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = write_set(folder, tmp_path / "out")
    os.truncate(out / "shard-000004.tar", 20 << 30)  # sparse: nothing on disk
    with pytest.raises(ValueError, match="the shard changed"):
        prefetch.TarSource(out)
    assert main(["shards", "verify", str(out)]) == 1
    assert f"shard-000004.tar: {20 << 30} bytes, the manifest says" in capsys.readouterr().out


def test_verify_mentions_classes_txt_only_where_there_is_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["shards", "verify", str(tmp_path)]) == 2
    assert "classes.txt" not in capsys.readouterr().err
    (tmp_path / "classes.txt").write_text("a\n")
    assert main(["shards", "verify", str(tmp_path)]) == 2
    assert "classes.txt alone is not one" in capsys.readouterr().err


# ---------------------------------------------------------------- over HTTP


@pytest.mark.usefixtures("fsspec_io_thread")
def test_a_url_folder_is_its_manifests_set_with_or_without_its_trailing_slash(
    folder: Path, tmp_path: Path
) -> None:
    out = write_set(folder, tmp_path / "site" / "out")
    some_tar(out / "notes.tar")
    with serve_folder(tmp_path / "site") as base:
        for url in (f"{base}out/", f"{base}out"):
            source = prefetch.TarSource(url)
            assert len(source) == COUNT and len(source.shards) == 5, url
        leave_journal(out)
        for url in (f"{base}out/", f"{base}out"):
            with pytest.raises(ValueError, match="did not finish"):
                prefetch.TarSource(url)


# ---------------------------------------------------------------- messages that know the format


def jpeg(value: int, size: int = 16) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (value, 0, 0)).save(buffer, "JPEG")
    return buffer.getvalue()


def test_a_shard_of_the_other_format_is_named_as_what_it_is(folder: Path, tmp_path: Path) -> None:
    tar = tmp_path / "a.tar"
    write_tar(tar, [("0", jpeg(1), 0)])
    record = tmp_path / "a.tfrecord"
    write_tfrecord(record, [(jpeg(1), 0)])
    with pytest.raises(ValueError, match="is a tar archive, not a TFRecord file") as raised:
        prefetch.TFRecordSource([tar])
    assert "read it with prefetch.TarSource" in str(raised.value)
    assert "on_error" not in str(raised.value)
    with pytest.raises(ValueError, match="is a TFRecord file, not a tar archive") as raised:
        prefetch.TarSource([record])
    assert "read it with prefetch.TFRecordSource" in str(raised.value)
    assert "on_error" not in str(raised.value)


def test_a_gzip_stream_says_what_it_holds_and_what_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord"
    write_tar(tmp_path / "inner.tar", [("0", jpeg(1), 0)])
    path.write_bytes(gzip.compress((tmp_path / "inner.tar").read_bytes()))
    with pytest.raises(ValueError, match=r"gzip-compressed tar \(a \.tar\.gz\)") as raised:
        prefetch.TFRecordSource([path])
    assert "gunzip -c shard.tfrecord" in str(raised.value)
    assert "read it with prefetch.TarSource" in str(raised.value)


@pytest.mark.usefixtures("fsspec_io_thread")
def test_an_html_page_is_named_as_one_locally_and_at_a_url(tmp_path: Path) -> None:
    page = b"<!DOCTYPE HTML>\n<html><head><title>Directory listing for /s</title></head>\n"
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "listing.tar").write_bytes(page + b"<body>" + b" " * 600 + b"</body>")
    with pytest.raises(ValueError, match="is an HTML page") as raised:
        prefetch.TarSource([tmp_path / "s" / "listing.tar"])
    assert "on_error" not in str(raised.value)
    with serve_folder(tmp_path) as base:
        with pytest.raises(ValueError, match="is an HTML page") as raised:
            prefetch.TarSource(f"{base}s/listing.tar")
        assert f"{base}s/*.tar" in str(raised.value)


def test_a_damaged_shard_gets_no_skip_advice_when_made_or_when_skipping_is_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "shard.tfrecord"
    write_tfrecord(path, [(jpeg(value), value % 2) for value in range(6)])
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF  # inside the last record's image: its data CRC no longer matches
    path.write_bytes(bytes(data))
    source = prefetch.TFRecordSource(path)
    with (
        caplog.at_level(logging.WARNING, logger="prefetch.loader"),
        prefetch.Loader(
            source, batch_size=3, image_size=(8, 8), shuffle=False, on_error="skip", workers=1
        ) as loader,
    ):
        images = sum(len(batch.images) for batch in loader)
    assert images == 5
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skipped and all("on_error" not in line for line in skipped)
    data[13] = 0 if data[13] else 1  # the first record's length CRC: damaged when made
    path.write_bytes(bytes(data))
    with pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TFRecordSource(path)
    assert "on_error" not in str(raised.value)


# ---------------------------------------------------------------- the newcomer's nits (item 6)


def test_a_set_written_twice_from_a_folder_with_bad_files_has_the_same_manifest_bytes(
    tmp_path: Path,
) -> None:
    images = write_image_folder(tmp_path / "images", per_class=3)
    write_bad_files(images / "square", ["text", "zero_byte", "corrupt"])
    manifests = []
    for out in ("one", "two"):  # two processes: an object's address differs between them
        done = subprocess.run(
            [sys.executable, "-m", "prefetch", "shards", "write", str(images), str(tmp_path / out)],
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert " at 0x" not in done.stdout, done.stdout
        manifests.append((tmp_path / out / MANIFESTS["tar"]).read_bytes())
    assert manifests[0] == manifests[1]
    assert b" at 0x" not in manifests[0] and b"not an image" in manifests[0]


def test_a_folder_of_the_other_format_or_of_images_says_what_reads_it(
    folder: Path, tmp_path: Path
) -> None:
    out = write_set(folder, tmp_path / "tfr", "tfrecord")
    with pytest.raises(FileNotFoundError, match="but 5 TFRecord shards") as raised:
        prefetch.TarSource(out)
    assert "read them with prefetch.TFRecordSource" in str(raised.value)
    with pytest.raises(
        FileNotFoundError, match=r"no TFRecord shards .* an image folder .*`prefetch shards write"
    ):
        prefetch.TFRecordSource(folder)
