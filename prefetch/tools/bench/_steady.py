"""One row of `prefetch bench`, measured as a training job runs it.

A job builds its pipeline once and iterates it for hours: tf.data with `.repeat()` and one
iterator, one open `prefetch.Loader`. So a row here is one long-lived pipeline (the contender's
`stream()`, crossing epoch boundaries as a job does), a warm-up that is not timed (AUTOTUNE's
ramp, the shuffle buffer, the window filling, the page cache), then a timed span of images
(`Span`). By default each row runs in a fresh spawned process (`measure_row`), so that no row
inherits another's threads, TensorFlow runtime or memory, and a row that fails says so in one
line (`RowFailed`) instead of ending the run. `measure_rounds` runs rows round after round,
their order reversed every other round (`alternated`), and `median_range` prints a row's rounds.
A benchmark script measures its own rows with the same machinery by passing `measure_row` its
own `make(key, setup)` (a module-level function of the script, so that the spawned row can
unpickle it).

The warm-up's rate, counted from the pipeline's construction (by default its first epoch), is
kept as the row's "cold start": what a short job, or one that rebuilds its pipeline every
epoch (an evaluation pass, a notebook), pays; a long training job does not.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue as queue_module
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prefetch.tools.bench._loaders import Contender, Setup, make_contender

# Default span: one epoch of warm-up, then three timed, for folders up to this many images;
# a larger folder is measured on this many warm-up images and three times as many timed ones
# (the timed span then need not cross an epoch boundary: a job on a large dataset rarely does).
SPAN_EPOCH_CAP = 2000
TIMED_EPOCHS = 3
# Seconds a spawned row may stay silent (no batch) before it is taken for hung.
ROW_SILENCE_S = 600.0


@dataclass(frozen=True)
class Span:
    """Images per row: `warmup` untimed (the first epoch's rate is the cold start), then
    `timed` timed, both rounded up to whole batches."""

    warmup: int
    timed: int

    @staticmethod
    def default(images: int) -> Span:
        """One warm-up epoch and `TIMED_EPOCHS` timed ones (capped at `SPAN_EPOCH_CAP` images
        per epoch's worth)."""
        epoch = min(images, SPAN_EPOCH_CAP)
        return Span(epoch, TIMED_EPOCHS * epoch)


@dataclass(frozen=True)
class RowResult:
    """One row in one round: images/s over the timed span; the share of the consumer's time
    spent waiting for a batch (None without a step: a consumer that only takes batches always
    waits); the cold start (images/s over the warm-up, counted from the pipeline's
    construction: by default its first epoch); and the contender's `describe()`."""

    images_per_s: float
    wait_fraction: float | None
    cold_images_per_s: float
    described: dict[str, Any]


class RowFailed(RuntimeError):
    """A row could not be measured (its message is one line: the error and where)."""


MakeContender = Callable[[str, Setup], Contender]
"""`make(key, setup)`: the contender of row `key` (`prefetch bench`'s: `make_contender`)."""


def measure_stream(
    key: str,
    setup: Setup,
    span: Span,
    step_s: float,
    tick: Callable[[], None],
    make: MakeContender = make_contender,
) -> RowResult:
    """Open contender `make(key, setup)` once, take `span.warmup` images untimed, then time
    `span.timed`; the consumer sleeps `step_s` after each batch (a simulated training step)."""
    contender = make(key, setup)
    with contextlib.ExitStack() as stack:
        began = time.perf_counter()
        contender.open(stack)
        stream = stack.enter_context(contextlib.closing(contender.stream()))
        rate, wait, cold = steady_rate(stream, span, began, step_s, tick)
        described = contender.describe()
    return RowResult(rate, wait, cold, described)


def steady_rate(
    stream: Iterator[int],
    span: Span,
    began: float,
    step_s: float = 0.0,
    tick: Callable[[], None] = lambda: None,
) -> tuple[float, float | None, float]:
    """(images/s over the timed span, wait fraction or None without a step, cold start) of a
    `stream` of batch sizes that was started at `time.perf_counter()` `began`: `span.warmup`
    images untimed (their rate from `began` is the cold start), then `span.timed` timed."""
    taken = 0
    while taken < span.warmup:
        taken += next(stream)
        _step(step_s)
        tick()
    cold = taken / (time.perf_counter() - began)
    images, waited = 0, 0.0
    started = time.perf_counter()
    while images < span.timed:
        asked = time.perf_counter()
        count = next(stream)
        waited += time.perf_counter() - asked
        images += count
        _step(step_s)
        tick()
    elapsed = time.perf_counter() - started
    return images / elapsed, (waited / elapsed if step_s > 0 else None), cold


def _step(step_s: float) -> None:
    if step_s > 0:
        time.sleep(step_s)


def measure_row(
    key: str,
    setup: Setup,
    span: Span,
    step_s: float,
    tick: Callable[[], None],
    *,
    isolate: bool = True,
    make: MakeContender = make_contender,
) -> RowResult:
    """`measure_stream`, in a fresh spawned process when `isolate` (`tick` is still called
    here, once per batch). Raises `RowFailed` with a one-line reason when the row fails.
    `make` must be picklable when `isolate`: a module-level function (a script's own, under
    its `if __name__ == "__main__":` guard, is: the spawned process imports the script)."""
    if not isolate:
        try:
            return measure_stream(key, setup, span, step_s, tick, make)
        except Exception as error:
            raise RowFailed(_one_line(error)) from error
    context = multiprocessing.get_context("spawn")
    messages: Any = context.Queue()
    child = context.Process(
        target=_child,
        args=(key, setup, span, step_s, messages, make),
        name=f"prefetch-bench-{key}",
    )
    child.start()
    try:
        silent_since = time.monotonic()
        while True:
            try:
                kind, value = messages.get(timeout=0.5)
            except queue_module.Empty:
                if not child.is_alive():
                    raise RowFailed(f"its process exited with code {child.exitcode}") from None
                if time.monotonic() - silent_since > ROW_SILENCE_S:
                    raise RowFailed(f"no batch for {ROW_SILENCE_S:.0f} s") from None
                continue
            silent_since = time.monotonic()
            if kind == "tick":
                tick()
            elif kind == "done":
                result: RowResult = value
                return result
            else:
                raise RowFailed(str(value))
    finally:
        end_children([child], messages)


def end_children(children: Sequence[Any], messages: Any) -> None:
    """Join each of `children` (multiprocessing processes that were told to end, or whose work
    ended), terminating one still alive after 10 s, then close their `messages` queue."""
    for child in children:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()
            child.join(timeout=10)
    messages.close()
    messages.join_thread()


def _child(
    key: str, setup: Setup, span: Span, step_s: float, messages: Any, make: MakeContender
) -> None:
    """A spawned row: measure, send a tick per batch, then ("done", result) or ("error", why)."""
    try:
        result = measure_stream(
            key, setup, span, step_s, lambda: messages.put(("tick", None)), make
        )
    except Exception as error:
        messages.put(("error", _one_line(error)))
    else:
        messages.put(("done", result))
    finally:
        messages.close()
        messages.join_thread()


def alternated(keys: Sequence[str], round_index: int) -> list[str]:
    """`keys` in order in even rounds (0, 2, ...), reversed in odd ones: no row always runs
    first, so a machine that slows down or warms up over a run hits every row alike."""
    return list(keys) if round_index % 2 == 0 else list(keys)[::-1]


def measure_rounds(
    keys: Sequence[str],
    rounds: int,
    measure: Callable[[str], RowResult],
    on_row: Callable[[int, str, RowResult | str], None] = lambda number, key, result: None,
) -> tuple[dict[str, list[RowResult]], dict[str, str]]:
    """`rounds` rounds of `measure(key)` for every key, in `alternated` order. A row that
    raises `RowFailed` is left out of later rounds. `on_row(round number from 1, key, result
    or why it failed)` after each row. Returns (key -> one result per round it was measured,
    key -> "failed in round N: why")."""
    results: dict[str, list[RowResult]] = {key: [] for key in keys}
    failed: dict[str, str] = {}
    for round_index in range(rounds):
        for key in alternated([key for key in keys if key not in failed], round_index):
            try:
                result = measure(key)
            except RowFailed as error:
                failed[key] = f"failed in round {round_index + 1}: {error}"
                on_row(round_index + 1, key, failed[key])
                continue
            results[key].append(result)
            on_row(round_index + 1, key, result)
    return results, failed


def median_range(values: Sequence[float], digits: int = 0) -> str:
    """ "median (min-max)" of a row's rounds ("median" alone for one round), `digits` after
    the point."""
    middle = f"{statistics.median(values):.{digits}f}"
    if len(values) < 2:
        return middle
    return f"{middle} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _one_line(error: BaseException) -> str:
    """`Type: first line of the message` (TensorFlow's errors span many lines)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
