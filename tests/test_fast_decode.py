"""decode_turbo (the `fast` extra): shapes for every option, pixels within the stated tolerance
of decode_image and of TensorFlow, the formats and files it leaves to decode_image, errors,
Loader backends, pickling, and the decoder registry.

Tests that need simplejpeg and OpenCV skip without them (CI installs `.[tf,test]` unless the
Makefile adds `fast`); the fallback without them is tested everywhere.
"""

from __future__ import annotations

import multiprocessing
import pickle
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefetch import DecodeOptions, FileList, Loader, decode_image
from prefetch.decode import _resize as resize
from prefetch.decode import _turbo as fast_decode
from prefetch.decode._decoders import INTERPOLATIONS
from prefetch.decode._turbo import available_decoders, best_decoder, decode_turbo
from prefetch.testing import draw_shape, write_bad_files, write_image_folder, write_odd_images

pytestmark = pytest.mark.timeout(60)

LAYOUTS = {
    "stretch": {},
    "crop": {"crop_to_aspect_ratio": True},
    "pad": {"pad_to_aspect_ratio": True},
}
PHOTO_TARGET = (224, 224)


@pytest.fixture
def turbo() -> fast_decode.TurboDecoder:
    """decode_turbo, or skip when the `fast` extra is not installed."""
    pytest.importorskip("simplejpeg")
    pytest.importorskip("cv2")
    return decode_turbo


def write_photo(path: Path, size: tuple[int, int], seed: int) -> str:
    """A textured photo like benchmarks/decoders.py's: a shape plus noise +-30, quality 90."""
    rng = np.random.default_rng(seed)
    image = np.asarray(draw_shape("circle", size, rng)).astype(np.int16)
    image += rng.integers(-30, 31, size=image.shape, dtype=np.int16)
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90)
    return str(path)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """ImageNet-sized photos (500x375, one portrait) and a larger one, by size name."""
    folder = tmp_path_factory.mktemp("photos")
    return {
        "imagenet": [
            write_photo(folder / "landscape.jpg", (500, 375), 0),
            write_photo(folder / "portrait.jpg", (375, 500), 1),
        ],
        "large": [write_photo(folder / "large.jpg", (1024, 768), 2)],
    }


def differences(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.int16) - want.astype(np.int16))


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_option_gives_the_target_shape_as_uint8(
    turbo: fast_decode.TurboDecoder, tmp_path: Path, antialias: bool, channels: int, layout: str
) -> None:
    write_image_folder(tmp_path / "jpeg", class_names=["a"], per_class=1, size=(40, 30))
    write_image_folder(tmp_path / "png", class_names=["a"], per_class=1, image_format="PNG")
    files = sorted(tmp_path.rglob("*.*"))
    methods = INTERPOLATIONS if antialias else resize.METHODS
    for interpolation in methods:
        options = DecodeOptions(
            (12, 20), channels, interpolation, antialias=antialias, **LAYOUTS[layout]
        )
        for path in files:
            image = turbo(str(path), options)
            assert image.shape == (12, 20, channels), (path.name, interpolation)
            assert image.dtype == np.uint8


def test_the_dct_scale_keeps_the_region_to_resize_at_least_the_target() -> None:
    size = DecodeOptions(PHOTO_TARGET)
    assert fast_decode._dct_factor(375, 500, size) == 1  # 188 rows at 1/2 would be too few
    assert fast_decode._dct_factor(768, 1024, size) == 2
    assert fast_decode._dct_factor(1200, 1600, size) == 4  # 300x400 >= 224x224; 1/8 is not
    assert fast_decode._dct_factor(4000, 6000, size) == 8  # libjpeg-turbo goes no further
    crop = DecodeOptions(PHOTO_TARGET, crop_to_aspect_ratio=True)
    assert fast_decode._dct_factor(900, 3600, crop) == 4  # the crop is 900x900 -> 225x225
    pad = DecodeOptions(PHOTO_TARGET, pad_to_aspect_ratio=True)
    assert fast_decode._dct_factor(500, 2000, pad) == 8  # the image fills only 224x56
    # "nearest" keeps Pillow's draft (twice the target), so it picks decode_image's pixels.
    nearest = DecodeOptions(PHOTO_TARGET, interpolation="nearest")
    assert fast_decode._dct_factor(1200, 1600, nearest) == 2
    assert fast_decode._dct_factor(768, 1024, nearest) == 1


# docs/decoders.md: the antialiased bilinear path (a Gaussian as wide as Pillow's triangle
# filter, then cv2's bilinear) against decode_image, on textured photos (the worst case).
# With crop_to_aspect_ratio the box is Keras's, in whole pixels, where Pillow's is fractional
# (here half a pixel apart), hence the wider bound.
ANTIALIASED_TOLERANCE = {"stretch": (1.0, 4), "crop": (3.0, 12), "pad": (1.0, 4)}


