"""The one check that a framework an adapter needs is installed, with the extra that brings it.

`prefetch.tf`, `prefetch.keras` and `prefetch.torch` call `require` before importing their
framework, so that a user without it reads one line naming the extra to install and what works
without it, instead of a bare `No module named ...`.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(
    module: str, *, adapter: str, framework: str, extra: str, alternative: str
) -> ModuleType:
    """Import `module`, or raise ModuleNotFoundError naming `pip install "prefetch[extra]"`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != module.split(".")[0]:
            raise  # the framework is there but something it imports is not: show that
        raise ModuleNotFoundError(
            f"{adapter} needs {framework}, which is not installed: "
            f'pip install "prefetch[{extra}]" (or {alternative})',
            name=module,
        ) from None
