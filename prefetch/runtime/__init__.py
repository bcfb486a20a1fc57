"""The loading job: the Loader, its epochs and their streams, the worker set, stats, autoscale.

`Loader` checks its options once, plans its epochs (`prefetch.plan`), builds and owns the
worker set (a backend of `prefetch.backends`, its slot ring, the worker tuner and the
`Coordinator`) and hands each epoch to a `Stream` through an epoch object; `loader.options` is
the read-only view of its configuration. A `Stream` is one epoch's iteration: it keeps up to
`depth` batches in flight and delivers them in order as `Batch` views. For a streamed shard
source, the `ShardSpool` fetches whole shards ahead into a local folder. `LoaderStats` and
`workers="auto"` (`WorkerTuner`) are here too. Imports `prefetch.backends` and below.
"""