@pytest.mark.parametrize("size", ["imagenet", "large"])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_antialiased_bilinear_stays_within_the_stated_tolerance_of_decode_image(
    turbo: fast_decode.TurboDecoder,
    photos: dict[str, list[str]],
    size: str,
    channels: int,
    layout: str,
) -> None:
    options = DecodeOptions(PHOTO_TARGET, channels, antialias=True, **LAYOUTS[layout])
    mean, p99 = ANTIALIASED_TOLERANCE[layout]
    for path in photos[size]:
        difference = differences(turbo(path, options), decode_image(path, options))
        assert difference.mean() <= mean
        assert np.percentile(difference, 99) <= p99


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nearest_picks_the_same_pixels_as_decode_image(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]], layout: str
) -> None:
    options = DecodeOptions((100, 60), interpolation="nearest", antialias=True, **LAYOUTS[layout])
    for path in photos["imagenet"] + photos["large"]:
        np.testing.assert_array_equal(turbo(path, options), decode_image(path, options))


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pillows_other_filters_stay_within_the_stated_tolerance_of_decode_image(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]], channels: int, layout: str
) -> None:
    # docs/decoders.md: a DCT scale of 1/2 where Pillow keeps full size; mean <= 2.5.
    options = DecodeOptions(PHOTO_TARGET, channels, "bicubic", antialias=True, **LAYOUTS[layout])
    for path in photos["large"]:
        difference = differences(turbo(path, options), decode_image(path, options))
        assert difference.mean() <= 2.5
        assert np.percentile(difference, 99) <= 12


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "area", "bicubic"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_keras_parity_stays_within_the_stated_tolerance_of_decode_image(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]], interpolation: str, layout: str
) -> None:
    # antialias=False: the same resize arithmetic; libjpeg-turbo's fast DCT (TensorFlow's
    # default) where decode_image uses Pillow's accurate one.
    options = DecodeOptions(
        PHOTO_TARGET, interpolation=interpolation, antialias=False, **LAYOUTS[layout]
    )
    for path in photos["imagenet"]:
        difference = differences(turbo(path, options), decode_image(path, options))
        assert difference.mean() <= 1.5
        assert np.percentile(difference, 99) <= 4


@pytest.mark.parametrize("channels", [1, 3])
def test_keras_parity_matches_tensorflow_closer_than_decode_image(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]], channels: int
) -> None:
    tf = pytest.importorskip("tensorflow")
    options = DecodeOptions(PHOTO_TARGET, channels, antialias=False)
    for path in photos["imagenet"]:
        decoded = tf.io.decode_jpeg(tf.io.read_file(path), channels=channels)
        keras = np.clip(np.rint(tf.image.resize(decoded, PHOTO_TARGET).numpy()), 0, 255)
        ours = differences(turbo(path, options), keras)
        default = differences(decode_image(path, options), keras)
        assert ours.mean() <= 0.4
        assert np.percentile(ours, 99) <= 1
        assert ours.mean() < default.mean()


@dataclass(frozen=True)
class OptionsWithANewField(DecodeOptions):
    """DecodeOptions as a later version might have it: a field decode_turbo does not know."""

    sharpen: bool = False


def test_options_it_does_not_implement_go_to_decode_image(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]]
) -> None:
    path = photos["large"][0]  # decoded at another DCT scale than decode_image's
    plain = OptionsWithANewField(PHOTO_TARGET)
    assert not np.array_equal(turbo(path, plain), decode_image(path, plain))
    sharpened = OptionsWithANewField(PHOTO_TARGET, sharpen=True)
    np.testing.assert_array_equal(turbo(path, sharpened), decode_image(path, sharpened))


@pytest.mark.parametrize("antialias", [True, False])
def test_non_jpegs_and_cmyk_jpegs_give_exactly_decode_images_pixels(
    turbo: fast_decode.TurboDecoder, tmp_path: Path, antialias: bool
) -> None:
    files = [image.path for image in write_odd_images(tmp_path / "odd").values()]
    for image_format in ("PNG", "BMP", "GIF"):
        folder = tmp_path / image_format
        write_image_folder(folder, class_names=["a"], per_class=1, image_format=image_format)
        files += sorted(folder.rglob("*.*"))
    gray_alpha = tmp_path / "gray_alpha.png"
    Image.new("LA", (24, 20), (120, 60)).save(gray_alpha)
    rgba = tmp_path / "rgba.png"
    Image.new("RGBA", (24, 20), (10, 200, 30, 128)).save(rgba)
    files += [gray_alpha, rgba]
    for size in [(16, 16), (10, 14)]:  # the odd images' own size, and a resize
        for channels in (1, 3, 4):
            options = DecodeOptions(size, channels, antialias=antialias)
            for path in files:
                np.testing.assert_array_equal(
                    turbo(str(path), options),
                    decode_image(str(path), options),
                    err_msg=f"{path.name} {size} channels={channels}",
                )


