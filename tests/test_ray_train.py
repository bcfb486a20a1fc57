"""Ray Train (issue 47): a `TorchTrainer` with 2 CPU workers, each reading a prefetch Loader on
the Ray backend through `prefetch.torch.DeviceLoader`, trains a small model for 2 epochs.

Ray Train sets up in each worker what torchrun would (its process group, and torchrun's
LOCAL_WORLD_SIZE/LOCAL_RANK, which `prefetch._host` reads): the DeviceLoader shards the Loader
by Ray Train's own rank and world size, as under torchrun, and the two ranks share the decode
node's CPUs (one each of its two). Every rank takes as many steps per epoch, and the shards
cover the epoch. The training runs as a user runs it, a script (`python train.py`) that joins
a real cluster (tests/ray_cluster.py): the head holds the two training workers, a decode node
of 2 CPUs the decoding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import RESOURCE, running_cluster

from prefetch.testing import write_image_folder

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2

TRAIN = """
import json
import sys
import time
from pathlib import Path

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

import prefetch
import prefetch.torch

ADDRESS, ROOT, OUT, RESOURCE = sys.argv[1:5]


def train_loop(config):
    loader = prefetch.Loader(
        ROOT, batch_size=4, image_size=16, seed=3, workers=1,
        backend=prefetch.RayOptions(resource=RESOURCE),
    )
    feed = prefetch.torch.DeviceLoader(loader)  # shards by Ray Train's rank, as torchrun's
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(16 * 16 * 3, 3))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, images = [], 0
    with loader:
        deadline = time.monotonic() + 60  # its worker here and its actor there, both ready
        while sum(p.actors for p in loader.stats().decoded_on) < 2:
            assert time.monotonic() < deadline, loader.stats().decoded_on
            time.sleep(0.1)
        for epoch in range(2):
            count = 0
            for batch, targets in feed:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(batch), targets).backward()
                optimizer.step()
                count, images = count + 1, images + len(targets)
            steps.append(count)
        remote = [p.actors for p in loader.stats().decoded_on if not p.local]
    rank = torch.distributed.get_rank()
    record = {
        "shard": [loader.options.num_shards, loader.options.shard_index],
        "steps": steps,
        "images": images,
        "remote_actors": remote,
        "reason": loader.backend_reason,
    }
    Path(OUT, f"rank-{rank}.json").write_text(json.dumps(record))


ray.init(address=ADDRESS, log_to_driver=False)
TorchTrainer(
    train_loop,
    scaling_config=ScalingConfig(
        num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1, "trainer": 1}
    ),
    run_config=RunConfig(storage_path=str(Path(OUT, "runs")), name="prefetch"),
).fit()
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # The training workers on the head (its "trainer" resource), never on the decode node.
    yield from running_cluster(
        decode_nodes=1, cpus=2, head_cpus=WORKERS, head_resources={"trainer": WORKERS}
    )


def test_a_torch_trainer_of_two_workers_trains_two_epochs_on_its_shards(
    cluster: Any, tmp_path: Path
) -> None:
    import ray

    root = write_image_folder(tmp_path / "tree", per_class=10, size=(32, 24))
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TRAIN, cluster.address, str(root), str(out), RESOURCE],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=240,
    )
    # Ray Train's autoscaling coordinator is detached (it outlives the job): it is Ray
    # Train's, not the loader's, so it is ended here rather than counted as a leak.
    for named in ray.util.list_named_actors(all_namespaces=True):
        ray.kill(ray.get_actor(named["name"], namespace=named["namespace"]))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(WORKERS)]
    assert [r["shard"] for r in records] == [[WORKERS, 0], [WORKERS, 1]]
    assert records[0]["steps"] == records[1]["steps"] == [4, 4]  # 15 samples each, batches of 4
    assert [r["images"] for r in records] == [2 * 15, 2 * 15]
    assert [r["remote_actors"] for r in records] == [[1], [1]], records  # 1 of the 2 CPUs each
    assert all("LOCAL_WORLD_SIZE=2" in r["reason"] for r in records), records[0]["reason"]
