"""workers="auto": the tuner's decisions, and a loader that changes its worker count mid-epoch."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch.runtime._autoscale import (
    IO_PROCESSES_PER_CORE,
    MAX_IO_WORKERS,
    SPAN_BATCHES,
    SPAN_S,
    WorkerTuner,
    connection_cap,
    tuner_for,
    usable_cores,
)
from prefetch.testing import (
    SlowDecoder,
    assert_same_batches,
    worker_processes,
    write_image_folder,
)

SMALL = (16, 16)


class Clock:
    """A clock the test moves by hand, so that windows close exactly when intended."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_window(tuner: WorkerTuner, clock: Clock, waited: float, ready: int, blocked: float):
    """Feed one full window of batches; returns what the tuner decided at its end."""
    decision = None
    for _ in range(SPAN_BATCHES):
        clock.now += SPAN_S / SPAN_BATCHES
        decision = tuner.observe(waited * SPAN_S / SPAN_BATCHES, ready, 0.1, 0.1 * blocked)
    return decision


def make_tuner(idle: float | None, clock: Clock, maximum: int = 8, start: int = 2) -> WorkerTuner:
    return WorkerTuner(
        start=start,
        maximum=maximum,
        depth=2,
        worker_bytes=10,
        budget_bytes=1000,
        idle_cores=lambda: idle,
        clock=clock,
    )


def test_an_input_bound_consumer_with_idle_cores_gets_one_more_worker_per_window() -> None:
    clock = Clock()
    tuner = make_tuner(idle=1.0, clock=clock)
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) == 3
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) is None  # settling
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) == 4
    assert [(d.before, d.after) for d in tuner.decisions] == [(2, 3), (3, 4)]
    assert "waited 50%" in tuner.decisions[0].reason


def test_no_worker_is_added_when_the_cpu_is_saturated_by_decoding() -> None:
    clock = Clock()
    tuner = make_tuner(idle=0.0, clock=clock)
    for _ in range(4):
        assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) is None
    assert tuner.decisions == []


def test_workers_blocked_on_io_get_company_even_on_a_busy_cpu() -> None:
    clock = Clock()
    tuner = make_tuner(idle=0.0, clock=clock)
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.9) == 3
    assert "blocked 90%" in tuner.decisions[0].reason


def test_workers_far_ahead_of_the_consumer_shrink_after_two_calm_spans() -> None:
    clock = Clock()
    tuner = make_tuner(idle=1.0, clock=clock, start=3)
    assert run_window(tuner, clock, waited=0.0, ready=2, blocked=0.0) is None
    assert run_window(tuner, clock, waited=0.0, ready=2, blocked=0.0) == 2
    assert "never waited" in tuner.decisions[0].reason


def test_the_memory_budget_caps_the_worker_count() -> None:
    clock = Clock()
    tuner = WorkerTuner(2, 8, 2, worker_bytes=400, budget_bytes=1000, idle_cores=lambda: 2.0)
    assert tuner.maximum == 2
    tuner = make_tuner(idle=1.0, clock=clock, maximum=3)
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) == 3
    run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0)
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.0) is None


def io_window(tuner: WorkerTuner, clock: Clock, batches: int, blocked: float = 0.9) -> int | None:
    """One span of `batches` batches in SPAN_S, the consumer waiting half of it and the
    workers blocked `blocked` of their busy time: storage-bound. Returns the tuner's decision."""
    decisions = []
    for _ in range(batches):
        clock.now += SPAN_S / batches + 1e-9  # the span closes at its last batch, not after
        decisions.append(tuner.observe(0.5 * SPAN_S / batches, 0, 0.1, 0.1 * blocked))
    return next((d for d in decisions if d is not None), None)


def make_io_tuner(clock: Clock, idle: float | None = 1.0, io_maximum: int = 64) -> WorkerTuner:
    return WorkerTuner(
        start=2,
        maximum=4,
        depth=2,
        worker_bytes=10,
        budget_bytes=10_000,
        idle_cores=lambda: idle,
        clock=clock,
        io_maximum=io_maximum,
        cores=2,
    )


def test_workers_blocked_on_io_step_towards_the_idle_cores_while_throughput_rises() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock)
    # each of 2 workers uses 10% of a core and 1 core is idle: 2 + 1 / 0.1 = 12 workers
    assert io_window(tuner, clock, batches=4) == 12  # no settling window after an I/O step
    assert io_window(tuner, clock, batches=8) == 24  # the rate doubled: at least x2 again
    assert io_window(tuner, clock, batches=16) == 48
    assert [(d.before, d.after) for d in tuner.decisions] == [(2, 12), (12, 24), (24, 48)]
    assert "I/O-bound, x6.0 towards 1.0 idle cores" in tuner.decisions[0].reason
    assert "blocked 90%" in tuner.decisions[0].reason
    assert tuner.workers > tuner.maximum  # past the CPU-bound cap of 2 x cores


