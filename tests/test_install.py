"""The editable install that `make` does, as a user meets it (issue 28.10).

A user who runs a script from the checkout's parent folder has a folder named `prefetch` (the
checkout itself) in the current directory. With setuptools' default editable install (an
import hook placed after the path search) that folder is found first, as a namespace package,
and `prefetch.Loader` is an AttributeError. The install must put a path in a .pth file, where
the real package wins. It did so with `editable_mode=compat`, which setuptools now warns "is
transitional and will be removed" (issue 35.6); pyproject.toml now declares the flat layout
(`package-dir = {"" = "."}`), for which setuptools' default editable mode writes that .pth
itself: the Makefile, and a user's `pip install -e .`, need no setting. The test installs a copy
of the checkout the way the Makefile's pip line does (any --config-settings read from the
Makefile), offline, into a throwaway environment, checks that no deprecation is printed, and
imports prefetch from the copy's parent folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# Installing builds an editable wheel (a few seconds; the C extension is copied up to date, so
# it is not compiled again): longer than a unit test, well under this on a loaded machine.
pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]


def makefile_config_settings() -> list[str]:
    """The --config-settings of the Makefile's editable install, as pip arguments (none: the
    default editable mode, a .pth, follows from pyproject.toml's layout)."""
    settings = re.findall(r"--config-settings[ =](\S+)", (REPO / "Makefile").read_text())
    assert "editable_mode=compat" not in settings, "compat is going away: see test docstring"
    return [argument for value in settings for argument in ("--config-settings", value)]


def test_a_folder_named_prefetch_in_the_current_directory_does_not_shadow_the_install(
    tmp_path: Path,
) -> None:
    for tool in ("pip", "setuptools"):  # the offline install borrows this environment's
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"needs {tool} in the test environment")
    parent = tmp_path / "parent"
    checkout = parent / "prefetch"
    checkout.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, checkout / name)
    shutil.copytree(REPO / "prefetch", checkout / "prefetch",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # pip, setuptools, numpy and Pillow from this environment; nothing is downloaded.
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(site, "build-tools.pth").write_text("\n".join(sorted(ours)) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = [python, "-m", "pip", "install", "--verbose", "--no-index", "--no-deps",
               "--no-build-isolation", "--ignore-installed", *makefile_config_settings(),
               "-e", str(checkout)]  # fmt: skip
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "transitional" not in done.stdout + done.stderr  # setuptools' warning for compat
    assert list(Path(site).glob("__editable__*finder*")) == []  # a .pth, not an import hook

    imported = subprocess.run(
        [python, "-c", "import prefetch; print(prefetch.Loader.__name__, prefetch.__file__)"],
        cwd=parent, capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr[-3000:]
    name, where = imported.stdout.split()
    assert name == "Loader" and Path(where) == checkout / "prefetch" / "__init__.py"
