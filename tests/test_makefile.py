"""`make clean` leaves the checkout as a clone has it (issue 45, item 11): it removes what the
install (`.venv`, setuptools' `build/` and `*.egg-info`, the compiled decoder built into the
package), the tools (pytest's, mypy's, ruff's, import-linter's and grimp's caches) and the docs
build (`site/`) leave, and nothing else. Run on a copy of the Makefile in a folder of its own."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LEFT_BY_BUILDS = [
    ".venv/bin/python",
    ".pytest_cache/README.md",
    ".mypy_cache/3.11/cache.db",
    ".ruff_cache/CACHEDIR.TAG",
    ".import_linter_cache/contracts.json",
    ".grimp_cache/prefetch.meta.json",
    "site/index.html",
    "build/lib.linux-x86_64-cpython-311/prefetch/decode/_jpegwindow.so",
    "prefetch.egg-info/PKG-INFO",
    "prefetch/decode/_jpegwindow.cpython-311-x86_64-linux-gnu.so",
]
SOURCES = ["Makefile", "setup.py", "prefetch/decode/__init__.py", "prefetch/decode/_c/binding.c"]


def test_make_clean_removes_what_the_install_the_tools_and_the_builds_left(
    tmp_path: Path,
) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    for name in LEFT_BY_BUILDS + SOURCES[1:]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("", encoding="utf-8")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    subprocess.run([make, "clean"], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == sorted(SOURCES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Makefile", "prefetch", "setup.py"]
