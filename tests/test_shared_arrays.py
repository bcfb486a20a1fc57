"""Worker processes share a source's large arrays instead of each holding a copy (issue 35,
item 3): a shard source's member table, a file source's paths and labels are written once into
an anonymous memory file that every worker maps (`prefetch.backends._shared_arrays`), and the
loader's process no longer pickles a copy of them per worker. Real worker processes; the leak
check of conftest.py (threads, children, /dev/shm) runs after each test."""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import re
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from PIL import Image

import prefetch
from prefetch.backends._shared_arrays import (
    SHARED_ARRAY_BYTES,
    SharedArrays,
    dumps_leaving_arrays,
)
from prefetch.testing import write_image_folder
from prefetch.testing.shards import write_tar

SEGMENT = "memfd:prefetch-shared-arrays"


def segment_kib(pid: int) -> int:
    """The size of the shared arrays' segment that process `pid` maps (0: none), in KiB."""
    size, inside = 0, False
    with open(f"/proc/{pid}/smaps") as file:
        for line in file:
            first = line.split(maxsplit=1)[0]
            if not first.endswith(":"):
                inside = SEGMENT in line
            elif inside and first == "Size:":
                size += int(line.split()[1])
    return size


def worker_pids() -> list[int]:
    """The loader's worker processes: this process's descendants but multiprocessing's
    resource tracker and forkserver (whose children, the workers, share its command line)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        command = " ".join(child.cmdline())
        server = "forkserver" in command and child.ppid() == os.getpid()
        if "resource_tracker" not in command and not server:
            found.append(child.pid)
    return found


def table_bytes(source: prefetch.TarSource) -> int:
    """The bytes of the member table's arrays that go to the shared segment."""
    arrays = list(source.members.columns.values())
    if source.members.keys is not None:
        arrays += list(source.members.keys.parts())
    return sum(array.nbytes for array in arrays if array.nbytes >= SHARED_ARRAY_BYTES)


def many_samples_tar(path: Path, count: int) -> None:
    """A tar of `count` copies of one tiny PNG (named .jpg), keyed like the writer's,
    labelled 0, 1, 2, 0, ..."""
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (10, 200, 30)).save(buffer, "PNG")
    write_tar(path, [(f"{number:09d}", buffer.getvalue(), number % 3) for number in range(count)])


def open_descriptors() -> list[str]:
    """What this process's descriptors refer to."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_map_one_shared_copy_of_the_member_table(tmp_path: Path, start_method: str) -> None:
    path = tmp_path / "many.tar"
    many_samples_tar(path, 20_000)  # 20 MB of tar; a member table of about 2.6 MB
    source = prefetch.TarSource(path)
    expected = [sample % 3 for sample in range(64)]
    options = prefetch.ProcessOptions(start_method=start_method)
    with prefetch.Loader(
        source, batch_size=32, image_size=2, workers=2, backend=options, shuffle=False
    ) as loader:
        batches = iter(loader)
        labels = [int(label) for _ in range(2) for label in next(batches).labels]
        workers = worker_pids()
        sizes = [segment_kib(pid) for pid in workers]
        shm_entries = os.listdir(os.environ.get("PREFETCH_SHM_DIR") or "/dev/shm")
    assert labels == expected  # the table read through the mapping finds the right members
    assert len(workers) == 2, workers
    assert all(size * 1024 >= table_bytes(source) for size in sizes), (sizes, table_bytes(source))
    assert not [entry for entry in shm_entries if "shared-arrays" in entry]  # no name anywhere
    assert not [link for link in open_descriptors() if SEGMENT in link]  # closed with the loader


# Runs in a child: a file source of many paths (only the first few exist and are read), read
# by two worker processes; prints each worker's private memory (USS), the segment it maps,
# and the loader process's peak RSS over the source's.
CHILD = """
import os, resource, psutil, numpy as np, prefetch

