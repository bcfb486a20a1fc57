"""backend="process": spawned workers, shared-memory slots, crashes, errors, and cleanup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import prefetch
from prefetch import ProcessOptions
from prefetch.backends._shm import PREFIX, SHM_DIR, check_free_space, sweep_stale
from prefetch.errors import RemoteTraceback, WorkerCrashedError
from prefetch.testing import (
    CrashingDecoder,
    FailingDecoder,
    SlowDecoder,
    assert_same_batches,
    random_flip_and_noise,
    worker_processes,
    write_bad_files,
    write_image_folder,
)
from prefetch.tools.timeline import TimedDecoder

pytestmark = pytest.mark.timeout(60)

SMALL = (16, 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("proc"), per_class=12, size=(24, 24))


def our_segments() -> list[str]:
    """This process's segments (other test runs on the machine have their own)."""
    ours = f"{PREFIX}{os.getpid()}_"
    return [name for name in os.listdir(SHM_DIR) if name.startswith(ours)]


def all_batches(loader: prefetch.Loader, epochs: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    with loader:
        return [(x.copy(), y.copy()) for _ in range(epochs) for x, y in loader]


def test_processes_give_the_same_batches_as_threads_for_two_epochs(folder: Path) -> None:
    options = dict(
        batch_size=5,
        image_size=SMALL,
        seed=4,
        augment=prefetch.Augment(transform=random_flip_and_noise),
    )
    threads = all_batches(prefetch.Loader(folder, workers=2, **options), epochs=2)  # type: ignore[arg-type]
    processes = all_batches(
        prefetch.Loader(folder, workers=2, backend="process", **options),
        epochs=2,  # type: ignore[arg-type]
    )
    assert_same_batches(processes, threads)
    assert not our_segments()


def test_worker_processes_persist_across_epochs_inside_with(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=6, image_size=SMALL, workers=2, backend="process")
    with loader:
        for _ in loader:
            pass
        first = {p.pid for p in _children()}
        for _ in loader:
            pass
        assert {p.pid for p in _children()} == first and len(first) == 2
    assert not _children()


def _children(pid: int | None = None) -> list[psutil.Process]:
    """Worker processes of `pid` (default: this process), less multiprocessing's helpers."""
    return worker_processes(pid)


def test_a_worker_error_keeps_its_type_with_the_worker_traceback_and_a_note(folder: Path) -> None:
    decoder = FailingDecoder("triangle_0002", error=PermissionError)
    loader = prefetch.Loader(
        folder, batch_size=6, image_size=SMALL, workers=2, backend="process", decoder=decoder
    )
    with pytest.raises(PermissionError, match="injected failure") as raised, loader:
        for _ in loader:
            pass
    assert isinstance(raised.value.__cause__, RemoteTraceback)
    assert "FailingDecoder" in str(raised.value.__cause__) or "__call__" in str(
        raised.value.__cause__
    )
    notes = "\n".join(raised.value.__notes__)
    assert "triangle_0002" in notes and "prefetch-process-" in notes


def test_skip_drops_bad_files_and_delivers_every_good_one_once(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "data", per_class=5, size=(24, 24))
    write_bad_files(root / "circle")
    loader = prefetch.Loader(
        root, batch_size=4, image_size=SMALL, workers=2, backend="process", on_error="skip"
    )
    with loader:
        labels = np.concatenate([y for _, y in loader])
    assert len(labels) == 15
    assert loader.stats().skipped == 4


def test_a_crash_restarts_the_worker_and_delivers_everything_once_in_order(
    folder: Path, tmp_path: Path
) -> None:
    options = dict(batch_size=5, image_size=SMALL, seed=9, workers=2)
    expected = all_batches(prefetch.Loader(folder, **options))  # type: ignore[arg-type]
    decoder = CrashingDecoder("square_0004", once_flag=str(tmp_path / "crashed"))
    loader = prefetch.Loader(folder, backend="process", decoder=decoder, **options)  # type: ignore[arg-type]
    assert_same_batches(all_batches(loader), expected)
    assert (tmp_path / "crashed").exists(), "the worker really crashed"


def test_more_crashes_than_max_restarts_raise_worker_crashed_error(folder: Path) -> None:
    loader = prefetch.Loader(
        folder,
        batch_size=5,
        image_size=SMALL,
        workers=2,
        backend=prefetch.ProcessOptions(max_restarts=1),
        decoder=CrashingDecoder("square_0004"),
    )
    started = time.monotonic()
    with pytest.raises(WorkerCrashedError) as raised, loader:
        for _ in loader:
            pass
    message = str(raised.value)
    assert "exit code 13" in message and "pid" in message and "square_0004" in message
    # Generous on purpose (1 s on a quiet 2-core machine, 5 s with four busy loops beside it):
    # it catches workers restarted past max_restarts, not a slow machine.
    assert time.monotonic() - started < 20


def test_a_worker_killed_from_outside_is_replaced_without_losing_a_batch(folder: Path) -> None:
    options = dict(batch_size=4, image_size=SMALL, seed=2, workers=2)
    expected = all_batches(prefetch.Loader(folder, **options))  # type: ignore[arg-type]
    loader = prefetch.Loader(folder, backend="process", decoder=SlowDecoder(0.02), **options)  # type: ignore[arg-type]
    got = []
    with loader:
        for i, (x, y) in enumerate(loader):
            if i == 1:
                os.kill(_children()[0].pid, signal.SIGKILL)
            got.append((x.copy(), y.copy()))
    assert_same_batches(got, expected)


def test_an_unpicklable_transform_is_refused_before_any_worker_starts(folder: Path) -> None:
    loader = prefetch.Loader(
        folder,
        image_size=SMALL,
        backend="process",
        augment=prefetch.Augment(transform=lambda image, rng: image),
    )
    with pytest.raises(TypeError, match="sends the transform to worker processes"), loader:
        pass


def test_batches_kept_after_close_stay_readable_and_no_segment_remains(folder: Path) -> None:
    loader = prefetch.Loader(folder, batch_size=6, image_size=SMALL, workers=2, backend="process")
    kept = list(loader)
    assert not our_segments()
    assert len(kept) == 6 and all(x.shape == (6, 16, 16, 3) for x, _ in kept)
    assert int(kept[-1][0].sum()) > 0


def test_too_little_shared_memory_fails_early_saying_how_to_fix_it() -> None:
    with pytest.raises(MemoryError, match=rf"Enlarge {SHM_DIR} .* or lower depth or batch_size"):
        check_free_space(1 << 60, slots=6, batch_size=64)


def test_segments_of_a_dead_parent_are_swept() -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = f"{SHM_DIR}/{PREFIX}{int(dead.stdout)}_deadbeef"
    Path(stale).write_bytes(b"\0" * 64)
    assert Path(stale).name in sweep_stale()
    assert not Path(stale).exists()


CTRL_C_SCRIPT = """
import os, signal, sys, time
import prefetch
from prefetch.testing import SlowDecoder

if __name__ == "__main__":
    # As in a terminal. A runner started in the background (`pytest &`, some CI shells) ignores
    # SIGINT, children inherit that, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    loader = prefetch.Loader(sys.argv[1], batch_size=2, image_size=(16, 16), workers=2,
                             backend="process", decoder=SlowDecoder(0.2))
    with loader:
        for batch in loader:
            print("batch", flush=True)
"""


def test_ctrl_c_gives_one_traceback_and_leaves_no_worker_or_segment(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "ctrl_c.py"
    script.write_text(textwrap.dedent(CTRL_C_SCRIPT))
    process = subprocess.Popen(
        [sys.executable, str(script), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.readline()  # the first batch arrived: workers are running
    workers = _children(process.pid)
    assert len(workers) == 2
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=20)
    assert stderr.count("Traceback (most recent call last)") == 1, stderr
    assert "KeyboardInterrupt" in stderr
    # Generous on purpose: the script joined its workers before it exited, so they are gone
    # or going; one that outlives this bound was left behind.
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive
    assert not [s for s in our_segments() if s.startswith(f"{PREFIX}{process.pid}_")]


PARENT_SCRIPT = """
import os, sys, time
import psutil
import prefetch
from prefetch.testing import SlowDecoder

if __name__ == "__main__":
    loader = prefetch.Loader(sys.argv[1], batch_size=2, image_size=(16, 16), workers=2,
                             backend="process", decoder=SlowDecoder(0.2))
    with loader:
        for batch in loader:
            workers = [c.pid for c in psutil.Process().children()
                       if "resource_tracker" not in " ".join(c.cmdline())]
            print(" ".join(map(str, workers)), flush=True)
            time.sleep(60)
"""


def test_workers_exit_within_seconds_when_their_parent_is_killed(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT_SCRIPT))
    parent = subprocess.Popen(
        [sys.executable, str(script), str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    workers = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2
    parent.kill()
    parent.wait(10)
    # Generous on purpose: orphans notice their parent's death within about a second (end of
    # file on the pipe, or its pid gone) and exit; on a busy machine their exit can take
    # seconds more. Workers that never notice run for good, which this still catches.
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, "orphaned workers kept running after their parent died"
    sweep_stale()  # the killed parent could not unlink its segments; the next start does


def test_reader_threads_in_a_worker_process_overlap_its_reads(folder: Path, tmp_path: Path) -> None:
    """ProcessOptions(threads_per_worker=4): one process reads a batch's samples at once."""
    spool = tmp_path / "spool"
    spool.mkdir()
    timed = TimedDecoder(SlowDecoder(0.3), spool)  # a read that waits, like a network mount
    options = {"batch_size": 8, "image_size": (16, 16), "shuffle": False}
    loader = prefetch.Loader(
        folder, workers=1, decoder=timed, backend=ProcessOptions(threads_per_worker=4), **options
    )
    got = all_batches(loader)
    expected = all_batches(prefetch.Loader(folder, workers=2, backend="thread", **options))
    for (x, y), (want_x, want_y) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    spans = timed.read_spans()
    assert len({span.worker for span in spans}) == 1  # one worker process ...
    edges = sorted([(s.start_s, 1) for s in spans] + [(s.end_s, -1) for s in spans])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    assert most >= 2, "... whose reader threads overlapped their reads"
