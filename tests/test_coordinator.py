"""Tests for `prefetch.Coordinator`: tf.train.Coordinator semantics, without TensorFlow.

Every test uses real threads (and, where it says so, real spawned processes), keeps its waits
short, and ends every thread and process it starts, so the leak check in conftest.py passes.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.resource_tracker
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import TracebackType

import pytest

from prefetch import Coordinator

# `join()` without a stop re-checks its threads once a second, as tf.train.Coordinator does, so
# a join that waits for threads to end returns within about this long after the last one ends.
JOIN_POLL_S = 1.0

# A short grace period, so that tests of stragglers stay fast.
GRACE_S = 0.2

# How late a busy machine (other jobs on every core) may wake a waiting thread. The upper time
# bounds here allow this much on top of what they check: generous on purpose, they tell a wait
# that ends from one that runs to its full timeout (5 s) or never ends, not fast from slow.
LATE_S = 2.0

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _start(target: Callable[[], object], name: str) -> threading.Thread:
    """Start a daemon thread running `target`, named `name`."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _exc_info_of(error: BaseException) -> ExcInfo:
    """Raise `error` and return `sys.exc_info()` from inside the `except` block."""
    try:
        raise error
    except BaseException:
        info = sys.exc_info()
        assert info[0] is not None and info[1] is not None
        return (info[0], info[1], info[2])


def _fail_deep_inside() -> None:
    """Raise a ValueError, so that its traceback names this function."""
    raise ValueError("failed deep inside")


def _sleep_then_exit(seconds: float) -> None:
    """Process target (module level, so the spawn context can pickle it)."""
    time.sleep(seconds)


# --- should_stop and wait_for_stop --------------------------------------------------------------


def test_should_stop_is_false_until_a_stop_is_requested() -> None:
    coord = Coordinator()
    assert not coord.should_stop()
    coord.request_stop()
    assert coord.should_stop()


def test_wait_for_stop_returns_false_when_the_timeout_passes_without_a_stop() -> None:
    coord = Coordinator()
    start = time.monotonic()
    assert coord.wait_for_stop(0.1) is False
    assert time.monotonic() - start >= 0.09
    assert not coord.should_stop()


def test_wait_for_stop_returns_true_at_once_when_already_stopped() -> None:
    coord = Coordinator()
    coord.request_stop()
    start = time.monotonic()
    assert coord.wait_for_stop(5.0) is True
    assert time.monotonic() - start < LATE_S


def test_wait_for_stop_returns_true_once_another_thread_requests_a_stop() -> None:
    coord = Coordinator()

    def stop_soon() -> None:
        time.sleep(0.1)
        coord.request_stop()

    stopper = _start(stop_soon, "stopper")
    start = time.monotonic()
    assert coord.wait_for_stop(5.0) is True
    assert time.monotonic() - start < 0.1 + LATE_S
    stopper.join()


# --- request_stop and the first error -----------------------------------------------------------


def test_request_stop_accepts_an_exception_object_and_join_reraises_that_same_object() -> None:
    coord = Coordinator()
    error = ValueError("bad sample")
    coord.request_stop(error)
    assert coord.should_stop()
    with pytest.raises(ValueError) as info:
        coord.join([])
    assert info.value is error


def test_request_stop_accepts_an_exc_info_tuple_from_inside_an_except_block() -> None:
    coord = Coordinator()
    error = KeyError("missing label")
    try:
        raise error
    except KeyError:
        coord.request_stop(sys.exc_info())  # type: ignore[arg-type]
    with pytest.raises(KeyError) as info:
        coord.join([])
    assert info.value is error


def test_request_stop_accepts_the_ex_keyword_as_in_tensorflow() -> None:
    coord = Coordinator()
    error = OSError("disk gone")
    coord.request_stop(ex=_exc_info_of(error))
    with pytest.raises(OSError) as info:
        coord.join([])
    assert info.value is error


