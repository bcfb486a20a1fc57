"""What every built-in decoder refuses before it runs, and how its errors name the file.

A JPEG of more scans than `MAX_JPEG_SCANS` (issue 29.13: a valid 1 MB progressive file with
1,200 scans took 40 s of CPU in Pillow and libjpeg-turbo alike) is refused by the Pillow,
turbo and window decoders with one message naming the file and the count, at once, so a
thread that is decoding it when the loader closes finishes within its cap. An empty file says
"empty file"; a file Pillow cannot identify names its path, with `crop=` too (issue 28.13).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, UnidentifiedImageError

import prefetch
from prefetch import Augment, CenterCrop, DecodeOptions, FileList, Loader, RandomResizedCrop
from prefetch.decode._decoders import decode_bytes, decode_image
from prefetch.decode._turbo import decode_turbo, fast_available
from prefetch.decode._window import decode_window
from prefetch.io._images import MAX_JPEG_SCANS
from prefetch.testing import write_bad_files, write_image_folder, write_scan_bomb

pytestmark = pytest.mark.timeout(60)

OPTIONS = DecodeOptions((16, 16))
CAP_MESSAGE = f"progressive JPEG with 600 scans, over the cap of {MAX_JPEG_SCANS}"


def window(engine: str) -> Callable[[str, DecodeOptions], np.ndarray]:
    def decode(path: str, options: DecodeOptions) -> np.ndarray:
        return decode_window(path, RandomResizedCrop(), np.random.default_rng(0), options, engine)

    return decode


# Every built-in way from a path to pixels; "turbo" ones need the `fast` extra.
DECODERS: dict[str, Callable[[str, DecodeOptions], np.ndarray]] = {
    "pillow": decode_image,
    "turbo": decode_turbo,
    "window turbo": window("turbo"),
    "window pillow": window("pillow"),
}


@pytest.fixture(params=sorted(DECODERS))
def decoder(request: pytest.FixtureRequest) -> Callable[[str, DecodeOptions], np.ndarray]:
    if request.param == "turbo" and not fast_available():
        pytest.skip("needs the fast extra")
    return DECODERS[request.param]


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_scan_bomb(tmp_path_factory.mktemp("scans") / "many_scans.jpg", scans=600)


def progressive_jpeg(path: Path, comment: bytes = b"") -> Path:
    """A progressive JPEG as encoders write them (libjpeg's 10 scans), with a COM segment."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", progressive=True, comment=comment)
    return path


# --- the scan cap ----------------------------------------------------------------------------


def test_the_scan_bomb_is_a_small_valid_progressive_jpeg_with_more_scans_than_the_cap(
    bomb: Path,
) -> None:
    data = bomb.read_bytes()
    assert len(data) < 64 * 1024 and data.count(b"\xff\xda") == 600 > MAX_JPEG_SCANS
    with Image.open(bomb) as image:
        assert image.format == "JPEG" and image.info.get("progressive")


def test_every_decoder_refuses_a_jpeg_of_too_many_scans_naming_the_file_and_the_count(
    bomb: Path, decoder: Callable[[str, DecodeOptions], np.ndarray]
) -> None:
    with pytest.raises(Image.DecompressionBombError) as raised:
        decoder(str(bomb), OPTIONS)
    assert CAP_MESSAGE in str(raised.value) and str(bomb) in str(raised.value)


def test_bytes_in_memory_are_checked_too(bomb: Path) -> None:
    with pytest.raises(Image.DecompressionBombError, match=CAP_MESSAGE):
        decode_bytes(bomb.read_bytes(), OPTIONS, "sample.jpg")


def test_bytes_before_the_frame_do_not_hide_a_progressive_jpeg_from_the_cap(
    bomb: Path, tmp_path: Path
) -> None:
    """libjpeg skips stray bytes before a marker (with a warning) and decodes on: so does the
    check's walk to the frame header."""
    data = bomb.read_bytes()
    frame = data.index(b"\xff\xc2")
    padded = tmp_path / "padded.jpg"
    padded.write_bytes(data[:frame] + b"\x00\x17\xff\x00" + data[frame:])
    with pytest.raises(Image.DecompressionBombError, match=CAP_MESSAGE):
        decode_image(str(padded), OPTIONS)


def test_jpegs_as_encoders_write_them_decode_whatever_their_metadata_holds(
    tmp_path: Path, decoder: Callable[[str, DecodeOptions], np.ndarray]
) -> None:
    """A progressive file of 10 scans, and a baseline one whose comment holds more scan
    markers than the cap (a baseline scan costs bits of the file for every block: not
    counted)."""
    progressive = progressive_jpeg(tmp_path / "progressive.jpg")
    noisy = Image.fromarray(np.full((40, 48, 3), 90, np.uint8))
    baseline = tmp_path / "baseline.jpg"
    noisy.save(baseline, "JPEG", comment=b"\xff\xda" * (MAX_JPEG_SCANS + 1))
    for path in (progressive, baseline):
        assert decoder(str(path), OPTIONS).shape == (16, 16, 3)


def test_a_loader_with_a_crop_raises_the_cap_naming_the_file_and_closes_its_threads(
    bomb: Path, tmp_path: Path
) -> None:
    folder = write_image_folder(tmp_path / "photos", class_names=("a",), per_class=3)
    paths = [*sorted((folder / "a").iterdir()), bomb]
    loader = Loader(FileList(paths, [0] * len(paths)), batch_size=2, image_size=(16, 16), workers=2,
                    shuffle=False, backend="thread",
                    augment=Augment(crop=RandomResizedCrop()))  # fmt: skip
    with pytest.raises(Image.DecompressionBombError, match=CAP_MESSAGE) as raised, loader:
        for _ in loader:
            pass
    assert str(bomb) in "\n".join(raised.value.__notes__)


# --- empty files and files Pillow cannot identify ---------------------------------------------


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_bad_files(tmp_path_factory.mktemp("bad"), kinds=("zero_byte", "text"))


def test_an_empty_file_says_empty_file_naming_it(
    bad: dict[str, Path], decoder: Callable[[str, DecodeOptions], np.ndarray]
) -> None:
    empty = bad["zero_byte"]
    with pytest.raises(UnidentifiedImageError) as raised:
        decoder(str(empty), OPTIONS)
    assert str(raised.value) == f"empty file (0 bytes): {str(empty)!r}"


def test_a_file_pillow_cannot_identify_is_named_by_its_path_never_a_bytesio(
    bad: dict[str, Path], decoder: Callable[[str, DecodeOptions], np.ndarray]
) -> None:
    text = bad["text"]
    with pytest.raises(UnidentifiedImageError) as raised:
        decoder(str(text), OPTIONS)
    assert str(raised.value) == f"cannot identify image file {str(text)!r}"


def test_bytes_without_a_name_are_described_not_shown_as_an_object() -> None:
    with pytest.raises(UnidentifiedImageError, match=r"'<5 bytes in memory>'"):
        decode_bytes(b"hello", OPTIONS)


@pytest.mark.parametrize("crop", [RandomResizedCrop(), CenterCrop()])
def test_a_loader_with_a_crop_names_the_file_in_the_error_message(
    bad: dict[str, Path], crop: RandomResizedCrop | CenterCrop
) -> None:
    text = bad["text"]
    loader = prefetch.Loader(FileList([text], [0]), batch_size=1, image_size=(16, 16),
                             workers=1, augment=prefetch.Augment(crop=crop),
                             backend="thread")  # fmt: skip
    with pytest.raises(UnidentifiedImageError) as raised, loader:
        next(iter(loader))
    assert str(text) in str(raised.value) and "BytesIO" not in str(raised.value)
