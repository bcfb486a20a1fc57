"""prefetch.tools.shards: write an image folder into shards (`prefetch shards write`) and check a
written set (`prefetch shards verify`).

`write_shards(folder, out, ...)` writes WebDataset tar or TFRecord shards and their manifest:
the per-sample work (read, check, optionally `fit_crop` re-encoding with `fit_image`) in
worker processes, the shards in order by the calling thread, every file under a fresh name in
an `OutFolder` (one writer at a time: a second one gets `FolderBusyError`), the set committed
all at once, and an interrupted write continued by the same call again. Its docstring states
the layouts and the guarantees; docs/shards.md the rest. `ProgressLine` shows its `Progress`
as one line; `add_shards_parser` is the `prefetch shards` command (`prefetch.cli` registers
it). Readers of the shards are `prefetch.TarSource` and `prefetch.TFRecordSource`.
"""

from prefetch.tools.shards._command import add_shards_parser
from prefetch.tools.shards._fit_crop import DEFAULT_QUALITY, fit_image, fitted_size
from prefetch.tools.shards._names import CLASSES_FILE, DEFAULT_PREFIX, shard_name, shard_pattern
from prefetch.tools.shards._out_folder import FolderBusyError, OutFolder
from prefetch.tools.shards._pass import SHARDS_PER_WORKER, Progress
from prefetch.tools.shards._progress import ProgressLine, describe
from prefetch.tools.shards._writer import FORMATS, write_shards

__all__ = [
    "CLASSES_FILE",
    "DEFAULT_PREFIX",
    "DEFAULT_QUALITY",
    "FORMATS",
    "SHARDS_PER_WORKER",
    "FolderBusyError",
    "OutFolder",
    "Progress",
    "ProgressLine",
    "add_shards_parser",
    "describe",
    "fit_image",
    "fitted_size",
    "shard_name",
    "shard_pattern",
    "write_shards",
]
