"""The classic overlap: the CPU loads the next batch while the GPU works on this one.

A simulated GPU step (a sleep of --gpu-ms) consumes real decoded batches. The same work runs
twice: one after the other, then with `prefetch.background` loading ahead. It prints each run's
Start/End events for the CPU (load) and the GPU (step) as a timeline, and the measured speed-up
beside the ideal (P + C) / max(P, C), where P is the load time and C the step time per batch.

    python demos/overlap.py [--batches 6] [--gpu-ms 0 (= match the load time)]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import prefetch
from prefetch.testing import write_image_folder

BATCH_SIZE = 16
IMAGE_SIZE = (128, 128)
TIMELINE_WIDTH = 64


class Timeline:
    """Start/End events of the CPU and GPU lanes, relative to the run's start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.events: list[tuple[float, str, str, int]] = []
        self._lock = threading.Lock()

    def mark(self, lane: str, what: str, batch: int) -> None:
        with self._lock:
            self.events.append((time.perf_counter() - self.start, lane, what, batch))

    def spans(self, lane: str) -> list[tuple[float, float, int]]:
        starts = {b: t for t, ln, w, b in self.events if ln == lane and w == "Start"}
        return [(starts[b], t, b) for t, ln, w, b in self.events if ln == lane and w == "End"]

    def print(self, title: str) -> None:
        print(f"\n{title}")
        for t, lane, what, batch in sorted(self.events):
            print(f"  {t * 1000:8.1f} ms  {lane:3s} {what:5s} batch {batch}")
        end = max(t for t, *_ in self.events)
        for lane in ("CPU", "GPU"):
            row = [" "] * TIMELINE_WIDTH
            for begin, finish, batch in self.spans(lane):
                first = int(begin / end * (TIMELINE_WIDTH - 1))
                last = max(first, int(finish / end * (TIMELINE_WIDTH - 1)))
                for i in range(first, last + 1):
                    row[i] = str(batch % 10)
            print(f"  {lane} |{''.join(row)}|")


def load_batches(files: np.ndarray, count: int, timeline: Timeline) -> Iterator[np.ndarray]:
    """Decode `count` batches one at a time in the calling thread (the CPU side)."""
    options = prefetch.DecodeOptions(IMAGE_SIZE)
    for batch in range(count):
        timeline.mark("CPU", "Start", batch)
        chunk = files[batch * BATCH_SIZE : (batch + 1) * BATCH_SIZE]
        images = np.stack([prefetch.decode_image(str(path), options) for path in chunk])
        timeline.mark("CPU", "End", batch)
        yield images


def gpu_step(images: np.ndarray, batch: int, step_s: float, timeline: Timeline) -> None:
    timeline.mark("GPU", "Start", batch)
    time.sleep(step_s)  # stands in for the device running the training step
    timeline.mark("GPU", "End", batch)


def run(files: np.ndarray, batches: int, step_s: float, ahead: bool) -> tuple[float, Timeline]:
    timeline = Timeline()
    source = load_batches(files, batches, timeline)
    stream = prefetch.background(source, depth=1) if ahead else source
    for batch, images in enumerate(stream):
        gpu_step(images, batch, step_s, timeline)
    return time.perf_counter() - timeline.start, timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--gpu-ms", type=float, default=0.0, help="step time; 0 = load time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_image_folder(
            Path(tmp), per_class=args.batches * BATCH_SIZE // 3 + 1, size=(640, 480)
        )
        files = prefetch.ImageFolder(folder).paths
        files = np.random.default_rng(0).permutation(files)
        list(load_batches(files, 1, Timeline()))  # warm the file cache and Pillow
        probe = Timeline()
        list(load_batches(files, args.batches, probe))
        load_s = float(np.median([end - begin for begin, end, _ in probe.spans("CPU")]))
        step_s = args.gpu_ms / 1000 if args.gpu_ms > 0 else load_s
        sequential_s, sequential = run(files, args.batches, step_s, ahead=False)
        overlapped_s, overlapped = run(files, args.batches, step_s, ahead=True)
    sequential.print("one after the other (load, then step):")
    overlapped.print("with prefetch.background (load the next batch during the step):")
    ideal = (load_s + step_s) / max(load_s, step_s)
    print(
        f"\nP (load) = {load_s * 1000:.1f} ms/batch, C (step) = {step_s * 1000:.1f} ms/batch, "
        f"{args.batches} batches of {BATCH_SIZE}"
    )
    print(f"one after the other: {sequential_s:.3f} s; with prefetch: {overlapped_s:.3f} s")
    print(
        f"speed-up {sequential_s / overlapped_s:.2f}x, ideal (P + C) / max(P, C) = {ideal:.2f}x "
        f"(the first load cannot overlap, so {args.batches} batches reach at most "
        f"{(load_s + step_s) * args.batches / (load_s + max(load_s, step_s) * args.batches):.2f}x)"
    )


if __name__ == "__main__":
    main()
