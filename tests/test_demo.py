"""The demo (`make demo`, demos/train_keras.py) advises what it does not already do (issue 45,
item 11): when training waited for data, it suggests worker processes only to a loader that
ran threads.

The folder is made input-bound on purpose: large JPEGs of noise (each a full entropy decode of
2.6 megapixels, tens of ms of a core) against the demo's small CNN on 64x64 crops (a few ms per
batch of 8), so the loader's workers are the bottleneck by a factor of ten or more, however busy
the machine.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def write_noise_folder(root: Path, per_class: int, side: int) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.jpg", quality=95)
    return root


@pytest.mark.slow
@pytest.mark.timeout(240)  # a subprocess that imports TensorFlow and trains an epoch
def test_an_input_bound_demo_on_processes_does_not_advise_processes(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    folder = write_noise_folder(tmp_path / "noise", per_class=10, side=1600)
    command = [sys.executable, str(ROOT / "demos" / "train_keras.py"), str(folder)]
    result = subprocess.run(
        [*command, "--epochs", "1", "--batch-size", "8"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    output = result.stdout
    assert "process backend" in output, output  # the default for files on Linux
    assert "training was input-bound: try `prefetch bench" in output, output
    assert 'backend="process"' not in output, output
    assert "more --workers" in output, output
