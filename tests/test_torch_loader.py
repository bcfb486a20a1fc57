"""prefetch.torch: tensors in the asked layout and dtype, a real training loop, the
IterableDataset view, resume, torch.distributed shares, and the missing-framework messages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import run_python, write_image_folder

torch = pytest.importorskip("torch")
import prefetch.torch  # noqa: E402

OPTIONS: dict[str, Any] = dict(batch_size=16, image_size=(24, 24), workers=2, seed=0)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("shapes"), per_class=20, size=(32, 32))


def test_batches_are_nchw_channels_last_floats_normalised_with_int64_labels(shapes: Path) -> None:
    reference, loader = prefetch.Loader(shapes, **OPTIONS), prefetch.Loader(shapes, **OPTIONS)
    expected = [(images.copy(), labels.copy()) for images, labels in reference]
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.5)
    batches = list(prefetch.torch.DeviceLoader(loader, mean=mean, std=std))
    assert len(batches) == len(expected) == 4
    for (images, labels), (raw, raw_labels) in zip(batches, expected, strict=True):
        assert images.shape == (len(raw), 3, 24, 24) and images.dtype == torch.float32
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.dtype == torch.int64 and labels.tolist() == raw_labels.tolist()
        want = (raw.transpose(0, 3, 1, 2) / 255 - np.reshape(mean, (1, 3, 1, 1))) / np.reshape(
            std, (1, 3, 1, 1)
        )
        np.testing.assert_allclose(images.numpy(), want, rtol=1e-5, atol=1e-5)


def test_uint8_contiguous_nchw_and_half_precision_are_given_as_asked(shapes: Path) -> None:
    raw = next(iter(prefetch.Loader(shapes, **OPTIONS))).images.copy()
    loader = prefetch.Loader(shapes, **OPTIONS)
    plain = prefetch.torch.DeviceLoader(
        loader, dtype=torch.uint8, memory_format=torch.contiguous_format
    )
    images, _ = next(iter(plain))
    assert images.dtype == torch.uint8 and images.is_contiguous()
    assert np.array_equal(images.numpy(), raw.transpose(0, 3, 1, 2))
    half, _ = next(iter(prefetch.torch.DeviceLoader(loader, dtype=torch.bfloat16)))
    assert half.dtype == torch.bfloat16 and float(half.max()) <= 1.0


def test_kept_tensors_are_never_overwritten_by_later_batches(shapes: Path) -> None:
    for dtype in (torch.uint8, torch.float32):
        loader = prefetch.Loader(shapes, **{**OPTIONS, "depth": 1})
        kept = list(prefetch.torch.DeviceLoader(loader, dtype=dtype))
        loader = prefetch.Loader(shapes, **{**OPTIONS, "depth": 1})
        expected = [
            (x.clone(), y.clone()) for x, y in prefetch.torch.DeviceLoader(loader, dtype=dtype)
        ]
        assert all(torch.equal(a[0], b[0]) for a, b in zip(kept, expected, strict=True))


def converter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("prefetch-torch-convert")]


def test_on_a_cpu_device_the_next_batch_is_converted_in_a_thread_that_ends_with_the_epoch(
    shapes: Path,
) -> None:
    loader = prefetch.Loader(shapes, **OPTIONS)
    device_loader = prefetch.torch.DeviceLoader(loader, mean=0.5, std=0.5)
    with loader:
        epoch = iter(device_loader)
        first = next(epoch)
        # While the consumer holds batch 0, batch 1 is being (or has been) converted there.
        assert len(converter_threads()) == 1
        assert first[0].shape == (16, 3, 24, 24)
        epoch.close()  # the consumer stops early: the thread ends with the epoch
        assert converter_threads() == []
        assert len(list(device_loader)) == 4  # a whole epoch after that, then no thread left
        assert converter_threads() == []


def test_bad_options_are_refused_naming_the_fix(shapes: Path) -> None:
    loader = prefetch.Loader(shapes, **OPTIONS)
    with pytest.raises(ValueError, match="floating dtype"):
        prefetch.torch.DeviceLoader(loader, dtype=torch.uint8, mean=0.5)
    with pytest.raises(ValueError, match="one value per channel"):
        prefetch.torch.DeviceLoader(loader, mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="or a floating dtype"):
        prefetch.torch.DeviceLoader(loader, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="init_process_group"):
        prefetch.torch.DeviceLoader(loader, distributed=True)


@pytest.mark.slow
def test_a_torch_training_loop_learns_the_shapes(shapes: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveMaxPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 3),
    ).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    loader = prefetch.Loader(shapes, **{**OPTIONS, "batch_size": 12})
    batches = prefetch.torch.DeviceLoader(loader, mean=0.5, std=0.5)
    with loader:
        for _ in range(12):
            for images, labels in batches:
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        model.eval()
        with torch.no_grad():
            right = sum(int((model(x).argmax(1) == y).sum()) for x, y in batches)
    assert loader.stats().epochs == 13
    assert right / 60 > 0.6, f"training accuracy {right / 60:.2f} is not clearly above chance"


def test_the_iterable_dataset_view_works_in_a_dataloader_without_workers(shapes: Path) -> None:
    loader = prefetch.Loader(shapes, **OPTIONS)
    dataset = prefetch.torch.DeviceLoader(loader, dtype=torch.uint8).dataset()
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    data = torch.utils.data.DataLoader(dataset, batch_size=None)
    assert len(data) == 4
    assert sum(len(labels) for _, labels in data) == 60
    workers = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1))
    try:
        with pytest.raises(RuntimeError, match="num_workers=0"):
            next(workers)
    finally:
        workers._shutdown_workers()  # type: ignore[attr-defined]  # its worker and queue thread


def test_state_dict_counts_batches_handed_out_and_resumes_the_same_batches(shapes: Path) -> None:
    reference = prefetch.torch.DeviceLoader(prefetch.Loader(shapes, **OPTIONS), dtype=torch.uint8)
    expected = [labels for _ in range(2) for _, labels in reference]
    first = prefetch.torch.DeviceLoader(prefetch.Loader(shapes, **OPTIONS), dtype=torch.uint8)
    epoch = iter(first)
    seen = [next(epoch)[1] for _ in range(2)]
    state = first.state_dict()  # one more batch was read ahead, not handed out
    assert state.items() >= {"seed": 0, "epoch": 0, "position": 2}.items()
    epoch.close()
    resumed = prefetch.torch.DeviceLoader(prefetch.Loader(shapes, **OPTIONS), dtype=torch.uint8)
    resumed.dataset().load_state_dict(state)
    got = [labels for _ in range(2) for _, labels in resumed]
    assert all(torch.equal(a, b) for a, b in zip(seen + got, expected, strict=True))


DDP_RANK = """
import json, sys
import torch, torch.distributed as dist
import prefetch, prefetch.torch
dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2)
def make():
    loader = prefetch.Loader(sys.argv[1], batch_size=4, image_size=8, workers=1, seed=7,
                             label_mode=None, backend="thread")
    return loader, prefetch.torch.DeviceLoader(loader, dtype=torch.uint8)