def test_one_io_step_is_at_most_eightfold_and_unknown_idle_means_all_cores() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock, idle=None)
    assert io_window(tuner, clock, batches=4, blocked=0.99) == 16  # 2 + 2 / 0.01, capped x8
    assert "towards 2.0 idle cores" in tuner.decisions[0].reason


def test_io_growth_steps_back_when_a_step_did_not_raise_throughput_by_a_tenth() -> None:
    for batches, gain in ((8, "0%"), (4, "-50%")):  # the same rate; half of it
        clock = Clock()
        tuner = make_io_tuner(clock)
        assert io_window(tuner, clock, batches=8) == 12
        assert io_window(tuner, clock, batches=batches) == 2  # back to where it was
        back = tuner.decisions[-1]
        assert (back.before, back.after) == (12, 2)
        assert back.reason.startswith("stepping back: 2 -> 12 workers changed the rate ")
        assert f"{gain} (8.0 -> " in back.reason
        assert str(back).startswith(f"batch {8 + batches}: 12 -> 2 workers (stepping back")
        for _ in range(3):  # and never past 2 again for I/O
            assert io_window(tuner, clock, batches=8) is None
        assert tuner.workers == 2 and len(tuner.decisions) == 2


def test_io_growth_stops_at_its_cap_and_the_memory_budget() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock, io_maximum=6)
    assert io_window(tuner, clock, batches=4) == 6
    assert "x3.0 towards" in tuner.decisions[0].reason  # the step taken, not the one aimed at
    assert io_window(tuner, clock, batches=12) is None
    tuner = WorkerTuner(2, 4, 2, worker_bytes=100, budget_bytes=1000, io_maximum=64)
    assert (tuner.maximum, tuner.io_maximum) == (4, 10)
    threads = tuner_for(process=False, workers=2, depth=2, ring_bytes=0, memory_budget=2**40)
    processes = tuner_for(process=True, workers=2, depth=3, ring_bytes=0, memory_budget=2**40)
    assert threads.io_maximum == connection_cap()
    # every process reads its share of every batch, so processes waiting on storage may grow
    # past `depth` too, to IO_PROCESSES_PER_CORE per core
    assert processes.io_maximum == max(3, IO_PROCESSES_PER_CORE * usable_cores())
    assert processes.maximum == usable_cores()  # CPU-bound processes: one per core


def test_no_window_is_judged_while_new_workers_are_starting() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock, io_maximum=8)
    for _ in range(4):  # processes still importing: a slow, busy window is not judged
        clock.now += SPAN_S / 4
        assert tuner.observe(0.5 * SPAN_S / 4, 0, 0.1, 0.09, starting=True) is None
    assert io_window(tuner, clock, batches=4) == 8
    for _ in range(2):  # the 6 new ones starting: a window at a quarter of the rate ...
        clock.now += 1.0
        assert tuner.observe(0.5, 0, 0.1, 0.09, starting=True) is None  # ... is no step back
    assert io_window(tuner, clock, batches=8) is None  # judged once they run: x2, kept
    assert [(d.before, d.after) for d in tuner.decisions] == [(2, 8)]


def test_processes_may_grow_past_depth_for_io() -> None:
    def processes(readers: int) -> WorkerTuner:
        return tuner_for(
            process=True,
            workers=2,
            depth=3,
            ring_bytes=0,
            memory_budget=2**40,
            readers_per_worker=readers,
        )

    # every process reads its share of every batch: depth no longer caps how many are busy
    assert processes(1).io_maximum == max(3, IO_PROCESSES_PER_CORE * usable_cores())
    assert processes(32).io_maximum == max(3, IO_PROCESSES_PER_CORE * usable_cores())
    assert processes(32).maximum == usable_cores()  # CPU-bound growth stops at the cores
    clock = Clock()
    tuner = WorkerTuner(2, 4, 2, 10, 10_000, idle_cores=lambda: 1.0, clock=clock, max_io_step=2)
    tuner.io_maximum = tuner._io_ceiling = 64
    assert io_window(tuner, clock, batches=4) == 4  # costly processes: x2, not towards 12


def test_a_low_open_file_limit_caps_the_reads_in_flight() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(100, hard), hard))
        assert connection_cap() == min(100, hard) // 4
        threads = tuner_for(process=False, workers=2, depth=2, ring_bytes=0, memory_budget=2**40)
        assert threads.io_maximum == connection_cap()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert connection_cap() <= MAX_IO_WORKERS


