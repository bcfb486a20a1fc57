"""prefetch.tools and the framework adapters stay out of the core: `import prefetch` imports
none of them. (That no module below the tools imports them is the layers contract that
tests/test_layout.py runs.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


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


def test_import_prefetch_imports_none_of_the_tools_and_no_framework_adapter() -> None:
    loaded = fresh_modules("import prefetch")

    assert "prefetch" in loaded
    outside = ("prefetch.tools", "prefetch.tf", "prefetch.keras", "prefetch.torch", "prefetch.cli")
    assert not {
        name for name in loaded if any(name == o or name.startswith(o + ".") for o in outside)
    }, sorted(loaded)


def test_the_tools_are_imported_by_their_path() -> None:
    loaded = fresh_modules("from prefetch.tools.tune import tune")
    assert "prefetch.tools.tune" in loaded
    assert not {"prefetch.tools.bench", "prefetch.tools.feeding"} & loaded
