"""Worker processes start and stop on one code (`prefetch.backends._lifecycle`): one close
deadline for all the workers, a crash named as the crash it is, and too few open files said
once with the fix (issue 41 item 5, issue 40 item 5). Real worker processes, real signals, a
real open-file limit; the leak check of conftest.py runs after each test."""

from __future__ import annotations

import errno
import logging
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import prefetch
from prefetch.backends import DRAIN_S
from prefetch.backends._lifecycle import (
    STOP_GRACE_S,
    STUCK_THREAD_JOIN_S,
    TERMINATE_GRACE_S,
    THREAD_JOIN_S,
)
from prefetch.errors import WorkerCrashedError
from prefetch.testing import (
    CrashingDecoder,
    FileLimitDecoder,
    HangingDecoder,
    write_image_folder,
)

SMALL = (16, 16)
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("life"), per_class=8, size=(24, 24))


# --- one close deadline for all the workers --------------------------------------------------


@pytest.mark.timeout(180)  # 8 worker processes start on 2 busy cores: up to a minute
@pytest.mark.parametrize("ignore_sigterm", [False, True], ids=["stuck", "stuck, SIGTERM ignored"])
def test_eight_stuck_workers_are_all_gone_within_one_deadline_not_eight(
    folder: Path, tmp_path: Path, ignore_sigterm: bool
) -> None:
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    decoder = HangingDecoder(arrivals, ignore_sigterm=ignore_sigterm)
    loader = prefetch.Loader(
        folder, batch_size=8, image_size=SMALL, workers=8, backend="process", decoder=decoder
    )
    ended: list[BaseException] = []

    def consume() -> None:  # waits for a batch that never comes, until the loader closes
        try:
            next(iter(loader))
        except BaseException as error:
            ended.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    deadline = time.monotonic() + 120
    while decoder.arrived() < 8 and time.monotonic() < deadline and consumer.is_alive():
        time.sleep(0.05)
    assert decoder.arrived() == 8, "each of the 8 workers is stuck in its row of the batch"
    began = time.monotonic()
    loader.close()
    took = time.monotonic() - began
    consumer.join(30)
    assert not consumer.is_alive() and ended, "the consumer's wait ended with the close"
    # One deadline for all: the old close waited STOP_GRACE_S per worker in turn (16 s here;
    # 32 s with SIGTERM ignored, a grace after it too). 3x leaves room for a busy machine.
    one_deadline = STOP_GRACE_S + (TERMINATE_GRACE_S if ignore_sigterm else 0.0)
    assert took < 3 * one_deadline, f"close() took {took:.1f} s for 8 stuck workers"


def test_the_docs_give_the_deadlines_the_code_uses() -> None:
    text = (DOCS / "shutdown.md").read_text()
    for seconds in (STOP_GRACE_S, TERMINATE_GRACE_S, THREAD_JOIN_S, STUCK_THREAD_JOIN_S, DRAIN_S):
        assert f"{seconds:g} s" in text, seconds


# --- a sample that kills its worker ---------------------------------------------------------


@pytest.mark.parametrize(
    ("crash", "said"),
    [
        (CrashingDecoder("circle_0001"), "exit code 13"),
        (CrashingDecoder("circle_0001", signum=signal.SIGSEGV), "signal SIGSEGV"),
    ],
    ids=["os._exit", "segfault"],
)
def test_a_sample_that_kills_its_worker_is_named_with_its_exit_code_not_as_a_failed_start(
    folder: Path, crash: CrashingDecoder, said: str
) -> None:
    loader = prefetch.Loader(
        folder,
        batch_size=4,
        image_size=SMALL,
        workers=1,
        shuffle=False,
        decoder=crash,
        backend=prefetch.ProcessOptions(max_restarts=0),
    )
    with pytest.raises(WorkerCrashedError) as raised, loader:
        next(iter(loader))
    message = str(raised.value)
    assert said in message, message
    assert re.search(r"while reading '[^']*circle_0001\.jpg'", message), message
    assert "start-up may have failed" not in message, message


