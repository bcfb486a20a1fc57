"""Recipe-resolution shards: `prefetch shards write --fit-crop SIZE [--fit-crop-quality Q]`
(real image folders, real JPEG and PNG files, real shards read back)."""

from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.cli import main
from prefetch.testing import write_image_folder
from prefetch.tools.fit_crop import DEFAULT_QUALITY, fit_image, fitted_size
from prefetch.tools.shard_writer import write_shards

MANIFEST = "shard-tar.manifest.json"
LARGE = {  # name in the folder: ((width, height), format); all larger than --fit-crop 224 needs
    "circle/large.jpg": ((1200, 1000), "JPEG"),
    "square/wide.png": ((1800, 500), "PNG"),
}


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A folder of small 48x40 JPEGs (kept as they are) and the `LARGE` images (resized)."""
    root = write_image_folder(tmp_path / "images", per_class=2)
    rng = np.random.default_rng(1)
    for name, ((width, height), kind) in LARGE.items():
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / name, kind)
    return root


def stored_images(out: Path, folder: Path) -> dict[str, bytes]:
    """The image bytes in `out`'s one tar shard (written unshuffled), by name in `folder`."""
    with tarfile.open(out / "shard-000000.tar") as archive:
        members = {
            member.name: archive.extractfile(member).read()  # type: ignore[union-attr]
            for member in archive.getmembers()
        }
    listing = prefetch.ImageFolder(folder)
    return {
        Path(path).relative_to(folder).as_posix(): members[
            f"{number:09d}{Path(path).suffix.lower()}"
        ]
        for number, path in enumerate(listing.paths.tolist())
    }


def originals(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*.*")}


@pytest.mark.parametrize("size", [(1000, 1000), (4000, 3000), (3000, 4000), (6000, 1000)])
def test_fitted_sizes_keep_every_crop_window_at_least_the_target_and_are_the_smallest(
    size: tuple[int, int],
) -> None:
    width, height = size
    fitted = fitted_size(width, height, 224)
    assert fitted is not None
    fitted_width, fitted_height = fitted
    assert abs((fitted_width / fitted_height) / (width / height) - 1) < 0.01  # proportions
    rng = np.random.default_rng(0)
    crop = prefetch.RandomResizedCrop()
    boxes = [crop.box(fitted_height, fitted_width, (224, 224), rng) for _ in range(4000)]
    assert min(min(box.height, box.width) for box in boxes) >= 224
    # the smallest: one pixel less on each side lets the recipe's smallest window under 224
    smallest_area = 0.08 * (fitted_width - 1) * (fitted_height - 1)
    assert math.sqrt(smallest_area * 3 / 4) < 224
    assert fitted_size(fitted_width, fitted_height, 224) is None  # fitted once is fitted


def test_fit_crop_resizes_large_images_at_quality_90_keeps_small_ones_byte_for_byte_and_records_it(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["shards", "write", str(images), str(out), "--fit-crop", "224", "--no-shuffle"]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert "--fit-crop 224: 2 images re-encoded smaller (lossy, JPEG quality 90)" in summary
    before = originals(images)
    for name, data in stored_images(out, images).items():
        if name in LARGE:
            (width, height), kind = LARGE[name]
            with Image.open(io.BytesIO(data)) as image:
                assert image.format == kind
                assert image.size == fitted_size(width, height, 224)
            assert data == fit_image(before[name], 224, 90)[0]  # encoded at quality 90
        else:
            assert data == before[name]
    manifest = json.loads((out / MANIFEST).read_text())
    assert DEFAULT_QUALITY == 90
    assert manifest["options"]["fit_crop"] == {
        "size": 224,
        "scale": [0.08, 1.0],
        "ratio": [0.75, 4 / 3],
        "jpeg_quality": 90,
        "resized": 2,
    }


def test_a_given_quality_is_used_and_recorded_and_small_images_stay_byte_for_byte(
    images: Path, tmp_path: Path
) -> None:
    stored = {}
    for quality in (50, 95):
        out = tmp_path / f"q{quality}"
        write_shards(
            images, out, format="tar", shard_size=100, shuffle=False, fit_crop=224,
            fit_crop_quality=quality,
        )  # fmt: skip
        manifest = json.loads((out / MANIFEST).read_text())
        assert manifest["options"]["fit_crop"]["jpeg_quality"] == quality
        stored[quality] = stored_images(out, images)
    before = originals(images)
    jpeg = "circle/large.jpg"
    assert stored[50][jpeg] == fit_image(before[jpeg], 224, 50)[0]
    sizes = set()
    for quality in (50, 95):
        with Image.open(io.BytesIO(stored[quality][jpeg])) as image:
            sizes.add(image.size)
    assert sizes == {fitted_size(1200, 1000, 224)}  # the same fitted size at both qualities
    assert len(stored[50][jpeg]) < len(stored[95][jpeg]) * 0.6  # fewer bytes at 50
    assert stored[50]["square/wide.png"] == stored[95]["square/wide.png"]  # PNG: lossless
    for name, data in before.items():
        if name not in LARGE:
            assert stored[50][name] == stored[95][name] == data


@pytest.mark.parametrize("quality", [0, 101, -5, True, 90.0, "90"])
def test_a_bad_quality_is_refused_naming_it_and_the_fix(
    images: Path, tmp_path: Path, quality: object
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"fit_crop_quality must be an int from 1 to 100") as info:
        write_shards(
            images, out, format="tar", shard_size=10, fit_crop=224,
            fit_crop_quality=quality,  # type: ignore[arg-type]
        )  # fmt: skip
    assert repr(quality) in str(info.value) and "pass 90" in str(info.value)
    assert not out.exists()


@pytest.mark.parametrize("text", ["0", "101", "high"])
def test_the_command_refuses_a_bad_quality_naming_it_and_the_fix(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    out = tmp_path / "out"
    argv = ["shards", "write", str(images), str(out), "--fit-crop", "224"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--fit-crop-quality", text])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--fit-crop-quality" in error and "from 1 to 100" in error and "pass 90" in error
    assert f"got {text}:" in error or f"got {text!r}:" in error
    assert not out.exists()


def test_a_quality_without_fit_crop_is_refused(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["shards", "write", str(images), str(out), "--fit-crop-quality", "95"])
    assert exit_info.value.code == 2
    assert "--fit-crop-quality 95 needs --fit-crop SIZE" in capsys.readouterr().err
    with pytest.raises(ValueError, match="fit_crop_quality=95 without fit_crop does nothing"):
        write_shards(images, out, format="tar", shard_size=10, fit_crop_quality=95)
    assert not out.exists()


def test_a_set_whose_manifest_predates_the_quality_still_reads_and_verifies(
    images: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    write_shards(images, out, format="tar", shard_size=100, fit_crop=224)
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest["options"]["fit_crop"]["jpeg_quality"]  # as an older writer recorded it
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert len(prefetch.TarSource(out)) == len(originals(images))
    assert main(["shards", "verify", str(out)]) == 0
    assert ": OK" in capsys.readouterr().out
