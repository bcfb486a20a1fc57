"""The process backend's shared memory against other programs and users (issue 10, 1-3, 5, 8).

Segments in /dev/shm are swept only when proven dead (their creator's lock is free), never
another user's, whatever else sits in /dev/shm; workers get segments as file descriptors, so a
name re-created or replaced by someone else is never written; a full /dev/shm is a clear
`MemoryError` at slot creation; a killed parent's workers unlink its segments.

The suite runs in a shared-memory directory of its own (tests/conftest.py sets PREFETCH_SHM_DIR
before prefetch is imported), so that no other prefetch process on the machine sweeps what a test
plants. Cross-user cases run in a subprocess that imports prefetch as root, then drops to `nobody`
(uid 65534): the interpreter itself lives where `nobody` cannot read. The PID-namespace case
uses `unshare --pid --fork` and is skipped where that is not allowed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

import prefetch
from prefetch.backends import _shm as shm
from prefetch.backends._processes import ProcessBackend
from prefetch.backends._shm import PREFIX, SharedSlots, SlotLayout, sweep_stale
from prefetch.decode._choice import get_decoder
from prefetch.decode._decoders import DecodeOptions
from prefetch.errors import WorkerCrashedError
from prefetch.testing import worker_processes, write_image_folder

pytestmark = pytest.mark.timeout(60)

SMALL = (16, 16)
NOBODY = 65534


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("shm"), per_class=8, size=(24, 24))


def dead_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def segment_path(name: str) -> Path:
    return Path(shm.SHM_DIR) / name


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a Python that imported prefetch as root, then became uid/gid 65534."""
    script = textwrap.dedent(
        """
        import json, os, sys
        from prefetch.backends._shm import PREFIX, SharedSlots, SlotLayout, sweep_stale
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        """
    ) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)  # fmt: skip


# --- 1. the sweep proves an owner dead; another PID namespace is not "dead" --------------------

OWNER = """
import os, sys
from prefetch.backends._shm import SharedSlots, SlotLayout
slot = SharedSlots(SlotLayout(2, (4, 4, 3))).create()
print(os.getpid(), slot.name, flush=True)
sys.stdin.readline()
os._exit(0)  # die without unlinking: the segment is left for a sweep
"""

# PID 1 of a new PID namespace: spend pids until the next one is not a pid the sweeper sees,
# then run the owner there, so that a pid test would wrongly call it dead.
LAUNCHER = """
import json, os, subprocess, sys
outside = set(json.loads(sys.argv[1]))
for _ in range(1000):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    if pid + 1 not in outside:
        break
sys.exit(subprocess.call([sys.executable, "-c", sys.argv[2]]))
"""


