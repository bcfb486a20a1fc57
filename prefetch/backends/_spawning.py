"""What starts a worker process: the parts it is sent, checked to pickle, and the main script.

spawn and forkserver children unpickle the transform, decoder and source they are sent; a part
that cannot be pickled is refused at construction with a message naming it (`check_picklable`),
or makes backend="auto" keep threads (`unpicklable_part`). `main_script_hidden` starts a worker
without re-running the parent's main script when nothing sent lives there. When something sent
does live there, the workers must run the script again (as `__mp_main__`) to find it: a script
whose loader runs outside `if __name__ == "__main__":` would then start workers in every worker,
and multiprocessing prints its long bootstrapping error. `unguarded_main_code` finds that case
before any process starts (from the main thread's stack and the script's syntax tree), so
`check_picklable` raises one error that shows the guard to add, and backend="auto" keeps threads.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prefetch.backends._shared_arrays import dumps_leaving_arrays
from prefetch.sample import SampleReader


def _sent_parts(reader: SampleReader) -> tuple[tuple[str, Any], ...]:
    """What a worker process receives besides tasks, by name."""
    transform = reader.augment.transform
    return (("transform", transform), ("decoder", reader.decoder), ("source", reader.source))


def unpicklable_part(reader: SampleReader) -> str:
    """The name of the first part sent to workers that cannot be pickled ("" when all can)."""
    for what, value in _sent_parts(reader):
        try:
            dumps_leaving_arrays(value)
        except Exception:
            return what
    return ""


def check_picklable(reader: SampleReader) -> bool:
    """Fail early, naming the part of the loader that cannot be sent to worker processes.

    Returns whether the pickled parts refer to the main script (`__main__`), which a worker
    must then run again to find them. When that script would also run the loader again (its
    code is not under `if __name__ == "__main__":`), raises RuntimeError showing the guard to
    add (`unguarded_main_code`) instead of letting every worker fail to bootstrap.
    """
    needs_main = False
    for what, value in _sent_parts(reader):
        try:
            pickled = dumps_leaving_arrays(value)
        except Exception as error:
            raise TypeError(
                f"backend='process' sends the {what} to worker processes, but {value!r} cannot be "
                f"pickled ({error}). Define it at module level (not a lambda or a local "
                "function), or use backend='thread'"
            ) from error
        if b"__main__" in pickled and not needs_main:
            needs_main = True
            code = unguarded_main_code()
            if code is not None:
                raise RuntimeError(code.message(what))
    return needs_main


def main_part(reader: SampleReader) -> str:
    """The name of the first part sent to workers that lives in the main script ("" when none
    does, or one cannot be pickled)."""
    for what, value in _sent_parts(reader):
        try:
            if b"__main__" in dumps_leaving_arrays(value):
                return what
        except Exception:
            return ""
    return ""


@dataclass(frozen=True)
class UnguardedCode:
    """A line of the main script that runs at import, outside `if __name__ == "__main__":`,
    and has started a loader's workers: spawned workers that import the script run it too."""

    path: str
    line: int
    text: str

    def message(self, part: str) -> str:
        """The error for a loader whose `part` (its transform, source, decoder) lives there."""
        return (
            f"backend='process' starts worker processes that import this script "
            f"({self.path}) again to find the {part} defined in it, and its line {self.line} "
            f'(`{self.text}`) runs outside `if __name__ == "__main__":`, so every worker '
            "would run it too and try to start workers of its own. Put the script's top-level "
            "code in a function (say main) and add these two lines at the end of the script:\n"
            "\n"
            '    if __name__ == "__main__":\n'
            "        main()\n"
            "\n"
            f"Or define the {part} in a module of its own that the script imports, or pass "
            "backend='thread'."
        )


def unguarded_main_code() -> UnguardedCode | None:
    """The line of the main script that is running now outside `if __name__ == "__main__":`,
    or None when there is none (the call comes from under the guard, or from a function the
    script did not call at its top level), or when workers would not run the script again (an
    interactive session, `python -c`, a package's `__main__`, a script whose file is gone).

    Looks at the main thread, whichever thread asks: it runs the script (tf.data may start a
    loader from one of its own threads).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if main is None or not path or spec_name.split(".")[-1] == "__main__":
        return None  # multiprocessing's spawn does not run such a main module again
    if not os.path.isfile(path):
        return None
    line = _main_module_line(main.__dict__)
    if line is None:
        return None
    try:
        with open(path, "rb") as file:
            source = file.read()
        tree = ast.parse(source, path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end:
                return None
    lines = source.decode("utf-8", "replace").splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return UnguardedCode(os.path.abspath(path), line, text)


def _main_module_line(main_globals: dict[str, Any]) -> int | None:
    """The line the main script's top-level code is at on the main thread's stack, or None."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    line = None
    try:
        while frame is not None:
            if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
                line = frame.f_lineno
            frame = frame.f_back
    finally:
        del frame
    return line


def _is_main_test(test: ast.expr) -> bool:
    """Whether `test` is `__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [side for side in sides if isinstance(side, ast.Name) and side.id == "__name__"]
    texts = [side for side in sides if isinstance(side, ast.Constant) and side.value == "__main__"]
    return len(names) == 1 and len(texts) == 1


_main_lock = threading.Lock()


@contextlib.contextmanager
def main_script_hidden() -> Iterator[None]:
    """Start processes without making them run the main script again.

    spawn and forkserver children re-run the parent's main script (as `__mp_main__`) so that
    functions defined there can be unpickled; its top-level imports, TensorFlow included, would
    then load in every worker. When nothing sent to the workers lives in the main script, this
    hides it while a process starts (multiprocessing reads `sys.modules["__main__"]` to decide).
    """
    with _main_lock:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main
