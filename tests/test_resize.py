"""prefetch.decode._resize: the fast route from a Pillow image (`resize_image`, which `decode_image`
takes with antialias=False) against the numpy reference `resize` (TensorFlow's arithmetic), and
both against `tf.image.resize` where TensorFlow is installed.

The files are real JPEGs and PNGs written with Pillow: textured (a shape plus noise), so that a
wrong source pixel or weight shows as a large difference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefetch import DecodeOptions, decode_image
from prefetch.decode import _resize as resize
from prefetch.decode._decoders import SAME_SIZE_IDENTITY, resize_like_keras, to_target_size
from prefetch.testing import draw_shape

pytestmark = pytest.mark.timeout(60)

LAYOUTS = {
    "stretch": {},
    "crop": {"crop_to_aspect_ratio": True},
    "pad": {"pad_to_aspect_ratio": True},
}
# (file height, width) -> target (height, width): shrink (ImageNet-sized), enlarge, one axis
# each way, non-square both ways, same size, and a sliver.
GEOMETRIES = [
    ((375, 500), (224, 224)),
    ((500, 375), (224, 224)),
    ((30, 40), (224, 224)),
    ((61, 97), (150, 23)),
    ((97, 61), (23, 150)),
    ((64, 48), (64, 48)),
    ((5, 3), (64, 1)),
]
# (format, channels): how each file is written and decoded.
FILES = [("JPEG", 1), ("JPEG", 3), ("PNG", 3), ("PNG", 4)]
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def write_textured(path: Path, size: tuple[int, int], channels: int, seed: int) -> Path:
    """A shape plus uniform noise of +-30 (height, width = size), saved by its suffix."""
    height, width = size
    rng = np.random.default_rng(seed)
    base = np.asarray(draw_shape("circle", (width, height), rng).convert("RGBA"))
    noisy = base.astype(np.int16) + rng.integers(-30, 31, size=base.shape, dtype=np.int16)
    image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGBA")
    options = {"quality": 90} if path.suffix == ".jpg" else {}
    image.convert(_MODES[channels]).save(path, **options)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, tuple[int, int]], Path]:
    """One file per format, channel count and source size."""
    folder = tmp_path_factory.mktemp("resize")
    written = {}
    for seed, (source, _) in enumerate(GEOMETRIES):
        for image_format, channels in FILES:
            suffix = ".jpg" if image_format == "JPEG" else ".png"
            name = f"{source[0]}x{source[1]}_{channels}{suffix}"
            written[image_format, channels, source] = write_textured(
                folder / name, source, channels, seed
            )
    return written


def full_size_pixels(path: Path, channels: int) -> np.ndarray:
    """The file decoded at full size by Pillow, as decode_image sees it before resizing."""
    with Image.open(path) as image:
        array = np.asarray(image.convert(_MODES[channels]))
    return array.reshape(array.shape[0], array.shape[1], channels)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize(("image_format", "channels"), FILES)
@pytest.mark.parametrize(("source", "target"), GEOMETRIES)
def test_decode_image_matches_the_numpy_reference(
    files: dict[tuple[str, int, tuple[int, int]], Path],
    source: tuple[int, int],
    target: tuple[int, int],
    image_format: str,
    channels: int,
    method: str,
    layout: str,
) -> None:
    path = files[image_format, channels, source]
    options = DecodeOptions(target, channels, method, antialias=False, **LAYOUTS[layout])
    fast = decode_image(str(path), options)
    reference = resize_like_keras(full_size_pixels(path, channels), options)  # resize.resize
    assert fast.shape == reference.shape == options.shape
    assert fast.dtype == np.uint8
    difference = np.abs(fast.astype(np.int16) - reference)
    if method == "nearest":
        assert difference.max() == 0  # the same source pixels, whichever route picked them
    else:
        assert difference.max() <= 1
        assert difference.mean() < 0.1


@pytest.mark.parametrize("method", resize.METHODS)
def test_resize_image_box_equals_resize_of_the_cropped_array(method: str) -> None:
    rng = np.random.default_rng(4)
    pixels = rng.integers(0, 256, size=(45, 70, 3), dtype=np.uint8)
    box = (7, 11, 30, 41)  # top, left, height, width
    top, left, height, width = box
    region = np.ascontiguousarray(pixels[top : top + height, left : left + width])
    for size in [(12, 20), (60, 50), (30, 41)]:
        fast = resize.resize_image(Image.fromarray(pixels), size, method, box)
        reference = resize.resize(region, size, method)
        difference = np.abs(fast.astype(np.int16) - reference)
        assert difference.max() <= (0 if method != "bilinear" else 1), (method, size)
        assert difference.mean() < 0.1


def test_nearest_falls_back_to_numpy_where_pillow_picks_other_pixels() -> None:
    # 640 -> 224: output column 17 sits exactly on a pixel boundary (17.5 * 640 / 224 = 50);
    # TensorFlow's float32 arithmetic takes pixel 50, Pillow's float64 steps pixel 49.
    assert not resize._pillow_nearest_agrees(1, 0, 640, 224)
    assert resize._pillow_nearest_agrees(1, 0, 500, 224)
    assert resize._pillow_nearest_agrees(0, 0, 375, 224)
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, size=(48, 640, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    expected = resize.resize(pixels, (20, 224), "nearest")
    np.testing.assert_array_equal(resize.resize_image(image, (20, 224), "nearest"), expected)
    pillow = np.asarray(image.resize((224, 20), Image.Resampling.NEAREST))
    assert (pillow != expected).any()  # the check above is what keeps Pillow's pixels out


def test_bilinear_results_are_fresh_arrays() -> None:
    """The rows-first bilinear works in per-thread scratch; results must not alias it."""
    rng = np.random.default_rng(6)
    first_pixels = rng.integers(0, 256, size=(40, 60, 3), dtype=np.uint8)
    first = resize.resize_image(Image.fromarray(first_pixels), (20, 30), "bilinear")
    kept = first.copy()
    second_pixels = rng.integers(0, 256, size=(40, 60, 3), dtype=np.uint8)
    resize.resize_image(Image.fromarray(second_pixels), (20, 30), "bilinear")
    np.testing.assert_array_equal(first, kept)


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_both_routes_match_tensorflow(channels: int, method: str) -> None:
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(7)
    for (height, width), size in GEOMETRIES:
        pixels = rng.integers(0, 256, size=(height, width, channels), dtype=np.uint8)
        image = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels)
        expected = tf.image.resize(pixels, size, method=method).numpy()
        expected = np.clip(np.rint(expected.astype(np.float64)), 0, 255)
        for result in (
            resize.resize(pixels, size, method),
            resize.resize_image(image, size, method),
        ):
            difference = np.abs(result - expected)
            assert difference.max() <= (0 if method == "nearest" else 1), (height, width, size)
            assert difference.mean() < 0.01


INTERPOLATIONS_KERAS = [
    "bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic"
]  # fmt: skip


@pytest.mark.parametrize("interpolation", INTERPOLATIONS_KERAS)
@pytest.mark.parametrize(
    "layout", [{}, {"crop_to_aspect_ratio": True}, {"pad_to_aspect_ratio": True}]
)
def test_an_array_already_at_the_target_size_gets_the_pixels_of_the_full_conversion(
    interpolation: str, layout: dict[str, bool]
) -> None:
    """A Source that stores images at the target size skips the conversion (no resize, no
    copy) only where the conversion would give back the same pixels."""
    rng = np.random.default_rng(7)
    array = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    options = DecodeOptions(image_size=(48, 64), interpolation=interpolation, **layout)

    converted = to_target_size(array, options)
    through_pillow = to_target_size(Image.fromarray(array), options)  # the full conversion

    np.testing.assert_array_equal(converted, through_pillow)
    assert (converted is array) == (interpolation in SAME_SIZE_IDENTITY)


@pytest.mark.parametrize("interpolation", ["bilinear", "lanczos3", "hamming"])
def test_the_antialiased_path_returns_an_array_at_the_target_size_as_it_is(
    interpolation: str,
) -> None:
    array = np.random.default_rng(8).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    options = DecodeOptions(image_size=(30, 40), interpolation=interpolation, antialias=True)

    assert to_target_size(array, options) is array
    np.testing.assert_array_equal(to_target_size(Image.fromarray(array), options), array)


def test_an_array_of_another_size_or_layout_is_still_converted() -> None:
    options = DecodeOptions(image_size=(20, 20))
    grey = np.full((20, 20), 7, np.uint8)  # the right size, without its channels
    larger = np.zeros((40, 40, 3), np.uint8)

    assert to_target_size(grey, options).shape == (20, 20, 3)
    assert (to_target_size(grey, options) == 7).all()
    assert to_target_size(larger, options).shape == (20, 20, 3)
