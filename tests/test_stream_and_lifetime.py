"""A Loader's epochs as Stream objects, and its lifetime: kept batches, dropped and exiting loaders.

Kept batches must cost memory only (no file descriptor each, so any number can be kept under the
usual open-file limit); a loader that is dropped, or still entered when the script exits, closes
quietly: no spurious restart, no traceback, no thread or /dev/shm segment left behind. The
process cases run in subprocesses: they need their own open-file limit or their own exit.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch import Batch, Loader, ProcessOptions, Stream
from prefetch.backends._ring import KEPT_REFERENCED_SLOTS
from prefetch.backends._shm import PREFIX, SHM_DIR
from prefetch.testing import RendezvousDecoder, assert_same_batches, write_image_folder

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_image_folder(
        tmp_path / "images", class_names=("a", "b"), per_class=10, size=(12, 12)
    )


def run_script(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100, cwd=tmp_path
    )


def our_segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if name.startswith(f"{PREFIX}{pid}_")]


# --- Stream ------------------------------------------------------------------------------------


def test_iterating_gives_a_stream_that_begins_at_its_first_next(folder: Path) -> None:
    loader = Loader(folder, batch_size=4, image_size=(8, 8), workers=1, seed=1)
    stream = iter(loader)
    assert isinstance(stream, Stream) and stream.epoch is None
    assert loader.state_dict().items() >= {"seed": 1, "epoch": 0, "position": 0}.items()
    first = next(stream)
    assert isinstance(first, Batch) and stream.epoch == 0 and stream.position == 1
    stream.close()
    assert loader.state_dict().items() >= {"seed": 1, "epoch": 0, "position": 1}.items()
    assert list(stream) == []  # a closed stream is exhausted
    assert [len(b.images) for b in iter(loader)] == [4] * 5  # the next epoch is whole


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_closing_a_stream_early_stops_an_unentered_loader(folder: Path, backend: str) -> None:
    loader = Loader(folder, batch_size=2, image_size=(8, 8), workers=2, backend=backend)
    stream = iter(loader)
    next(stream)
    stream.close()
    assert loader._epochs.workers.backend is None  # closed: the no_leaks fixture checks the rest


def test_a_consumer_that_keeps_every_batch_gets_copies_once_the_ring_is_crowded(
    folder: Path,
) -> None:
    loader = Loader(folder, batch_size=2, image_size=(8, 8), workers=1, depth=2, seed=3)
    kept = list(loader)
    views = [b for b in kept if b.images.base is not None and not b.images.flags.owndata]
    assert len(kept) == 10
    # The first batches are views into ring slots; once KEPT_REFERENCED_SLOTS of them are held,
    # later ones are private copies, so the ring never grows past its capacity.
    assert len(views) <= KEPT_REFERENCED_SLOTS + loader.options.depth
    assert all(b.images.flags.owndata for b in kept[KEPT_REFERENCED_SLOTS + loader.options.depth :])
    again = list(Loader(folder, batch_size=2, image_size=(8, 8), workers=1, depth=2, seed=3))
    for a, b in zip(kept, again, strict=True):
        np.testing.assert_array_equal(a.images, b.images)


def test_thousands_of_kept_process_batches_need_no_open_file_each(tmp_path: Path) -> None:
    """1,200 kept batches under an open-file limit of 256: each kept batch used to hold one."""
    result = run_script(
        f"""
        import os, resource
        from prefetch import Loader
        from prefetch.backends._ring import ring_capacity
        from prefetch.backends._shm import PREFIX, SHM_DIR
        from prefetch.testing import RendezvousDecoder, assert_same_batches, write_image_folder

        if __name__ == "__main__":
            folder = write_image_folder({str(tmp_path / "imgs")!r}, class_names=("a", "b"),
                                        per_class=25, size=(8, 8))
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
            loader = Loader(folder, batch_size=1, image_size=(8, 8), workers=1, depth=2,
                            backend="process")
            kept, most = [], 0
            with loader:
                for _ in range(24):
                    for batch in loader:
                        kept.append(batch)
                    ours = f"{PREFIX}{os.getpid()}_"
                    mine = [n for n in os.listdir(SHM_DIR) if n.startswith(ours)]
                    most = max(most, len(mine))
            assert most <= ring_capacity(loader.options.depth), most
            print("kept", len(kept), "fds", len(os.listdir("/proc/self/fd")))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    assert words[:2] == ["kept", "1200"]
    assert int(words[3]) < 100, result.stdout


