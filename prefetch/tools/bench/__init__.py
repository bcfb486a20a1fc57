"""prefetch.tools.bench: measure loaders on one image folder against the machine's limits.

`run(root, ...)` measures, in one run, the single-core decode + resize rate of every decoder
in `available_decoders()` (the decode limit is usable cores x the best rate), the entropy
floor (`floor_rate`: entropy decoding alone, x usable cores) and the steady-state images/s of
each loader as a training job runs it (a Python loop, a 15-line thread pool, `prefetch.Loader`
by default, with threads and with processes, and tf.data, Keras and torch where installed;
`measure_row`: one long-lived pipeline per row, in a fresh process). It returns a
`BenchReport` (table, JSON, chart) and, when the `fast` extra is missing, an estimate of what
installing it would gain (`fast_hint`). Rounds are interleaved (every loader once per round,
alternating their order; medians over rounds) so that a busy machine slows all rows alike.
`root` may be an fsspec URL (a bucket, a web server): the decode limit is then measured on
local copies of the decode sample (the CPU's limit, without the storage's latency), and the
TensorFlow rows are skipped when `tf.io.gfile` cannot read the URL.

A row is measured as a training job runs its pipeline: built once, iterated across epochs, a
warm-up that is not timed (kept as the row's "cold start"), then a timed `Span` of images;
by default in a fresh spawned process (`measure_row`), so that no row inherits another's
threads, TensorFlow runtime or memory, and a row that fails says so in one line (`RowFailed`).
A benchmark script measures rows of its own with the same machinery (`measure_row` with its
own module-level `make(key, setup)`, `measure_rounds`, `steady_rate`, `median_range`). The
entropy floor is `floor_sample` (a sample of files read into memory, with the last pixel row
each one needs) timed by `floor_rate` with `entropy_decoder()`.

Contract: runs in the calling thread; every loader it opens (threads, processes), and every
process it spawns for a row, is closed before `run` returns or raises. TensorFlow, Keras and
torch are imported only to measure their loaders (in the rows' processes), matplotlib only to
draw. Figures are timings: compare rows of one run, not runs. `add_bench_parser` is the
`prefetch bench` command (`prefetch.cli` registers it).
"""

from prefetch.tools.bench._command import add_bench_parser
from prefetch.tools.bench._floor import (
    NO_ENTROPY_DECODER,
    FloorSample,
    entropy_decoder,
    floor_rate,
    floor_sample,
)
from prefetch.tools.bench._frameworks import KerasContender, TfDataContender
from prefetch.tools.bench._hint import FAST_INSTALL, TURBO_MEASURED, FastHint, fast_hint
from prefetch.tools.bench._loaders import (
    LOADER_NAMES,
    Contender,
    OpenLoader,
    Setup,
    make_contender,
    missing_requirement,
    python_loop_batches,
    thread_pool_batches,
)
from prefetch.tools.bench._machine import (
    DECODER_PROVIDERS,
    DECODERS,
    SAMPLE_SIZE,
    available_decoders,
    cpu_model,
    decoder_name,
    default_decoder,
    local_sample,
    machine_info,
    write_sample_folder,
)
from prefetch.tools.bench._report import (
    SCHEMA_VERSION,
    BenchConfig,
    BenchReport,
    DecoderRate,
    LoaderResult,
    Measurement,
)
from prefetch.tools.bench._rounds import Progress
from prefetch.tools.bench._run import DECODE_SAMPLE, run
from prefetch.tools.bench._steady import (
    SPAN_EPOCH_CAP,
    TIMED_EPOCHS,
    MakeContender,
    RowFailed,
    RowResult,
    Span,
    alternated,
    end_children,
    measure_rounds,
    measure_row,
    measure_stream,
    median_range,
    steady_rate,
)
from prefetch.tools.bench._timeline import record_timeline

__all__ = [
    "DECODERS",
    "DECODER_PROVIDERS",
    "DECODE_SAMPLE",
    "FAST_INSTALL",
    "LOADER_NAMES",
    "NO_ENTROPY_DECODER",
    "SAMPLE_SIZE",
    "SCHEMA_VERSION",
    "SPAN_EPOCH_CAP",
    "TIMED_EPOCHS",
    "TURBO_MEASURED",
    "BenchConfig",
    "BenchReport",
    "Contender",
    "DecoderRate",
    "FastHint",
    "FloorSample",
    "KerasContender",
    "LoaderResult",
    "MakeContender",
    "Measurement",
    "OpenLoader",
    "Progress",
    "RowFailed",
    "RowResult",
    "Setup",
    "Span",
    "TfDataContender",
    "add_bench_parser",
    "alternated",
    "available_decoders",
    "cpu_model",
    "decoder_name",
    "default_decoder",
    "end_children",
    "entropy_decoder",
    "fast_hint",
    "floor_rate",
    "floor_sample",
    "local_sample",
    "machine_info",
    "make_contender",
    "measure_rounds",
    "measure_row",
    "measure_stream",
    "median_range",
    "missing_requirement",
    "python_loop_batches",
    "record_timeline",
    "run",
    "steady_rate",
    "thread_pool_batches",
    "write_sample_folder",
]
