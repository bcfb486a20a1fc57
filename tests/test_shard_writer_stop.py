"""A stop is never data: a `prefetch shards write` worker sent SIGTERM while it decodes a photo
removes the shard it was writing and the write fails naming the signal (issue 45), instead of
recording the photo as one that "cannot be decoded" and finishing a set one photo short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_shard_write_at_scale import COUNTING_SITE, logged_decodes, start_write

import prefetch

# COUNTING_SITE's slow decode, which also writes the pid of the process that decodes (before it
# sleeps, inside Pillow's `load`, so inside the writer's `try` around its decode) to a file.
DECODING_SITE = (
    COUNTING_SITE
    + """
_counting = ImageFile.ImageFile.load


def load_naming_its_process(self):
    if getattr(self, "tile", None):
        with open(os.environ["DECODE_LOG"] + ".pids", "a") as log:
            log.write(f"{os.getpid()}\\n")
    return _counting(self)


ImageFile.ImageFile.load = load_naming_its_process
"""
)


def photo_folder(root: Path, count: int) -> Path:
    """`count` JPEGs of 320x240 (noise) in two classes: each one is re-encoded by --fit-crop 64,
    so decoded once."""
    rng = np.random.default_rng(7)
    for number in range(count):
        folder = root / ("cat", "dog")[number % 2]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (240, 320, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{number:02d}.jpg", "JPEG", quality=85)
    return root


def first_decoder(pids: Path, deadline_s: float) -> int:
    """The pid of the first process that began a decode (waiting for one up to `deadline_s`)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if pids.exists() and pids.read_text().endswith("\n"):
            return int(pids.read_text().split()[0])
        time.sleep(0.01)
    raise AssertionError(f"no decode began within {deadline_s} s")


@pytest.mark.timeout(180)  # two runs of the command, with worker processes
@pytest.mark.parametrize(
    ("photos", "shard_size"),
    [(8, 1), (16, 16)],
    # 8 shards, 4 per worker: each worker writes whole ones; 1 shard: the workers share its
    # chunks of samples (`_pass.write_remaining` chooses)
    ids=["by-shard", "by-sample"],
)
def test_a_worker_sent_sigterm_in_a_decode_fails_the_write_naming_it_and_loses_no_photo(
    tmp_path: Path, photos: int, shard_size: int
) -> None:
    folder = photo_folder(tmp_path / "photos", photos)
    environment, log = logged_decodes(tmp_path, DECODING_SITE)
    out = tmp_path / "out"
    arguments = [str(folder), str(out), "--shard-size", str(shard_size), "--fit-crop", "64"]
    arguments += ["--workers", "2", "--quiet"]
    child = start_write(arguments, environment, sleep_s=1)
    try:
        decoding = first_decoder(Path(f"{log}.pids"), 60)
        assert decoding != child.pid  # a worker process, in its decode
        os.kill(decoding, signal.SIGTERM)
        _, errors = child.communicate(timeout=90)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 2, errors
    assert "SIGTERM" in errors and "run the same command again" in errors, errors
    assert "Traceback" not in errors
    assert not out.exists()  # the shards being written removed, and OUT with them (it was new)
    command = [sys.executable, "-m", "prefetch", "shards", "write", *arguments]
    again = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert again.returncode == 0, again.stderr
    assert "skipped" not in again.stdout
    assert len(prefetch.TarSource(out)) == photos  # every photo, none recorded as undecodable
