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
from prefetch.decode import DecodeOptions, decode_bytes
from prefetch.testing import write_image_folder
from prefetch.testing.bombs import write_scan_bomb
from prefetch.tools.shards import DEFAULT_QUALITY, fit_image, fitted_size, write_shards

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
    stored = {}
    for number, path in enumerate(listing.paths.tolist()):
        member = f"{number:09d}{Path(path).suffix.lower()}"
        if member in members:  # else skipped
            stored[Path(path).relative_to(folder).as_posix()] = members[member]
    return stored


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


# ---------------------------------------------------------------- what the loader reads, kept


def ramp(width: int, height: int, top: int) -> np.ndarray:
    """A smooth diagonal gradient from 0 to `top` (resampling changes it little)."""
    return np.add.outer(np.linspace(0, top / 2, height), np.linspace(0, top / 2, width))


def loader_pixels(data: bytes, size: tuple[int, int], channels: int) -> np.ndarray:
    """What the loader reads from the image `data` at `size` (width, height)."""
    options = DecodeOptions((size[1], size[0]), channels=channels, antialias=True)
    return decode_bytes(data, options).astype(np.int64)


@pytest.fixture
def kinds(tmp_path: Path) -> Path:
    """Large images of the kinds the loader converts: 16-bit gray PNG, transparent palette PNG,
    CMYK JPEG, and an RGB JPEG whose EXIF says to rotate it."""
    root = tmp_path / "kinds"
    for name in ("gray16", "palette", "cmyk", "exif"):
        (root / name).mkdir(parents=True)
    wide = ramp(1200, 1000, 65535).astype(np.uint16)
    Image.fromarray(wide).save(root / "gray16" / "a.png")  # mode I;16
    palette = Image.fromarray(ramp(1200, 1000, 255).astype(np.uint8)).convert(
        "P", palette=Image.Palette.ADAPTIVE, colors=64
    )
    palette.save(root / "palette" / "a.png", transparency=0)
    levels = ramp(1200, 1000, 255).astype(np.uint8)
    cmyk = np.stack([levels, 255 - levels, levels // 2, np.full_like(levels, 40)], axis=-1)
    Image.fromarray(cmyk, "CMYK").save(root / "cmyk" / "a.jpg", quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90
    rgb = np.stack([levels, levels[::-1], 255 - levels], axis=-1)
    Image.fromarray(rgb).save(root / "exif" / "a.jpg", quality=95, exif=exif.tobytes())
    return root


def test_fit_crop_stores_what_the_loader_reads_from_16_bit_palette_cmyk_and_exif_images(
    kinds: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    write_shards(kinds, out, format="tar", shard_size=100, shuffle=False, fit_crop=224)
    before = originals(kinds)
    for name, data in stored_images(out, kinds).items():
        with Image.open(io.BytesIO(data)) as image:
            size = image.size
            assert size == fitted_size(1200, 1000, 224), name
            mode, orientation = image.mode, image.getexif().get(0x0112)
        channels = 4 if name.startswith("palette") else 3
        stored = loader_pixels(data, size, channels)
        original = loader_pixels(before[name], size, channels)
        difference = np.abs(stored - original).mean()
        assert difference < 2.0, (name, mode, difference)  # 127.5 levels for 16-bit before
        expected_mode = {"gray16": "L", "palette": "RGBA", "cmyk": "RGB", "exif": "RGB"}
        assert mode == expected_mode[name.split("/")[0]], name
        assert orientation == (6 if name.startswith("exif") else None), name


@pytest.fixture
def damaged(images: Path) -> Path:
    """`images` plus a large JPEG cut in half and a small progressive JPEG of 600 scans."""
    rng = np.random.default_rng(2)
    whole = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (1000, 1200, 3), dtype=np.uint8)).save(whole, "JPEG")
    (images / "circle" / "cut.jpg").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    write_scan_bomb(images / "square" / "scans.jpg")
    return images


def test_fit_crop_skips_and_names_an_image_it_cannot_decode_or_the_readers_refuse(
    damaged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["shards", "write", str(damaged), str(out), "--fit-crop", "224", "--no-shuffle"]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    cut = str(damaged / "circle" / "cut.jpg")
    scans = str(damaged / "square" / "scans.jpg")
    assert f"skipped {cut}: cannot be decoded (OSError: image file is truncated" in summary
    assert f"skipped {scans}: over the readers' limits (progressive JPEG with 600 scans" in summary
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(item["file"] for item in manifest["skipped"]) == [
        "circle/cut.jpg",
        "square/scans.jpg",
    ]
    stored = stored_images(out, damaged)
    assert "circle/cut.jpg" not in stored and "circle/large.jpg" in stored
    # without --fit-crop a truncated file is stored as it is (only its header is read)
    write_shards(damaged, tmp_path / "copied", format="tar", shard_size=100, shuffle=False)
    assert "circle/cut.jpg" in stored_images(tmp_path / "copied", damaged)


def test_fit_crop_with_strict_refuses_an_image_it_cannot_decode_naming_it(
    damaged: Path, tmp_path: Path
) -> None:
    (damaged / "square" / "scans.jpg").unlink()
    with pytest.raises(ValueError, match=r"cut\.jpg'?: cannot be decoded .* without --strict"):
        write_shards(
            damaged, tmp_path / "out", format="tar", shard_size=5, fit_crop=224, strict=True
        )
