"""Tests for the exception tree of `prefetch.errors`, and for the errors a stop or a close raises.

The tree in the module's docstring must name every `PrefetchError` subclass that the package
defines. A loader or background iterator closed from another thread while its consumer waits
raises `ClosedError`; a `Coordinator.join` whose threads outlive the grace period raises
`StopTimeoutError`. Both are also `RuntimeError`s, as those cases were before. The tests use real
threads and processes and synchronise on what the consumer is doing, never on how long it takes;
the leak check in conftest.py verifies that each test ends everything it starts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import prefetch
import prefetch.errors
from prefetch import Background, ClosedError, Coordinator, Loader, StopTimeoutError
from prefetch.testing import SlowDecoder, write_image_folder

pytestmark = pytest.mark.timeout(60)

PUBLIC_ERRORS = (
    "PrefetchError",
    "TooManySkippedError",
    "WorkerCrashedError",
    "SampleTimeoutError",
    "ClosedError",
    "StopTimeoutError",
    "CorruptShardError",
)
# A bound on waiting for a thread to reach a given function; generous, for a loaded machine.
REACH_TIMEOUT_S = 30.0
# Each image of the slow loader sleeps this long, so an epoch lasts seconds: ample time to close it
# while its consumer waits, and short enough that close() joins a worker mid-image at once.
SLOW_IMAGE_S = 0.2


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _is_in(frame: FrameType | None, function: str, module_file: str) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == function and code.co_filename.endswith(module_file):
            return True
        frame = frame.f_back
    return False


def _wait_until_in(thread: threading.Thread, function: str, module_file: str) -> bool:
    """Wait until `thread` runs `function` of `module_file` (True), or it ended or time ran out."""
    deadline = time.monotonic() + REACH_TIMEOUT_S
    while thread.is_alive() and time.monotonic() < deadline:
        assert thread.ident is not None
        if _is_in(sys._current_frames().get(thread.ident), function, module_file):
            return True
        time.sleep(0.005)
    return False


class _Consumer(threading.Thread):
    """Iterates `iterable` to its end, keeping how many items came and the error that ended it."""

    def __init__(self, iterable: object) -> None:
        super().__init__(name="test-consumer", daemon=True)
        self.iterable = iterable
        self.items = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for _ in self.iterable:  # type: ignore[attr-defined]
                self.items += 1
        except BaseException as error:
            self.error = error


# --- the tree ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PUBLIC_ERRORS)
def test_each_public_error_is_importable_from_prefetch_and_prefetch_errors(name: str) -> None:
    assert name in prefetch.__all__
    assert getattr(prefetch, name) is getattr(prefetch.errors, name)
    assert issubclass(getattr(prefetch, name), prefetch.PrefetchError)
    assert getattr(prefetch, name).__doc__


def test_the_docstring_tree_names_every_prefetch_error_the_package_defines() -> None:
    tree = prefetch.errors.__doc__
    assert tree is not None
    ours = {
        cls
        for cls in _subclasses(prefetch.PrefetchError)
        if cls.__module__ == "prefetch" or cls.__module__.startswith("prefetch.")
    }
    assert {cls.__name__ for cls in ours} >= set(PUBLIC_ERRORS) - {"PrefetchError"}
    for cls in (prefetch.PrefetchError, *ours, prefetch.errors.RemoteTraceback):
        assert f"-- {cls.__name__} " in tree, f"{cls.__name__} is not drawn in prefetch.errors"
    # DoesNotFitError lives in prefetch.tf (TensorFlow) for now; the tree draws it all the same.
    assert "-- DoesNotFitError " in tree


def test_closed_and_stop_timeout_errors_are_runtime_errors_for_code_that_catches_those() -> None:
    assert issubclass(ClosedError, RuntimeError)
    assert issubclass(StopTimeoutError, RuntimeError)
    assert not issubclass(prefetch.TooManySkippedError, RuntimeError)


# --- ClosedError ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_closing_a_loader_while_its_consumer_waits_raises_closed_error(
    tmp_path: Path, backend: str
) -> None:
    folder = write_image_folder(tmp_path / "images", per_class=8, size=(16, 16))
    loader = Loader(
        folder,
        batch_size=4,
        image_size=(8, 8),
        workers=1,
        depth=2,
        shuffle=False,
        decoder=SlowDecoder(SLOW_IMAGE_S),
        backend=backend,
    )
    consumer = _Consumer(loader)
    consumer.start()
    try:
        assert _wait_until_in(consumer, "_wait", "stream.py"), "the consumer never waited"
        loader.close()
        consumer.join(REACH_TIMEOUT_S)
    finally:
        loader.close()
    assert not consumer.is_alive()
    assert isinstance(consumer.error, ClosedError), repr(consumer.error)
    assert isinstance(consumer.error, RuntimeError)
    assert "closed while a batch was being waited for" in str(consumer.error)
    assert consumer.items < len(loader)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_the_next_batch_of_an_epoch_whose_loader_was_closed_raises_closed_error(
    tmp_path: Path, backend: str
) -> None:
    folder = write_image_folder(tmp_path / "images", per_class=8, size=(16, 16))
    loader = Loader(folder, batch_size=4, image_size=(8, 8), workers=1, backend=backend)
    batches = iter(loader)
    next(batches)
    loader.close()  # the epoch has batches left, but its workers are gone
    with pytest.raises(ClosedError, match="the loader was closed"):
        next(batches)


def test_stopping_a_loaders_coordinator_while_its_consumer_waits_raises_closed_error(
    tmp_path: Path,
) -> None:
    folder = write_image_folder(tmp_path / "images", per_class=8, size=(16, 16))
    loader = Loader(
        folder, batch_size=4, image_size=(8, 8), workers=1, decoder=SlowDecoder(SLOW_IMAGE_S)
    )
    consumer = _Consumer(loader)
    with loader:
        consumer.start()
        assert _wait_until_in(consumer, "_wait", "stream.py"), "the consumer never waited"
        loader.coordinator.request_stop()
        consumer.join(REACH_TIMEOUT_S)
    assert isinstance(consumer.error, ClosedError), repr(consumer.error)


def test_closing_a_background_iterator_while_its_consumer_waits_raises_closed_error() -> None:
    release = threading.Event()

    def held_back() -> Iterator[int]:
        release.wait(REACH_TIMEOUT_S)  # no item can arrive before the test releases it
        yield 1

    items = Background(held_back(), depth=1)
    consumer = _Consumer(items)
    # close() waits for the producer to finish its item, so it runs in a thread of its own.
    closer = threading.Thread(target=items.close, name="test-closer", daemon=True)
    consumer.start()
    try:
        assert _wait_until_in(consumer, "__next__", "background.py"), "the consumer never waited"
        closer.start()
        consumer.join(REACH_TIMEOUT_S)
    finally:
        release.set()
        if closer.ident is not None:
            closer.join()
        items.close()
    assert not consumer.is_alive()
    assert consumer.items == 0
    assert isinstance(consumer.error, ClosedError), repr(consumer.error)
    assert isinstance(consumer.error, RuntimeError)
    assert "closed while an item was being waited for" in str(consumer.error)


def test_a_background_iterator_closed_before_next_just_ends() -> None:
    items = Background(iter([1, 2, 3]), depth=1)
    items.close()
    assert list(items) == []


# --- StopTimeoutError ----------------------------------------------------------------------------


def test_join_raises_stop_timeout_error_naming_threads_that_ignore_the_stop() -> None:
    coord = Coordinator()
    release = threading.Event()

    def ignores_the_stop() -> None:
        while not release.is_set():  # does not check coord.should_stop()
            release.wait(0.01)

    stubborn = threading.Thread(target=ignores_the_stop, name="stubborn-reader", daemon=True)
    prompt = threading.Thread(target=coord.wait_for_stop, name="prompt-writer", daemon=True)
    for thread in (stubborn, prompt):
        coord.register_thread(thread)
        thread.start()
    try:
        coord.request_stop()
        # The prompt thread has ended before join looks, however busy the machine: the short
        # grace then only times the stubborn one, which never ends within it.
        prompt.join(REACH_TIMEOUT_S)
        assert not prompt.is_alive()
        with pytest.raises(StopTimeoutError) as raised:
            coord.join(stop_grace_period_secs=0.05)
    finally:
        release.set()
        stubborn.join()
        prompt.join()
    assert isinstance(raised.value, RuntimeError)
    message = str(raised.value)
    assert message.startswith("Coordinator stopped with threads still running: ")
    assert "stubborn-reader" in message
    assert "prompt-writer" not in message


def test_a_reported_error_wins_over_the_stop_timeout() -> None:
    coord = Coordinator()
    release = threading.Event()
    stubborn = threading.Thread(target=release.wait, name="stubborn", daemon=True)
    stubborn.start()
    try:
        coord.request_stop(ValueError("the first error"))
        with pytest.raises(ValueError, match="the first error"):
            coord.join([stubborn], stop_grace_period_secs=0.01)
    finally:
        release.set()
        stubborn.join()


# --- a misspelt keyword names what was meant (issue 28.13) ---------------------------------------

MISSPELT: list[tuple[str, str, str]] = [
    # (public callable, misspelt keyword, what it should suggest)
    ("Loader", "imgsize", "image_size"),
    ("ImageFolder", "folow_links", "follow_links"),
    ("FileList", "class_name", "class_names"),
    ("TFRecordSource", "label_keys", "label_key"),
    ("TarSource", "image_exts", "image_ext"),
    ("DecodeOptions", "chanels", "channels"),
    ("RemoteOptions", "max_object_size", "max_object_bytes"),
    ("ProcessOptions", "threads_per_workers", "threads_per_worker"),
    ("RandomResizedCrop", "scales", "scale"),
    ("CenterCrop", "fractions", "fraction"),
]


@pytest.mark.parametrize(("name", "keyword", "meant"), MISSPELT)
def test_a_misspelt_keyword_says_did_you_mean_the_accepted_one(
    name: str, keyword: str, meant: str
) -> None:
    with pytest.raises(TypeError) as raised:
        getattr(prefetch, name)("unused", **{keyword: 1})
    message = str(raised.value)
    assert message.startswith(f"{name}() got an unexpected keyword argument {keyword!r}")
    assert f"did you mean {meant}" in message


def test_a_keyword_like_none_accepted_lists_them_all() -> None:
    with pytest.raises(TypeError, match=r"'wat': it accepts paths, labels, class_names$"):
        prefetch.FileList([], wat=1)  # type: ignore[call-arg]
