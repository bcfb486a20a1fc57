"""Benchmark: how long `Loader.close()` takes when every worker process is stuck in a sample.

A folder of small JPEGs read by `Loader(backend="process", workers=N)`, batch N, with
`prefetch.testing.HangingDecoder`: each worker hangs in its row of the first batch (a dead
network mount), in the "sigterm-ignored" mode ignoring SIGTERM too, so that only SIGKILL ends
it. The consumer waits for that batch in another thread; once all N workers are stuck,
`close()` is timed. Printed: N, the mode, the seconds `close()` took, and the one deadline the
code gives all the workers together (`STOP_GRACE_S`, plus `TERMINATE_GRACE_S` when SIGTERM is
ignored: prefetch/backends/_lifecycle.py). Before that deadline was shared, close() waited
`STOP_GRACE_S` per worker in turn (and as long again after SIGTERM).

    python benchmarks/close_stuck.py [--workers 8,32] [--modes stuck,sigterm-ignored]

Each N starts N worker processes (about 60 MB each), once per mode.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
from pathlib import Path

from prefetch import Loader
from prefetch.backends._lifecycle import STOP_GRACE_S, TERMINATE_GRACE_S
from prefetch.testing import HangingDecoder, write_image_folder

MODES = {"stuck": False, "sigterm-ignored": True}


def close_seconds(folder: Path, arrivals: Path, workers: int, ignore_sigterm: bool) -> float:
    """Seconds `close()` takes once `workers` workers hang in a sample."""
    arrivals.mkdir()
    decoder = HangingDecoder(arrivals, ignore_sigterm=ignore_sigterm)
    loader = Loader(
        folder,
        batch_size=workers,
        image_size=(16, 16),
        workers=workers,
        backend="process",
        decoder=decoder,
    )

    def consume() -> None:
        with contextlib.suppress(Exception):  # the close ends the wait (ClosedError)
            next(iter(loader))

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    while decoder.arrived() < workers:
        if not consumer.is_alive():
            raise RuntimeError("the consumer ended before every worker was stuck")
        time.sleep(0.05)
    began = time.monotonic()
    loader.close()
    took = time.monotonic() - began
    consumer.join(30)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="8,32", help="worker counts, comma-separated")
    parser.add_argument("--modes", default=",".join(MODES), help="stuck, sigterm-ignored")
    args = parser.parse_args()
    counts = [int(count) for count in args.workers.split(",")]
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        folder = write_image_folder(Path(scratch) / "images", per_class=max(counts), size=(24, 24))
        print(f"{'workers':>7}  {'mode':<16} {'close s':>8}  {'one deadline s':>14}")
        for count in counts:
            for mode in modes:
                arrivals = Path(scratch) / f"arrivals-{count}-{mode}"
                took = close_seconds(folder, arrivals, count, MODES[mode])
                deadline = STOP_GRACE_S + (TERMINATE_GRACE_S if MODES[mode] else 0.0)
                print(f"{count:>7}  {mode:<16} {took:>8.2f}  {deadline:>14.1f}", flush=True)


if __name__ == "__main__":
    main()
