"""tf.distribute: one shard per input pipeline, MirroredStrategy and MultiWorkerMirroredStrategy.

The strategies run in subprocesses: logical CPU devices must be configured before TensorFlow
initialises its devices, and each MultiWorkerMirroredStrategy worker is its own process. Every
sample carries its index as its label, so the scripts can report which samples each replica saw.
"""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import free_ports, log_tails, run_together, write_image_folder

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.timeout(60)

SAMPLES = 21  # 3 classes x 7: odd, so shards and batches come out uneven

# Shared by the scripts: the generated folder as a FileList whose label is the sample index.
SAMPLE_IDS = """
import numpy as np

import prefetch


def sample_ids(folder):
    files = prefetch.ImageFolder(folder)
    count = len(files)
    return prefetch.FileList(files.paths, np.arange(count), [str(i) for i in range(count)])
"""

MIRRORED_SCRIPT = """
import json
import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras

import prefetch.tf

folder, out = sys.argv[1], sys.argv[2]
ids = sample_ids(folder)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
loader = prefetch.Loader(ids, batch_size=5, image_size=(8, 8), workers=2, seed=0)
contexts = []


def dataset_fn(context):
    contexts.append(
        [context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync]
    )
    return prefetch.tf.dataset(loader, input_context=context)


@tf.function
def labels_per_replica(images, labels):
    return strategy.run(lambda images, labels: labels, args=(images, labels))


result = {"replicas": strategy.num_replicas_in_sync, "epochs": []}
with loader:
    batches = strategy.distribute_datasets_from_function(dataset_fn)
    for epoch in range(2):
        steps = []
        for images, labels in batches:
            per_replica = strategy.experimental_local_results(labels_per_replica(images, labels))
            steps.append([replica.numpy().tolist() for replica in per_replica])
        result["epochs"].append(steps)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(len(ids)),
            ]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batches, epochs=2, shuffle=False, verbose=0)
result["contexts"] = contexts
result["loss"] = history.history["loss"]
with open(out, "w") as file:
    json.dump(result, file)
"""

MULTI_WORKER_SCRIPT = """
import json
import os
import sys

import keras
import tensorflow as tf

import prefetch.tf

folder, out = sys.argv[1], sys.argv[2]
ids = sample_ids(folder)
communication = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING,
    timeout_seconds=120,  # a collective whose peer is gone fails instead of hanging
)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication)
loader = prefetch.Loader(ids, batch_size=5, image_size=(8, 8), workers=1, seed=0)
with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(len(ids)),
        ]
    )
    optimizer = keras.optimizers.SGD(0.1)


@tf.function
def train_step(images, labels):
    def step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_sample = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )
            loss = tf.nn.compute_average_loss(per_sample)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss, labels

    loss, labels = strategy.run(step, args=(images, labels))
    return strategy.reduce("SUM", loss, axis=None), labels


result = {"epochs": []}
with loader:
    batches = strategy.distribute_datasets_from_function(
        lambda context: prefetch.tf.dataset(loader, input_context=context)
    )
    result["shard"] = [loader.options.num_shards, loader.options.shard_index]
    for epoch in range(2):
        seen, losses = [], []
        for images, labels in batches:
            loss, labels = train_step(images, labels)
            losses.append(float(loss))
            local = strategy.experimental_local_results(labels)
            seen += [int(i) for replica in local for i in replica.numpy()]
        result["epochs"].append({"ids": seen, "losses": losses})
result["weights"] = [float(tf.reduce_sum(v)) for v in model.trainable_variables]
with open(out + ".part", "w") as file:
    json.dump(result, file)
os.replace(out + ".part", out)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("distribute"), per_class=7, size=(16, 16))


def sample_ids(folder: Path) -> prefetch.FileList:
    files = prefetch.ImageFolder(folder)
    return prefetch.FileList(files.paths, np.arange(len(files)), [str(i) for i in range(SAMPLES)])


def labels_of_epochs(loader: prefetch.Loader, ds: Any, epochs: int) -> list[list[int]]:
    with loader:
        return [[int(i) for _, labels in ds for i in labels.numpy()] for _ in range(epochs)]


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(textwrap.dedent(SAMPLE_IDS) + textwrap.dedent(body))
    return script


def worker_env(**extra: str) -> dict[str, str]:
    """CPU only, TensorFlow's INFO logs off, the checkout importable."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="1", **extra)
    root = str(Path(prefetch.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


# ---- input_context in this process -------------------------------------------------------


def test_each_input_pipeline_reads_its_own_shard_and_together_they_cover_every_epoch(
    folder: Path,
) -> None:
    epochs_by_pipeline = []
    for pipeline in range(3):
        loader = prefetch.Loader(sample_ids(folder), batch_size=4, image_size=(8, 8), seed=7)
        context = tf.distribute.InputContext(3, pipeline, 3)
        ds = prefetch.tf.dataset(loader, input_context=context)
        assert (loader.options.num_shards, loader.options.shard_index) == (3, pipeline)
        assert ds.cardinality().numpy() == len(loader) == 2  # 7 samples: batches of 4 and 3
        epochs_by_pipeline.append(labels_of_epochs(loader, ds, 2))
    for epoch in range(2):
        parts = [epochs[epoch] for epochs in epochs_by_pipeline]
        combined = [i for part in parts for i in part]
        assert sorted(combined) == list(range(SAMPLES))  # disjoint, and all covered
    assert epochs_by_pipeline[0][0] != epochs_by_pipeline[0][1]  # each epoch reshuffled


def test_input_pipelines_of_a_size_that_does_not_divide_yield_the_same_batches(
    folder: Path,
) -> None:
    # 21 samples on 2 pipelines: 11 each (the epoch's first sample twice), batches of 5, 5, 1
    # (unpadded, 11 and 10 samples gave 3 and 2 batches).
    lengths, read = [], []
    for pipeline in range(2):
        loader = prefetch.Loader(sample_ids(folder), batch_size=5, image_size=(8, 8), seed=7)
        ds = prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, pipeline, 2))
        with loader:
            batches = [labels.numpy().tolist() for _, labels in ds]
        lengths.append((int(ds.cardinality().numpy()), len(loader), len(batches)))
        read += [i for batch in batches for i in batch]
    assert lengths == [(3, 3, 3), (3, 3, 3)]
    whole = prefetch.Loader(sample_ids(folder), batch_size=5, image_size=(8, 8), seed=7)
    assert sorted(read) == sorted([*range(SAMPLES), int(whole.batch_indices(0)[0][0])])