loader, batches = make()  # sharded by the process group's rank and world size
whole = [int(x.sum()) for x in batches]  # epoch 0, uninterrupted
_, batches = make()
epoch = iter(batches)
first = [int(next(epoch).sum())]
state = batches.state_dict()
epoch.close()
_, resumed = make()
resumed.load_state_dict(state)
rest = [int(x.sum()) for x in resumed]
print(json.dumps({"shard": [loader.options.shard_index, loader.options.num_shards],
                  "indices": [int(i) for b in loader.batch_indices(0) for i in b],
                  "state": state, "same_order": first + rest == whole}))
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(180)  # two spawned Python processes that import torch
def test_under_torch_distributed_each_rank_reads_a_disjoint_share_of_the_epoch(
    shapes: Path, tmp_path: Path
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(DDP_RANK))
    environment = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": str(ROOT),
    }
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(shapes), str(rank)],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=150) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-3000:] for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["shard"] for r in results] == [[0, 2], [1, 2]]
    shares = [set(r["indices"]) for r in results]
    assert not shares[0] & shares[1]
    assert shares[0] | shares[1] == set(range(60))
    for result in results:  # stopped after one batch, resumed: the same batches in order
        assert result["state"].items() >= {"seed": 7, "epoch": 0, "position": 1}.items()
        assert result["same_order"]


BLOCKED = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
import prefetch
try:
    import prefetch.{adapter}
except ModuleNotFoundError as error:
    print(type(error).__name__, error)
"""


@pytest.mark.parametrize(
    "adapter, module, extra",
    [("tf", "tensorflow", "tf"), ("torch", "torch", "torch"), ("keras", "keras", "keras")],
)
def test_a_missing_framework_is_named_with_the_extra_that_installs_it(
    adapter: str, module: str, extra: str
) -> None:
    code = BLOCKED.format(module=module, adapter=adapter)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout
    assert lines[0].startswith(f"ModuleNotFoundError prefetch.{adapter} needs ")
    assert f'pip install "prefetch[{extra}]"' in lines[0]
    assert " (or " in lines[0]  # and the alternative


def test_importing_prefetch_imports_no_framework() -> None:
    code = (
        "import sys, prefetch; print(sorted({'tensorflow', 'torch', 'keras'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_batches_equal_the_cpu_ones_and_kept_ones_are_never_overwritten(
    shapes: Path,
) -> None:
    options = {**OPTIONS, "depth": 1}
    on_cpu = list(prefetch.torch.DeviceLoader(prefetch.Loader(shapes, **options), mean=0.5))
    loader = prefetch.Loader(shapes, **options)
    on_gpu = list(prefetch.torch.DeviceLoader(loader, device="cuda", mean=0.5))
    torch.cuda.synchronize()
    assert all(x.device.type == "cuda" and y.device.type == "cuda" for x, y in on_gpu)
    for (x, y), (cx, cy) in zip(on_gpu, on_cpu, strict=True):
        torch.testing.assert_close(x.cpu(), cx)
        assert torch.equal(y.cpu(), cy)
