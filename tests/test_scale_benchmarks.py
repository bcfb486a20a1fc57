"""The scale benchmarks run as docs/scale.md shows them, on tiny trees: `make_tree.py` builds
an ImageNet-shaped tree and finishes a half-built one, `ranks_listing.py` lists once for its
ranks, `scale.py` prints its rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_benchmarks import run_script

from prefetch.testing import write_image_folder

pytestmark = pytest.mark.timeout(120)


def run(name: str, *args: str, tmp_path: Path) -> str:
    return run_script(name, list(args), tmp_path, timeout=110)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "photos", per_class=2, size=(16, 12))


def test_make_tree_builds_the_tree_once_and_finishes_a_half_built_one(
    photos: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    args = [str(tree), "--files", "25", "--classes", "4", "--photos", str(photos)]
    assert "25 links made" in run("make_tree.py", *args, tmp_path=tmp_path)
    files = sorted(tree.rglob("*.JPEG"))
    assert [len(list((tree / f"n{c:08d}").iterdir())) for c in range(4)] == [7, 6, 6, 6]
    assert files[0].stat().st_ino in {p.stat().st_ino for p in (tmp_path / "tree.photos").iterdir()}
    assert "complete already" in run("make_tree.py", *args, tmp_path=tmp_path)

    (tree / ".make_tree.json").unlink()  # as if interrupted before the end
    files[3].unlink()
    assert "1 links made" in run("make_tree.py", *args, tmp_path=tmp_path)
    assert sorted(tree.rglob("*.JPEG")) == files
    assert json.loads((tree / ".make_tree.json").read_text())["files"] == 25


def test_ranks_listing_lists_once_and_scale_prints_its_rows(photos: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    run("make_tree.py", str(tree), "--files", "8", "--classes", "2", "--photos", str(photos),
        tmp_path=tmp_path)  # fmt: skip
    then = 1_000_000_000
    for folder in [tree, *tree.iterdir()]:
        os.utime(folder, (then, then))  # long settled: a listing made now serves later ranks

    out = run("ranks_listing.py", str(tree), "--ranks", "2", "--modes", "first,later",
              tmp_path=tmp_path)  # fmt: skip
    assert "listed by 1 rank(s), listing" in out
    assert "listed by 0 rank(s); read by 2" in out

    out = run("scale.py", str(tree), "--rows", "listed,kept", tmp_path=tmp_path)
    assert "prefetch listed" in out and "prefetch kept" in out
