"""The running loader: what turns a source and its options into batches, epoch after epoch.

The data flow, for one loader (the consumer's thread on the left; the workers on the right):

    Loader ── iter() ──> Stream (one epoch)          Epochs (plan, cursor, stats, spool)
                           │ next():                    │ begin(): cursor -> (epoch, position)
                           │   window.top_up()          │   Workers.start() -> backend, ring
                           │   item = window.take(run)  │   window.claim(plan, epoch, position)
                           │   wait, then deliver       ▼
                           │                     Window: one bounded deque of InFlight,
                           │                     at most Workers.in_flight() batches
                           │                       runs: [epoch e, claimed | e+1, ahead]
                           │                        │ BatchTask(indices, epoch, seed) + Slot
                           │                        ▼
                           │                     backend.submit(task, slot) -> PendingBatch
                           │                        │ rows split among workers (split_rows)
                           │                        ▼
                           │                     threads | processes (shared-memory slots)
                           │                       | Ray actors: SampleReader.read_into rows
                           │                        │ BatchOutcome (count, skipped, counts)
                           ▼                        ▼
                      Batch(images, labels) <── the slot's rows (a view, or a copy when the
                                                consumer keeps many: SlotRing)

- `Loader` (`_loader`): the user's object. It checks its options (`LoaderOptions`,
  `ErrorPolicy`, `Autotune`: `_options`), builds one `Epochs` and hands it to every `Stream`.
- `Epochs` (`_epochs`): the loader's epochs, the only part of a loader a stream uses: the plan
  that draws each epoch's batches, the cursor of where iteration stands, the skip counter, the
  stats recorder, the worker set, the window and the spool.
- `Window` (`_window`): the one bounded queue of the loader's batches in flight, topped up from
  the runs of batches the streams claimed, then from the next epoch's (`with loader:` only).
- `Stream` (`_stream`): one epoch: take the next batch from the window, wait for it, hand it
  out as a `Batch`.
- `Workers` (`_workers`): the worker set: the backend, its slot ring, the coordinator and the
  worker tuner; started at the first epoch or at `with loader:`, closed by `close()`; its
  sizes decided once (`_choice`).
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
