"""Files changed while they are read, on both paths (issues 40.5 and 45).

The promise (docs/remote.md, "Files changed while they are read"): a file replaced by
rename while it is read is read whole, the old version or the new, and never refused (the check
compared the change time, which the rename moves: a whole read was refused); a file rewritten in
place is refused when its size or modification time moved while it was read (a torn read that
moves neither cannot be seen by any check of the file's metadata, and is not promised).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
import prefetch.io._local_files as local_files
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions
from prefetch.io import read_local
from prefetch.plan import Augment, CenterCrop
from prefetch.testing import draw_shape
from prefetch.testing.rewrites import ChangedWhileRead, rewriting

# Reads tried before a rewrite must have overlapped one (a rewrite every 20 ms, a read of a
# few MB about a millisecond: about one read in ten overlaps; on a loaded machine more).
TRIES = 3000

# Calls of the chunk path during which the file was replaced by rename, at the least, before
# the test ends: a read of 4 MB is most of a call, so many of them span a rename.
RENAMES_SPANNED = 30


def jpeg(shape: str = "circle") -> bytes:
    buffer = io.BytesIO()
    draw_shape(shape, (160, 120), np.random.default_rng(0)).save(buffer, "JPEG")
    return buffer.getvalue()


def padded(data: bytes, size: int, fill: bytes) -> bytes:
    """`data` (a JPEG) with `fill` bytes after its end, to `size` bytes: decodes like `data`."""
    return data + fill * (size - len(data))


def versions(size: int = 4 << 20) -> tuple[bytes, bytes]:
    """Two versions of one file, of the same size, that decode to the same pixels (the same
    JPEG, then different padding): a torn read of them decodes without an error, so only the
    check before and after the read can tell."""
    head = jpeg()
    return padded(head, size, b"\0"), padded(head, size, b"\1")


def two_images(size: int) -> tuple[bytes, bytes]:
    """Two versions of one file, of the same size, that decode to different pixels."""
    return padded(jpeg("circle"), size, b"\0"), padded(jpeg("square"), size, b"\0")


def test_a_file_rewritten_between_two_reads_of_it_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = versions(1 << 20)
    path = tmp_path / "photo.jpg"
    path.write_bytes(old)
    rewriter = ChangedWhileRead(path, new)
    monkeypatch.setattr(local_files, "os", rewriter)
    with pytest.raises(OSError, match="changed while it was read") as raised:
        read_local(str(path))
    assert rewriter.changed and repr(str(path)) in str(raised.value)
    assert read_local(str(path)) == new  # once written, it reads whole


@pytest.mark.parametrize("grows", [True, False], ids=["longer", "shorter"])
def test_a_rewrite_in_place_that_changes_the_size_is_refused_within_one_clock_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grows: bool
) -> None:
    """The rewrite keeps the file's modification time (as one within a coarse clock's tick
    does): its new size alone tells, wherever in the read it lands."""
    old = padded(jpeg(), 64 << 10, b"\0")
    new = padded(jpeg(), len(old) + (4096 if grows else -4096), b"\1")
    path = tmp_path / "photo.jpg"
    for at_read in range(1, len(old) // 4096 + 1):
        path.write_bytes(old)
        written = path.stat().st_mtime_ns
        rewriter = ChangedWhileRead(path, new, at_read=at_read, same_tick=True)
        monkeypatch.setattr(local_files, "os", rewriter)
        with pytest.raises(OSError, match="changed while it was read") as raised:
            read_local(str(path))
        assert rewriter.changed and repr(str(path)) in str(raised.value)
        assert path.stat().st_mtime_ns == written  # the time kept: the size told


def test_a_file_replaced_by_rename_while_read_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wherever in the read the rename lands (after each of the 4 KiB parts the fake reads),
    the read returns the version it opened, whole. (It was refused: the rename moved the old
    file's change time, which the check compared.)"""
    old, new = two_images(64 << 10)
    path = tmp_path / "photo.jpg"
    for at_read in range(1, len(old) // 4096 + 1):
        path.write_bytes(old)
        renamer = ChangedWhileRead(path, new, how="rename", at_read=at_read)
        monkeypatch.setattr(local_files, "os", renamer)
        assert read_local(str(path)) == old, at_read
        assert renamer.changed
        assert read_local(str(path)) == new
    assert sorted(os.listdir(tmp_path)) == ["photo.jpg"]  # the renamer's new files all renamed


def test_the_loader_names_a_file_rewritten_while_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the per-sample path of a thread loader (the rewrite is injected in this
    process): the error names the file, and on_error="skip" skips it."""
    (tmp_path / "a").mkdir()
    old, new = versions(1 << 20)
    for number in range(3):
        (tmp_path / "a" / f"{number}.jpg").write_bytes(old)
    path = tmp_path / "a" / "1.jpg"
    for on_error in ("raise", "skip"):
        path.write_bytes(old)
        monkeypatch.setattr(local_files, "os", ChangedWhileRead(path, new))
        loader = prefetch.Loader(
            tmp_path, batch_size=3, image_size=32, workers=1, backend="thread", on_error=on_error
        )
        if on_error == "raise":
            with pytest.raises(OSError, match="changed while it was read") as raised, loader:
                next(iter(loader))
            assert "1.jpg" in str(raised.value)
        else:
            with loader:
                assert sum(len(batch.labels) for batch in loader) == 2


def test_the_loader_reads_a_file_replaced_by_rename_while_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread loader's batch holds every sample, the replaced one decoded from the version
    it opened (the old loader raised "changed while it was read" for it)."""
    (tmp_path / "a").mkdir()
    old, new = two_images(1 << 20)
    for number in range(3):
        (tmp_path / "a" / f"{number}.jpg").write_bytes(old)
    path = tmp_path / "a" / "1.jpg"
    renamer = ChangedWhileRead(path, new, how="rename")
    monkeypatch.setattr(local_files, "os", renamer)

    def images() -> np.ndarray:
        loader = prefetch.Loader(
            tmp_path, batch_size=3, image_size=32, shuffle=False, workers=1, backend="thread"
        )
        with loader:
            (batch,) = [batch.images.copy() for batch in loader]
        return batch

    during = images()
    assert renamer.changed and len(during) == 3
    np.testing.assert_array_equal(during[1], during[0])  # the old version, whole
    after = images()
    assert not np.array_equal(after[1], after[0])  # the new version, now


def test_a_file_rewritten_by_another_writer_is_refused_by_the_python_read(
    tmp_path: Path,
) -> None:
    """A real writer thread, rewriting the file in place (same size, new bytes, a new
    modification time each): some read spans a rewrite that moves the time, and is refused.
    (Not every torn read is seen: one between two writes of a rewrite moves nothing.)"""
    path = tmp_path / "photo.jpg"
    first, second = versions()
    path.write_bytes(first)
    refused = 0
    with rewriting(path, [first, second]) as started:
        started.wait(10)
        for _ in range(TRIES):
            try:
                read_local(str(path))
            except OSError as error:
                assert "changed while it was read" in str(error)
                refused += 1
                break
    assert refused == 1


@pytest.mark.compiled
def test_a_file_rewritten_by_another_writer_is_left_by_the_chunk_path(tmp_path: Path) -> None:
    """The compiled chunk path reads with the same check (its twin in C): a read that spanned
    a rewrite that moved the time is not decoded there (the per-sample path then reads the
    file again, or names it). Both versions decode alike, so a torn read would have passed
    unseen."""
    path = tmp_path / "photo.jpg"
    first, second = versions()
    path.write_bytes(first)
    options = DecodeOptions(32)
    images = np.zeros((1, *options.shape), np.uint8)
    want = window_decode.decode_window(
        str(path), CenterCrop(), Augment.rng(0, 0, 0), options, "turbo"
    )
    left = 0
    with rewriting(path, [first, second]) as started:
        started.wait(10)
        for _ in range(TRIES):
            done, _ = window_decode.decode_chunk(
                [str(path)], [0], [0], 0, 0, CenterCrop(), False, options, images
            )
            if not done[0]:
                left += 1
                break
            np.testing.assert_array_equal(images[0], want)
    assert left == 1
    with Image.open(path) as image:
        assert image.size == (160, 120)


@pytest.mark.compiled
def test_a_file_replaced_by_rename_is_read_whole_by_the_chunk_path(tmp_path: Path) -> None:
    """A writer thread renames new versions (two different images) over the file while the
    chunk path reads it: every read is decoded there, to one version's pixels, never left (it
    was left to the per-sample path whenever the rename landed during the read)."""
    path = tmp_path / "photo.jpg"
    images_of = two_images(4 << 20)
    path.write_bytes(images_of[0])
    options = DecodeOptions(32)
    wants = []
    for data in images_of:
        path.write_bytes(data)
        wants.append(
            window_decode.decode_window(
                str(path), CenterCrop(), Augment.rng(0, 0, 0), options, "turbo"
            )
        )
    assert not np.array_equal(*wants)
    images = np.zeros((1, *options.shape), np.uint8)
    spanned, seen = 0, set()
    with rewriting(path, images_of, pause_s=0.001, how="rename") as started:
        started.wait(10)
        for _ in range(TRIES):
            inode = path.stat().st_ino
            done, _ = window_decode.decode_chunk(
                [str(path)], [0], [0], 0, 0, CenterCrop(), False, options, images
            )
            spanned += path.stat().st_ino != inode
            assert done[0], "a file replaced by rename while read was left by the chunk path"
            matches = [n for n, want in enumerate(wants) if np.array_equal(images[0], want)]
            assert matches, "the chunk path decoded neither version"
            seen.update(matches)
            if spanned >= RENAMES_SPANNED and len(seen) == 2:
                break
    assert spanned >= RENAMES_SPANNED and seen == {0, 1}
