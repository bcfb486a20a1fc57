"""`prefetch._as_command`: Ctrl-C while the `prefetch` command imports is one line, and a program
that imports prefetch is never touched: its `sys.excepthook` stays, whatever its `sys.argv`
holds (an embedding application may empty, remove or replace it).

`hush_interrupt` is what `prefetch.cli` (the command's module) runs first; it is called here
with `sys.argv` as each kind of process has it while the package imports. The command itself
is tested through real Ctrl-C in tests/test_shard_write_frictions.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetch import _as_command

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sys.excepthook as a program leaves it, put back after the test whatever happened."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(_as_command, "_previous", [])
    yield


@pytest.mark.parametrize("argv", [[], [None], [b"prefetch"]], ids=["empty", "none", "bytes"])
def test_a_program_whose_argv_is_not_a_list_of_names_imports_prefetch_untouched(
    hook: None, monkeypatch: pytest.MonkeyPatch, argv: object
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    _as_command.hush_interrupt()
    assert sys.excepthook is sys.__excepthook__


def test_a_program_without_argv_imports_prefetch_untouched(
    hook: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(sys, "argv")
    _as_command.hush_interrupt()
    assert sys.excepthook is sys.__excepthook__


@pytest.mark.parametrize(
    ("argv", "orig_argv", "hushed"),
    [
        (["-m"], ["python", "-m", "prefetch", "shards"], True),
        (["-m"], ["python", "-mprefetch"], True),
        (["/venv/bin/prefetch", "shards"], ["python", "/venv/bin/prefetch", "shards"], True),
        (["-m"], ["python", "-m", "train.main"], False),  # a package of yours imports prefetch
        (["-m"], ["python", "-m", "prefetch_tools"], False),
        (["-c"], ["python", "-c", "import prefetch"], False),
        (["train.py"], ["python", "train.py"], False),
        ([""], ["python"], False),  # the interactive interpreter
        (["/venv/prefetch/__main__.py"], ["python", "-m", "prefetch"], True),  # -m, running
        (["/src/train/__main__.py"], ["python", "-m", "train"], False),
    ],
)
def test_only_the_prefetch_command_is_hushed(
    hook: None,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    orig_argv: list[str],
    hushed: bool,
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    _as_command.hush_interrupt()
    assert (sys.excepthook is not sys.__excepthook__) is hushed
    _as_command.restore_excepthook()  # what prefetch.cli.main does first
    assert sys.excepthook is sys.__excepthook__


def test_a_script_that_imports_prefetch_shows_its_own_ctrl_c_traceback(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import prefetch
            assert sys.excepthook is sys.__excepthook__
            raise KeyboardInterrupt
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, check=False
    )
    assert "Traceback" in done.stderr and "KeyboardInterrupt" in done.stderr, done.stderr
    assert "prefetch: interrupted" not in done.stderr


def test_importing_prefetch_has_no_side_effect_even_in_the_command(tmp_path: Path) -> None:
    """`import prefetch` imports no layer (no numpy) and leaves `sys.excepthook` alone, even in
    a process whose `sys.argv` names the command; only the command's module (`prefetch.cli`)
    hushes."""
    script = tmp_path / "check.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.argv = ["/venv/bin/prefetch", "shards"]
            import prefetch
            assert sys.excepthook is sys.__excepthook__
            bottom = {"prefetch.background", "prefetch.coordinator", "prefetch.errors"}
            layers = sorted(m for m in sys.modules if m.startswith("prefetch."))
            assert set(layers) <= bottom and "numpy" not in sys.modules, layers
            assert prefetch.Loader.__name__ == "Loader"  # imported on first use
            import prefetch.cli
            assert sys.excepthook is not sys.__excepthook__
            print("ok")
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
