"""`prefetch bench`'s table is free of TensorFlow's C++ log (issue 35, item 6): no absl, CUDA
stub, oneDNN or cuInit line in its output, with TF_CPP_MIN_LOG_LEVEL unset as a user's shell
has it. One real run of a tf.data row, in a subprocess."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prefetch.tools import bench

# A line of TensorFlow's C++ log (absl's "I0000 00:00:... file.cc:31] ...") or its start-up.
TF_LOG = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|cuInit|oneDNN|cudart_stub", re.MULTILINE)


@pytest.mark.timeout(240)  # two rounds of a row that imports TensorFlow in its own process
def test_the_bench_table_has_no_tensorflow_log_lines(tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    folder = bench.write_sample_folder(tmp_path / "images", 8, size=(40, 30))
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "prefetch", "bench", str(folder), "--loaders", "loop,tf.data",
         "--batch-size", "4", "--image-size", "16x16", "--repeats", "1",
         "--decode-sample", "4"],
        capture_output=True,
        text=True,
        timeout=220,
        env=environment,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert any(line.startswith("tf.data") for line in result.stdout.splitlines()), result.stdout
    found = TF_LOG.findall(result.stdout + result.stderr)
    assert not found, result.stdout + result.stderr
