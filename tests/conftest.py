"""Shared fixtures: every test is checked for leaked threads, child processes and /dev/shm.

On Linux (where CI runs) the suite needs the compiled window decoder: without it the run stops
at once saying why and how to build it, instead of skipping every comparison of it with the
Python paths (issue 40). Elsewhere it is optional: tests marked `compiled` are skipped, said
once at the end of the run.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from ray_cluster import of_ray

# TensorFlow's C++ log kept out of the suite's output, errors included (on a machine without a
# GPU every TensorFlow start logs "failed call to cuInit"); its Python errors still raise. Set
# before any test module imports TensorFlow, and inherited by the processes tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# How long a test's threads and processes get to wind down before they count as leaked.
# Generous on purpose: what a test drops (an iterator, a tf.data pipeline) ends on its next poll,
# 0.1 s to 1 s, which a busy machine can stretch; the check ends as soon as nothing is left, so
# only a real leak waits it out.
LEAK_GRACE_S = 10.0
# Ray ends a killed actor's process asynchronously (the GCS tells the node's raylet, which
# signals the worker), and refills its pool of idle workers meanwhile: on a loaded 2-core
# machine (beside two busy loops) that took longer than LEAK_GRACE_S in 2 of 6 runs of
# test_ray_backend (quiet: under 5 s). Ray's worker processes (tests/ray_cluster.py) are given
# this long before they count as leaked; a process of an actor never killed stays, and fails.
RAY_GRACE_S = 40.0


def _private_shm_dir() -> str | None:
    """A shared-memory directory of this run's own, made before prefetch is imported.

    Another prefetch process on the machine (a second test run, a user's loader) rightly sweeps
    dead segments in /dev/shm, which is what some tests plant; and its segments are not ours
    to count as leaks. PREFETCH_SHM_DIR (prefetch.backends._shm) is inherited by every process a
    test starts. Sticky and world-writable like /dev/shm, for the tests that run as `nobody`.
    None when the caller set PREFETCH_SHM_DIR or there is no /dev/shm.
    """
    if os.environ.get("PREFETCH_SHM_DIR") or not os.path.isdir("/dev/shm"):
        return None
    private = tempfile.mkdtemp(prefix="pytest-shm-", dir="/dev/shm")
    os.chmod(private, 0o1777)
    os.environ["PREFETCH_SHM_DIR"] = private
    return private


PRIVATE_SHM_DIR = _private_shm_dir()
SHM_DIR = os.environ.get("PREFETCH_SHM_DIR") or "/dev/shm"


def _compiled_problem() -> str | None:
    """Why the compiled window decoder, with its chunk path, cannot be used here; None when it
    can."""
    try:
        module = importlib.import_module("prefetch.decode._jpegwindow")
    except ImportError as error:
        return f"prefetch.decode._jpegwindow does not import ({error})"
    if not hasattr(module, "decode_chunk"):
        return "prefetch.decode._jpegwindow is built without its chunk path (decode_chunk)"
    return None


COMPILED_PROBLEM = _compiled_problem()
COMPILED_REQUIRED = sys.platform.startswith("linux")
COMPILED_MISSING = (
    "the compiled window decoder is missing: {problem}. On Linux the test suite needs it (its "
    "tests hold it to the Python paths, which a skip would leave untested). Install a C compiler "
    "and libjpeg-turbo's headers (Debian, Ubuntu: apt-get install gcc libjpeg-dev; Fedora: dnf "
    "install gcc libjpeg-turbo-devel), then rebuild it: pip install -e . (or python setup.py "
    "build_ext --inplace in the checkout)"
)


def pytest_configure(config: pytest.Config) -> None:
    if COMPILED_PROBLEM is not None and COMPILED_REQUIRED:
        raise pytest.UsageError(COMPILED_MISSING.format(problem=COMPILED_PROBLEM))
    # Many tests run more workers than CI's 2 cores on purpose (ordering, cancelling, faults
    # across workers), which says TooManyWorkersWarning each time. Kept out of the summary;
    # the tests of the warning set their own filter (pytest.warns, catch_warnings), which this
    # one does not hide from them (tests/test_ranks.py).
    config.addinivalue_line("filterwarnings", "ignore::prefetch.errors.TooManyWorkersWarning")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say once, at the end of the run, why the tests marked `compiled` were skipped."""
    if COMPILED_PROBLEM is not None:
        terminalreporter.write_line(
            f"compiled window decoder: not used ({COMPILED_PROBLEM}); it is optional on "
            f"{sys.platform}, so the tests marked `compiled` were skipped"
        )


def _private_cache_dir() -> str | None:
    """A cache folder of this run's own (PREFETCH_CACHE_DIR, inherited by the processes tests
    start): the folder listings every ImageFolder keeps, and shard indexes, never go to
    ~/.cache. None when the caller set PREFETCH_CACHE_DIR."""
    if os.environ.get("PREFETCH_CACHE_DIR"):
        return None
    private = tempfile.mkdtemp(prefix="pytest-prefetch-cache-")
    os.environ["PREFETCH_CACHE_DIR"] = private
    return private


PRIVATE_CACHE_DIR = _private_cache_dir()


def pytest_unconfigure(config: pytest.Config) -> None:
    for private in (PRIVATE_SHM_DIR, PRIVATE_CACHE_DIR):
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _shm_entries() -> set[str]:
    """Our entries in SHM_DIR: those of this process tree, or of processes that no longer run.

    Segments of other live processes (another test run on the same machine) are not ours.
    """
    try:
        names = {name for name in os.listdir(SHM_DIR) if "prefetch" in name}
    except FileNotFoundError:
        return set()
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    return {name for name in names if _owner(name) in ours or not psutil.pid_exists(_owner(name))}


def _owner(name: str) -> int:
    """The pid in a `prefetch_<pid>_<hex>` segment name (0 when there is none)."""
    parts = name.split("_")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else 0


def _live_children() -> set[int]:
    """Child processes, less multiprocessing's long-lived helpers (resource tracker, forkserver)."""
    children = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        # multiprocessing's own helpers; workers forked by a forkserver share its command line,
        # so only the server itself (our direct child) is left out.
        if "resource_tracker" in command:
            continue
        if "forkserver" in command and child.ppid() == os.getpid():
            continue
        children.add(child.pid)
    return children


def _of_ray(pid: int) -> bool:
    """Whether `pid` is one of Ray's worker processes (an actor's, or an idle one), or gone."""
    try:
        return of_ray(" ".join(psutil.Process(pid).cmdline()))
    except psutil.NoSuchProcess:
        return True


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail the test if it leaves a thread, a child process or a /dev/shm segment behind."""
    threads_before = set(threading.enumerate())
    children_before = _live_children()
    shm_before = _shm_entries()
    yield
    began = time.monotonic()
    while True:
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        children = _live_children() - children_before
        shm = _shm_entries() - shm_before
        if not (threads or children or shm):
            break
        waited = time.monotonic() - began
        only_ray = not (threads or shm) and all(_of_ray(pid) for pid in children)
        if waited > LEAK_GRACE_S and (waited > RAY_GRACE_S or not only_ray):
            break
        time.sleep(0.05)
    assert not threads, f"threads leaked: {[t.name for t in threads]}"
    assert not children, f"child processes leaked: {sorted(children)}"
    assert not shm, f"/dev/shm segments leaked: {sorted(shm)}"


@pytest.fixture(scope="session")
def fsspec_io_thread() -> None:
    """Start fsspec's IO thread before the leak checks look: async filesystems (http) run on
    one daemon event-loop thread per process, started once and kept, which is not a leak.
    Nothing to start where the remote extra is not installed."""
    try:
        import fsspec.asyn
    except ImportError:
        return
    fsspec.asyn.get_loop()


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Indexes of read-only folders and of URLs go to a folder of this test, never ~/.cache."""
    folder = tmp_path / "prefetch-cache"
    monkeypatch.setenv("PREFETCH_CACHE_DIR", str(folder))
    return folder


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `compiled` where the compiled window decoder is missing (off Linux:
    on Linux the run has stopped already), and tests marked `gpu` when TensorFlow sees no GPU
    (TF is imported only if one exists)."""
    if COMPILED_PROBLEM is not None:
        skip_compiled = pytest.mark.skip(
            reason="needs the compiled window decoder (see the end of the run)"
        )
        for item in items:
            if item.get_closest_marker("compiled"):
                item.add_marker(skip_compiled)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return
    skip = pytest.mark.skip(reason="needs a GPU; TensorFlow sees none")
    for item in gpu_items:
        item.add_marker(skip)
