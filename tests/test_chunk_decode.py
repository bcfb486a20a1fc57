"""A chunk of crops in one call of the compiled decoder (issue 34: the GIL held for almost
nothing): the same generator draws as numpy's, the same pixels as the per-sample path, one call
per chunk, and every file it cannot take left to the per-sample path (which names the error).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import prefetch
import prefetch.sample._reader as reader_module
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions
from prefetch.io import MAX_HEADER_SEGMENTS
from prefetch.plan import AUGMENT_STREAM, Augment, CenterCrop, RandomResizedCrop
from prefetch.sample import BatchTask, Slot
from prefetch.testing import draw_shape, write_bad_files

pytestmark = [pytest.mark.timeout(120), pytest.mark.compiled]

# Sizes (width, height): landscape, portrait, square, wide, and one under the target.
SIZES = ((160, 120), (120, 160), (128, 128), (200, 90), (40, 30))
TARGET = (48, 48)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JPEGs of five shapes (3 classes x 8), a gray one, a progressive one and a PNG."""
    root = tmp_path_factory.mktemp("chunk-photos")
    rng = np.random.default_rng(5)
    for class_index, name in enumerate(("circle", "square", "triangle")):
        (root / name).mkdir()
        for i in range(8):
            size = SIZES[(i + class_index) % len(SIZES)]
            draw_shape(name, size, rng).save(root / name / f"{i:02d}.jpg", quality=90)
    draw_shape("circle", (90, 70), rng).convert("L").save(root / "circle" / "gray.jpg")
    progressive = draw_shape("square", (100, 80), rng)
    progressive.save(root / "square" / "progressive.jpg", progressive=True)
    draw_shape("triangle", (70, 90), rng).save(root / "triangle" / "drawing.png")
    return root


def test_draws_are_numpys_default_rng_bit_for_bit() -> None:
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    rng = np.random.default_rng(0)
    cases = [(0, 0, 0), (1, 2, 3), (2**32 - 1, 2**32, 2**40), (2**64 - 1, 7, 0)]
    cases += [tuple(int(v) for v in rng.integers(0, 2**63, 3)) for _ in range(200)]
    cases += [tuple(int(v) for v in rng.integers(0, 1000, 3)) for _ in range(200)]
    for seed, epoch, index in cases:
        want = np.random.default_rng([seed, epoch, index, AUGMENT_STREAM]).random(25)
        got = np.frombuffer(jpeg.draws(seed, epoch, index, AUGMENT_STREAM, 25))
        np.testing.assert_array_equal(got, want, err_msg=str((seed, epoch, index)))


def crop_loader(files: Any, **options: Any) -> prefetch.Loader:
    """A one-thread Loader of training crops (flipped) at TARGET, batch 4, unless `options`
    say otherwise."""
    settings: dict[str, Any] = {
        "batch_size": 4,
        "image_size": TARGET,
        "workers": 1,
        "backend": "thread",
        "augment": Augment(RandomResizedCrop(), flip=True),
    }
    return prefetch.Loader(files, **{**settings, **options})


def read_all(photos: Path, chunked: bool, monkeypatch: pytest.MonkeyPatch, **options: Any) -> Any:
    """Every batch of two epochs, with the chunk path on or off."""
    on = window_decode.chunk_available
    monkeypatch.setattr(reader_module, "chunk_available", on if chunked else lambda *a: False)
    loader = prefetch.Loader(photos, batch_size=7, image_size=TARGET, workers=2, **options)
    with loader:
        return [(x.copy(), y.copy()) for _ in range(2) for x, y in loader]


