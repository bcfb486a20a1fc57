"""How long a thread worker holds the GIL per sample, with the chunk path (one call of the
compiled window decoder per worker task, issue 34) off and on, alternated in one run.

Two measures, RandomResizedCrop to 224 + flip, one worker thread:

- **held**: the worker thread's CPU time (`time.thread_time`) per sample, less the CPU time
  spent inside the calls that release the GIL (the window decoder's `decode` and
  `decode_chunk`, OpenCV's resize, blur and flip, the file system calls of `read_local`).
  Counts this thread's CPU only, so other load on the machine does not move it.
- **spinner**: `scaling.py`'s `gil_share`: the share of its solo rate a pure-Python thread
  loses while one worker thread reads 48 samples (it includes the waits to hand the GIL over,
  and every other process's load: take it on a quiet machine).

    python benchmarks/gil_held.py --root /tmp/photos [--rounds 7] [--rate-rounds 3]

Prints the median of `--rounds` for each, per sample: CPU, GIL held, held share, spinner share;
with `--rate-rounds`, the images/s of `Loader(workers=1 and 2, backend="thread")` (batch 256),
each mode alternated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import prefetch.io._local_files as local_files
import prefetch.sample._reader as reader_module
from prefetch.decode import _window, _window_resize
from prefetch.sample import BatchTask, Slot

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling  # beside this file

# The chunk path on and off: the reader asks `chunk_available` once per task.
MODES: dict[str, Callable[..., bool]] = {
    "per sample": lambda *args: False,
    "chunk": _window.chunk_available,
}


class _Timed:
    """`module` with the functions `names` adding their thread CPU time to `spent[0]`."""

    def __init__(self, module: Any, names: set[str], spent: list[float]) -> None:
        self._module, self._names, self._spent = module, names, spent

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if name not in self._names:
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return value(*args, **kwargs)
            finally:
                self._spent[0] += time.thread_time() - began

        return timed


def held_per_sample(args: argparse.Namespace, rows: int = 128) -> dict[str, list[float]]:
    """(CPU us, GIL-held us) per sample for each mode and round; `rows` a task (a thread
    worker's chunk of a 256 batch)."""
    spent = [0.0]
    cv2, jpeg, os_module = _window_resize.cv2_module(), _window._jpegwindow, local_files.os
    timed_cv2 = _Timed(cv2, {"resize", "GaussianBlur", "flip"}, spent)
    _window._jpegwindow = _Timed(jpeg, {"decode", "decode_chunk"}, spent)
    for module in (_window, _window_resize):  # the chunk path's resize, and the shared one
        module.cv2_module = lambda: timed_cv2  # type: ignore[assignment]
    local_files.os = _Timed(os, {"open", "pread", "fstat", "close"}, spent)
    results: dict[str, list[float]] = {f"{mode} {what}": [] for mode in MODES for what in "ch"}
    try:
        with scaling.make_loader(args, workers=1, backend="thread") as loader:
            reader = loader._epochs.workers.reader
            slot = Slot(
                np.empty((rows, args.image_size, args.image_size, 3), np.uint8),
                np.empty(rows, np.int32),
                started=np.zeros(rows),
            )
            for round_ in range(args.rounds):
                indices = (np.arange(rows) + round_ * rows) % len(loader.source)
                for mode, available in MODES.items():
                    reader_module.chunk_available = available
                    reader.read_into(BatchTask(indices, 1000, 0), slot, 0, rows, "warm-up")
                    spent[0], began = 0.0, time.thread_time()
                    reader.read_into(BatchTask(indices, round_, 0), slot, 0, rows, "held")
                    cpu = time.thread_time() - began
                    results[f"{mode} c"].append(1e6 * cpu / rows)
                    results[f"{mode} h"].append(1e6 * (cpu - spent[0]) / rows)
    finally:
        _window._jpegwindow = jpeg
        for module in (_window, _window_resize):
            module.cv2_module = lambda: cv2  # type: ignore[assignment]
        local_files.os = os_module
        reader_module.chunk_available = MODES["chunk"]
    return results


def spinner_shares(args: argparse.Namespace) -> dict[str, list[float]]:
    shares: dict[str, list[float]] = {mode: [] for mode in MODES}
    try:
        for _ in range(args.rounds):
            for mode, available in MODES.items():
                reader_module.chunk_available = available
                shares[mode].append(scaling.gil_share(args))
    finally:
        reader_module.chunk_available = MODES["chunk"]
    return shares


def thread_rates(args: argparse.Namespace) -> dict[tuple[str, int], list[float]]:
    """images/s of `Loader(workers=n, backend="thread")`, n = 1 and 2, for each mode (a
    pipeline opened once, warmed up, timed: `scaling.py`'s rows)."""
    rates: dict[tuple[str, int], list[float]] = {(m, n): [] for m in MODES for n in (1, 2)}
    try:
        for _ in range(args.rate_rounds):
            for workers in (1, 2):
                for mode, available in MODES.items():
                    reader_module.chunk_available = available
                    row = scaling.prefetch_row(args, "", workers=workers, backend="thread")
                    rates[mode, workers].append(row["images_per_s"])
    finally:
        reader_module.chunk_available = MODES["chunk"]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="an image folder (class subfolders)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rate-rounds", type=int, default=0, help="thread 1 and 2 rows' rounds")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    args.batch_size = 256  # the loader's; the tasks read here are sized by this script
    held = held_per_sample(args)
    shares = spinner_shares(args)
    print(
        f"{'path':12} {'CPU us/sample':>14} {'GIL held us':>12} {'held share':>11} {'spinner':>8}"
    )
    for mode in MODES:
        cpu, gil = held[f"{mode} c"], held[f"{mode} h"]
        share = statistics.median(h / c for h, c in zip(gil, cpu, strict=True))
        print(
            f"{mode:12} {statistics.median(cpu):14.0f} {statistics.median(gil):12.1f} "
            f"{share:11.1%} {statistics.median(shares[mode]):8.1%}"
        )
    if args.rate_rounds:
        rates = {key: statistics.median(values) for key, values in thread_rates(args).items()}
        print(f"{'path':12} {'thread 1':>9} {'thread 2':>9} {'2 / 1':>6}  (images/s, medians)")
        for mode in MODES:
            one, two = rates[mode, 1], rates[mode, 2]
            print(f"{mode:12} {one:9.0f} {two:9.0f} {two / one:6.2f}")


if __name__ == "__main__":
    main()
