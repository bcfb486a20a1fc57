"""Multi-process Keras as docs/many-gpus.md shows it (issue 45, item 9): its JAX example with two
real JAX processes on the CPU, and its `MultiWorkerMirroredStrategy` example with two TensorFlow
workers on localhost, each run as written.

What the suite adds to a page's example: `make_model` (the reader's, before it), fewer epochs,
the launcher's part (JAX's coordinator on a free loopback port, passed to
`jax.distributed.initialize`, which finds it itself under SLURM, Open MPI and on Cloud TPU;
`TF_CONFIG` for each worker) and, after it, a line that writes what the process ended with:
its steps and its weights. The processes run at once on the sample folder of
tests/doc_blocks.py (300 JPEGs: 150 per process, 3 batches of 64), under a deadline: a process
that hangs in a collective fails the test, never the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from doc_blocks import block, environment, run_all, run_folder, sample_data

from prefetch.testing import free_ports

PAGE = "docs/many-gpus.md"
SAMPLES = 300  # data/train of the sample
DEADLINE_S = 240  # both processes together, on a busy 2-core machine

# The reader's model: any uint8 images, 3 classes, compiled (JAX's `fit` needs it compiled).
MAKE_MODEL = """
def make_model():
    import keras

    model = keras.Sequential(
        [
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(4, 3, strides=4, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3),
        ]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

"""
# After the example: what this process ended with, for the test to compare.
RESULT = """
import json as _json
import sys as _sys

_weights = [w.tolist() for w in {model}.get_weights()]
_result = {{"steps": int({optimizer}.iterations.numpy()), "shard": [train.options.num_shards,
           train.options.shard_index], "batches": len(train), "weights": _weights}}
with open(_sys.argv[1], "w") as _file:
    _json.dump(_result, _file)
"""


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data(tmp_path_factory.mktemp("keras-multiprocess"))


def program(contains: str, replace: list[tuple[str, str]], result: str) -> str:
    code = block(PAGE, contains).code
    for old, new in replace:
        assert old in code, f"{PAGE}'s example no longer has {old!r}"
        code = code.replace(old, new)
    return MAKE_MODEL + code + result


def run_processes(folder: Path, script: str, envs: list[dict[str, str]]) -> list[dict]:
    """Run `script` once per environment, at once, in `folder`; each process's result."""
    (folder / "example.py").write_text(script, encoding="utf-8")
    outs = [folder / f"result{i}.json" for i in range(len(envs))]
    commands = [[sys.executable, "example.py", str(out)] for out in outs]
    results = run_all(commands, folder, envs, DEADLINE_S)
    for result in results:
        assert result.returncode == 0, f"exit codes {[r.returncode for r in results]}\n" + (
            "\n".join(r.stderr[-3000:] for r in results)
        )
    return [json.loads(out.read_text()) for out in outs]


def worker(cluster: dict[str, list[str]], index: int) -> dict[str, object]:
    return {"cluster": cluster, "task": {"type": "worker", "index": index}}


def assert_trained_in_step(results: list[dict], epochs: int) -> None:
    """Every process read its own shard, took the same steps, and ended with the same weights."""
    processes = len(results)
    assert [r["shard"] for r in results] == [[processes, i] for i in range(processes)]
    batches = -(-SAMPLES // processes // 64)  # 150 samples per process: 3 batches of 64
    assert [r["batches"] for r in results] == [batches] * processes
    assert [r["steps"] for r in results] == [batches * epochs] * processes
    for result in results[1:]:
        for mine, first in zip(result["weights"], results[0]["weights"], strict=True):
            np.testing.assert_allclose(mine, first, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S + 60)
def test_the_jax_example_trains_two_jax_processes_in_step(sample: Path, tmp_path: Path) -> None:
    pytest.importorskip("jax")
    port = free_ports(1)[0]
    initialize = (
        f'jax.distributed.initialize(coordinator_address="127.0.0.1:{port}", num_processes=2, '
        "process_id=int(os.environ['PROCESS_ID']))"
    )
    script = program(
        "jax.distributed.initialize()",
        [("jax.distributed.initialize()", initialize), ("epochs=10", "epochs=2")],
        RESULT.format(model="model", optimizer="model.optimizer"),
    )
    envs = [
        environment(KERAS_BACKEND="jax", PROCESS_ID=str(i), JAX_PLATFORMS="cpu") for i in range(2)
    ]
    results = run_processes(run_folder(tmp_path, sample), script, envs)
    assert_trained_in_step(results, epochs=2)


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S + 60)
def test_the_multi_worker_example_trains_two_workers_in_step(sample: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    script = program(
        "tf.distribute.MultiWorkerMirroredStrategy()",
        [("for epoch in range(10):", "for epoch in range(2):")],
        RESULT.format(model="model", optimizer="optimizer"),
    )
    envs = [
        environment(KERAS_BACKEND="tensorflow", TF_CONFIG=json.dumps(worker(cluster, i)))
        for i in range(2)
    ]
    results = run_processes(run_folder(tmp_path, sample), script, envs)
    assert_trained_in_step(results, epochs=2)
