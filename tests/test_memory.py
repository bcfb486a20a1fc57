"""Memory: numpy file lists, resident memory flat over epochs, and the process backend's ring.

Resident memory is read per process from /proc/<pid>/status (found with psutil: this process
and its worker children). Plain RSS counts a shared-memory page once in every process that has
touched it, and which worker first touches which slot of the ring depends on scheduling, so it
can creep up for many epochs by up to workers x ring bytes without anything leaking. So
`resident_bytes()` adds up each process's private and file-backed pages (RssAnon + RssFile) and
counts the shared ring once, by the sizes of our /dev/shm segments.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from prefetch import FileList, ImageFolder, Loader
from prefetch.backends._ring import ring_capacity
from prefetch.backends._shm import PREFIX, SHM_DIR, SlotLayout
from prefetch.sources._folders import PathArray
from prefetch.testing import worker_processes, write_image_folder

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)"),
]

BACKENDS = ("thread", "process")
MIB = 1 << 20
# Growth allowed over the measured epochs. After the warm-up epochs the growth measured on the
# 2-core development machine was under 30 KiB for both backends (3 runs each). A batch here is
# 216 KiB (8 x 96 x 96 x 3): a consumer keeping one batch per epoch made it grow by 3.6 MiB over
# the 17 measured epochs, and leaking one per batch would add about 29 MiB; both exceed this.
GROWTH_TOLERANCE = 2 * MIB
# Epochs before the baseline is taken: the slot ring, malloc's arenas and Python's caches
# reach their size in the first epochs.
WARM_UP_EPOCHS = 3
EPOCHS = 20
# How much more private memory a worker process may hold than a fresh interpreter that has
# imported prefetch and decoded an image: multiprocessing's modules, the pickled source, and a
# few images being decoded. A worker that kept its decoded batches would pass it within the run.
WORKER_MARGIN = 16 * MIB


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 small JPEGs: 8 batches of 8 per epoch."""
    return write_image_folder(
        tmp_path_factory.mktemp("memory"), class_names=("a", "b"), per_class=32, size=(24, 24)
    )


def proc_status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/<pid>/status, in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key.startswith(("Rss", "Vm")) and value.strip().endswith("kB"):
                values[key] = int(value.split()[0]) * 1024
    return values


def our_segments() -> dict[str, int]:
    """Our /dev/shm segments (named after this process), with their sizes in bytes."""
    mine = f"{PREFIX}{os.getpid()}_"
    return {
        name: os.path.getsize(os.path.join(SHM_DIR, name))
        for name in os.listdir(SHM_DIR)
        if name.startswith(mine)
    }


def resident_bytes() -> int:
    """Private and file-backed resident memory of this process and its children, plus the ring."""
    gc.collect()
    total = sum(our_segments().values())
    for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        status = proc_status(process.pid)
        total += status["RssAnon"] + status["RssFile"]
    return total


def ring_bytes(loader: Loader) -> int:
    """(depth + 2) slots of one batch each (images, int32 labels, the rows' start times): what a
    consumer that drops each batch before the next keeps in use."""
    return (loader.options.depth + 2) * SlotLayout(
        loader.options.batch_size, loader.image_shape
    ).nbytes


def test_file_lists_keep_paths_and_labels_in_compact_numpy_buffers(folder: Path) -> None:
    for source in (
        ImageFolder(folder),
        FileList([str(p) for p in sorted(folder.rglob("*.jpg"))], [0] * 64),
        FileList(sorted(folder.rglob("*.jpg"))),
        ImageFolder(folder).subset([3, 1, 2]),
    ):
        # UTF-8 bytes, a separator and an offset per path: no Python object per path to copy.
        assert isinstance(source.paths, PathArray)
        assert source.paths.nbytes <= 8 + sum(len(str(p).encode()) + 9 for p in source.paths)
        assert isinstance(source.labels, np.ndarray) and source.labels.dtype == np.int32
        assert len(source.paths) == len(source.labels) == len(source)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resident_memory_stays_flat_over_twenty_epochs(folder: Path, backend: str) -> None:
    loader = Loader(folder, batch_size=8, image_size=(96, 96), workers=2, seed=1, backend=backend)
    readings = []
    with loader:
        for _ in range(EPOCHS):
            checksum = 0
            for images, _ in loader:
                checksum += int(images.sum())  # touch every page of the batch
            assert checksum > 0
            readings.append(resident_bytes())
    baseline = readings[WARM_UP_EPOCHS - 1]
    growth = [reading - baseline for reading in readings[WARM_UP_EPOCHS:]]
    assert max(growth) < GROWTH_TOLERANCE, (
        f"resident memory grew by {max(growth) / MIB:.1f} MiB after epoch {WARM_UP_EPOCHS} "
        f"(per epoch, MiB: {[round(r / MIB, 1) for r in readings]})"
    )


@pytest.mark.parametrize("depth", [1, 3])
def test_the_shared_ring_holds_depth_plus_two_batches_while_iterating(
    folder: Path, depth: int
) -> None:
    loader = Loader(
        folder, batch_size=8, image_size=(32, 32), workers=2, depth=depth, backend="process"
    )
    sizes, names = [], []
    with loader:
        for _ in range(3):
            for _batch in loader:
                segments = our_segments()
                sizes.append(sum(segments.values()))
                names.append(frozenset(segments))
    assert not our_segments()
    assert max(sizes) == ring_bytes(loader)
    steady = depth + 2  # from this batch on, every slot of the ring exists
    assert set(sizes[steady:]) == {ring_bytes(loader)}
    assert len(set(names[steady:])) == 1, "the same segments serve every later batch and epoch"


def test_each_worker_maps_at_most_the_ring_and_keeps_a_fixed_private_memory(
    folder: Path, tmp_path: Path
) -> None:
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, prefetch; "
            "prefetch.decode_image(sys.argv[1], prefetch.DecodeOptions((96, 96))); "
            "print(open('/proc/self/status').read())",
            str(next(folder.rglob("*.jpg"))),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    fresh_anon = next(
        int(line.split()[1]) * 1024
        for line in fresh.stdout.splitlines()
        if line.startswith("RssAnon:")
    )
    loader = Loader(
        folder, batch_size=8, image_size=(96, 96), workers=2, depth=2, backend="process"
    )
    page = os.sysconf("SC_PAGE_SIZE")
    slot_pages = -(-ring_bytes(loader) // (loader.options.depth + 2) // page)
    with loader:
        for _ in range(5):
            for _batch in loader:
                pass
        statuses = [proc_status(worker.pid) for worker in worker_processes()]
    assert len(statuses) == 2
    for status in statuses:
        assert status["RssShmem"] <= (loader.options.depth + 2) * slot_pages * page
        assert status["RssAnon"] <= fresh_anon + WORKER_MARGIN, (
            f"a worker holds {status['RssAnon'] / MIB:.1f} MiB of private memory, a fresh "
            f"interpreter {fresh_anon / MIB:.1f} MiB"
        )


def test_segments_of_batches_the_consumer_kept_are_given_back_once_it_drops_them(
    folder: Path,
) -> None:
    loader = Loader(
        folder, batch_size=4, image_size=(32, 32), workers=1, depth=2, backend="process"
    )
    with loader:
        for _ in range(3):
            kept = list(loader)  # e.g. a whole validation epoch collected for a metric
            del kept
            for _batch in loader:  # later epochs that keep nothing
                pass
        held = len(our_segments())
    assert held <= ring_capacity(loader.options.depth)
