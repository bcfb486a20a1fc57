"""backend="auto": choose threads or processes from a short measurement of the per-sample work.

Worker threads run in parallel only while the work releases the GIL. Pillow's decode and resize
release it; a Python transform (and a source's own `__getitem__`, or a decoder written in Python)
holds it, so threads serialise on it and also slow the training loop's own Python. The choice
times the stages of a few samples on the calling thread:

- time spent in stages known to release the GIL: the built-in decoder `decode_image`, and any
  decoder whose `releases_gil` attribute is True;
- time spent in everything else (the transform, a source's `__getitem__`, other decoders).

If the second share is at least `PROCESS_SHARE` of the total, the loader uses processes;
otherwise threads, which start faster and copy nothing. Remote URLs (`reads_over_network`) go
to processes whatever the share when the worker count is tuned (the default on URLs): reading
them costs CPU in fsspec's event-loop thread, which the measurement does not see and which all
threads of one process share (on a loopback server, processes read about 1.4x the images/s of
threads, docs/performance.md). A fixed worker count keeps the measured choice: sized for
threads, it would start that many processes. Processes also need the decoder,
transform and source to pickle; when one does not (a lambda, a local function), the choice is
threads and the reason says which part kept it there; so it is when a part lives in a main script
whose loader runs outside `if __name__ == "__main__":` (workers would run the script again,
`spawning.unguarded_main_code`). The measurement runs in the training
process itself, so it sees the same conditions (TensorFlow imported, its malloc settings) as the
thread workers would.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from prefetch.backends._reader import SampleReader
from prefetch.backends._spawning import main_part, unguarded_main_code, unpicklable_part
from prefetch.decode import decode_image, to_target_size
from prefetch.sources import is_file_source, reads_over_network, source_scheme

# Share of per-sample time spent holding the GIL above which processes beat threads: at 25%,
# two threads already lose about a fifth of their speed-up to the GIL (Amdahl), which the
# process backend's fixed costs (spawn, a pipe message per batch) do not.
PROCESS_SHARE = 0.25
# The measurement stops after this many samples or this many seconds, whichever comes first.
MAX_SAMPLES = 8
BUDGET_S = 0.5


@dataclass(frozen=True)
class BackendChoice:
    """The backend `backend="auto"` chose, and why (shown in `LoaderStats.backend_reason`)."""

    name: str
    gil_share: float
    seconds_per_sample: float
    samples: int
    reason: str


def releases_gil(decoder: object) -> bool:
    """True for decoders known to do their work without the GIL."""
    return decoder is decode_image or getattr(decoder, "releases_gil", False) is True


def choose_backend(reader: SampleReader, indices: np.ndarray, tuned: bool = True) -> BackendChoice:
    """Time up to `MAX_SAMPLES` of `indices` (within `BUDGET_S`) and pick "thread" or "process".

    Samples that fail to read are left out of the measurement (the epoch reports them). Remote
    URLs go to processes when the worker count is `tuned` (a fixed count, sized for threads,
    would start that many processes).
    """
    free_s = held_s = 0.0
    samples = 0
    began = time.perf_counter()
    for index in indices[:MAX_SAMPLES]:
        try:
            free, held, image = _time_read(reader, int(index))
            free_s, held_s = free_s + free, held_s + held
            transform = reader.augment.transform
            if transform is not None:
                start = time.perf_counter()
                transform(image, np.random.default_rng(int(index)))
                held_s += time.perf_counter() - start
            samples += 1
        except Exception:
            pass
        if time.perf_counter() - began > BUDGET_S:
            break
    total = free_s + held_s
    if samples == 0 or total <= 0:
        return BackendChoice(
            "thread", 0.0, 0.0, samples, "auto: thread (nothing could be measured)"
        )
    share = held_s / total
    name = "process" if share >= PROCESS_SHARE else "thread"
    reason = (
        f"the GIL was held for {share:.0%} of {1000 * total / samples:.2f} ms per "
        f"sample over {samples} samples; processes from {PROCESS_SHARE:.0%}"
    )
    if name == "thread" and tuned and reads_over_network(reader.source):
        name = "process"
        reason += (
            "; but remote URLs read faster from processes: each runs its own HTTP client "
            "(fsspec's event loop), where threads share one"
        )
    if name == "process":
        unpicklable = unpicklable_part(reader)
        if unpicklable:
            name = "thread"
            reason += f"; but the {unpicklable} cannot be pickled for worker processes"
        elif source_scheme(reader.source) == "memory":
            name = "thread"
            reason += "; but memory:// files exist in this process only, not in its workers"
        elif main_part(reader) and unguarded_main_code() is not None:
            name = "thread"
            reason += (
                f"; but the {main_part(reader)} is defined in the main script, whose loader "
                'runs outside `if __name__ == "__main__":`: worker processes would run it again'
            )
    return BackendChoice(name, share, total / samples, samples, f"auto: {name} ({reason})")


def _time_read(reader: SampleReader, index: int) -> tuple[float, float, np.ndarray]:
    """Read one sample; returns (seconds without the GIL, seconds with it, the image)."""
    start = time.perf_counter()
    if is_file_source(reader.source):
        rng = reader.augment.rng(0, 0, index) if reader.augment else None
        image = reader.decode_file(reader.file_path(index), rng)
        spent = time.perf_counter() - start
        # The crop path (libjpeg-turbo, OpenCV or Pillow) decodes without the GIL.
        free = releases_gil(reader.decoder) or reader.augment.crop is not None
        return (spent, 0.0, image) if free else (0.0, spent, image)
    item = reader.source[index]
    fetched = time.perf_counter()
    image = to_target_size(item[0] if reader.labelled else item, reader.options)
    return time.perf_counter() - fetched, fetched - start, image
