"""prefetch.tools.tune: find the smallest loader configuration that keeps up with a training
step (`prefetch tune`).

`tune(root, step_ms=...)` runs short trials of the Loader on a folder, with a simulated training
step of `step_ms` per batch (a sleep, like a device step that leaves the CPU free; 0: the
loader alone), over backend x depth x workers, in `repeats` rounds:

- round 1 searches: for each backend and depth, workers go up from 1; the search along workers
  stops early once the consumer no longer waits (`KEPT_UP_WAIT`), or once two more workers in
  a row gained less than `tolerance` over the best so far;
- the other rounds measure the same configurations again, in the same order, so that a machine
  that gets busier for a while slows every configuration alike; each configuration reports
  the median of its rounds and their spread, (max - min) / median;
- each trial takes `trial_batches` batches after one warm-up batch (start-up and the first
  batches in flight are not timed);
- the candidate is the smallest configuration (fewest workers, then the smallest `depth`, then
  threads before processes) within `tolerance` of the best median.

The candidate is always recommended, as the best answer the data supports; it is uncertain
(`TuneReport.uncertain`, the reasons in `noise`) unless the machine's load average before the
search was at most its usable cores and no configuration that could be chosen (one with a
round within `tolerance` of the best median) spread over `max_spread` (default
`SPREAD_PER_TOLERANCE` x `tolerance`: the median of 3 rounds is uncertain by about 0.4 times
their range, so over twice the tolerance, noise could decide what lies within the tolerance).
An uncertain answer comes with its range, the configurations it cannot be told from, and
what would sharpen it. The report prints as a table and draws throughput against workers
(`plot`, needs matplotlib). Runs in the calling thread; every loader is closed before the
trial returns. `add_tune_parser` is the `prefetch tune` command (`prefetch.cli` registers
it). Importing this package imports neither `prefetch.tools.bench` nor TensorFlow.
"""

from prefetch.tools.tune._command import add_tune_parser
from prefetch.tools.tune._report import (
    SPREAD_PER_TOLERANCE,
    STEP_HOW_TO,
    TRIAL_BATCHES,
    Trial,
    TuneReport,
)
from prefetch.tools.tune._tune import KEPT_UP_WAIT, REPEATS, TOLERANCE, load_average, tune

__all__ = [
    "KEPT_UP_WAIT",
    "REPEATS",
    "SPREAD_PER_TOLERANCE",
    "STEP_HOW_TO",
    "TOLERANCE",
    "TRIAL_BATCHES",
    "Trial",
    "TuneReport",
    "add_tune_parser",
    "load_average",
    "tune",
]
