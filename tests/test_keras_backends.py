"""prefetch.keras.dataset under each Keras backend (the cases: keras_backend_cases.py), each in a
subprocess with KERAS_BACKEND set, since Keras fixes its backend when first imported."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Backend -> the module it needs. JAX is tested where it is installed.
BACKENDS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax"}


@pytest.mark.slow
@pytest.mark.timeout(300)  # a subprocess that imports Keras and its backend and trains 5 models
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_keras_dataset_works_under_the_backend(backend: str) -> None:
    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras is not installed")
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"the {backend} backend is not installed")
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "pytest", str(HERE / "keras_backend_cases.py")]
    command += ["-q", "-p", "no:cacheprovider", "-x"]
    result = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=280, cwd=HERE.parent
    )
    assert result.returncode == 0, f"under KERAS_BACKEND={backend}:\n{result.stdout[-6000:]}"
    assert " passed" in result.stdout