def test_a_single_input_pipeline_leaves_the_loader_unsharded(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8))  # a random seed is fine
    prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(1, 0, 2))
    assert (loader.options.num_shards, loader.options.shard_index, len(loader)) == (1, 0, 6)


def test_a_loader_that_has_begun_an_epoch_is_not_re_sharded(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
    with loader:
        next(iter(loader))
        with pytest.raises(RuntimeError, match=r"shard\(2, 1\)") as raised:
            prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, 1, 2))
    assert "input_context asks for shard 1 of 2" in "\n".join(raised.value.__notes__)
    assert (loader.options.num_shards, loader.options.shard_index) == (1, 0)


def test_a_loader_already_made_for_the_pipeline_is_accepted_after_epochs(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
    loader.shard(2, 1)
    with loader:
        for _ in loader:
            pass
        ds = prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, 1, 2))
        assert sum(len(y) for _, y in ds) == 11  # 21 samples, padded to 2 x 11


def test_sharding_a_shuffling_loader_with_a_random_seed_is_refused(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8))
    with pytest.raises(ValueError, match=r"explicit seed.*same seed= to the Loader"):
        prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, 0, 2))
    unshuffled = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), shuffle=False)
    unshuffled.shard(2, 0)  # the order is the same everywhere without shuffling
    assert len(unshuffled) == 3


def test_a_per_replica_batch_leaving_a_replica_without_data_is_refused(folder: Path) -> None:
    # 2 pipelines feeding 2 replicas each; shard 1 has 10 samples: one batch of 16.
    loader = prefetch.Loader(folder, batch_size=16, image_size=(8, 8), seed=0)
    with pytest.raises(ValueError, match="get_per_replica_batch_size") as raised:
        prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, 1, 4))
    assert "1 batches of 16 per epoch for its 2 replicas" in str(raised.value)