def test_first_error_wins_and_later_ones_are_ignored() -> None:
    coord = Coordinator()
    first = ValueError("first")
    coord.request_stop(first)
    coord.request_stop(KeyError("second"))
    coord.request_stop(_exc_info_of(RuntimeError("third")))
    with pytest.raises(ValueError) as info:
        coord.join([])
    assert info.value is first


def test_an_error_reported_after_a_clean_stop_is_ignored_as_in_tensorflow() -> None:
    coord = Coordinator()
    coord.request_stop()
    coord.request_stop(ValueError("too late: the group is already stopping"))
    coord.join([])
    coord.raise_requested_exception()


def test_exactly_one_error_wins_when_many_threads_report_at_once() -> None:
    coord = Coordinator()
    errors = [ValueError(f"worker {i}") for i in range(8)]
    barrier = threading.Barrier(len(errors))

    def report(error: BaseException) -> None:
        barrier.wait()
        coord.request_stop(error)

    threads = [
        _start(lambda error=error: report(error), f"reporter-{i}") for i, error in enumerate(errors)
    ]
    for thread in threads:
        thread.join()
    with pytest.raises(ValueError) as info:
        coord.join(threads)
    assert any(info.value is error for error in errors)
    with pytest.raises(ValueError) as again:
        coord.raise_requested_exception()
    assert again.value is info.value


@pytest.mark.parametrize(
    ("ex", "expected"),
    [
        ("not an exception", TypeError),
        (ValueError, TypeError),
        ((ValueError, "not an exception", None), ValueError),
        ((ValueError,), ValueError),
    ],
    ids=["string", "exception-class", "tuple-without-exception", "short-tuple"],
)
def test_request_stop_rejects_what_is_neither_an_exception_nor_an_exc_info_tuple(
    ex: object, expected: type[Exception]
) -> None:
    coord = Coordinator()
    with pytest.raises(expected, match="exc_info tuple"):
        coord.request_stop(ex)  # type: ignore[arg-type]
    assert not coord.should_stop()


# --- exceptions made or passed outside an except block ------------------------------------------


def test_an_exception_created_and_passed_outside_any_except_block_is_reported() -> None:
    coord = Coordinator()
    error = ValueError("made here, never raised")
    assert error.__traceback__ is None
    coord.request_stop(error)
    with pytest.raises(ValueError) as info:
        coord.join([])
    assert info.value is error


def test_an_exception_passed_after_its_except_block_keeps_its_traceback() -> None:
    coord = Coordinator()
    try:
        _fail_deep_inside()
    except ValueError as error:
        caught = error
    assert caught.__traceback__ is not None
    coord.request_stop(caught)  # outside the except block: sys.exc_info() is empty here
    with pytest.raises(ValueError) as info:
        coord.join([])
    assert info.value is caught
    frames = [frame.name for frame in traceback.extract_tb(info.value.__traceback__)]
    assert "_fail_deep_inside" in frames


# --- register_thread and join -------------------------------------------------------------------


def test_join_waits_for_registered_and_given_threads() -> None:
    coord = Coordinator()
    registered = _start(lambda: time.sleep(0.2), "registered-worker")
    given = _start(lambda: time.sleep(0.4), "given-worker")
    coord.register_thread(registered)
    coord.join([given])
    assert not registered.is_alive()
    assert not given.is_alive()
    assert coord.joined


def test_join_returns_when_all_threads_end_without_a_stop_request() -> None:
    coord = Coordinator()
    threads = [_start(lambda: time.sleep(0.1), f"short-worker-{i}") for i in range(3)]
    start = time.monotonic()
    coord.join(threads, stop_grace_period_secs=GRACE_S)
    assert time.monotonic() - start < JOIN_POLL_S + LATE_S
    assert not any(thread.is_alive() for thread in threads)
    assert not coord.should_stop()


def test_join_after_a_stop_waits_within_the_grace_period_for_threads_that_end() -> None:
    coord = Coordinator()
    worker = _start(lambda: (coord.wait_for_stop(5.0), time.sleep(0.1)), "slow-to-stop")
    coord.request_stop()
    # Generous on purpose (100 times the thread's 0.1 s): join returns as soon as the thread
    # ends, so only a machine too busy to run it for seconds would reach the end of the grace.
    coord.join([worker], stop_grace_period_secs=10.0)
    assert not worker.is_alive()


