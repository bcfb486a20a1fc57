"""Ctrl-C while the `prefetch` command is still importing: one line, as later, not a traceback.

`python -m prefetch ...` (and the `prefetch` console script) imports `prefetch.cli` (numpy,
Pillow, every layer; 0.3 s on a quiet machine, seconds on a busy one), and only then does
`prefetch.cli.main` run and catch Ctrl-C itself. `hush_interrupt()`, the first statement of
`prefetch.cli` (the command's module: `import prefetch` itself has no side effect and imports
nothing yet), sets `sys.excepthook` so that a KeyboardInterrupt that ends the process prints
`prefetch: interrupted` instead of a traceback, when (and only when) this process is the
command: `python -m prefetch` (while `-m` locates its module, `sys.argv[0]` is "-m" and
`sys.orig_argv` names it; once it runs, the path of `prefetch/__main__.py`) or the console
script (`sys.argv[0]` named `prefetch`). Python then ends the process as killed by SIGINT (exit
status 130 in a shell, as `main` returns). Any other error goes to the previous hook, and
`prefetch.cli.main` puts it back as it starts (`restore_excepthook`). A program that imports
prefetch, or even `prefetch.cli`, is not touched (nor one that emptied, removed or replaced
`sys.argv`). Python's own start-up before the command's module is imported (tens of
milliseconds) is out of any module's reach.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

_previous: list[object] = []


def hush_interrupt() -> None:
    """Set the hook (module docstring) when this process is the `prefetch` command."""
    if not _previous and _is_command():
        _previous.append(sys.excepthook)
        sys.excepthook = _interrupted


def _is_command() -> bool:
    """Whether this process is the `prefetch` command (module docstring). A program that
    emptied, removed or replaced `sys.argv` (an embedding application) is not."""
    argv = getattr(sys, "argv", None)
    first = argv[0] if isinstance(argv, list) and argv else None
    if not isinstance(first, str):
        return False
    if os.path.basename(first) == "prefetch":  # the console script
        return True
    # `python -m prefetch`: "-m" while it locates the module, then the path of its __main__
    main = os.path.basename(first) == "__main__.py"
    return _module_run(first) == "prefetch" or (main and _package_of(first) == "prefetch")


def _package_of(main: str) -> str:
    """The folder name of a `__main__.py` path: the package `python -m` runs."""
    return os.path.basename(os.path.dirname(os.path.abspath(main)))


def _module_run(first: str) -> str | None:
    """The module `python -m` is locating now (`sys.argv[0]`, `first`, is "-m" until it is
    found): the one after Python's first `-m` (`-m prefetch` or `-mprefetch`); None
    otherwise."""
    if first != "-m":
        return None
    arguments = sys.orig_argv[1:]
    for position, argument in enumerate(arguments):
        if argument.startswith("-m"):
            module = argument[2:] or (arguments[position + 1 : position + 2] or [""])[0]
            return module
    return None


def restore_excepthook() -> None:
    """Put back the hook `hush_interrupt` replaced (nothing when it replaced none)."""
    if _previous and sys.excepthook is _interrupted:
        sys.excepthook = _previous.pop()  # type: ignore[assignment]


def _interrupted(
    kind: type[BaseException], error: BaseException, trace: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt):
        print("\nprefetch: interrupted", file=sys.stderr, flush=True)
        return
    previous = _previous[0] if _previous else sys.__excepthook__
    previous(kind, error, trace)  # type: ignore[operator]