def test_shard_refuses_bad_values_and_a_shard_without_a_batch(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
    with pytest.raises(ValueError, match=r"shard_index must be in \[0, num_shards=2\), got 2"):
        loader.shard(2, 2)
    with pytest.raises(ValueError, match="num_shards must be an int >= 1, got 0"):
        loader.shard(0, 0)
    dropping = prefetch.Loader(folder, batch_size=8, image_size=(8, 8), seed=0, drop_remainder=True)
    with pytest.raises(ValueError, match="0 batches of 8: too few"):
        dropping.shard(3, 2)  # 7 samples
    assert (dropping.options.num_shards, dropping.options.shard_index) == (1, 0)


def test_resuming_a_shard_from_its_state_continues_where_it_stopped(folder: Path) -> None:
    options = dict(batch_size=3, image_size=(8, 8), seed=4)
    first = prefetch.Loader(sample_ids(folder), **options)  # type: ignore[arg-type]
    first.shard(2, 1)
    with first:
        epoch = iter(first)
        next(epoch)
        state = first.state_dict()
        rest = [int(i) for _, labels in epoch for i in labels]
    assert state["position"] == 1 and len(rest) == 8  # 11 samples (21 padded to 2 x 11)
    resumed = prefetch.Loader(sample_ids(folder), **options)  # type: ignore[arg-type]
    resumed.load_state_dict(state)
    ds = prefetch.tf.dataset(resumed, input_context=tf.distribute.InputContext(2, 1, 2))
    assert labels_of_epochs(resumed, ds, 1) == [rest]


def test_re_sharding_after_the_dataset_was_made_fails_at_iteration(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
    ds = prefetch.tf.dataset(loader, input_context=tf.distribute.InputContext(2, 0, 2))
    loader.shard(2, 1)
    with pytest.raises(RuntimeError, match=r"made for shard 0 of 2.*one Loader per input"), loader:
        for _ in ds:
            pass


def test_an_input_context_of_another_type_is_refused(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=(8, 8), seed=0)
    with pytest.raises(TypeError, match=r"tf\.distribute\.InputContext"):
        prefetch.tf.dataset(loader, input_context=(2, 0))  # type: ignore[arg-type]


# ---- strategies, in subprocesses -----------------------------------------------------------


# Keras fit in a fresh interpreter that imports TensorFlow: 8 s on a quiet 2-core machine, 49 s
# with four busy loops beside it.
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_mirrored_strategy_on_two_cpus_gives_every_sample_to_one_replica_once_per_epoch(
    folder: Path, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "mirrored.py", MIRRORED_SCRIPT)
    out, log = tmp_path / "mirrored.json", tmp_path / "mirrored.log"
    codes = run_together(
        [[sys.executable, str(script), str(folder), str(out)]], [worker_env()], [log], 150
    )
    assert codes == [0], f"exit codes {codes}\n{log_tails([log])}"
    result = json.loads(out.read_text())
    assert result["replicas"] == 2
    assert result["contexts"] == [[1, 0, 2]]  # one input pipeline feeding both replicas
    for steps in result["epochs"]:
        # 5 batches of at most 5 for 2 replicas: 3 steps, the last one gives a replica nothing.
        assert len(steps) == 3
        assert all(len(step) == 2 for step in steps)
        assert all(len(batch) <= 5 for step in steps for batch in step)
        by_replica = [[i for step in steps for i in step[r]] for r in range(2)]
        assert all(by_replica), "a replica got no data"
        assert sorted(by_replica[0] + by_replica[1]) == list(range(SAMPLES))
    assert len(result["loss"]) == 2 and all(math.isfinite(x) for x in result["loss"])


# Two TensorFlow processes train in step: 11 s on a quiet 2-core machine, 62 s with four busy
# loops beside it.
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_multi_worker_mirrored_strategy_workers_read_equal_shards_and_train_in_step(
    folder: Path, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "worker.py", MULTI_WORKER_SCRIPT)
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    outs = [tmp_path / f"worker{i}.json" for i in range(2)]
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    envs = [
        worker_env(
            TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
        )
        for i in range(2)
    ]
    commands = [[sys.executable, str(script), str(folder), str(out)] for out in outs]
    codes = run_together(commands, envs, logs, timeout_s=200)
    assert codes == [0, 0], f"exit codes {codes} (None: killed at the deadline)\n{log_tails(logs)}"
    results = [json.loads(out.read_text()) for out in outs]
    assert [r["shard"] for r in results] == [[2, 0], [2, 1]]
    whole = prefetch.Loader(sample_ids(folder), batch_size=5, image_size=(8, 8), seed=0)
    for epoch in range(2):
        seen = [r["epochs"][epoch]["ids"] for r in results]
        # 21 samples padded to 2 x 11: the epoch's first sample comes again at its end.
        assert len(seen[0]) == len(seen[1]) == 11
        first = int(whole.batch_indices(epoch)[0][0])
        assert set(seen[0]) & set(seen[1]) == {first}
        assert sorted(seen[0] + seen[1]) == sorted([*range(SAMPLES), first])
        losses = [r["epochs"][epoch]["losses"] for r in results]
        assert len(losses[0]) == len(losses[1]) == 3  # batches of 5, 5, 1 on both workers
        assert all(math.isfinite(x) for x in losses[0] + losses[1])
        assert losses[0] == pytest.approx(losses[1])  # the same all-reduced loss per step
    # The gradients were all-reduced: both workers end with the same weights.
    assert results[0]["weights"] == pytest.approx(results[1]["weights"])