def test_join_after_a_stop_raises_runtime_error_naming_the_threads_still_running() -> None:
    coord = Coordinator()
    release = threading.Event()
    stuck = _start(release.wait, "stuck-reader")
    finished = _start(lambda: None, "finished-writer")
    try:
        coord.request_stop()
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="stuck-reader") as info:
            coord.join([stuck, finished], stop_grace_period_secs=GRACE_S)
        elapsed = time.monotonic() - start
        assert GRACE_S - 0.01 <= elapsed < GRACE_S + LATE_S
        assert "finished-writer" not in str(info.value)
        assert coord.joined
    finally:
        release.set()
        stuck.join()


def test_join_with_ignore_live_threads_does_not_raise_for_threads_still_running() -> None:
    coord = Coordinator()
    release = threading.Event()
    stuck = _start(release.wait, "stuck-reader")
    try:
        coord.register_thread(stuck)
        coord.request_stop()
        start = time.monotonic()
        coord.join(stop_grace_period_secs=GRACE_S, ignore_live_threads=True)
        assert GRACE_S - 0.01 <= time.monotonic() - start < GRACE_S + LATE_S
        assert stuck.is_alive()
    finally:
        release.set()
        stuck.join()


def test_join_reraises_the_reported_error_rather_than_complaining_about_live_threads() -> None:
    coord = Coordinator()
    release = threading.Event()
    stuck = _start(release.wait, "stuck-reader")
    error = ValueError("the real problem")
    try:
        coord.request_stop(error)
        with pytest.raises(ValueError) as info:
            coord.join([stuck], stop_grace_period_secs=GRACE_S)
        assert info.value is error
    finally:
        release.set()
        stuck.join()


# --- multiprocessing.Process --------------------------------------------------------------------


@pytest.fixture(scope="module")
def resource_tracker_running() -> Iterator[None]:
    """Start Python's resource tracker before the leak check looks at child processes.

    The first spawn-context process starts this stdlib helper process, which then lives as long
    as the interpreter; started here (module scope runs before the per-test leak check), it is
    not taken for a process that the test leaked.
    """
    multiprocessing.resource_tracker.ensure_running()
    yield


@pytest.mark.usefixtures("resource_tracker_running")
def test_join_waits_for_a_multiprocessing_process_to_end() -> None:
    process = multiprocessing.get_context("spawn").Process(
        target=_sleep_then_exit, args=(0.3,), name="sleeping-process", daemon=True
    )
    coord = Coordinator()
    process.start()
    try:
        coord.register_thread(process)
        coord.join(stop_grace_period_secs=GRACE_S)
        assert not process.is_alive()
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.terminate()
        process.join(timeout=5.0)


@pytest.mark.usefixtures("resource_tracker_running")
def test_join_names_a_process_still_running_after_the_grace_period() -> None:
    process = multiprocessing.get_context("spawn").Process(
        target=_sleep_then_exit, args=(30.0,), name="stuck-process", daemon=True
    )
    coord = Coordinator()
    process.start()
    try:
        coord.request_stop()
        with pytest.raises(RuntimeError, match="stuck-process"):
            coord.join([process], stop_grace_period_secs=GRACE_S)
        assert process.is_alive()
    finally:
        process.terminate()
        process.join(timeout=5.0)
    assert not process.is_alive()


# --- stop_on_exception --------------------------------------------------------------------------


def test_stop_on_exception_reports_the_exception_and_swallows_it() -> None:
    coord = Coordinator()
    error = ValueError("decode failed")
    with coord.stop_on_exception():
        raise error
    assert coord.should_stop()
    with pytest.raises(ValueError) as info:
        coord.join([])
    assert info.value is error


