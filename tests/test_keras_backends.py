"""prefetch.keras.dataset under each Keras backend (the cases: keras_backend_cases.py), each in a
subprocess with KERAS_BACKEND set, since Keras fixes its backend when first imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefetch.testing import write_image_folder

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


# A fake `jax` (prefetch.testing.fake_jax, a fault-injection fake: JAX is not installed here, and
# a real multi-process job needs its coordinator) stands in for each process of a JAX job; the
# dataset's sharding decision is made from it. Keras runs on torch, imported before the fake.
JAX_PROCESSES = """
import json, sys
import keras
import prefetch, prefetch.keras
from prefetch.testing import BackendStarted, fake_jax

def made(fake, **options):
    sys.modules["jax"] = fake
    loader = prefetch.Loader(sys.argv[1], batch_size=4, image_size=8, seed=3, workers=1)
    try:
        prefetch.keras.dataset(loader, **options)
    except (RuntimeError, BackendStarted) as error:
        return type(error).__name__ + ": " + str(error)
    return [loader.options.shard_index, loader.options.num_shards, len(loader),
            [int(i) for b in loader.batch_indices(0) for i in b]]

print(json.dumps({
    "ranks": [made(fake_jax(3, rank)) for rank in range(3)],
    "one process": made(fake_jax(1, 0)),
    "not initialised": made(fake_jax(3, 1, initialized=False, backend_allowed=False)),
    "old jax": made(fake_jax(3, 1, initialized=None, backend_allowed=False)),
    "not asked": made(fake_jax(3, 1, backend_allowed=False), distributed=False),
    "required": made(fake_jax(3, 1, initialized=False, backend_allowed=False), distributed=True),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)  # a subprocess that imports Keras and torch
def test_the_keras_dataset_shards_by_process_in_a_multi_process_jax_job(tmp_path: Path) -> None:
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("needs Keras and torch")
    folder = write_image_folder(tmp_path / "images", per_class=7, size=(10, 10))  # 21 samples
    script = tmp_path / "processes.py"
    script.write_text(JAX_PROCESSES)
    environment = {**os.environ, "KERAS_BACKEND": "torch"}
    result = subprocess.run(
        [sys.executable, str(script), str(folder)],
        env=environment, capture_output=True, text=True, timeout=110, cwd=HERE.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # jax.distributed initialised, 3 processes: shard jax.process_index() of 3, 7 samples
    # each (21 divides), 2 batches each, together every sample once.
    assert [rank[:3] for rank in found["ranks"]] == [[r, 3, 2] for r in range(3)]
    assert sorted(i for rank in found["ranks"] for i in rank[3]) == list(range(21))
    unsharded = [0, 1, 6]
    assert found["one process"][:3] == unsharded
    # Not initialised (and Keras not on JAX): not sharded, and JAX's backend never asked.
    assert found["not initialised"][:3] == unsharded
    assert found["old jax"][:3] == unsharded
    assert found["not asked"][:3] == unsharded
    assert found["required"].startswith("RuntimeError: distributed=True needs a multi-process")