@pytest.mark.parametrize(
    "options",
    [
        {"augment": Augment(RandomResizedCrop(), flip=True)},
        {"augment": Augment(RandomResizedCrop((0.5, 1.0), (0.5, 2.0)))},
        {"augment": Augment(CenterCrop(), flip=True)},
        {"augment": Augment(RandomResizedCrop(), flip=True), "antialias": True},
        {"augment": Augment(RandomResizedCrop(), flip=True), "color_mode": "grayscale"},
        {"augment": Augment(CenterCrop(0.5), flip=True), "interpolation": "nearest"},
        {"augment": Augment(RandomResizedCrop(), flip=True), "backend": "process"},
    ],
    ids=["random-flip", "random", "center-flip", "antialias", "gray", "nearest", "process"],
)
def test_the_chunk_path_gives_the_per_sample_paths_batches(
    photos: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    options = {"backend": "thread", "seed": 9, **options}
    want = read_all(photos, False, monkeypatch, **options)
    got = read_all(photos, True, monkeypatch, **options)
    assert len(got) == len(want)
    for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def test_one_call_a_chunk_and_what_it_cannot_take_goes_one_by_one(
    photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of 27 files is one call of decode_chunk per `CHUNK_ROWS` rows (8 here; each
    call holds its rows' files and windows in memory: a bound, not the whole part); the PNG
    and the progressive JPEG (and nothing else) are read by the per-sample window decoder."""
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    calls = {"decode_chunk": 0, "decode_window": 0}

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(jpeg, name)

        def decode_chunk(self, *args: Any) -> Any:
            calls["decode_chunk"] += 1
            return jpeg.decode_chunk(*args)

    def counting_window(*args: Any, **kwargs: Any) -> np.ndarray:
        calls["decode_window"] += 1
        return window_decode.decode_window(*args, **kwargs)

    monkeypatch.setattr(window_decode, "_jpegwindow", Counting())
    monkeypatch.setattr(reader_module, "CHUNK_ROWS", 8)
    monkeypatch.setattr(reader_module, "decode_window", counting_window)
    loader = crop_loader(photos)
    with loader:
        reader = loader._epochs.workers.reader  # type: ignore[attr-defined]
        count = len(loader.source)
        slot = Slot(
            np.empty((count, *TARGET, 3), np.uint8),
            np.empty(count, np.int32),
            started=np.zeros(count),
        )
        outcome = reader.read_into(BatchTask(np.arange(count), 0, 1), slot, 0, count, "test")
    assert count == 27
    assert calls == {"decode_chunk": 4, "decode_window": 2}  # 27 rows, 8 a call
    assert not outcome.skipped and len(outcome.read_s) == count
    assert not slot.started.any()  # every row's clock is stopped
    np.testing.assert_array_equal(slot.labels, loader.source.labels)  # type: ignore[attr-defined]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_bad_files_still_raise_or_skip_by_name(photos: Path, tmp_path: Path, on_error: str) -> None:
    """Files the chunk cannot decode go the per-sample way: named, or skipped and counted."""
    root = tmp_path / "photos"
    shutil.copytree(photos, root)
    bad = write_bad_files(root / "circle", ("corrupt", "truncated", "zero_byte", "text", "scans"))
    loader = crop_loader(root, batch_size=8, workers=2, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(Exception) as caught, loader:
            for _ in loader:
                pass
        notes = " ".join(getattr(caught.value, "__notes__", []))
        assert any(path.name in notes for path in bad.values()), notes
    else:
        with loader:
            seen = sum(len(labels) for _, labels in loader)
        assert seen == len(loader.source) - len(bad)


def test_an_image_over_max_pixels_is_refused_as_before(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    draw_shape("circle", (300, 200), np.random.default_rng(0)).save(tmp_path / "a" / "big.jpg")
    Image.new("RGB", (60, 50)).save(tmp_path / "a" / "small.jpg")
    loader = crop_loader(
        tmp_path,
        batch_size=2,
        augment=Augment(RandomResizedCrop()),
        on_error=prefetch.ErrorPolicy(max_pixels=10_000),
    )
    with pytest.raises(Image.DecompressionBombError, match="max_pixels"), loader:
        next(iter(loader))


@pytest.mark.parametrize(
    "crop",
    [RandomResizedCrop(), RandomResizedCrop((0.9, 1.0), (0.2, 0.3)), CenterCrop(0.33)],
    ids=["default", "narrow", "center"],
)
def test_windows_and_flips_are_the_plans_for_any_shape(tmp_path: Path, crop: Any) -> None:
    """Each sample's window (at its DCT scale) and flip are what `crop.box`, `dct_scale`,
    `scaled_box` and `Augment.flipped` give, for odd shapes, targets, seeds and indices."""
    rng = np.random.default_rng(1)
    sizes = [(int(w), int(h)) for w, h in rng.integers(8, 700, (24, 2))] + [(1, 300), (300, 1)]
    paths = []
    for number, size in enumerate(sizes):
        paths.append(tmp_path / f"{number}.jpg")
        Image.new("RGB", size, (number, 50, 90)).save(paths[-1])
    augment = Augment(crop, flip=True)
    options = DecodeOptions((7, 300))
    for seed, epoch in ((0, 0), (2**40 + 5, 2**33)):
        indices = [int(i) for i in rng.integers(0, 10**7, len(paths))]
        images = np.empty((len(paths), *options.shape), np.uint8)
        done, _ = window_decode.decode_chunk(
            [str(p) for p in paths],
            indices,
            list(range(len(paths))),
            seed,
            epoch,
            crop,
            True,
            options,
            images,
        )
        assert done.all()
        for number, ((width, height), index) in enumerate(zip(sizes, indices, strict=True)):
            generator = Augment.rng(seed, epoch, index)
            want = window_decode.decode_window(
                str(paths[number]), crop, generator, options, "turbo"
            )
            if augment.flipped(generator):
                want = want[:, ::-1]
            np.testing.assert_array_equal(images[number], want, err_msg=str((width, height)))


def test_a_url_is_never_handed_to_the_compiled_decoder(
    photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled decoder opens paths: `memory://bucket/x.jpg` opened as one is
    `memory:/bucket/x.jpg` under the working folder, somebody else's file. URLs (and
    `file://` paths, as plain paths) are read the per-sample way, through storage."""
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://chunk-{tmp_path.name}/a.jpg"
    real = photos / "circle" / "00.jpg"
    fsspec.filesystem("memory").pipe_file(url, real.read_bytes())
    handed: list[str] = []
    chunk = reader_module.decode_chunk

    def spy(paths: list[str], *args: Any) -> Any:
        handed.extend(paths)
        return chunk(paths, *args)

    monkeypatch.setattr(reader_module, "decode_chunk", spy)
    try:
        for location in (url, f"file://{real}", str(real)):
            source = prefetch.FileList([location] * 4, [0] * 4, class_names=["a"])
            with crop_loader(source, image_size=(32, 32)) as loader:
                assert sum(len(images) for images, _ in loader) == 4
    finally:
        fsspec.filesystem("memory").rm(url)
    assert handed and set(handed) == {str(real)}, set(handed)  # file:// too, as its path


def test_a_call_holds_at_most_chunk_bytes_and_a_larger_file_goes_alone(
    photos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40.4: memory per worker bounded in bytes, not rows. With a budget of two files,
    each call of the compiled decoder reads at most two; with a budget under one file, one a
    call; the rows are the same as in one call."""
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    paths = sorted(str(p) for p in photos.rglob("*.jpg") if "gray" not in p.name)[:12]
    sizes = [Path(p).stat().st_size for p in paths]
    options, crop = DecodeOptions(TARGET), RandomResizedCrop()
    handled: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(jpeg, name)

        def decode_chunk(self, *args: Any) -> Any:
            windows, table, count = jpeg.decode_chunk(*args)
            handled.append(count)
            return windows, table, count

    def decode(budget: int) -> np.ndarray:
        monkeypatch.setattr(window_decode, "CHUNK_BYTES", budget)
        images = np.zeros((len(paths), *options.shape), np.uint8)
        done, _ = window_decode.decode_chunk(
            paths,
            list(range(len(paths))),
            list(range(len(paths))),
            4,
            1,
            crop,
            True,
            options,
            images,
        )
        assert done.all()
        return images

    monkeypatch.setattr(window_decode, "_jpegwindow", Counting())
    whole = decode(1 << 40)
    assert handled == [len(paths)]
    handled.clear()
    budget = 2 * max(sizes)
    np.testing.assert_array_equal(decode(budget), whole)
    assert sum(handled) == len(paths) and len(handled) > 2, handled
    first = 0
    for count in handled:  # each call held at most the budget of files
        assert count == 1 or sum(sizes[first : first + count]) <= budget, (handled, sizes)
        first += count
    handled.clear()
    np.testing.assert_array_equal(decode(1), whole)
    assert handled == [1] * len(paths)


def test_a_caller_that_clears_its_list_of_paths_during_a_call_loses_no_sample(
    photos: Path, tmp_path: Path
) -> None:
    """Issue 45: the compiled decoder opens the files with the GIL released. A thread of the
    caller's that clears the list of paths meanwhile (freeing them; their memory is then
    reused) changes nothing the call reads: every JPEG is decoded. (The call read the paths
    where the list's bytes had been, and opened what was written there since: samples were
    left.) The list is cleared while the call reads its first file (48 MB, not a JPEG: left to
    the caller), before it opens the others."""
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    first = tmp_path / "first.bin"
    first.write_bytes(bytes(48 << 20))
    jpegs = sorted(str(p) for p in photos.rglob("*.jpg") if "progressive" not in p.name)
    names = [str(first), *jpegs]
    count = len(names)
    for _ in range(20):  # until the clear lands while the first file is read (almost always)
        paths = [os.fsencode(name) for name in names]  # the list holds their only references
        started = np.zeros(count)
        during: list[bool] = []
        thread = threading.Thread(target=clear_when_reading, args=(paths, started, during))
        thread.start()
        _, raw, handled = jpeg.decode_chunk(
            paths,
            list(range(count)),
            list(range(count)),
            3,
            0,
            AUGMENT_STREAM,
            2,  # a center crop
            (1.0, 0.0, 0.0, 0.0),
            False,
            *TARGET,
            3,
            -1,
            -1,
            1 << 40,
            MAX_HEADER_SEGMENTS,
            1 << 40,
            started,
        )
        thread.join()
        status = np.frombuffer(raw, np.int64).reshape(count, 6)[:, 0].tolist()
        assert handled == count and status == [1] + [0] * (count - 1), status
        if during == [True]:
            break
    assert during == [True], "the list was never cleared while the call read its first file"


def clear_when_reading(paths: list[bytes], started: np.ndarray, during: list[bool]) -> None:
    """Once row 0 of `started` says the call reads its first file: clear `paths`, make as many
    bytes of each of their sizes again (naming no file: the freed memory is reused for them),
    and append to `during` whether the call was still reading that file."""
    sizes = [len(path) for path in paths]
    deadline = time.monotonic() + 10
    while started[0] == 0 and time.monotonic() < deadline:
        pass
    paths.clear()
    reused = [b"/nowhere/" + b"x" * (size - 9) for size in sizes * 20]
    during.append(bool(started[0] != 0))
    del reused
