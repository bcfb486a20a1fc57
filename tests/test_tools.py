"""prefetch.tools stays out of the core: `import prefetch` leaves it unimported, `prefetch.tune`
imports it on first use, and the old module paths warn and re-export the moved names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import prefetch
from prefetch.tools import tune

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(prefetch.__file__).parent
# Modules allowed to import prefetch.tools: the command, the old paths, the tools themselves.
TOOL_USERS = {"cli", "__main__", "bench", "tuning", "timeline", "tools"}


def fresh_modules(code: str) -> set[str]:
    """The prefetch modules loaded after running `code` in a fresh interpreter."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{code}\nimport sys\nprint(' '.join(m for m in sys.modules if 'prefetch' in m))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(done.stdout.split())


def test_import_prefetch_imports_none_of_the_tools() -> None:
    loaded = fresh_modules("import prefetch")

    assert "prefetch" in loaded
    assert not {name for name in loaded if name.startswith("prefetch.tools")}
    assert not loaded & {"prefetch.cli"}


def test_no_core_module_imports_the_tools() -> None:
    core = [
        f"prefetch.{path.stem}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.stem not in TOOL_USERS | {"__init__"}
    ]
    loaded = fresh_modules("\n".join(f"import {name}" for name in core))

    assert set(core) <= loaded
    assert not {name for name in loaded if name.startswith("prefetch.tools")}


def test_no_tensorflow_module_imports_the_tools() -> None:
    # Read, not imported: importing prefetch.tf imports TensorFlow.
    for path in sorted((PACKAGE / "tf").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any(name.startswith("prefetch.tools") for name in names), path


def test_prefetch_tune_is_imported_on_first_use_and_stays_public() -> None:
    loaded = fresh_modules("import prefetch\nprefetch.tune")
    assert "prefetch.tools.tune" in loaded

    from prefetch import tune as imported

    assert imported is prefetch.tune is tune.tune
    assert "tune" in prefetch.__all__
