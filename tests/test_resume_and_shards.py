"""Resume mid-epoch from state_dict (also in a fresh process), and disjoint shards.

Each runs through both worker backends and several worker counts: the state and the shards
depend only on (seed, epoch, position), never on who decodes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
from prefetch.testing import assert_same_batches, random_flip_and_noise, write_image_folder

pytestmark = pytest.mark.timeout(60)

OPTIONS = dict(
    batch_size=7,
    image_size=(16, 16),
    seed=11,
    augment=prefetch.Augment(transform=random_flip_and_noise),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("resume"), per_class=10, size=(20, 20))


def sharded(loader: prefetch.Loader, num_shards: int, index: int) -> prefetch.Loader:
    """`loader`, made to yield shard `index` of `num_shards`."""
    loader.shard(num_shards, index)
    return loader


def epochs_of(loader: prefetch.Loader, count: int) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    with loader:
        return [[(x.copy(), y.copy()) for x, y in loader] for _ in range(count)]


@pytest.fixture(scope="module")
def uninterrupted(folder: Path) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Two epochs of an uninterrupted run (thread backend, 2 workers)."""
    return epochs_of(prefetch.Loader(folder, workers=2, **OPTIONS), 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers_before, workers_after", [(2, 1), (1, 3)])
@pytest.mark.parametrize(
    "backend_before, backend_after",
    [("thread", "thread"), ("process", "process"), ("thread", "process"), ("process", "thread")],
)
def test_resuming_mid_epoch_gives_the_batches_of_an_uninterrupted_run(
    folder: Path,
    uninterrupted: list[list[tuple[np.ndarray, np.ndarray]]],
    backend_before: str,
    backend_after: str,
    workers_before: int,
    workers_after: int,
) -> None:
    first = prefetch.Loader(folder, workers=workers_before, backend=backend_before, **OPTIONS)  # type: ignore[arg-type]
    with first:
        for taken, _ in enumerate(first, start=1):
            if taken == 3:
                break
        state = first.state_dict()
    assert state.items() >= {"seed": 11, "epoch": 0, "position": 3}.items()

    resumed = prefetch.Loader(
        folder,
        workers=workers_after,
        backend=backend_after,
        batch_size=7,
        image_size=(16, 16),
        augment=prefetch.Augment(transform=random_flip_and_noise),
    )
    resumed.load_state_dict(state)
    rest_of_epoch, next_epoch = epochs_of(resumed, 2)
    assert_same_batches(rest_of_epoch, uninterrupted[0][3:])
    assert_same_batches(next_epoch, uninterrupted[1])


def test_state_at_the_end_of_an_epoch_points_at_the_start_of_the_next(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS)  # type: ignore[arg-type]
    assert loader.state_dict().items() >= {"seed": 11, "epoch": 0, "position": 0}.items()
    for _ in loader:
        pass
    assert loader.state_dict().items() >= {"seed": 11, "epoch": 1, "position": 0}.items()


def test_a_state_from_another_batch_size_is_refused_with_a_reason(folder: Path) -> None:
    loader = prefetch.Loader(folder, **OPTIONS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="another batch_size"):
        loader.load_state_dict({"seed": 1, "epoch": 0, "position": 99})


RESUME_SCRIPT = """
import json, sys
import numpy as np
import prefetch
from prefetch.testing import random_flip_and_noise

if __name__ == "__main__":
    folder, state_file, out, backend, workers = sys.argv[1:6]
    loader = prefetch.Loader(folder, batch_size=7, image_size=(16, 16), workers=int(workers),
                             augment=prefetch.Augment(transform=random_flip_and_noise),
                             backend=backend)
    loader.load_state_dict(json.loads(open(state_file).read()))
    images = [x.copy() for x, _ in loader]
    np.save(out, np.concatenate(images))
"""


@pytest.mark.parametrize("backend, workers", [("thread", 2), ("process", 1), ("process", 3)])
def test_resuming_in_a_fresh_process_continues_the_same_epoch(
    folder: Path,
    tmp_path: Path,
    uninterrupted: list[list[tuple[np.ndarray, np.ndarray]]],
    backend: str,
    workers: int,
) -> None:
    loader = prefetch.Loader(folder, workers=2, backend=backend, **OPTIONS)  # type: ignore[arg-type]
    iterator = iter(loader)
    next(iterator), next(iterator)
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(loader.state_dict()))
    del iterator
    script = tmp_path / "resume.py"
    script.write_text(textwrap.dedent(RESUME_SCRIPT))
    out = tmp_path / "rest.npy"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            str(folder),
            str(state_file),
            str(out),
            backend,
            str(workers),
        ],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, result.stderr
    expected = np.concatenate([x for x, _ in uninterrupted[0][2:]])
    np.testing.assert_array_equal(np.load(out), expected)


def test_shards_are_disjoint_and_together_cover_each_epoch(folder: Path) -> None:
    shards = [
        sharded(prefetch.Loader(folder, batch_size=4, image_size=(16, 16), seed=3), 3, i)
        for i in range(3)
    ]
    for epoch in range(2):
        parts = [np.concatenate(shard.batch_indices(epoch)) for shard in shards]
        combined = np.concatenate(parts)
        assert sorted(combined.tolist()) == list(range(30))  # disjoint, and all covered
        order = prefetch.plan._epochs.epoch_order(30, shuffle=True, seed=3, epoch=epoch)
        for index, part in enumerate(parts):
            np.testing.assert_array_equal(part, order[index::3])
    counted = [sum(len(y) for _, y in shard) for shard in shards]
    assert counted == [10, 10, 10]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_shards_deliver_disjoint_samples_covering_each_epoch(
    folder: Path, backend: str, workers: int
) -> None:
    files = prefetch.ImageFolder(folder)
    numbered = prefetch.FileList(files.paths, np.arange(len(files)))  # label = sample index
    options: dict[str, Any] = dict(batch_size=4, image_size=(16, 16), seed=3, workers=workers)
    shards = [
        sharded(prefetch.Loader(numbered, backend=backend, **options), 3, i) for i in range(3)
    ]
    delivered = [epochs_of(shard, 2) for shard in shards]
    for epoch in range(2):
        parts = [[y.tolist() for _, y in epochs[epoch]] for epochs in delivered]
        for shard, part in zip(shards, parts, strict=True):
            assert part == [b.tolist() for b in shard.batch_indices(epoch)]
        combined = [index for part in parts for batch in part for index in batch]
        assert sorted(combined) == list(range(30)), "disjoint, and all covered"


def test_a_shard_index_outside_the_shard_count_is_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match=r"shard_index must be in \[0, num_shards=2\), got 2"):
        prefetch.Loader(folder).shard(2, 2)