def test_a_live_segment_of_another_pid_namespace_survives_the_sweep_until_its_owner_dies() -> None:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "true"]).returncode:
        pytest.skip("cannot create a PID namespace here (unshare --pid --fork)")
    owner = subprocess.Popen(
        [unshare, "--pid", "--fork", sys.executable, "-c", LAUNCHER,
         json.dumps(psutil.pids()), OWNER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert owner.stdout is not None and owner.stdin is not None
    try:
        inner_pid, name = owner.stdout.readline().split()
        if psutil.pid_exists(int(inner_pid)):
            pytest.skip(f"the owner's pid {inner_pid} inside the namespace is also one outside")
        assert name not in sweep_stale()
        assert segment_path(name).exists(), "a live segment was swept"
    finally:
        owner.communicate("exit\n", timeout=20)
    assert name in sweep_stale(), "a segment whose owner died is swept"
    assert not segment_path(name).exists()


def test_a_dead_segment_of_another_user_is_left_alone() -> None:
    made = as_nobody("print(SharedSlots(SlotLayout(2, (4, 4, 3))).create().name); os._exit(0)")
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        assert segment_path(name).stat().st_uid == NOBODY
        assert name not in sweep_stale()
        assert segment_path(name).exists()
    finally:
        segment_path(name).unlink()


# --- 2. nothing someone else put in /dev/shm stops a start -------------------------------------


@pytest.fixture()
def planted() -> Iterator[list[Path]]:
    """Things named like dead segments that are not ours to remove: a directory, a FIFO, a
    symlink, and a root-owned stale file (for a sweep run as nobody)."""
    pid = dead_pid()
    paths = [segment_path(f"{PREFIX}{pid}_{kind}") for kind in ("dir", "fifo", "link", "root")]
    paths[0].mkdir()
    os.mkfifo(paths[1])
    paths[2].symlink_to("/etc/hostname")
    paths[3].write_bytes(b"\0" * 64)
    os.chmod(paths[3], 0o600)
    yield paths
    paths[0].rmdir()
    for path in paths[1:]:
        path.unlink(missing_ok=True)


def test_foreign_entries_named_like_segments_never_fail_a_sweep_or_a_start(
    planted: list[Path], folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="prefetch"):
        sweep_stale()
        sweep_stale()
        loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1,
                                 backend="process")  # fmt: skip
        with loader:
            assert next(iter(loader))[0].shape == (4, 16, 16, 3)
    assert all(os.path.lexists(path) for path in planted[:3])
    logged = [r.getMessage() for r in caplog.records if planted[0].name in r.getMessage()]
    assert len(logged) == 1, f"logged once at debug level, got {logged}"


def test_an_unprivileged_user_sweeps_and_creates_despite_root_files_and_directories(
    planted: list[Path],
) -> None:
    result = as_nobody(
        """
        sweep_stale()
        slots = SharedSlots(SlotLayout(2, (4, 4, 3)))
        slots.create()
        slots.close()
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    assert planted[3].exists(), "another user's file is never removed"


def test_a_planted_segment_name_only_makes_creation_pick_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokens = iter(["planted", "planted", "fresh"])
    monkeypatch.setattr(shm.secrets, "token_hex", lambda n: next(tokens))
    taken = segment_path(f"{PREFIX}{os.getpid()}_planted")
    taken.mkdir()
    slots = SharedSlots(SlotLayout(2, (4, 4, 3)))
    try:
        slot = slots.create()
        assert slot.name.endswith("_fresh")
    finally:
        slots.close()
        taken.rmdir()


# --- 3. a worker never writes into a file someone else made under a segment's name -------------


def replace_after_creation(monkeypatch: pytest.MonkeyPatch, replace: object) -> list[Path]:
    """Make every new slot's name point elsewhere (`replace(path)`) before a worker uses it."""
    replaced: list[Path] = []
    create = ProcessBackend.new_slot

    def new_slot(self: ProcessBackend) -> object:
        slot = create(self)
        path = segment_path(slot.name)
        path.unlink()
        replace(path)  # type: ignore[operator]
        replaced.append(path)
        return slot

    monkeypatch.setattr(ProcessBackend, "new_slot", new_slot)
    return replaced


def expected_batches(folder: Path) -> list[np.ndarray]:
    # threads: no segment of the reference's may meet a test's planted names
    loader = prefetch.Loader(
        folder, batch_size=4, image_size=SMALL, workers=1, seed=3, backend="thread"
    )
    return [x.copy() for x, _ in loader]


def test_a_name_recreated_by_another_user_never_receives_pixels(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched: list[int] = []  # the watcher keeps its files open, to read what lands in them

    def recreate(path: Path) -> None:
        path.write_bytes(b"\0" * (1 << 16))
        os.chmod(path, 0o666)
        os.chown(path, NOBODY, NOBODY)
        watched.append(os.open(path, os.O_RDONLY))

    replaced = replace_after_creation(monkeypatch, recreate)
    loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1, seed=3,
                             backend="process")  # fmt: skip
    try:
        got = [x.copy() for x, _ in loader]
        seen = [os.pread(fd, 1 << 16, 0) for fd in watched]
    finally:
        for fd in watched:
            os.close(fd)
        for path in replaced:
            path.unlink(missing_ok=True)
    assert seen and not any(any(data) for data in seen), "pixels reached the watcher's file"
    assert all(np.array_equal(a, b) for a, b in zip(got, expected_batches(folder), strict=True))


def test_a_symlink_planted_under_a_segment_name_is_never_followed(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "root-only"
    target.write_bytes(b"\xab" * (1 << 16))
    target.chmod(0o600)
    replaced = replace_after_creation(monkeypatch, lambda path: path.symlink_to(target))
    loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1, seed=3,
                             backend="process")  # fmt: skip
    try:
        got = [x.copy() for x, _ in loader]
    finally:
        for path in replaced:
            path.unlink(missing_ok=True)
    assert target.read_bytes() == b"\xab" * (1 << 16), "a worker wrote through the symlink"
    assert all(np.array_equal(a, b) for a, b in zip(got, expected_batches(folder), strict=True))


def test_segments_are_private_to_their_user(monkeypatch: pytest.MonkeyPatch) -> None:
    slots = SharedSlots(SlotLayout(2, (4, 4, 3)))
    try:
        slot = slots.create()
        assert segment_path(slot.name).stat().st_mode & 0o777 == 0o600
    finally:
        slots.close()


# --- 5. a full /dev/shm: a clear MemoryError at slot creation, "exhausted" for a SIGBUS --------


@pytest.fixture()
def tiny_shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 1 MiB tmpfs standing in for /dev/shm."""
    mount = tmp_path / "shm"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    monkeypatch.setattr(shm, "SHM_DIR", str(mount))
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(directory: str) -> None:
    """Take every free byte of `directory`'s file system."""
    with open(os.path.join(directory, "filler"), "ab", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\1" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC


def test_a_full_shm_raises_memory_error_at_slot_creation_naming_it_and_the_fix(
    tiny_shm: Path, folder: Path
) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1, depth=2,
                             backend="process")  # fmt: skip
    with pytest.raises(MemoryError) as raised, loader:
        fill(str(tiny_shm))
        next(iter(loader))
    message = str(raised.value)
    assert str(tiny_shm) in message and "MiB free" in message
    assert "--shm-size" in message and "backend='thread'" in message


class SigbusDecoder:
    """Fills `directory` (a tmpfs), then dies of SIGBUS, as a worker writing to it would."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        if "circle" in path:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            fill(self.directory)
            os.kill(os.getpid(), signal.SIGBUS)
        return get_decoder("auto")(path, options)


def test_a_worker_killed_by_sigbus_with_shm_full_is_reported_as_shared_memory_exhausted(
    tiny_shm: Path, folder: Path
) -> None:
    loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1, depth=2,
                             backend=prefetch.ProcessOptions(max_restarts=0),  shuffle=False,
                             decoder=SigbusDecoder(str(tiny_shm)))  # fmt: skip
    with pytest.raises(WorkerCrashedError) as raised, loader:
        for _ in loader:
            pass
    message = str(raised.value)
    assert "SIGBUS" in message and "shared memory exhausted" in message
    assert str(tiny_shm) in message


# --- 8. a killed parent's workers unlink its segments; the CLI sweeps at start -----------------

PARENT_SCRIPT = """
import sys, time
import prefetch
from prefetch.testing import SlowDecoder

if __name__ == "__main__":
    loader = prefetch.Loader(sys.argv[1], batch_size=2, image_size=(16, 16), workers=2,
                             backend="process", decoder=SlowDecoder(0.2))
    with loader:
        for batch in loader:
            print("batch", flush=True)
            time.sleep(60)
"""


def test_a_killed_parent_leaves_no_segment_once_its_workers_exit(
    folder: Path, tmp_path: Path
) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    assert parent.stdout is not None
    parent.stdout.readline()
    workers = worker_processes(parent.pid)
    assert len(workers) == 2
    mine = f"{PREFIX}{parent.pid}_"
    assert any(name.startswith(mine) for name in os.listdir(shm.SHM_DIR))
    parent.kill()
    parent.wait(10)
    # Generous on purpose: orphans notice their parent's death within about a second (end of
    # file on the pipe, or its pid gone) and exit; on a busy machine their exit can take
    # seconds more. Workers that never notice run for good, which this still catches.
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive
    assert not [name for name in os.listdir(shm.SHM_DIR) if name.startswith(mine)]


def test_the_prefetch_command_sweeps_dead_segments_at_start() -> None:
    stale = segment_path(f"{PREFIX}{dead_pid()}_cafe")
    stale.write_bytes(b"\0" * 64)
    try:
        from prefetch.cli import main

        with pytest.raises(SystemExit):
            main(["bench", "--help"])
        assert not stale.exists()
    finally:
        stale.unlink(missing_ok=True)


def test_this_suite_has_a_shared_memory_directory_that_other_sweeps_never_enter(
    planted: list[Path],
) -> None:
    """Another prefetch process on the machine sweeps /dev/shm, never the suite's directory."""
    assert shm.SHM_DIR != "/dev/shm" and planted[3].parent == Path(shm.SHM_DIR)
    env = {k: v for k, v in os.environ.items() if k != "PREFETCH_SHM_DIR"}
    sweep = "from prefetch.backends._shm import sweep_stale; sweep_stale()"
    subprocess.run([sys.executable, "-c", sweep], env=env, check=True, timeout=30)
    assert planted[3].exists()