def uss_mb(pid):
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            parts = line.split()
            if len(parts) == 3:
                fields[parts[0]] = int(parts[1])
    return (fields["Private_Clean:"] + fields["Private_Dirty:"]) / 1024

real = prefetch.ImageFolder(ROOT)
fake = [f"{ROOT}/never-read/{n:012d}-{'x' * 40}.png" for n in range(COUNT)]
paths = real.paths.tolist() + fake
source = prefetch.FileList(paths, np.arange(len(paths)) % 3)
del fake, paths
arrays_mb = (source.paths.nbytes + source.labels.nbytes) / 2**20
steady = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
with prefetch.Loader(source, batch_size=8, image_size=16, workers=2, backend="process",
                     shuffle=False) as loader:
    batches = iter(loader)
    next(batches); next(batches)
    workers = [c.pid for c in psutil.Process().children()
               if "resource_tracker" not in " ".join(c.cmdline())]
    print("ARRAYS_MB", round(arrays_mb, 1))
    print("WORKER_USS_MB", *[round(uss_mb(pid), 1) for pid in workers])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("PARENT_OVER_MB", round(peak - steady, 1))
"""


@pytest.mark.timeout(180)
def test_a_worker_holds_no_private_copy_of_a_large_source(tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "images", per_class=8)
    code = f"ROOT, COUNT = {str(root)!r}, 800_000\n" + CHILD
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=170, check=False
    )
    output = done.stdout + done.stderr
    print(output)  # the numbers, with pytest -s
    assert done.returncode == 0, output
    arrays = float(re.search(r"ARRAYS_MB (\S+)", output).group(1))  # type: ignore[union-attr]
    found = re.search(r"WORKER_USS_MB (.+)", output)
    assert found, output
    workers = [float(value) for value in found.group(1).split()]
    parent = float(re.search(r"PARENT_OVER_MB (\S+)", output).group(1))  # type: ignore[union-attr]
    assert arrays > 90, output  # paths and labels: about 100 MB
    assert len(workers) == 2 and all(uss < arrays / 2 for uss in workers), output
    assert parent < arrays / 2, output  # no pickled copy per worker either


def _check_in_a_worker(value: Any, conn: Connection) -> None:
    """Runs in a spawned process: `value` arrived through a `SharedArrays`."""
    big = value["big"]
    mapped = SEGMENT in Path(f"/proc/{os.getpid()}/maps").read_text()
    same = big is value["again"]
    big[0] = 7  # copy-on-write: a private page, the segment is untouched
    conn.send(
        (
            mapped,
            same,
            int(big.sum()),
            float(value["fortran"][199, 3]),
            bool(value["frozen"].flags.writeable),
            int(value["frozen"][-1]),
            len(value["small"]),
        )
    )


def test_a_spawned_process_gets_equal_arrays_from_the_shared_segment() -> None:
    big = np.arange(SHARED_ARRAY_BYTES, dtype=np.int64)  # 8 x the threshold
    frozen = np.arange(SHARED_ARRAY_BYTES // 4, dtype=np.int32)
    frozen.flags.writeable = False
    fortran = np.asfortranarray(np.arange(40_000, dtype=np.float64).reshape(200, 200))
    value = {"big": big, "again": big, "frozen": frozen, "fortran": fortran, "small": np.ones(3)}
    assert len(dumps_leaving_arrays(value)) < 4096  # names the arrays, without their bytes
    shared = SharedArrays(value)
    parent_end, child_end = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(
        target=_check_in_a_worker, args=(shared, child_end), daemon=True
    )
    try:
        assert shared.nbytes >= big.nbytes + frozen.nbytes + fortran.nbytes
        process.start()
        child_end.close()
        assert parent_end.poll(60), "the process did not answer"
        answer = parent_end.recv()
    finally:
        process.join(30)
        shared.close()
        parent_end.close()
    expected_sum = int(big.sum()) + 7
    assert answer == (True, True, expected_sum, float(fortran[199, 3]), False, int(frozen[-1]), 3)
    assert big[0] == 0  # the worker's write stayed in the worker