def test_bad_files_raise_what_decode_image_raises(
    turbo: fast_decode.TurboDecoder, tmp_path: Path
) -> None:
    bad = write_bad_files(tmp_path, ["corrupt", "truncated", "zero_byte", "text", "bomb"])
    options = DecodeOptions((16, 16))
    for kind, path in bad.items():
        with pytest.raises(Exception) as expected:
            decode_image(str(path), options)
        with pytest.raises(type(expected.value)) as raised:
            turbo(str(path), options)
        assert type(raised.value) is type(expected.value), kind
        assert str(raised.value) == str(expected.value), kind
    # A truncated JPEG is an error, never a partly grey image; libjpeg-turbo's own complaint
    # is kept with it.
    with pytest.raises(OSError, match="truncated") as truncated:
        turbo(str(bad["truncated"]), options)
    assert "libjpeg-turbo" in str(truncated.value.__context__)


def test_a_jpeg_damaged_in_the_middle_gives_what_decode_image_gives(
    turbo: fast_decode.TurboDecoder, tmp_path: Path
) -> None:
    path = Path(write_photo(tmp_path / "photo.jpg", (64, 48), 0))
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 40] = bytes(40)  # zeros inside the entropy-coded data
    path.write_bytes(bytes(data))
    options = DecodeOptions((16, 16))
    try:
        want = decode_image(str(path), options)
    except Exception as error:
        with pytest.raises(type(error)):
            turbo(str(path), options)
    else:
        np.testing.assert_array_equal(turbo(str(path), options), want)


def test_pillows_pixel_limit_applies(
    turbo: fast_decode.TurboDecoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(write_photo(tmp_path / "photo.jpg", (64, 48), 0))  # 3072 pixels
    options = DecodeOptions((16, 16))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # over twice the limit: refused
    with pytest.raises(Image.DecompressionBombError):
        turbo(path, options)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # over the limit: a warning
    with pytest.warns(Image.DecompressionBombWarning):
        image = turbo(path, options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        np.testing.assert_array_equal(image, decode_image(path, options))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_loader_with_decode_turbo_delivers_each_files_decode(
    turbo: fast_decode.TurboDecoder, tmp_path: Path, backend: str
) -> None:
    folder = write_image_folder(tmp_path, per_class=3, size=(64, 48))
    paths = sorted(folder.rglob("*.jpg"))
    source = FileList(paths, np.arange(len(paths)), [str(i) for i in range(len(paths))])
    loader = Loader(
        source,
        batch_size=4,
        image_size=(16, 16),
        workers=2,
        shuffle=True,
        seed=1,
        decoder=turbo,
        backend=backend,
    )
    options = DecodeOptions((16, 16))
    seen = []
    with loader:
        for images, labels in loader:
            for image, label in zip(images, labels, strict=True):
                np.testing.assert_array_equal(image, turbo(str(paths[label]), options))
                seen.append(int(label))
    assert sorted(seen) == list(range(len(paths)))


def test_decode_turbo_pickles_and_says_it_releases_the_gil(
    turbo: fast_decode.TurboDecoder, photos: dict[str, list[str]]
) -> None:
    copy = pickle.loads(pickle.dumps(turbo))
    assert isinstance(copy, fast_decode.TurboDecoder)
    options = DecodeOptions((32, 32))
    path = photos["imagenet"][0]
    np.testing.assert_array_equal(copy(path, options), turbo(path, options))
    assert turbo.releases_gil is True and copy.releases_gil is True


def opencv_threads_after_first_use() -> int:
    """In a fresh process: OpenCV's thread count once fast_decode has imported it."""
    import cv2

    fast_decode.turbo_modules()
    threads: int = cv2.getNumThreads()
    return threads


def test_opencv_runs_single_threaded_in_worker_processes_only(
    turbo: fast_decode.TurboDecoder,
) -> None:
    import cv2

    original = cv2.getNumThreads()
    cv2.setNumThreads(3)
    fast_decode._import_modules.cache_clear()
    try:
        fast_decode.turbo_modules()  # imports and configures again
        assert cv2.getNumThreads() == 3, "the main process keeps its own setting"
    finally:
        cv2.setNumThreads(original)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        assert pool.submit(opencv_threads_after_first_use).result(timeout=30) == 1


def test_the_registry_lists_both_decoders_and_the_best_is_one_of_them(
    turbo: fast_decode.TurboDecoder,
) -> None:
    assert available_decoders() == {"pillow": decode_image, "turbo": turbo}
    best = best_decoder()
    assert best in (decode_image, turbo)
    assert best_decoder() is best, "measured once, then cached"


def test_without_the_extra_the_registry_and_the_best_decoder_are_pillow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast_decode, "turbo_modules", lambda: None)
    best_decoder.cache_clear()
    try:
        assert not fast_decode.fast_available()
        assert available_decoders() == {"pillow": decode_image}
        assert best_decoder() is decode_image
        path = write_photo(tmp_path / "photo.jpg", (32, 24), 0)
        with pytest.raises(ImportError, match=r"prefetch\[fast\]"):
            decode_turbo(path, DecodeOptions((8, 8)))
    finally:
        best_decoder.cache_clear()
