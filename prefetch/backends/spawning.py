"""What starts a worker process: the parts it is sent, checked to pickle, and the main script.

spawn and forkserver children unpickle the transform, decoder and source they are sent; a part
that cannot be pickled is refused at construction with a message naming it (`check_picklable`),
or makes backend="auto" keep threads (`unpicklable_part`). `main_script_hidden` starts a worker
without re-running the parent's main script when nothing sent lives there.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

from prefetch.backends.reader import SampleReader


def _sent_parts(reader: SampleReader) -> tuple[tuple[str, Any], ...]:
    """What a worker process receives besides tasks, by name."""
    return (("transform", reader.transform), ("decoder", reader.decoder), ("source", reader.source))


def unpicklable_part(reader: SampleReader) -> str:
    """The name of the first part sent to workers that cannot be pickled ("" when all can)."""
    for what, value in _sent_parts(reader):
        try:
            pickle.dumps(value)
        except Exception:
            return what
    return ""


def check_picklable(reader: SampleReader) -> bool:
    """Fail early, naming the part of the loader that cannot be sent to worker processes.

    Returns whether the pickled parts refer to the main script (`__main__`), which a worker
    must then run again to find them.
    """
    needs_main = False
    for what, value in _sent_parts(reader):
        try:
            needs_main |= b"__main__" in pickle.dumps(value)
        except Exception as error:
            raise TypeError(
                f"backend='process' sends the {what} to worker processes, but {value!r} cannot be "
                f"pickled ({error}). Define it at module level (not a lambda or a local "
                "function), or use backend='thread'"
            ) from error
    return needs_main


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