def test_stop_on_exception_reports_an_error_raised_in_a_worker_thread() -> None:
    coord = Coordinator()
    error = OSError("read failed")

    def worker() -> None:
        with coord.stop_on_exception():
            raise error

    thread = _start(worker, "failing-worker")
    thread.join()
    with pytest.raises(OSError) as info:
        coord.join([thread])
    assert info.value is error


def test_stop_on_exception_does_nothing_when_the_body_succeeds() -> None:
    coord = Coordinator()
    with coord.stop_on_exception():
        pass
    assert not coord.should_stop()


def test_stop_on_exception_treats_stop_iteration_as_a_clean_stop() -> None:
    coord = Coordinator()
    with coord.stop_on_exception():
        raise StopIteration
    assert coord.should_stop()
    coord.join([])


# --- clear_stop, joined and raise_requested_exception -------------------------------------------


def test_clear_stop_clears_the_stop_flag_and_the_stored_exception() -> None:
    coord = Coordinator()
    coord.request_stop(ValueError("old error"))
    coord.clear_stop()
    assert not coord.should_stop()
    coord.raise_requested_exception()
    new_error = KeyError("new error")
    coord.request_stop(new_error)
    with pytest.raises(KeyError) as info:
        coord.raise_requested_exception()
    assert info.value is new_error


def test_joined_is_true_after_join_and_false_after_clear_stop() -> None:
    coord = Coordinator()
    assert not coord.joined
    coord.join([])
    assert coord.joined
    coord.clear_stop()
    assert not coord.joined


def test_joined_is_true_even_when_join_raises() -> None:
    coord = Coordinator()
    coord.request_stop(ValueError("reported"))
    with pytest.raises(ValueError):
        coord.join([])
    assert coord.joined


def test_raise_requested_exception_raises_the_stored_exception() -> None:
    coord = Coordinator()
    error = ValueError("stored")
    coord.request_stop(_exc_info_of(error))
    with pytest.raises(ValueError) as info:
        coord.raise_requested_exception()
    assert info.value is error


def test_raise_requested_exception_does_nothing_when_there_is_none() -> None:
    coord = Coordinator()
    coord.raise_requested_exception()
    coord.request_stop()
    coord.raise_requested_exception()
    coord.request_stop(StopIteration())
    coord.raise_requested_exception()


# --- request_stop after join --------------------------------------------------------------------


@pytest.mark.parametrize("as_exc_info", [False, True], ids=["exception", "exc_info"])
def test_request_stop_with_an_exception_after_join_raises_it_at_once(as_exc_info: bool) -> None:
    coord = Coordinator()
    coord.join([])
    error = ValueError("reported after join")
    with pytest.raises(ValueError) as info:
        coord.request_stop(_exc_info_of(error) if as_exc_info else error)
    assert info.value is error


def test_request_stop_without_an_exception_after_join_does_not_raise() -> None:
    coord = Coordinator()
    coord.join([])
    coord.request_stop()
    assert coord.should_stop()


def test_request_stop_with_a_clean_stop_exception_after_join_does_not_raise() -> None:
    coord = Coordinator()
    coord.join([])
    coord.request_stop(StopIteration())
    assert coord.should_stop()


# --- clean_stop_exception_types -----------------------------------------------------------------


def test_stop_iteration_is_a_clean_stop_by_default() -> None:
    coord = Coordinator()
    assert StopIteration in coord.clean_stop_exception_types
    coord.request_stop(StopIteration())
    assert coord.should_stop()
    coord.join([])
    coord.raise_requested_exception()


def test_a_clean_stop_exception_passed_as_exc_info_is_a_clean_stop_too() -> None:
    coord = Coordinator()
    coord.request_stop(_exc_info_of(StopIteration()))
    coord.request_stop(StopIteration())
    coord.join([])


def test_default_clean_stop_types_are_only_stop_iteration_without_tensorflow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    assert Coordinator().clean_stop_exception_types == (StopIteration,)


