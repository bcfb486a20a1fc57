"""Process backend faults: an abandoned epoch kills no worker (issue 10, point 6), and a worker's
error that cannot be pickled keeps its type and traceback (point 11).

Classes here are sent to spawned workers, which import this module to unpickle them.
"""

from __future__ import annotations

import logging
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.decode._choice import get_decoder
from prefetch.decode._decoders import DecodeOptions
from prefetch.errors import PrefetchError, RemoteTraceback
from prefetch.testing import SlowDecoder, worker_processes, write_image_folder

pytestmark = pytest.mark.timeout(90)

SMALL = (16, 16)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("faults"), per_class=12, size=(24, 24))


# --- 6. breaking out of an epoch early ---------------------------------------------------------


def test_breaking_out_of_epochs_early_kills_no_worker_and_spends_no_restart(
    folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="prefetch"):
        for _ in range(10):
            loader = prefetch.Loader(folder, batch_size=2, image_size=SMALL, workers=2, depth=6,
                                     backend="process", decoder=SlowDecoder(0.005))  # fmt: skip
            with loader:
                workers = worker_processes()
                epoch = iter(loader)
                next(epoch)
                epoch.close()  # abandon the epoch with batches queued on the workers
                assert sum(1 for _ in loader) == 18, "the next epoch runs on the same workers"
                assert [w.pid for w in worker_processes()] == [w.pid for w in workers]
                assert all(w.is_running() for w in workers)
    restarts = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert not restarts, restarts


# --- 11. errors that cannot be pickled ---------------------------------------------------------


class LockHoldingError(RuntimeError):
    """Importable, but holds a lock, so it cannot be pickled as it is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()
        self.path = "kept"


def local_error_class() -> type[Exception]:
    class Unpicklable(RuntimeError):  # defined in a function: not importable by the parent
        pass

    return Unpicklable


class TwoArgumentError(ValueError):
    """Cannot be rebuilt from its args (its __init__ takes two, its args hold one)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class RaisingDecoder:
    """Raises an error of kind `kind` for every file."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        if self.kind == "lock":
            raise LockHoldingError("unpicklable")
        if self.kind == "local":
            raise local_error_class()("unpicklable")
        raise TwoArgumentError("bad", "reason")
        return get_decoder("auto")(path, options)


def raise_in_worker(folder: Path, kind: str) -> BaseException:
    loader = prefetch.Loader(folder, batch_size=4, image_size=SMALL, workers=1,
                             backend="process", decoder=RaisingDecoder(kind))  # fmt: skip
    with pytest.raises(Exception) as raised, loader:
        next(iter(loader))
    return raised.value


def test_an_unpicklable_importable_error_arrives_with_its_own_type_and_traceback(
    folder: Path,
) -> None:
    error = raise_in_worker(folder, "lock")
    assert type(error) is LockHoldingError and str(error) == "unpicklable"
    assert error.path == "kept"  # type: ignore[attr-defined]
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "RaisingDecoder" in str(error.__cause__) or "__call__" in str(error.__cause__)
    assert "prefetch-process-0" in "\n".join(error.__notes__)


def test_an_error_of_a_local_class_is_still_caught_as_its_builtin_base(folder: Path) -> None:
    error = raise_in_worker(folder, "local")
    assert isinstance(error, RuntimeError) and isinstance(error, PrefetchError)
    assert type(error).__name__ == "Unpicklable" and str(error) == "unpicklable"
    assert isinstance(error.__cause__, RemoteTraceback)
    assert "Unpicklable: unpicklable" in str(error.__cause__)
    assert "prefetch-process-0" in "\n".join(error.__notes__)


def test_an_error_that_cannot_be_rebuilt_from_its_args_keeps_its_base_and_message() -> None:
    from prefetch.backends._remote_error import ErrorSpec, rebuild, with_traceback_text

    sent, text = with_traceback_text(TwoArgumentError("bad", "reason"))
    assert isinstance(sent, ErrorSpec)
    error = rebuild(pickle.loads(pickle.dumps(sent)), text)
    assert isinstance(error, ValueError) and isinstance(error, PrefetchError)
    assert type(error).__name__ == "TwoArgumentError" and str(error) == "bad: reason"
    assert "TwoArgumentError" in str(error.__cause__)


def test_a_picklable_error_crosses_unchanged() -> None:
    from prefetch.backends._remote_error import with_traceback_text

    sent, _ = with_traceback_text(KeyError("k"))
    assert type(sent) is KeyError and sent.args == ("k",)
