"""The entropy-decode floor (`window_decode.entropy_decode_rows`): which rows it decodes for
baseline and progressive JPEGs, and that it refuses what is not a whole JPEG."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from prefetch.decode._window import entropy_decode_rows

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.compiled,
]

SIZE = (200, 150)  # width, height: 150 is not a multiple of an MCU row


def jpeg(subsampling: int = 2, progressive: bool = False, mode: str = "RGB") -> bytes:
    """A noisy 200x150 JPEG (subsampling 2 is 4:2:0, 16-row MCUs; 0 is 4:4:4, 8 rows)."""
    rng = np.random.default_rng(0)
    shape = (SIZE[1], SIZE[0], 3) if mode == "RGB" else (SIZE[1], SIZE[0])
    image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    return out.getvalue()


@pytest.mark.parametrize(
    ("subsampling", "mode", "mcu_rows"), [(2, "RGB", 16), (0, "RGB", 8), (0, "L", 8)]
)
def test_a_baseline_jpeg_is_decoded_down_to_the_mcu_row_of_last_row(
    subsampling: int, mode: str, mcu_rows: int
) -> None:
    data = jpeg(subsampling, mode=mode)
    height = SIZE[1]
    for last_row in (0, mcu_rows - 1, mcu_rows, 77, height - 2, height - 1):
        expected = min((last_row // mcu_rows + 1) * mcu_rows, height)
        assert entropy_decode_rows(data, last_row) == expected


def test_a_progressive_jpeg_is_decoded_whole_for_any_window() -> None:
    data = jpeg(progressive=True)
    assert data[:2] == b"\xff\xd8" and b"\xff\xc2" in data  # SOF2: progressive
    for last_row in (0, 40, SIZE[1] - 1):
        assert entropy_decode_rows(data, last_row) == SIZE[1]


def test_what_is_not_a_whole_jpeg_is_refused() -> None:
    png = io.BytesIO()
    Image.new("RGB", SIZE).save(png, "PNG")
    for bad in (png.getvalue(), b"", b"not an image at all"):
        with pytest.raises(ValueError, match="libjpeg-turbo"):
            entropy_decode_rows(bad, 0)
    data = jpeg()
    with pytest.raises(ValueError, match="libjpeg-turbo"):
        entropy_decode_rows(data[: len(data) // 2], SIZE[1] - 1)  # truncated in its rows
    with pytest.raises(ValueError, match="outside the 200x150 image"):
        entropy_decode_rows(data, SIZE[1])
    with pytest.raises(ValueError, match="last_row must be >= 0"):
        entropy_decode_rows(data, -1)
