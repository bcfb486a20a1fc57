"""backend="process" in a script without `if __name__ == "__main__":` (issue 19, item 10).

Spawned workers import the main script again to find a transform defined in it; a script whose
loader runs at its top level would start workers in every worker, and multiprocessing prints
its bootstrapping error once per worker. Each test runs a real script in a subprocess and reads
what it prints: one clear error that shows the guard to add, or a run that works.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prefetch.testing import write_image_folder

# Spawned workers import numpy, Pillow and prefetch: seconds on a busy 2-core machine.
pytestmark = pytest.mark.timeout(180)
RUN_TIMEOUT_S = 150
ROOT = Path(__file__).resolve().parent.parent

HEADER = """
import sys
import time

import prefetch


def brighten(image, rng):
    time.sleep(0.002)  # Python work: backend="auto" measures the GIL held for it
    return image

"""
LOADER = """
loader = prefetch.Loader(
    sys.argv[1], batch_size=2, image_size=(8, 8), workers=1, backend=BACKEND,
    augment=prefetch.Augment(transform=TRANSFORM),
)
for images, labels in loader:
    pass
print("done", loader.backend_name, loader.backend_reason)
"""


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    folder = write_image_folder(tmp_path / "data", per_class=2, size=(16, 16))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(HEADER) + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(script), str(folder)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def loader_code(backend: str, transform: str) -> str:
    return LOADER.replace("BACKEND", repr(backend)).replace("TRANSFORM", transform)


def test_an_unguarded_script_gets_one_error_that_shows_the_guard(tmp_path: Path) -> None:
    run = run_script(tmp_path, loader_code("process", "brighten"))
    assert run.returncode == 1, run.stderr
    assert "bootstrapping" not in run.stderr
    assert run.stderr.count("Traceback") == 1, run.stderr
    assert "RuntimeError: backend='process' starts worker processes" in run.stderr
    assert "the transform defined in it" in run.stderr and "train.py" in run.stderr
    assert '    if __name__ == "__main__":\n        main()' in run.stderr
    assert "for images, labels in loader:" in run.stderr  # the line that would run again


def test_the_same_script_under_a_main_guard_runs_in_worker_processes(tmp_path: Path) -> None:
    body = "def main():\n" + textwrap.indent(loader_code("process", "brighten"), "    ")
    run = run_script(tmp_path, body + '\n\nif __name__ == "__main__":\n    main()\n')
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("done process")


def test_backend_auto_keeps_threads_in_an_unguarded_script(tmp_path: Path) -> None:
    run = run_script(tmp_path, loader_code("auto", "brighten"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("done thread"), run.stdout
    assert 'outside `if __name__ == "__main__":`' in run.stdout


def test_an_unguarded_script_that_sends_nothing_of_its_own_runs_in_processes(
    tmp_path: Path,
) -> None:
    body = "from prefetch.testing import random_flip_and_noise\n" + loader_code(
        "process", "random_flip_and_noise"
    )
    run = run_script(tmp_path, body)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("done process")
