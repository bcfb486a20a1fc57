"""Bad input through both worker backends, under on_error="raise" and on_error="skip".

The files: good JPEGs, the odd-but-valid images of `prefetch.testing.write_odd_images`
(grayscale JPEG, CMYK JPEG, 16-bit PNG, palette PNG with transparency), and one bad file of
each kind of `write_bad_files`: corrupt, truncated, zero-byte, non-image text, a decompression
bomb, a JPEG of too many scans and (in a subprocess, see below) a file without read
permission. A `FileList` gives every file its own label, its position in the list, so each
delivered row names its file whatever the backend and the order; its pixels are then compared
with what that file must give.

The unreadable file: root reads a mode-000 file anyway (CAP_DAC_OVERRIDE), so its tests run the
loaders in a subprocess that first drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its
capability bounding set and re-executes Python; as any other user the file is unreadable as is.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, UnidentifiedImageError

import prefetch
from prefetch import DecodeOptions, FileList, Loader
from prefetch.decode._choice import get_decoder
from prefetch.testing import OddImage, write_bad_files, write_image_folder, write_odd_images

pytestmark = pytest.mark.timeout(60)

BACKENDS = ("thread", "process")
# The target (height, width): the odd images are written at this size, so they arrive unresized
# and their pixels can be compared exactly; the good JPEGs (24x20) are resized.
SIZE = (16, 16)
# What Pillow raises for each bad kind that every user can produce in this process (for a JPEG
# of too many scans, prefetch raises Pillow's bomb error before Pillow runs).
PILLOW_ERRORS: dict[str, type[Exception]] = {
    "corrupt": UnidentifiedImageError,
    "truncated": OSError,
    "zero_byte": UnidentifiedImageError,
    "text": UnidentifiedImageError,
    "bomb": Image.DecompressionBombError,
    "scans": Image.DecompressionBombError,
}
WORKER_NAMES = {"thread": "prefetch-worker-", "process": "prefetch-process-"}


@dataclass
class Files:
    """The written files, by kind."""

    good: list[Path]
    odd: dict[str, OddImage]
    bad: dict[str, Path]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("bad_input")
    write_image_folder(root / "good", class_names=("good",), per_class=7, size=(24, 20))
    good = sorted((root / "good" / "good").iterdir())
    odd = write_odd_images(root / "odd", size=(SIZE[1], SIZE[0]))
    bad = write_bad_files(root / "bad", kinds=tuple(PILLOW_ERRORS))
    return Files(good, odd, bad)


def labelled(paths: list[Path]) -> FileList:
    """The files with label i for paths[i], so that a label names its file."""
    return FileList(paths, list(range(len(paths))), [p.name for p in paths])


def expected_image(path: Path, files: Files, channels: int = 3) -> tuple[np.ndarray, int]:
    """What the loader must deliver for `path`, and the tolerance per channel."""
    for odd in files.odd.values():
        if odd.path == path:
            rgba = odd.rgba
            return (rgba[..., :3] if channels == 3 else rgba), odd.tolerance
    return get_decoder("auto")(str(path), DecodeOptions(SIZE, channels)), 0  # the Loader's


def assert_image_of(image: np.ndarray, path: Path, files: Files) -> None:
    want, tolerance = expected_image(path, files, image.shape[-1])
    difference = np.abs(image.astype(np.int16) - want.astype(np.int16))
    assert difference.max() <= tolerance, f"{path.name}: pixels off by up to {difference.max()}"


def all_notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


# --- the files themselves -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(PILLOW_ERRORS))
def test_each_bad_file_makes_the_default_decoder_raise_what_pillow_raises(
    files: Files, kind: str
) -> None:
    with pytest.raises(Exception) as raised:
        prefetch.decode_image(str(files.bad[kind]), DecodeOptions(SIZE))
    assert type(raised.value) is PILLOW_ERRORS[kind]


def test_the_bomb_is_a_small_file_that_pillow_refuses_at_its_default_limit(files: Files) -> None:
    bomb = files.bad["bomb"]
    assert bomb.stat().st_size < 64 * 1024
    assert Image.MAX_IMAGE_PIXELS == prefetch.testing.PILLOW_DEFAULT_MAX_PIXELS
    with pytest.raises(Image.DecompressionBombError):
        Image.open(bomb)


# --- odd but valid images -------------------------------------------------------------------------


@pytest.mark.parametrize("color_mode", ["rgb", "rgba"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_odd_but_valid_images_are_converted_correctly_and_never_errors(
    files: Files, backend: str, color_mode: str
) -> None:
    paths = [odd.path for odd in files.odd.values()]
    loader = Loader(
        labelled(paths),
        batch_size=3,
        image_size=SIZE,
        workers=2,
        shuffle=False,
        color_mode=color_mode,
        backend=backend,
    )
    with loader:
        batches = [(images.copy(), labels.copy()) for images, labels in loader]
    labels = np.concatenate([labels for _, labels in batches])
    assert labels.tolist() == list(range(len(paths)))
    for image, label in zip(np.concatenate([images for images, _ in batches]), labels, strict=True):
        assert_image_of(image, paths[label], files)
    assert loader.stats().skipped == 0


# --- on_error="skip" ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_delivers_every_readable_image_once_and_counts_each_bad_file(
    files: Files, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="prefetch")
    odd = [image.path for image in files.odd.values()]
    bad = list(files.bad.values())
    paths = [*files.good[:3], *odd[:2], *bad, *files.good[3:], *odd[2:]]
    readable = {i for i, path in enumerate(paths) if path not in bad}
    loader = Loader(
        labelled(paths),
        batch_size=4,
        image_size=SIZE,
        workers=2,
        seed=5,
        on_error="skip",
        backend=backend,
    )
    epochs = 2
    with loader:
        for _ in range(epochs):
            delivered: dict[int, np.ndarray] = {}
            for images, labels in loader:
                for image, label in zip(images, labels, strict=True):
                    assert int(label) not in delivered, f"{paths[label].name} delivered twice"
                    delivered[int(label)] = image.copy()
            assert set(delivered) == readable
            for label, image in delivered.items():
                assert_image_of(image, paths[label], files)
    stats = loader.stats()
    assert stats.images == epochs * len(readable)
    assert stats.skipped == epochs * len(bad)
    assert sorted(stats.skipped_paths) == sorted(str(path) for path in bad * epochs)
    assert all(str(path) in caplog.text for path in bad), "each skipped file is logged"


# --- on_error="raise" ---------------------------------------------------------------------------


def raise_case_paths(files: Files, bad: Path) -> list[Path]:
    """Batches of 3: [4 odd images and 2 good ones] in batches 0-1, then `bad` in batch 2."""
    odd = [image.path for image in files.odd.values()]
    return [*odd[:2], files.good[0], *odd[2:], files.good[1], files.good[2], bad, *files.good[3:]]


@pytest.mark.parametrize("kind", sorted(PILLOW_ERRORS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_raise_stops_at_the_bad_files_batch_with_its_own_error_and_a_note(
    files: Files, backend: str, kind: str
) -> None:
    bad = files.bad[kind]
    paths = raise_case_paths(files, bad)
    loader = Loader(
        labelled(paths), batch_size=3, image_size=SIZE, workers=2, shuffle=False, backend=backend
    )
    delivered = []
    with pytest.raises(PILLOW_ERRORS[kind]) as raised, loader:
        for images, labels in loader:
            delivered.append((images.copy(), labels.copy()))
    assert type(raised.value) is PILLOW_ERRORS[kind], "the error keeps its original type"
    notes = all_notes(raised.value)
    assert str(bad) in notes and WORKER_NAMES[backend] in notes
    assert [labels.tolist() for _, labels in delivered] == [[0, 1, 2], [3, 4, 5]]
    for images, labels in delivered:
        for image, label in zip(images, labels, strict=True):
            assert_image_of(image, paths[label], files)


# --- a file without read permission, in a subprocess without root's override -------------------

# Run as `python -c DROP_DAC_CAPABILITIES script args...`: drop the capabilities that let root
# read any file from the bounding set, then exec Python again (root's capabilities are
# recomputed from the bounding set on exec, and spawned workers inherit it).
DROP_DAC_CAPABILITIES = """
import ctypes, os, sys
PR_CAPBSET_DROP, DAC_CAPABILITIES = 24, (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
with open("/proc/self/status") as status:
    effective = int(next(l for l in status if l.startswith("CapEff:")).split()[1], 16)
if any(effective >> cap & 1 for cap in DAC_CAPABILITIES):
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in DAC_CAPABILITIES:
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            sys.exit(f"cannot drop capability {cap}: errno {ctypes.get_errno()}")
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""

UNREADABLE_SCRIPT = """
import json, os, sys
import prefetch

if __name__ == "__main__":
    paths, unreadable = json.loads(sys.argv[1]), sys.argv[2]
    report = {"readable": os.access(unreadable, os.R_OK), "runs": {}}
    for backend in ("thread", "process"):
        for on_error in ("raise", "skip"):
            loader = prefetch.Loader(
                prefetch.FileList(paths, list(range(len(paths)))), batch_size=2,
                image_size=(8, 8), workers=2, shuffle=False, on_error=on_error, backend=backend)
            labels, error = [], None
            try:
                with loader:
                    for _, batch_labels in loader:
                        labels.append(batch_labels.tolist())
            except Exception as caught:
                error = {"type": type(caught).__name__, "notes": getattr(caught, "__notes__", [])}
            report["runs"][f"{backend}-{on_error}"] = {
                "labels": labels, "error": error,
                "skipped_paths": list(loader.stats().skipped_paths)}
    print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def unreadable_runs(
    files: Files, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """Both backends under both on_error values, on [good x3, unreadable, good x2], batch 2."""
    folder = tmp_path_factory.mktemp("unreadable")
    unreadable = write_bad_files(folder, kinds=("unreadable",))["unreadable"]
    paths = [*files.good[:3], unreadable, *files.good[3:5]]
    script = folder / "load_unreadable.py"
    script.write_text(textwrap.dedent(UNREADABLE_SCRIPT))
    command = [sys.executable, "-c", DROP_DAC_CAPABILITIES, str(script)]
    result = subprocess.run(
        [*command, json.dumps([str(p) for p in paths]), str(unreadable)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    if "cannot drop capability" in result.stderr:
        pytest.skip(f"cannot make a file unreadable here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    if report["readable"]:
        pytest.skip("the mode-000 file stayed readable without CAP_DAC_OVERRIDE")
    return unreadable, report["runs"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unreadable_file_raises_permission_error_naming_it_after_the_good_batches(
    unreadable_runs: tuple[Path, dict[str, Any]], backend: str
) -> None:
    unreadable, runs = unreadable_runs
    run = runs[f"{backend}-raise"]
    assert run["error"] is not None and run["error"]["type"] == "PermissionError"
    notes = "\n".join(run["error"]["notes"])
    assert str(unreadable) in notes and WORKER_NAMES[backend] in notes
    assert run["labels"] == [[0, 1]], "the batch before the unreadable file was delivered"


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_drops_an_unreadable_file_and_delivers_the_rest(
    unreadable_runs: tuple[Path, dict[str, Any]], backend: str
) -> None:
    unreadable, runs = unreadable_runs
    run = runs[f"{backend}-skip"]
    assert run["error"] is None
    assert run["labels"] == [[0, 1], [2], [4, 5]]
    assert run["skipped_paths"] == [str(unreadable)]
