"""backend="auto": threads or processes, from the kind of source (and a short measurement of it).

A loader's consumer runs Python: a training loop launches its model's kernels from Python, and
Keras, tf.data's generator thread and prefetch.torch's conversion thread run Python beside it.
Worker threads run in parallel only while their work releases the GIL, and after every C call
(a decode, a resize) a worker needs the GIL back: a busy Python thread gives it up only at the
interpreter's switch interval (5 ms), so thread workers stall behind a training loop (the
convoy effect: one worker thread fell to 0.04 of its rate beside a pure-Python thread, where a
worker process kept all of it, docs/performance.md "Many cores"). Their own per-sample
Python (14% to 26% of a sample, `benchmarks/scaling.py`) also runs one thread at a time,
which bends the thread curve on many cores. Processes pay neither: each decodes on its own
core and writes its rows of every batch straight into shared memory; they cost a start-up
(about a second) and a pipe message per worker and batch (microseconds of the parent's CPU
per image).

So the choice is:

- file sources (folders, file lists, shards, URLs: `is_file_source`): processes, on any number
  of cores; but threads for remote URLs with a fixed worker count (sized for threads, it would
  start that many processes, each with a reader thread per row);
- any other source (a `Source` with its own `__getitem__`, which may hold its data in this
  process): the stages of a few samples are timed on the calling thread, the conversion to the
  target size (which releases the GIL) against the rest (`__getitem__`, the transform);
  processes if the second share is at least `PROCESS_SHARE`, else threads, which start at once
  and copy nothing.

Processes then need the decoder, transform and source to pickle; when one does not (a lambda,
a local function), the choice is threads and the reason says which part kept it there; so it is
for memory:// files (they exist in this process only), when a part lives in a main script whose
loader runs outside `if __name__ == "__main__":` (workers would run the script again,
`spawning.unguarded_main_code`). The runtime's one decision (`prefetch.runtime._choice.decide`)
takes this choice, checks that the shared-memory folder can hold the slots within this rank's
share, sizes the workers and writes the reason once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from prefetch.backends._spawning import main_part, unguarded_main_code, unpicklable_part
from prefetch.decode import to_target_size
from prefetch.sample import SampleReader
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
    """The backend that suits a reader (`name`), and why (`reason`, without the "auto: name"
    that `prefetch.runtime._choice.decide` puts before it in `LoaderStats.backend_reason`)."""

    name: str
    gil_share: float
    seconds_per_sample: float
    samples: int
    reason: str


def choose_backend(reader: SampleReader, indices: np.ndarray, tuned: bool = True) -> BackendChoice:
    """Pick "thread" or "process": processes for a file source; for any other source, from a
    measurement of up to `MAX_SAMPLES` of `indices` (within `BUDGET_S`); then threads where
    processes cannot run the loader's parts (the reason says which).

    Samples that fail to read are left out of the measurement (the epoch reports them). Remote
    URLs go to processes when the worker count is `tuned` (a fixed count, sized for threads,
    would start that many processes).
    """
    if is_file_source(reader.source) and reads_over_network(reader.source) and not tuned:
        choice = BackendChoice(
            "thread",
            0.0,
            0.0,
            0,
            "remote URLs with a fixed worker count: a count sized for threads would start that "
            "many processes, each with a reader thread per row",
        )
    elif is_file_source(reader.source):
        choice = BackendChoice(
            "process",
            0.0,
            0.0,
            0,
            "files are decoded in worker processes, so that none waits for the GIL while the "
            "training thread runs Python",
        )
    else:
        choice = _measured(reader, indices)
    name, reason = choice.name, choice.reason
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
    return replace(choice, name=name, reason=reason)


def _measured(reader: SampleReader, indices: np.ndarray) -> BackendChoice:
    """The choice for a source that is not a file source, from the GIL share of its samples."""
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
        return BackendChoice("thread", 0.0, 0.0, samples, "nothing could be measured")
    share = held_s / total
    name = "process" if share >= PROCESS_SHARE else "thread"
    reason = (
        f"the GIL was held for {share:.0%} of {1000 * total / samples:.2f} ms per "
        f"sample over {samples} samples; processes from {PROCESS_SHARE:.0%}"
    )
    return BackendChoice(name, share, total / samples, samples, reason)


def _time_read(reader: SampleReader, index: int) -> tuple[float, float, np.ndarray]:
    """Read one sample of a source that is not a file source; returns (seconds without the
    GIL: the conversion to the target size, seconds with it: `__getitem__`, the image)."""
    start = time.perf_counter()
    item = reader.source[index]
    fetched = time.perf_counter()
    image = to_target_size(item[0] if reader.labelled else item, reader.options)
    return time.perf_counter() - fetched, fetched - start, image
