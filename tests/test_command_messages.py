"""What the `prefetch` command says where a user looks first (issue 45): its help names every
action, a bad folder is one line (no usage block), the writer's plan says what is true, and a
lock file that is not the writer's own is refused naming it and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prefetch.cli import main
from prefetch.testing import write_image_folder
from prefetch.tools.shards import write_shards
from prefetch.tools.shards._out_folder import LOCK_NAME

pytestmark = pytest.mark.timeout(60)

# The refusal's fix, as the writer says it for a lock file that is not a regular file of yours.
FIX = "remove it if you made it; else another user may write into"


def test_the_help_names_both_shards_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "shards write" in shown and "shards verify" in shown


@pytest.mark.parametrize(
    ("kind", "said"),
    [("missing", "image folder {}"), ("empty", "no class folders in {}")],
)
def test_bench_of_a_folder_it_cannot_use_is_one_line_naming_it_with_status_2(
    tmp_path: Path, kind: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "photos"
    if kind == "empty":
        folder.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(folder)])
    assert exit_info.value.code == 2
    errors = capsys.readouterr().err
    assert errors.startswith("prefetch bench: error: " + said.format(repr(str(folder)))), errors
    assert "usage:" not in errors and len(errors.splitlines()) == 1, errors


@pytest.mark.parametrize(
    ("files", "shard_size", "plan"),
    [
        (6, 1000, "into 1 tar shard in"),
        (6, 4, "into 2 tar shards of 4 files (the last of 2) in"),
        (6, 3, "into 2 tar shards of 3 files in"),
    ],
    ids=["one-shard", "last-shorter", "all-full"],
)
def test_the_writer_says_how_many_files_each_shard_gets(
    tmp_path: Path, files: int, shard_size: int, plan: str
) -> None:
    folder = write_image_folder(tmp_path / "photos", class_names=("a", "b"), per_class=files // 2)
    said: list[str] = []
    write_shards(
        folder, tmp_path / "out", format="tar", shard_size=shard_size, on_status=said.append
    )
    assert said[0].startswith(f"{files} files in 2 classes: checking each one's header"), said
    assert plan in said[0], said


def planted(out: Path, kind: str) -> None:
    """A lock file at `out` that is not a regular file of yours, of `kind`."""
    out.mkdir()
    lock = out / LOCK_NAME
    if kind == "symlink":
        lock.symlink_to(out.parent / "elsewhere")
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)


@pytest.mark.parametrize(
    ("kind", "what"),
    [("symlink", "a symbolic link"), ("folder", "a folder"), ("fifo", "a FIFO")],
)
def test_a_lock_file_that_is_not_a_regular_file_is_refused_naming_it_and_the_fix(
    tmp_path: Path, kind: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_image_folder(tmp_path / "photos", class_names=("a",), per_class=2)
    out = tmp_path / "out"
    planted(out, kind)
    assert main(["shards", "write", str(folder), str(out), "--quiet"]) == 2
    errors = capsys.readouterr().err
    assert errors.startswith(
        f"prefetch shards write: error: {str(out / LOCK_NAME)!r}, the lock of `prefetch shards "
        f"write`, is not a regular file of yours ({what}"
    ), errors
    assert FIX in errors
    assert os.listdir(out) == [LOCK_NAME]  # nothing written, the planted one left alone


# Runs as root, takes the folder, then becomes `nobody` (who may not open root's 0600 lock file
# in a sticky folder anyone may write to, as /tmp is) and asks for the lock.
AS_NOBODY = """
import os, sys
from prefetch.tools.shards import OutFolder
out = OutFolder(sys.argv[1])
os.setgroups([]); os.setgid(65534); os.setuid(65534)
try:
    out.lock()
except OSError as error:
    print(type(error).__name__, error)
"""


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="setuid needs root")
def test_another_users_lock_file_is_refused_naming_it_for_a_user_who_cannot_open_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o1777)
    out.chmod(0o1777)
    (out / LOCK_NAME).write_bytes(b"")
    (out / LOCK_NAME).chmod(0o600)  # root's
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(AS_NOBODY), str(out)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.startswith(
        f"PermissionError [Errno 1] {str(out / LOCK_NAME)!r}, the lock of `prefetch shards "
        "write`, is not a regular file of yours (a file of user 0)"
    ), done.stdout
    assert FIX in done.stdout
