"""Decoders by name: a plain Loader decodes with the fastest decoder installed and says which."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.decode._choice import DECODER_NAMES, get_decoder
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.decode._turbo import decode_turbo, fast_available
from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(60)

needs_fast = pytest.mark.skipif(not fast_available(), reason="needs the fast extra")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "data", class_names=("a", "b"), per_class=6, size=(96, 72))


def test_an_unknown_decoder_name_is_refused_at_construction_listing_the_names(
    folder: Path,
) -> None:
    with pytest.raises(ValueError, match="decoder must be one of") as raised:
        prefetch.Loader(folder, decoder="libjpeg", image_size=(32, 32))
    for name in DECODER_NAMES:
        assert repr(name) in str(raised.value)
    assert "'libjpeg'" in str(raised.value)


@needs_fast
def test_a_plain_loader_decodes_with_the_fast_decoder_and_says_so(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(32, 32), seed=0)
    with loader:
        images = np.concatenate([batch.images for batch in loader])
    stats = loader.stats()
    assert stats.decoder == "turbo"
    assert stats.images == len(images) == 12
    assert "turbo decoder" in str(stats)


def test_pillow_by_name_decodes_every_image_as_decode_image_does(folder: Path) -> None:
    loader = prefetch.Loader(
        folder, batch_size=5, image_size=(40, 30), shuffle=False, decoder="pillow"
    )
    with loader:
        images = np.concatenate([batch.images for batch in loader])
    assert loader.stats().decoder == "pillow"
    options = DecodeOptions((40, 30))
    expected = np.stack([decode_image(str(path), options) for path in loader.source.paths])
    np.testing.assert_array_equal(images, expected)


def test_names_resolve_to_the_decoders_and_callables_pass_through() -> None:
    assert get_decoder("pillow") is decode_image
    custom = lambda path, options: decode_image(path, options)  # noqa: E731
    assert get_decoder(custom) is custom
    expected = decode_turbo if fast_available() else decode_image
    assert get_decoder("auto") is expected
    assert get_decoder(None) is expected


def test_a_local_decoder_runs_in_threads_named_in_stats_as_auto_cannot_send_it(
    folder: Path,
) -> None:
    def my_decoder(path: str, options: DecodeOptions) -> np.ndarray:
        return decode_image(path, options)  # a Python decoder: auto would pick processes

    loader = prefetch.Loader(folder, batch_size=6, image_size=(16, 16), decoder=my_decoder)
    with loader:
        assert sum(len(batch.images) for batch in loader) == 12
    stats = loader.stats()
    assert "my_decoder" in stats.decoder
    assert stats.backend == "thread"
    assert "the decoder cannot be pickled" in stats.backend_reason


def test_a_plain_loader_chooses_its_backend_and_says_why(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(32, 32))
    with loader:
        assert sum(len(batch.images) for batch in loader) == 12
    stats = loader.stats()
    assert stats.backend in ("thread", "process")
    assert stats.backend_reason.startswith(f"auto: {stats.backend}")


# Run in a fresh interpreter where simplejpeg and OpenCV cannot be imported.
_WITHOUT_FAST = """
import sys
sys.modules["simplejpeg"] = None
sys.modules["cv2"] = None
import prefetch
"""


def _run_without_fast(code: str) -> subprocess.CompletedProcess[str]:
    script = _WITHOUT_FAST + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=50, check=False
    )


def test_without_the_fast_extra_auto_falls_back_to_pillow(folder: Path) -> None:
    result = _run_without_fast(
        f"""
        loader = prefetch.Loader({str(folder)!r}, batch_size=4, image_size=(32, 32))
        with loader:
            count = sum(len(batch.images) for batch in loader)
        print(count, loader.stats().decoder)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["12", "pillow"]


def test_without_the_fast_extra_turbo_by_name_names_the_extra_to_install(folder: Path) -> None:
    result = _run_without_fast(
        f"""
        try:
            prefetch.Loader({str(folder)!r}, image_size=(32, 32), decoder="turbo")
        except ImportError as error:
            print("ImportError:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ImportError:")
    assert "prefetch[fast]" in result.stdout