def test_custom_clean_stop_exception_types_replace_the_defaults() -> None:
    coord = Coordinator(clean_stop_exception_types=[KeyError])
    assert coord.clean_stop_exception_types == (KeyError,)
    coord.request_stop(KeyError("end of the table"))
    coord.join([])
    coord.clear_stop()
    error = StopIteration()
    coord.request_stop(error)
    with pytest.raises(StopIteration) as info:
        coord.join([])
    assert info.value is error


def test_subclasses_of_a_clean_stop_type_are_clean_stops_too() -> None:
    coord = Coordinator(clean_stop_exception_types=(LookupError,))
    coord.request_stop(IndexError("past the end"))
    coord.join([])


@pytest.mark.tf
def test_tensorflow_out_of_range_error_is_a_clean_stop_once_tensorflow_is_imported() -> None:
    tf = pytest.importorskip("tensorflow")
    coord = Coordinator()
    assert StopIteration in coord.clean_stop_exception_types
    assert tf.errors.OutOfRangeError in coord.clean_stop_exception_types
    coord.request_stop(tf.errors.OutOfRangeError(None, None, "end of sequence"))
    assert coord.should_stop()
    coord.join([])


# --- the Coordinator as a context manager -------------------------------------------------------


def test_with_block_requests_a_stop_and_joins_registered_threads_on_exit() -> None:
    def loop_until_stopped(coord: Coordinator) -> None:
        while not coord.should_stop():
            time.sleep(0.005)

    with Coordinator() as coord:
        workers = [_start(lambda: loop_until_stopped(coord), f"looper-{i}") for i in range(3)]
        for worker in workers:
            coord.register_thread(worker)
        assert not coord.should_stop()
    assert coord.should_stop()
    assert coord.joined
    assert not any(worker.is_alive() for worker in workers)


def test_with_block_reraises_at_exit_an_error_reported_by_a_thread() -> None:
    error = ValueError("from a worker thread")

    def fail(coord: Coordinator) -> None:
        with coord.stop_on_exception():
            raise error

    with pytest.raises(ValueError) as info, Coordinator() as coord:
        coord.register_thread(_start(lambda: fail(coord), "failing-worker"))
        assert coord.wait_for_stop(5.0)
    assert info.value is error


def test_with_block_lets_an_exception_from_the_body_propagate_unchanged() -> None:
    body_error = KeyError("from the body")
    with pytest.raises(KeyError) as info, Coordinator() as coord:
        worker = _start(lambda: coord.wait_for_stop(5.0), "waits-for-stop")
        coord.register_thread(worker)
        raise body_error
    assert info.value is body_error
    assert info.value.__context__ is None
    assert not worker.is_alive()


def test_with_block_lets_the_body_exception_propagate_even_after_a_thread_reported_one() -> None:
    thread_error = ValueError("from a worker thread, first")
    body_error = KeyError("from the body, second")

    def fail(coord: Coordinator) -> None:
        with coord.stop_on_exception():
            raise thread_error

    with pytest.raises(KeyError) as info, Coordinator() as coord:
        worker = _start(lambda: fail(coord), "failing-worker")
        coord.register_thread(worker)
        assert coord.wait_for_stop(5.0)
        raise body_error
    assert info.value is body_error
    assert "from a worker thread, first" in "\n".join(getattr(body_error, "__notes__", []))


# --- the TensorFlow worker-loop pattern ---------------------------------------------------------


def test_worker_loop_stops_every_thread_when_one_raises_and_join_reraises_its_error() -> None:
    coord = Coordinator()
    error = RuntimeError("worker-2 failed at step 5")
    steps = [0] * 4

    def work(index: int) -> None:
        with coord.stop_on_exception():
            while not coord.should_stop():
                steps[index] += 1
                if index == 2 and steps[index] == 5:
                    raise error
                time.sleep(0.002)

    threads = [
        threading.Thread(target=work, args=(i,), name=f"worker-{i}", daemon=True) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        coord.join(threads, stop_grace_period_secs=5.0)
    assert info.value is error
    assert time.monotonic() - start < LATE_S  # the threads stopped: no wait for the grace
    assert not any(thread.is_alive() for thread in threads)
    assert steps[2] == 5