@pytest.mark.parametrize(
    ("backend", "workers", "readers"),
    [("thread", 8, 8), (ProcessOptions(threads_per_worker=2), 3, 6)],
    ids=["threads", "processes with reader threads"],
)
def test_every_worker_reads_at_once_even_past_what_depth_alone_would_feed(
    folder: Path, tmp_path: Path, backend: str | ProcessOptions, workers: int, readers: int
) -> None:
    # depth 2 x batch 2 = 4 rows, 2 batches: too few for 8 threads, or 3 processes of 2 reader
    # threads, that wait on slow storage. The stream keeps two rows per thread and two batches
    # per such process in flight (Session.in_flight), so all of them read at once.
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    loader = Loader(
        folder,
        batch_size=2,
        depth=2,
        workers=workers,
        backend=backend,
        seed=4,
        decoder=RendezvousDecoder(arrivals, readers),
    )
    got = [(b.images.copy(), b.labels.copy()) for b in loader]
    want = [(b.images.copy(), b.labels.copy()) for b in Loader(folder, batch_size=2, seed=4)]
    assert_same_batches(got, want)


def test_a_worker_process_with_reader_threads_reads_two_batches_at_once(
    folder: Path, tmp_path: Path
) -> None:
    # one process, 4 reader threads, batches of 2: the next batch's rows are read while the
    # current one's are, so 4 rows are in the readers at once (BATCHES_AT_ONCE)
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    loader = Loader(
        folder,
        batch_size=2,
        depth=1,
        workers=1,
        backend=ProcessOptions(threads_per_worker=4),
        seed=4,
        decoder=RendezvousDecoder(arrivals, 4),
    )
    got = [(b.images.copy(), b.labels.copy()) for b in loader]
    want = [(b.images.copy(), b.labels.copy()) for b in Loader(folder, batch_size=2, seed=4)]
    assert_same_batches(got, want)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_new_workers_count_as_starting_until_they_answer_a_batch(
    folder: Path, backend: str
) -> None:
    loader = Loader(folder, batch_size=4, workers=1, backend=backend, image_size=(12, 12))
    with loader:
        started, _ = loader._epochs.start()
        assert started.starting() == (1 if backend == "process" else 0)
        next(iter(loader))
        assert started.starting() == 0


# --- dropped and exiting loaders ---------------------------------------------------------------