def test_a_restarted_worker_is_logged_with_the_sample_that_killed_it(
    folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crash = CrashingDecoder("circle_0002", once_flag=str(tmp_path / "crashed"))
    loader = prefetch.Loader(
        folder, batch_size=4, image_size=SMALL, workers=1, shuffle=False, decoder=crash
    )
    with caplog.at_level(logging.WARNING, "prefetch.backends"), loader:
        labels = [int(label) for _, batch in loader for label in batch]
    assert len(labels) == 24  # restarted, nothing lost
    assert re.search(r"exit code 13 while reading '[^']*circle_0002\.jpg'", caplog.text)


# --- too few open files -------------------------------------------------------------------

# Runs in a child: lowers its open-file limit to leave room for a few files beside those open
# (the shared arrays' memory file among them) but not for 8 workers and their slots, then
# starts a loader three times; prints what the starts raised and the memory files left open.
LOW_LIMIT = """
import errno, os, resource, sys
import numpy as np
import prefetch

def memory_files():
    links = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
             if os.path.exists(f"/proc/self/fd/{fd}")]
    return sum("prefetch-shared-arrays" in link for link in links)

if __name__ == "__main__":
    real = prefetch.ImageFolder(sys.argv[1])
    fake = [f"{sys.argv[1]}/never-read/{n:09d}-{'x' * 40}.png" for n in range(2000)]
    paths = real.paths.tolist() + fake  # paths of 64 KiB and more go to a shared memory file
    source = prefetch.FileList(paths, np.arange(len(paths)) % 3)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = len(os.listdir("/proc/self/fd")) + 12
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, room if sys.argv[2] == "hard" else hard))
    for _ in range(3):
        loader = prefetch.Loader(source, batch_size=8, image_size=16, workers=8,
                                 backend="process", shuffle=False)
        try:
            with loader:
                next(iter(loader))
        except OSError as error:
            print("ERRNO", errno.errorcode.get(error.errno), flush=True)
            last = error
    print("MEMORY_FILES", memory_files(), flush=True)
    raise last
"""


def run_low_limit(folder: Path, tmp_path: Path, hard: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "low_limit.py"
    script.write_text(textwrap.dedent(LOW_LIMIT))
    return subprocess.run(
        [sys.executable, str(script), str(folder), hard],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=tmp_path,
    )


def test_a_start_that_runs_out_of_open_files_leaks_no_memory_file(
    folder: Path, tmp_path: Path
) -> None:
    run = run_low_limit(folder, tmp_path, "soft")
    assert run.stdout.count("ERRNO EMFILE") == 3, run.stdout + run.stderr[-3000:]
    assert "MEMORY_FILES 0" in run.stdout, run.stdout  # one leaked per failed start before


@pytest.mark.parametrize("hard", ["soft", "hard"])
def test_too_low_an_open_file_limit_is_one_message_that_says_what_is_short_and_the_fix(
    folder: Path, tmp_path: Path, hard: str
) -> None:
    run = run_low_limit(folder, tmp_path, hard)
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
    message = run.stderr.strip().splitlines()[-1]
    assert "too few open files for backend='process' with 8 workers" in message, message
    assert "RLIMIT_NOFILE" in message and "ulimit -n" in message, message
    assert "use fewer workers" in message, message
    if hard == "soft":  # a script may raise its own soft limit up to the hard one
        assert "resource.setrlimit" in message, message
    assert "ancdata" not in run.stderr and "Process prefetch-process" not in run.stderr


def test_a_worker_that_runs_out_of_open_files_is_one_error_without_restarts_or_noise(
    folder: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    loader = prefetch.Loader(
        folder,
        batch_size=4,
        image_size=SMALL,
        workers=2,
        backend="process",
        decoder=FileLimitDecoder(),
    )
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    with caplog.at_level(logging.WARNING, "prefetch"), pytest.raises(OSError) as raised, loader:
        next(iter(loader))
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limit  # the fake lowered a worker's
    error = raised.value
    assert error.errno == errno.EMFILE
    message = str(error)
    assert message.startswith("worker process prefetch-process-"), message
    assert "ran out of open files" in message and "ulimit -n" in message, message
    assert "restarting" not in caplog.text  # a restart would run out the same way
    stderr = capfd.readouterr().err
    assert "ancdata" not in stderr and "Traceback" not in stderr, stderr
