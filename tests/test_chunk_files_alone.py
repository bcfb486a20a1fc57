"""A file decodes the same alone, first, or after any other file (issue 40.1): nothing of one
file's decode carries to the next in the compiled chunk path, on either backend, for any worker
count and chunk split. A JPEG without Huffman tables (DHT) decodes with the standard tables, as
Pillow decodes it; one without quantization tables (DQT) is refused on both paths, named.
"""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.decode._turbo import decode_turbo, fast_available
from prefetch.plan import Augment, CenterCrop, RandomResizedCrop
from prefetch.testing import draw_shape
from prefetch.testing._jpeg_segments import DHT, DQT, strip

pytestmark = pytest.mark.timeout(120)

TARGET = (40, 40)


def encoded(image: Image.Image, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def noise(size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def alternating(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Issue 40.1's folder: 8 JPEGs, optimized Huffman tables and no DHT at all, alternating.
    Decoded with the previous file's optimized tables, the files without DHT are garbage that
    libjpeg does not notice (noise: almost any bit string is a valid code)."""
    root = tmp_path_factory.mktemp("alternating")
    (root / "a").mkdir()
    rng = np.random.default_rng(40)
    for number in range(8):
        size = (int(rng.integers(90, 200)), int(rng.integers(90, 200)))
        if number % 2 == 0:
            data = encoded(draw_shape("circle", size, rng), quality=90, optimize=True)
        else:
            data = strip(encoded(noise(size, rng), quality=85), DHT)
        (root / "a" / f"{number}.jpg").write_bytes(data)
    return root


def identity(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return image


def batches(root: Path, per_sample: bool, **options: Any) -> list[np.ndarray]:
    """Every batch of two epochs of training crops; `per_sample` forces the per-sample path
    (a transform does)."""
    augment = Augment(RandomResizedCrop(), flip=True, transform=identity if per_sample else None)
    settings = {"batch_size": 4, "image_size": TARGET, "seed": 3, "augment": augment}
    with prefetch.Loader(root, **{**settings, **options}) as loader:
        return [images.copy() for _ in range(2) for images, _ in loader]


@pytest.mark.compiled
@pytest.mark.parametrize(("backend", "workers"), [("thread", 1), ("process", 1), ("process", 2)])
def test_files_without_huffman_tables_after_optimized_ones_give_the_per_sample_rows(
    alternating: Path, backend: str, workers: int
) -> None:
    want = batches(alternating, True, backend="thread", workers=1)
    got = batches(alternating, False, backend=backend, workers=workers)
    assert len(got) == len(want) == 4
    for got_images, want_images in zip(got, want, strict=True):
        np.testing.assert_array_equal(got_images, want_images)


@pytest.mark.compiled
def test_a_file_decodes_the_same_alone_first_or_after_any_other(alternating: Path) -> None:
    """decode_chunk of every ordered pair and of shuffled whole chunks: each file's row is its
    window decoded alone."""
    paths = sorted(str(p) for p in (alternating / "a").iterdir())
    options, crop = DecodeOptions(TARGET), CenterCrop(0.9)
    alone = [
        window_decode.decode_window(p, crop, Augment.rng(0, 0, i), options, "turbo")
        for i, p in enumerate(paths)
    ]
    orders = [list(pair) for pair in itertools.permutations(range(len(paths)), 2)]
    rng = np.random.default_rng(1)
    orders += [rng.permutation(len(paths)).tolist() for _ in range(4)]
    for order in orders:
        images = np.zeros((len(order), *options.shape), np.uint8)
        done, _ = window_decode.decode_chunk(
            [paths[i] for i in order],
            order,
            list(range(len(order))),
            0,
            0,
            crop,
            False,
            options,
            images,
        )
        assert done.all(), order
        for row, i in enumerate(order):
            np.testing.assert_array_equal(images[row], alone[i], err_msg=str(order))


def test_every_decoder_decodes_a_jpeg_without_dht_with_the_standard_tables(tmp_path: Path) -> None:
    """Standard tables: the file with its DHT segments stripped (Pillow writes the standard
    tables unless told to optimize) decodes to the file's own pixels, by every decoder."""
    image = noise((120, 90), np.random.default_rng(2))
    whole = tmp_path / "whole.jpg"
    whole.write_bytes(encoded(image, quality=85))
    bare = tmp_path / "bare.jpg"
    bare.write_bytes(strip(whole.read_bytes(), DHT))
    assert b"\xff\xc4" not in bare.read_bytes()[:600]
    options = DecodeOptions((90, 120))
    decoders = [decode_image] + ([decode_turbo] if fast_available() else [])
    for decoder in decoders:
        np.testing.assert_array_equal(decoder(str(bare), options), decoder(str(whole), options))
    crop = CenterCrop(1.0)
    for engine in window_decode.ENGINES:
        windows = [
            window_decode.decode_window(str(p), crop, Augment.rng(0, 0, 0), options, engine)
            for p in (bare, whole)
        ]
        np.testing.assert_array_equal(*windows)


@pytest.mark.parametrize(("backend", "workers"), [("thread", 1), ("process", 1), ("process", 2)])
def test_a_jpeg_without_dqt_is_refused_wherever_it_sits_naming_it(
    alternating: Path, tmp_path: Path, backend: str, workers: int
) -> None:
    """Issue 40.2: with the previous file's tables it was delivered by one worker and refused
    by two. Now it is refused, by its name, whatever precedes it."""
    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    for path in sorted((alternating / "a").iterdir()):
        (root / "a" / path.name).write_bytes(path.read_bytes())
    good = encoded(draw_shape("square", (120, 100), np.random.default_rng(3)), quality=90)
    (root / "a" / "3.jpg").write_bytes(strip(good, DQT))  # after 0.jpg, 1.jpg, 2.jpg
    with pytest.raises(Exception) as caught:
        batches(root, False, backend=backend, workers=workers, shuffle=False)
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "3.jpg" in notes, (caught.value, notes)
