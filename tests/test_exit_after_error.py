"""A script whose `fit` meets a bad file raises, then exits promptly (issue 10, point 12).

Each run is a fresh interpreter: `model.fit` over a folder with one truncated JPEG, through
`prefetch.tf.dataset(loader)` with and without `with loader:`, and through the drop-in
`prefetch.tf.image_dataset_from_directory` (thread backend). The script catches the error, prints
when, and ends; it must exit within EXIT_S of the error and leave no process and no /dev/shm
segment behind.

Why it hung (prefetch/tf/_dataset.py now ends tf.data's runs at exit): after TensorFlow's
prefetch thread delivers the generator's error it calls the
generator twice more (the next element, then the finalizer), each a py_func that takes the GIL.
When that call is late, the interpreter has begun to finalize; CPython then ends the thread that
asks for the GIL, the py_func never returns, and the iterator's destructor (run by the last
garbage collection) waits for the prefetch thread forever. Half of the runs make that call late
on purpose (LATE_S, by wrapping the generator TensorFlow is given), which a busy machine does at
random; the other half are left to chance.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from prefetch.backends._shm import SHM_DIR
from prefetch.testing import write_bad_files, write_image_folder

if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
    pytest.skip("needs TensorFlow and Keras", allow_module_level=True)

pytestmark = pytest.mark.tf

# How soon after the error each run must have exited. Generous on purpose: a run exits within
# seconds of it on a quiet machine, two TensorFlow runs beside other work take several times as
# long, and the bug this catches made a run hang for good.
EXIT_S = 20.0
# How late the made-late runs make TensorFlow's calls after the error: later than the
# interpreter takes to reach finalization after the script ends (about 1 s).
LATE_S = 2.5
# How long a run may take to reach the error (TensorFlow's import, Keras's first step).
# Generous on purpose: importing TensorFlow alone took 43 s with four busy loops beside it
# (tests/test_auto_and_start_methods.py), and two runs go at once.
ERROR_BY_S = 120.0
CASES = ("without", "with", "dropin")
RUNS = 20
# Runs at a time: two keep the 20 runs near a minute on two cores.
PARALLEL = 2

CHILD = r"""
import os, sys, time
case, root, seed, late_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
import tensorflow as tf

if late_s:
    class Late:
        # Delegates to the generator; the call after its error comes late_s late.
        def __init__(self, iterable):
            self.iterator, self.failed = iter(iterable), False
        def __iter__(self):
            return self
        def __next__(self):
            if self.failed:
                time.sleep(late_s)
            try:
                return next(self.iterator)
            except StopIteration:
                raise
            except BaseException:
                self.failed = True
                del self  # the kept error's traceback must not keep this wrapper alive
                raise
    from_generator = tf.data.Dataset.from_generator
    def late_from_generator(generator, *args, **kwargs):
        return from_generator(lambda *a: Late(generator(*a)), *args, **kwargs)
    tf.data.Dataset.from_generator = staticmethod(late_from_generator)

import keras
import prefetch
import prefetch.tf

model = keras.Sequential(
    [keras.Input((32, 32, 3)), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)]
)
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
options = dict(batch_size=8, image_size=(32, 32), workers=2, seed=seed, backend="thread")
try:
    if case == "dropin":
        ds = prefetch.tf.image_dataset_from_directory(root, verbose=False, **options)
        model.fit(ds, epochs=2, shuffle=False, verbose=0)
    else:
        loader = prefetch.Loader(root, **options)
        if case == "with":
            with loader:
                model.fit(prefetch.tf.dataset(loader), epochs=2, shuffle=False, verbose=0)
        else:
            model.fit(prefetch.tf.dataset(loader), epochs=2, shuffle=False, verbose=0)
except Exception as error:
    print(f"ERROR-RAISED {time.time():.6f} {type(error).__name__}", flush=True)
else:
    print("NO-ERROR", flush=True)
"""


def _session_members(sid: int) -> list[int]:
    """Live, non-zombie processes of session `sid` (the run and anything it started)."""
    members = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process.pid)
        except (OSError, psutil.Error):
            continue
    return members


def _shm_of(pid: int) -> list[str]:
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [name for name in names if name.startswith("prefetch") and f"_{pid}_" in name]


def _run(script: Path, root: Path, case: str, seed: int, late_s: float, log: Path) -> str:
    """One run; returns "" when it behaved, else what went wrong."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    what = f"{case} run (seed {seed}, late {late_s} s)"
    with open(log, "wb") as out:
        child = subprocess.Popen(
            [sys.executable, str(script), case, str(root), str(seed), str(late_s)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    started, raised_at, problem = time.time(), None, ""
    while child.poll() is None:
        time.sleep(0.05)
        if raised_at is None:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("ERROR-RAISED"):
                    raised_at = float(line.split()[1])
        now = time.time()
        if raised_at is not None and now - raised_at > EXIT_S:
            problem = f"{what} still running {EXIT_S:.0f} s after the error"
            break
        if raised_at is None and now - started > ERROR_BY_S:
            problem = f"{what} did not reach the error within {ERROR_BY_S:.0f} s"
            break
    exited_at = time.time()
    if problem:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    output = log.read_text(errors="replace")
    if not problem and raised_at is None:
        problem = f"{what} exited ({child.returncode}) without the error being raised"
    elif not problem and child.returncode != 0:
        problem = f"{what} exited with {child.returncode}"
    if not problem:
        deadline = time.monotonic() + 2.0  # a process that is exiting gets a moment
        while _session_members(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _session_members(child.pid)
        if left:
            problem = f"{what} left processes behind: {left}"
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        elif _shm_of(child.pid):
            problem = f"{what} left /dev/shm segments: {_shm_of(child.pid)}"
    if problem:
        return f"{problem}; exit {exited_at - (raised_at or started):.1f} s after\n{output[-1500:]}"
    return ""


# 20 fresh interpreters import TensorFlow and fit, two at a time: 84 s on a quiet 2-core
# machine, 148 s with four busy loops beside it.
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fit_that_meets_a_bad_file_exits_promptly(tmp_path: Path) -> None:
    root = write_image_folder(
        tmp_path / "images", class_names=("circle", "square"), per_class=16, size=(40, 32)
    )
    write_bad_files(root / "circle", ["truncated"])
    script = tmp_path / "fit_bad_file.py"
    script.write_text(CHILD)

    def run(i: int) -> str:
        case, late_s = CASES[i % len(CASES)], LATE_S if i % 2 else 0.0
        return _run(script, root, case, i, late_s, tmp_path / f"run{i}.log")

    with ThreadPoolExecutor(PARALLEL) as pool:
        problems = list(pool.map(run, range(RUNS)))
    failed = [problem for problem in problems if problem]
    assert not failed, f"{len(failed)} of {RUNS} runs misbehaved:\n" + "\n\n".join(failed)
