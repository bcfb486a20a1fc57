"""Tests for `prefetch.background`: run any iterable ahead of its consumer in one thread.

Every test uses a real producer thread, keeps its waits short, and ends the thread it starts
(close, `with`, break, or dropping the iterator), so the leak check in conftest.py passes.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
from collections.abc import Iterator

import pytest

import prefetch

# A bound for every test here; none should come close.
pytestmark = pytest.mark.timeout(20)

# The producer re-checks its stop flag every 0.1 s, so "promptly" means well within this.
# Generous on purpose (30 polls), for a machine busy with other work; still below close()'s
# CLOSE_TIMEOUT_S (5 s), so a producer that ignored the stop and made close() wait it out fails.
PROMPT_S = 3.0

# How long a wait for something that must happen may take before the test calls it a hang:
# generous, so that a machine busy with other work never trips it.
HANG_S = 10.0

# The name the producer thread is given (see prefetch/background.py).
THREAD_NAME = "prefetch-background"


class ProducerError(Exception):
    """Raised inside a producer, so that tests can check the type survives the thread hop."""


def _producer_threads() -> list[threading.Thread]:
    """The live background producer threads."""
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def _wait_for_no_producer_threads(timeout_s: float = PROMPT_S) -> bool:
    """Wait until no background producer thread is alive; True if that happened in time."""
    deadline = time.monotonic() + timeout_s
    while _producer_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _count_forever(finished: threading.Event) -> Iterator[int]:
    """0, 1, 2, ... without end; sets `finished` when the generator is closed."""
    try:
        i = 0
        while True:
            yield i
            i += 1
    finally:
        finished.set()


def _three_then_fail() -> Iterator[int]:
    """Yield 0, 1, 2, then raise a ProducerError from this very frame."""
    yield 0
    yield 1
    yield 2
    raise ProducerError("producer failed after three items")


def test_items_from_a_range_come_out_in_order_and_complete() -> None:
    assert list(prefetch.background(range(1000))) == list(range(1000))


def test_items_from_a_generator_come_out_in_order_and_complete() -> None:
    def squares() -> Iterator[int]:
        for i in range(500):
            yield i * i

    assert list(prefetch.background(squares(), depth=5)) == [i * i for i in range(500)]


def test_an_empty_iterable_ends_at_once() -> None:
    assert list(prefetch.background([])) == []


def test_none_items_pass_through_and_do_not_end_the_stream() -> None:
    assert list(prefetch.background([None, 0, None, ""])) == [None, 0, None, ""]


def test_the_iterator_keeps_raising_stop_iteration_once_exhausted() -> None:
    items = prefetch.background(range(3))
    assert list(items) == [0, 1, 2]
    with pytest.raises(StopIteration):
        next(items)


def test_a_producer_exception_reaches_the_consumer_with_its_type_and_traceback() -> None:
    received = []
    items = prefetch.background(_three_then_fail())
    with pytest.raises(ProducerError, match="after three items") as info:
        for item in items:
            received.append(item)

    assert received == [0, 1, 2], "items before the failure are delivered first"
    assert type(info.value) is ProducerError
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_three_then_fail" in frames, f"the producer's frame is missing from {frames}"
    assert _wait_for_no_producer_threads()


def test_breaking_out_of_a_for_loop_stops_the_producer_promptly() -> None:
    finished = threading.Event()
    for item in prefetch.background(_count_forever(finished)):
        if item == 3:
            break

    assert finished.wait(PROMPT_S), "the generator's finally did not run after break"
    assert _wait_for_no_producer_threads(), "the producer thread is still running after break"


def test_close_stops_the_producer_and_runs_the_generator_finally() -> None:
    finished = threading.Event()
    items = prefetch.background(_count_forever(finished))
    assert next(items) == 0

    started = time.monotonic()
    items.close()

    assert time.monotonic() - started < PROMPT_S
    assert finished.is_set(), "close() returned before the generator was closed"
    assert not _producer_threads()
    with pytest.raises(StopIteration):
        next(items)


def test_close_is_idempotent() -> None:
    finished = threading.Event()
    items = prefetch.background(_count_forever(finished))
    next(items)

    items.close()
    items.close()

    assert finished.is_set()
    with pytest.raises(StopIteration):
        next(items)


def test_close_after_exhaustion_is_harmless() -> None:
    items = prefetch.background(range(2))
    assert list(items) == [0, 1]
    items.close()
    assert not _producer_threads()


def test_leaving_a_with_block_stops_the_producer() -> None:
    finished = threading.Event()
    with prefetch.background(_count_forever(finished)) as items:
        assert [next(items) for _ in range(5)] == [0, 1, 2, 3, 4]

    assert finished.is_set(), "leaving the with block did not close the generator"
    assert not _producer_threads()


def test_leaving_a_with_block_by_an_exception_stops_the_producer() -> None:
    finished = threading.Event()
    with pytest.raises(KeyError), prefetch.background(_count_forever(finished)) as items:
        next(items)
        raise KeyError("consumer failed")

    assert finished.is_set()
    assert not _producer_threads()


def test_a_slow_consumer_keeps_the_producer_at_most_depth_items_ahead() -> None:
    # Slow by counts, not by time: holding item i, the consumer waits until the producer has
    # made item i + depth + 1 (it fills the queue, then blocks putting that one), so the queue
    # is full at every step however the threads are scheduled. HANG_S only bounds a producer
    # that never gets there.
    depth, count = 3, 30
    consumed = 0
    leads: list[int] = []
    changed = threading.Condition()

    def produce() -> Iterator[int]:
        for i in range(count):
            # Items 0 .. i-1 have left the generator; at most `depth` sit in the queue and one
            # may be in the consumer's hand, taken but not yet counted.
            with changed:
                leads.append(i - consumed)
                changed.notify_all()
            yield i

    with prefetch.background(produce(), depth=depth) as items:
        for item in items:
            consumed += 1
            assert item == consumed - 1
            wanted = min(item + depth + 2, count)  # items 0 .. item + depth + 1
            with changed:
                ahead = changed.wait_for(lambda n=wanted: len(leads) >= n, timeout=HANG_S)
            assert ahead, f"holding item {item}, the producer made only {len(leads)} items"

    assert consumed == 30
    assert max(leads) <= depth + 1, f"the producer ran {max(leads)} items ahead: {leads}"
    assert max(leads) >= depth, f"the producer never filled its queue: {leads}"


def test_a_dropped_iterator_leaves_no_thread() -> None:
    finished = threading.Event()
    items = prefetch.background(_count_forever(finished))
    assert next(items) == 0

    del items
    gc.collect()

    assert finished.wait(PROMPT_S), "dropping the iterator did not close the generator"
    assert _wait_for_no_producer_threads(), "dropping the iterator left the producer running"


@pytest.mark.parametrize("depth", [0, -1])
def test_depth_below_one_is_rejected_with_the_bad_value(depth: int) -> None:
    with pytest.raises(ValueError, match=f"depth must be >= 1, got {depth}"):
        prefetch.background(range(3), depth=depth)
    assert not _producer_threads(), "a rejected call must not start a thread"


def test_a_rejected_depth_leaves_no_error_for_the_garbage_collector(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unraisable: list[str] = []
    monkeypatch.setattr(
        sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    )
    with pytest.raises(ValueError, match="depth must be >= 1"):
        prefetch.background(range(3), depth=0)
    gc.collect()

    assert unraisable == []


def test_the_producer_runs_ahead_while_the_consumer_works() -> None:
    # Told by counts, not by time: while the consumer holds item i and has not asked for more,
    # the producer makes the next `depth` items. HANG_S only bounds a producer that never does.
    count, depth = 20, 2
    produced: list[int] = []
    changed = threading.Condition()
    received = []

    def produce() -> Iterator[int]:
        for i in range(count):
            with changed:
                produced.append(i)
                changed.notify_all()
            yield i

    for item in prefetch.background(produce(), depth=depth):
        wanted = min(item + 1 + depth, count)
        with changed:
            ran_ahead = changed.wait_for(lambda n=wanted: len(produced) >= n, timeout=HANG_S)
        assert ran_ahead, f"holding item {item}, the producer made only {len(produced)} items"
        received.append(item)

    assert received == list(range(count))
