"""A file rewritten in place while it is read is refused, naming it, on both paths (issue 40.5):
it gave torn rows (the start of one version, the end of another), silently. The reads compare
the file's `fstat` before and after, as the shard index compares a shard's.
"""

from __future__ import annotations

import io
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
from prefetch.testing.rewrites import RewrittenAfterFirstRead, rewriting

# Reads tried before a rewrite must have overlapped one (a rewrite every 20 ms, a read of a
# few MB about a millisecond: about one read in ten overlaps; on a loaded machine more).
TRIES = 3000


def jpeg() -> bytes:
    buffer = io.BytesIO()
    draw_shape("circle", (160, 120), np.random.default_rng(0)).save(buffer, "JPEG")
    return buffer.getvalue()


def versions(size: int = 4 << 20) -> tuple[bytes, bytes]:
    """Two versions of one file, of the same size, that decode to the same pixels (the same
    JPEG, then different padding): a torn read of them decodes without an error, so only the
    check before and after the read can tell."""
    head = jpeg()
    return head + b"\0" * (size - len(head)), head + b"\1" * (size - len(head))


def test_a_file_rewritten_between_two_reads_of_it_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = versions(1 << 20)
    path = tmp_path / "photo.jpg"
    path.write_bytes(old)
    rewriter = RewrittenAfterFirstRead(path, new)
    monkeypatch.setattr(local_files, "os", rewriter)
    with pytest.raises(OSError, match="changed while it was read") as raised:
        read_local(str(path))
    assert rewriter.rewritten and repr(str(path)) in str(raised.value)
    assert read_local(str(path)) == new  # once written, it reads whole


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
        monkeypatch.setattr(local_files, "os", RewrittenAfterFirstRead(path, new))
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


def test_a_file_rewritten_by_another_writer_is_refused_by_the_python_read(
    tmp_path: Path,
) -> None:
    """A real writer thread, rewriting the file in place (same size, new bytes): a read that
    spanned a rewrite is refused. (The old read returned it, half one version and half the
    other.)"""
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
    a rewrite is not decoded there (the per-sample path then reads the file again, or names
    it). Both versions decode alike, so a torn read would have passed unseen."""
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
