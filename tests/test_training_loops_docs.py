"""The complete programs of docs/training-loops.md run as written (with EPOCHS and SIZE small),
each in a subprocess, on a small folder of real JPEG files."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prefetch.testing import write_image_folder

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "training-loops.md"
SETTINGS = re.compile(r"^EPOCHS, SIZE = \d+, \d+$", re.MULTILINE)


def program(name: str) -> str:
    """The ```python block of the page whose first line is `# name`."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if block.startswith(f"# {name}")]
    assert len(found) == 1, f"docs/training-loops.md has no single program {name}"
    assert SETTINGS.search(found[0]), f"{name} sets no `EPOCHS, SIZE = ...` line"
    return SETTINGS.sub("EPOCHS, SIZE = 2, 32", found[0])


@pytest.mark.slow
@pytest.mark.timeout(240)  # a subprocess that imports its framework and trains
@pytest.mark.parametrize("name, backend", [("train_torch.py", None), ("train_keras.py", "torch")])
def test_the_pages_program_runs_as_written(name: str, backend: str | None, tmp_path: Path) -> None:
    for module in ("torch", "keras"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    write_image_folder(
        tmp_path / "data" / "train", per_class=24, size=(48, 40), seed=1
    )  # a batch of 64
    write_image_folder(tmp_path / "data" / "val", per_class=4, size=(48, 40), seed=2)
    (tmp_path / name).write_text(program(name), encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    if backend is not None:
        environment["KERAS_BACKEND"] = backend
    result = subprocess.run(
        [sys.executable, name],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