def test_blocked_workers_on_a_busy_cpu_grow_by_half_while_throughput_rises() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock, idle=0.0)
    assert io_window(tuner, clock, batches=4) == 3
    assert io_window(tuner, clock, batches=6) == 4  # measured at once: no settling window
    assert io_window(tuner, clock, batches=8) == 6
    assert "x1.5 on a busy CPU" in tuner.decisions[-1].reason
    assert io_window(tuner, clock, batches=8) == 4  # 6 gave nothing over 4: back to 4
    assert io_window(tuner, clock, batches=8) is None
    assert tuner.workers == 4


def test_slow_batches_close_a_window_after_two_batches_and_two_seconds() -> None:
    clock = Clock()
    tuner = make_io_tuner(clock)
    clock.now += 1.4
    assert tuner.observe(1.4, 0, 1.4, 1.3) is None
    clock.now += 1.4
    assert tuner.observe(1.4, 0, 1.4, 1.3) == 16  # blocked 93%: 2 + 1 / 0.07, capped x8


def test_cpu_bound_growth_is_still_one_worker_per_window() -> None:
    clock = Clock()
    tuner = make_tuner(idle=1.0, clock=clock)
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.3) == 3
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.3) is None
    assert run_window(tuner, clock, waited=0.5, ready=0, blocked=0.3) == 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("autotune"), per_class=40, size=(24, 24))


# How long the loader below may take to make its first worker decision. Generous on purpose:
# the tuner judges spans of real time (at least SPAN_S and SPAN_BATCHES batches, none
# while spawned workers are still starting), so on a busy machine its first judged window can
# come many epochs in. On a quiet 2-core machine it decides within the first epoch (threads)
# or two (processes), and the test goes on only until it has.
GROWTH_DEADLINE_S = 60.0


# The deadline above, one epoch after the first decision, and the expected epochs.
@pytest.mark.timeout(GROWTH_DEADLINE_S + 60)
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_auto_workers_grow_for_a_slow_io_bound_decoder_and_lose_nothing(
    folder: Path, backend: str
) -> None:
    loader = prefetch.Loader(
        folder,
        batch_size=4,
        image_size=SMALL,
        workers="auto",
        depth=4,
        backend=backend,
        decoder=SlowDecoder(0.02),
        seed=5,
    )
    started = loader.workers
    batches, epochs = [], 0
    deadline = time.monotonic() + GROWTH_DEADLINE_S
    with loader:
        # Whole epochs until the tuner's first decision, then one more on the count it chose.
        while not (loader._epochs.workers.tuner and loader._epochs.workers.tuner.decisions):
            assert time.monotonic() < deadline, (
                f"the tuner decided nothing in {GROWTH_DEADLINE_S:.0f} s ({epochs} epochs)"
            )
            batches += [(b.images.copy(), b.labels.copy()) for b in loader]
            epochs += 1
        batches += [(b.images.copy(), b.labels.copy()) for b in loader]
        epochs += 1
    tuner = loader._epochs.workers.tuner
    assert tuner is not None
    # Decided on the first decision, not on the final count: after an I/O step that did not
    # raise the measured rate by a tenth (as on a busy machine) the tuner steps back, as it should.
    first = tuner.decisions[0]
    assert first.before == started and first.after > started, (
        f"an input-bound loader whose workers sleep should grow first: {first}"
    )
    assert loader.stats().worker_decisions == tuple(map(str, tuner.decisions))
    assert loader.stats().workers == tuner.workers
    expected = prefetch.Loader(folder, batch_size=4, image_size=SMALL, seed=5)
    want = [(b.images.copy(), b.labels.copy()) for _ in range(epochs) for b in expected]
    assert_same_batches(batches, want)


def test_retired_worker_processes_finish_their_batches_and_leave(folder: Path) -> None:
    loader = prefetch.Loader(
        folder, batch_size=4, image_size=SMALL, workers=3, depth=3, backend="process", seed=6
    )
    with loader:
        batches = []
        for i, batch in enumerate(loader):
            batches.append((batch.images.copy(), batch.labels.copy()))
            if i == 2:
                assert loader._epochs.workers.backend is not None
                loader._epochs.workers.backend.set_workers(1)
        # Generous on purpose: the two retired processes finish their batch and exit within a
        # second on a quiet machine; this only tells "they leave" from "they stay".
        deadline = time.monotonic() + 30
        while len(worker_processes()) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(worker_processes()) == 1
        batches += [(b.images.copy(), b.labels.copy()) for b in loader]
    expected = prefetch.Loader(folder, batch_size=4, image_size=SMALL, seed=6)
    want = [(b.images.copy(), b.labels.copy()) for _ in range(2) for b in expected]
    assert_same_batches(batches, want)
    assert np.concatenate([b[1] for b in batches]).size == 2 * 120


def test_workers_must_be_a_positive_int_or_auto(folder: Path) -> None:
    with pytest.raises(ValueError, match="or 'auto'"):
        prefetch.Loader(folder, workers="many")
