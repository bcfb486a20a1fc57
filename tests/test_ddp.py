"""Four CPU ranks train a DistributedDataParallel model through prefetch.torch.DeviceLoader
(issue 41, item 2): every rank gets the same number of batches, so no collective step waits
for a rank that has none, and every sample of each epoch is read (the padding once more).

37 samples (prime), 4 ranks, batches of 3: unpadded, rank 0 would have 10 samples (4 batches)
and the others 9 (3 batches), and rank 0's fourth all-reduce would wait for ranks that never
come. Each rank is a process of its own (gloo on loopback), its loader one thread worker.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.testing import free_ports, log_tails, run_together, write_image_folder

pytest.importorskip("torch")

RANKS = 4
SAMPLES = 37
BATCH = 3
EPOCHS = 2
ROOT = Path(__file__).resolve().parent.parent

RANK_SCRIPT = """
import datetime, json, os, sys
import numpy as np
import torch
import torch.distributed as dist
import prefetch, prefetch.torch

folder, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# A collective that waits longer than this fails the rank instead of hanging it.
dist.init_process_group(
    "gloo", rank=rank, world_size={ranks}, timeout=datetime.timedelta(seconds=60)
)
torch.manual_seed(0)
files = prefetch.ImageFolder(folder)
ids = prefetch.FileList(files.paths, np.arange(len(files)), [str(i) for i in range(len(files))])
loader = prefetch.Loader(ids, batch_size={batch}, image_size=8, workers=1, backend="thread", seed=7)
batches = prefetch.torch.DeviceLoader(loader)  # sharded by rank
net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, len(files)))
model = torch.nn.parallel.DistributedDataParallel(net)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
result = {{"shard": [loader.options.shard_index, loader.options.num_shards], "epochs": []}}
with loader:
    for epoch in range({epochs}):
        seen, steps = [], 0
        for images, labels in batches:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()  # after the gradients' all-reduce with every other rank
            seen += labels.tolist()
            steps += 1
        result["epochs"].append({{"ids": seen, "steps": steps, "length": len(batches)}})
result["weights"] = [float(p.detach().sum()) for p in model.parameters()]
dist.barrier()
dist.destroy_process_group()
with open(out + ".part", "w") as file:
    json.dump(result, file)
os.replace(out + ".part", out)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ddp")
    return write_image_folder(root, class_names=("circle",), per_class=SAMPLES, size=(10, 10))


# Four processes that import torch and train: 25-40 s on a quiet 2-core machine; the deadline
# leaves room for a busy one. A rank whose collective waits 60 s fails (the gloo timeout).
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_ranks_train_the_same_steps_and_read_every_sample(folder: Path, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT.format(ranks=RANKS, batch=BATCH, epochs=EPOCHS)))
    environment = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_ports(1)[0]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    outs = [tmp_path / f"rank{rank}.json" for rank in range(RANKS)]
    logs = [tmp_path / f"rank{rank}.log" for rank in range(RANKS)]
    commands = [
        [sys.executable, str(script), str(folder), str(rank), str(out)]
        for rank, out in enumerate(outs)
    ]
    codes = run_together(commands, [environment] * RANKS, logs, timeout_s=260)
    assert codes == [0] * RANKS, f"exit codes {codes} (None: killed)\n{log_tails(logs)}"
    results = [json.loads(out.read_text()) for out in outs]
    assert [r["shard"] for r in results] == [[rank, RANKS] for rank in range(RANKS)]
    files = prefetch.ImageFolder(folder)
    whole = prefetch.Loader(
        prefetch.FileList(files.paths, np.arange(SAMPLES)), batch_size=1, image_size=8, seed=7
    )
    for epoch in range(EPOCHS):
        runs = [r["epochs"][epoch] for r in results]
        # ceil(37 / 4) = 10 samples each: 4 batches (3, 3, 3, 1) on every rank.
        assert [(run["steps"], run["length"]) for run in runs] == [(4, 4)] * RANKS
        first = [int(b[0]) for b in whole.batch_indices(epoch)][: -SAMPLES % RANKS]
        read = Counter(i for run in runs for i in run["ids"])
        assert read == Counter([*range(SAMPLES), *first])  # the epoch's first 3 twice
    # DDP all-reduced every step's gradients: the ranks end with the same weights.
    for result in results[1:]:
        assert result["weights"] == pytest.approx(results[0]["weights"])
