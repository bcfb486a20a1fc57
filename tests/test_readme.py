"""The README's examples run as written on any machine (issue 35, item 6): the PyTorch one on a
machine without CUDA, in a subprocess, on a small folder of real JPEG files, with `model` and
`optimizer` (the reader's own) defined and the epochs cut to one."""

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
README = ROOT / "README.md"

# What the README leaves to the reader: a model and an optimizer, for 224x224 RGB batches.
YOURS = """
import torch
model = torch.nn.Sequential(
    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 3)
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def readme_block(containing: str) -> str:
    """The README's ```python block that contains `containing`."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    found = [block for block in blocks if containing in block]
    assert len(found) == 1, f"README.md has no single python block with {containing!r}"
    return found[0]


@pytest.mark.timeout(240)  # a subprocess that imports torch and trains an epoch
def test_the_readmes_pytorch_example_runs_on_a_machine_without_cuda(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    write_image_folder(tmp_path / "data" / "train", per_class=4, size=(48, 40), seed=1)
    program = readme_block("prefetch.torch.DeviceLoader").replace("range(10)", "range(1)")
    (tmp_path / "train.py").write_text(YOURS + program, encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
