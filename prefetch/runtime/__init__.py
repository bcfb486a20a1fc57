"""The running loader: what turns a source and its options into batches, epoch after epoch.

- `Loader` (`_loader`): the user's object. It checks its options (`LoaderOptions`,
  `ErrorPolicy`, `Autotune`: `_options`), builds one `Epochs` and hands it to every `Stream`.
- `Epochs` (`_epochs`): the loader's epochs, the only part of a loader a stream uses: the plan
  that draws each epoch's batches, the cursor of where iteration stands, the skip counter, the
  stats recorder, the worker set and the spool.
- `Stream` (`_stream`): one epoch: the batches in flight (at most `depth`, more for many thread
  workers), waiting for each, and handing it out as a `Batch`.
- `Workers` (`_workers`): the worker set: the backend, its slot ring, the coordinator and the
  worker tuner; started at the first epoch or at `with loader:`, closed by `close()`.
- `ShardSpool` (`_spool`): the whole shards of a streamed shard source, fetched ahead of the
  batches that read them.
- `LoaderStats` (`_stats`) and the worker tuner (`_autoscale`).

The layer imports the backends, plan, sources and io below it, never the frameworks above.
"""

from prefetch.host import available_memory_bytes, default_workers, usable_cores
from prefetch.runtime._loader import Batch, Loader, Stream
from prefetch.runtime._options import Autotune, ErrorPolicy, LoaderOptions
from prefetch.runtime._spool import ShardSpool
from prefetch.runtime._stats import LoaderStats

__all__ = [
    "Autotune",
    "Batch",
    "ErrorPolicy",
    "Loader",
    "LoaderOptions",
    "LoaderStats",
    "ShardSpool",
    "Stream",
    "available_memory_bytes",
    "default_workers",
    "usable_cores",
]
