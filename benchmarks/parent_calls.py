"""Benchmark: what the process backend's parent costs per batch, counted and timed.

A folder of small JPEGs read by `Loader(backend="process", workers=N)` with a decoder that
sleeps `--sleep-ms` a sample (`prefetch.testing.SlowDecoder`: the workers cost little CPU, so
the parent's own work shows), batch `--batch-size`:

- calls: the parent's `os.waitpid`, `os.read`, pipe writes and `poll` calls per batch over two
  epochs after a warm-up one (each is a system call, and each releases the GIL, which the
  thread draining the loader then waits for behind a training thread that runs Python);
- rates: images/s drained by a thread alone, then beside this thread spinning pure Python (as
  prefetch.torch and Keras drain a loader beside a training loop), `--rounds` alternations,
  medians.

    python benchmarks/parent_calls.py [--workers 16] [--sleep-ms 2] [--batch-size 256]

It imports no framework. On a 2-core machine the spinner also takes a core from the workers
and the parent, so the rates there show the GIL and the CPU together.
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import statistics
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from prefetch import Loader
from prefetch.testing import SlowDecoder, write_image_folder

calls: collections.Counter[str] = collections.Counter()


def count_calls() -> None:
    """Count this process's waitpid, read, write and poll calls from now on."""
    for name in ("waitpid", "read"):
        call = getattr(os, name)

        def counted(*args: Any, _call: Any = call, _name: str = name) -> Any:
            calls[_name] += 1
            return _call(*args)

        setattr(os, name, counted)
    send = Connection._send  # type: ignore[attr-defined]  # its os.write was bound at import

    def counted_send(self: Connection, *args: Any) -> Any:
        calls["write"] += 1
        return send(self, *args)

    Connection._send = counted_send  # type: ignore[attr-defined]
    make_poll = select.poll

    class CountedPoll:
        def __init__(self) -> None:
            self._poll = make_poll()

        def __getattr__(self, name: str) -> Any:
            return getattr(self._poll, name)

        def poll(self, *args: Any) -> Any:
            calls["poll"] += 1
            return self._poll.poll(*args)

    select.poll = CountedPoll  # type: ignore[assignment,misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=20, help="batches per timed phase")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    count_calls()
    folder = write_image_folder(Path(tempfile.mkdtemp()) / "images", per_class=400)
    loader = Loader(
        folder,
        batch_size=args.batch_size,
        image_size=(16, 16),
        workers=args.workers,
        backend="process",
        decoder=SlowDecoder(args.sleep_ms / 1000),
    )

    def drain(out: list[float], done: threading.Event | None = None) -> None:
        taken, began = 0, time.perf_counter()
        while taken < args.batches:
            for _ in loader:
                taken += 1
                if taken == args.batches:
                    break
        out.append(args.batches * args.batch_size / (time.perf_counter() - began))
        if done is not None:
            done.set()

    def spin(stop: threading.Event) -> None:
        while not stop.is_set():
            pass

    with loader:
        for _ in loader:  # warm-up: workers started, files in the page cache
            pass
        calls.clear()
        batches = sum(1 for _ in range(2) for _ in loader)
        per_batch = {name: round(calls[name] / batches, 1) for name in sorted(calls)}
        print(f"{args.workers} workers, per batch of {args.batch_size}: {per_batch}")
        alone: list[float] = []
        beside: list[float] = []
        for _ in range(args.rounds):
            drain(alone)
            done = threading.Event()
            thread = threading.Thread(target=drain, args=(beside, done))
            thread.start()
            spin(done)
            thread.join()
        print(
            f"images/s drained alone {statistics.median(alone):,.0f} "
            f"({min(alone):,.0f}-{max(alone):,.0f}), beside a Python thread "
            f"{statistics.median(beside):,.0f} ({min(beside):,.0f}-{max(beside):,.0f})"
        )


if __name__ == "__main__":
    main()