def test_an_entered_thread_loader_that_is_dropped_stops_its_workers(folder: Path) -> None:
    loader = Loader(folder, batch_size=2, image_size=(8, 8), workers=2, backend="thread")
    loader.__enter__()
    next(iter(loader))
    workers = [t for t in threading.enumerate() if t.name.startswith("prefetch-worker")]
    assert workers
    del loader
    gc.collect()
    for thread in workers:
        thread.join(timeout=30)  # a generous bound: they exit at once when woken
    assert not any(t.is_alive() for t in workers)


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("how", ["entered", "dropped mid-epoch"])
def test_a_script_that_exits_with_an_open_loader_exits_quietly(
    tmp_path: Path, backend: str, how: str
) -> None:
    result = run_script(
        f"""
        import os
        from prefetch import Loader
        from prefetch.testing import RendezvousDecoder, assert_same_batches, write_image_folder

        if __name__ == "__main__":
            folder = write_image_folder({str(tmp_path / "imgs")!r}, class_names=("a", "b"),
                                        per_class=6, size=(8, 8))
            loader = Loader(folder, batch_size=2, image_size=(8, 8), workers=2,
                            backend={backend!r})
            if {how!r} == "entered":
                loader.__enter__()
                batches = iter(loader)
                next(batches)
            else:
                batches = iter(loader)
                next(batches)
                del loader
            print("pid", os.getpid(), flush=True)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    pid = int(result.stdout.split()[1])
    assert "restarting" not in result.stderr
    assert "Exception ignored" not in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert our_segments_of(pid) == []


# --- options -----------------------------------------------------------------------------------


def test_process_options_select_the_process_backend_with_their_settings(folder: Path) -> None:
    options = ProcessOptions(max_restarts=0, start_method="spawn")
    loader = Loader(folder, batch_size=4, image_size=(8, 8), workers=1, backend=options)
    assert loader.backend_name == "process"
    assert loader.options.process == options and loader.options.process.method == "spawn"
    with loader:
        assert len(list(loader)) == 5
    assert loader.stats().backend == "process"


@pytest.mark.parametrize(
    ("keyword", "spelling"),
    [
        ("max_restarts", "backend=ProcessOptions(max_restarts=...)"),
        ("start_method", "backend=ProcessOptions(start_method=...)"),
        ("num_shards", "loader.shard(num_shards, shard_index)"),
        ("shard_index", "loader.shard(num_shards, shard_index)"),
        ("max_skipped", 'on_error=ErrorPolicy("skip", max_skipped=...)'),
        ("sample_timeout_s", "on_error=ErrorPolicy(sample_timeout_s=...)"),
        ("memory_budget", "workers=Autotune(memory_budget=...)"),
        ("cache_dir", "remote=RemoteOptions(cache_dir=...)"),
        ("crop", "augment=Augment(crop=...)"),
        ("flip", "augment=Augment(flip=True)"),
        ("transform", "augment=Augment(transform=...)"),
        ("copy", "batch.images.copy()"),
    ],
)
def test_a_removed_keyword_is_refused_naming_its_new_spelling(
    folder: Path, keyword: str, spelling: str
) -> None:
    with pytest.raises(
        TypeError, match=f"no longer takes {keyword}=: pass .*{re.escape(spelling)}"
    ):
        Loader(folder, **{keyword: 1})


def test_process_options_are_checked(folder: Path) -> None:
    with pytest.raises(ValueError, match="start_method must be one of"):
        ProcessOptions(start_method="fork")
    with pytest.raises(ValueError, match="max_restarts must be >= 0"):
        ProcessOptions(max_restarts=-1)


def test_options_are_read_only_after_construction(folder: Path) -> None:
    loader = Loader(folder, batch_size=4, image_size=(8, 8))
    with pytest.raises(AttributeError):
        loader.options.batch_size = 8  # type: ignore[misc]
    assert loader.options.batch_size == 4


def test_the_options_read_back_what_the_loader_was_made_with(folder: Path) -> None:
    process = ProcessOptions(max_restarts=1)
    augment = prefetch.Augment(prefetch.CenterCrop(), flip=True)
    loader = Loader(
        folder,
        image_size=8,
        workers="auto",
        backend=process,
        on_error="skip",
        augment=augment,
        color_mode="grayscale",
    )
    options = loader.options
    assert options.image_size == (8, 8) and isinstance(options.seed, int)
    assert options.workers == prefetch.Autotune() and options.memory_budget is None
    assert (options.backend, options.process) == ("process", process)
    assert options.on_error == prefetch.ErrorPolicy("skip")
    assert options.augment == augment and options.color_mode == "grayscale"
    assert options.decode.shape == loader.image_shape == (8, 8, 1)
    assert options.remote == prefetch.RemoteOptions() and options.cache_dir is None
    assert (options.num_shards, options.shard_index) == (1, 0)


def test_shard_and_load_state_dict_change_the_options_they_set(folder: Path) -> None:
    loader = Loader(folder, batch_size=2, image_size=(8, 8), seed=3)
    loader.shard(2, 1)
    loader.load_state_dict({"seed": 9, "epoch": 1, "position": 0})
    assert (loader.options.num_shards, loader.options.shard_index) == (2, 1)
    assert loader.options.seed == 9 and loader.state_dict()["seed"] == 9
    budget = Loader(folder, image_size=(8, 8), workers=prefetch.Autotune(memory_budget=2**30))
    assert budget.options.memory_budget == 2**30 and budget.autotune


# --- labels from user sources ------------------------------------------------------------------


class TwoClasses:
    """A user source whose labels are given per index; has two classes."""

    def __init__(self, labels: list[object]) -> None:
        self.class_names = ["cat", "dog"]
        self.labels_given = labels

    def __len__(self) -> int:
        return len(self.labels_given)

    def __getitem__(self, index: int) -> tuple[np.ndarray, object]:
        return np.zeros((8, 8, 3), np.uint8), self.labels_given[index]


@pytest.mark.parametrize("label_mode", ["int", "categorical"])
@pytest.mark.parametrize("bad", [-1, 7, 1.5, "dog"])
def test_a_label_outside_the_classes_is_a_value_error_naming_sample_and_label(
    label_mode: str, bad: object
) -> None:
    source = TwoClasses([0, 1, bad, 0])
    loader = Loader(source, batch_size=4, image_size=(8, 8), workers=1, label_mode=label_mode)
    with pytest.raises(ValueError, match=f"label {bad!r}|label {bad} ") as raised:
        list(loader)
    # The note names the user code that returned it, and the fix there (not on_error).
    assert "TwoClasses.__getitem__(2)" in "\n".join(getattr(raised.value, "__notes__", []))


def test_a_bad_label_is_skipped_and_counted_under_on_error_skip() -> None:
    source = TwoClasses([0, 1, 9, 0])
    loader = Loader(
        source, batch_size=4, image_size=(8, 8), workers=1, on_error="skip", shuffle=False
    )
    (batch,) = list(loader)
    assert batch.labels is not None and list(batch.labels) == [0, 1, 0]
    assert loader.stats().skipped == 1


def test_labels_are_checked_once_per_sample_not_per_batch_shape() -> None:
    labels = [np.int64(1), np.int32(0), True, 1.0]  # whole numbers of any type are accepted
    source = TwoClasses(labels)
    (batch,) = list(Loader(source, batch_size=4, image_size=(8, 8), workers=1, shuffle=False))
    assert batch.labels is not None and list(batch.labels) == [1, 0, 1, 1]
    assert prefetch.sources._labels.check_label(np.int64(1), 2) == 1


# --- reads in flight and read latency ------------------------------------------------------------


class GatedSource:
    """A user source whose samples from `gate_from` on wait for `gate` (a slow remote read)."""

    def __init__(self, size: int, gate_from: int) -> None:
        self.size, self.gate_from = size, gate_from
        self.gate = threading.Event()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        if index >= self.gate_from:
            self.gate.wait(60)
        return np.zeros((8, 8, 3), np.uint8), 0


def test_stats_show_the_reads_in_flight_and_the_read_latency() -> None:
    source = GatedSource(12, gate_from=4)
    loader = Loader(
        source, batch_size=4, image_size=(8, 8), workers=3, backend="thread", shuffle=False
    )
    stream = iter(loader)
    try:
        next(stream)  # batch 0 is ungated; the workers now wait in batch 1's samples
        in_flight = 0
        for _ in range(600):  # a generous bound (60 s) for the workers to reach the gate
            in_flight = loader.stats().reads_in_flight
            if in_flight == 3:
                break
            threading.Event().wait(0.1)
        assert in_flight == 3  # one per worker thread, each stuck in a gated read
    finally:
        source.gate.set()
    assert len([batch for batch in stream]) == 2
    stats = loader.stats()
    assert stats.reads_in_flight == 0
    assert 0 <= stats.read_p50_s <= stats.read_p90_s <= stats.read_p99_s
    assert "ms (p50)" in str(stats)
