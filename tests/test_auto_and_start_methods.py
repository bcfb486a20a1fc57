"""backend="auto" (threads or processes, from a measurement); spawn and forkserver workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest

import prefetch
from prefetch.backends._shm import PREFIX, sweep_stale
from prefetch.testing import (
    CrashingDecoder,
    GilHoldingTransform,
    assert_same_batches,
    worker_processes,
    write_image_folder,
)

SMALL = (16, 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("auto"), per_class=8, size=(48, 48))


def epoch_batches(loader: prefetch.Loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(b.images.copy(), b.labels.copy()) for b in loader]


class ArraySource:
    """A plain indexable dataset of arrays (no file paths)."""

    def __init__(self, count: int) -> None:
        self.images = np.random.default_rng(0).integers(0, 255, (count, 16, 16, 3), np.uint8)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], index % 3


def test_auto_picks_processes_for_files_and_says_why(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=8, image_size=SMALL, backend="auto", seed=1)
    with loader:
        batches = epoch_batches(loader)
    stats = loader.stats()
    assert stats.backend == "process"
    assert stats.backend_reason.startswith("auto: process (files are decoded in worker processes")
    assert "training thread" in stats.backend_reason
    expected = prefetch.Loader(folder, batch_size=8, image_size=SMALL, seed=1, backend="thread")
    assert_same_batches(batches, epoch_batches(expected))


class LargeArraySource(ArraySource):
    """Large arrays: resizing them to the target size (which releases the GIL) is the work."""

    def __init__(self, count: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 255, (count, 1024, 1024, 3), np.uint8)


def test_auto_keeps_threads_for_a_source_whose_work_releases_the_gil() -> None:
    loader = prefetch.Loader(LargeArraySource(8), batch_size=4, image_size=SMALL, seed=1)
    with loader:
        assert sum(len(b.images) for b in loader) == 8
    reason = loader.stats().backend_reason
    assert loader.stats().backend == "thread", reason
    assert "GIL was held for" in reason and "processes from 25%" in reason


def test_auto_picks_processes_when_a_python_transform_dominates(folder: Path) -> None:
    transform = GilHoldingTransform(0.004)
    loader = prefetch.Loader(
        folder,
        batch_size=8,
        image_size=SMALL,
        backend="auto",
        augment=prefetch.Augment(transform=transform),
        seed=2,
    )
    with loader:
        batches = epoch_batches(loader)
    stats = loader.stats()
    assert stats.backend == "process", stats.backend_reason
    assert stats.backend_reason.startswith("auto: process")
    threads = prefetch.Loader(
        folder,
        batch_size=8,
        image_size=SMALL,
        augment=prefetch.Augment(transform=transform),
        seed=2,
    )
    assert_same_batches(batches, epoch_batches(threads))


def test_auto_counts_a_sources_own_getitem_as_python_work() -> None:
    quick = prefetch.Loader(ArraySource(12), batch_size=4, image_size=SMALL, backend="auto")
    with quick:
        assert sum(len(b.images) for b in quick) == 12
    assert quick.stats().backend in ("thread", "process")
    assert "samples" in quick.stats().backend_reason


def test_an_explicit_backend_is_reported_as_asked_for(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=8, image_size=SMALL, backend="thread")
    assert loader.stats().backend_reason == "backend='thread' was asked for"


def test_fork_is_refused_with_the_reason(folder: Path) -> None:
    with pytest.raises(ValueError, match="never forked"):
        prefetch.Loader(
            folder,
            backend=prefetch.ProcessOptions(start_method="fork"),
        )


def test_forkserver_workers_give_the_same_batches_as_spawned_ones(folder: Path) -> None:
    results = []
    for method in ("spawn", "forkserver"):
        loader = prefetch.Loader(
            folder,
            batch_size=5,
            image_size=SMALL,
            workers=2,
            backend=prefetch.ProcessOptions(start_method=method),
            seed=3,
        )
        with loader:
            results.append(epoch_batches(loader) + epoch_batches(loader))
    assert_same_batches(results[0], results[1])


def test_forkserver_restarts_a_crashed_worker_and_delivers_everything_once(
    folder: Path, tmp_path: Path
) -> None:
    decoder = CrashingDecoder("circle_0003", once_flag=str(tmp_path / "crashed"))
    loader = prefetch.Loader(
        folder,
        batch_size=4,
        image_size=SMALL,
        workers=2,
        backend=prefetch.ProcessOptions(start_method="forkserver"),
        decoder=decoder,
        seed=4,
    )
    with loader:
        batches = epoch_batches(loader)
    expected = prefetch.Loader(folder, batch_size=4, image_size=SMALL, seed=4)
    assert_same_batches(batches, epoch_batches(expected))
    assert (tmp_path / "crashed").exists()


TF_PARENT_SCRIPT = """
import sys, time
import tensorflow as tf  # noqa: F401  (the parent runs TensorFlow)
import prefetch
from prefetch.testing import SlowDecoder

if __name__ == "__main__":
    loader = prefetch.Loader(sys.argv[1], batch_size=2, image_size=(16, 16), workers=2,
                             backend=prefetch.ProcessOptions(start_method=sys.argv[2]),
                             decoder=SlowDecoder(0.2))
    with loader:
        for batch in loader:
            print("batch", flush=True)
            time.sleep(60)
"""


# A fresh interpreter imports TensorFlow before its workers start: 6 s on a quiet 2-core
# machine, 43 s with four busy loops beside it.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_of_a_tensorflow_process_never_load_tensorflow_and_die_with_it(
    folder: Path, tmp_path: Path, method: str
) -> None:
    script = tmp_path / "tf_parent.py"
    script.write_text(textwrap.dedent(TF_PARENT_SCRIPT))
    parent = subprocess.Popen(
        [sys.executable, str(script), str(folder), method], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "batch"
        parent_libraries = {m.path for m in psutil.Process(parent.pid).memory_maps()}
        assert any("tensorflow" in path for path in parent_libraries)
        workers = worker_processes(parent.pid)
        assert len(workers) == 2
        for worker in workers:
            loaded = [m.path for m in worker.memory_maps() if "tensorflow" in m.path]
            assert not loaded, f"worker {worker.pid} loaded TensorFlow: {loaded[:3]}"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        # Generous on purpose: orphans notice their parent's death within about a second (end of
        # file on the pipe, or its pid gone) and exit; on a busy machine their exit can take
        # seconds more. Workers that never notice run for good, which this still catches.
        _, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, "orphaned workers kept running after their parent died"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        swept = sweep_stale()  # the killed parent could not unlink its segments
    assert all(name.startswith(PREFIX) for name in swept)


MAIN_TRANSFORM_SCRIPT = """
import sys
import numpy as np
import prefetch


def invert(image, rng):
    return 255 - image


if __name__ == "__main__":
    for method in ("spawn", "forkserver"):
        loader = prefetch.Loader(sys.argv[1], batch_size=4, image_size=(8, 8), workers=2,
                                 backend=prefetch.ProcessOptions(start_method=method),
                                 augment=prefetch.Augment(transform=invert), shuffle=False)
        plain = prefetch.Loader(sys.argv[1], batch_size=4, image_size=(8, 8), shuffle=False)
        with loader:
            got = np.concatenate([b.images for b in loader])
        want = 255 - np.concatenate([b.images for b in plain])
        print(method, bool((got == want).all()), flush=True)
"""


def test_a_transform_defined_in_the_main_script_reaches_the_workers(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "main_transform.py"
    script.write_text(textwrap.dedent(MAIN_TRANSFORM_SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["spawn", "True", "forkserver", "True"]
