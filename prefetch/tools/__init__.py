"""prefetch.tools: the measurement programs and the shard writer behind the `prefetch` command.

One subpackage per command, each naming in its `__init__` what `prefetch.cli` and users take
from it: `bench` (loaders against the machine's decode limit and entropy floor; the
steady-state harness benchmark scripts reuse), `tune` (the smallest loader configuration
that keeps up with a step: `from prefetch.tools.tune import tune`, or `prefetch tune`) and
`shards` (`prefetch shards write` and `verify`: `write_shards`). Beside them, two modules
used on their own: `timeline` (spans of work, as text or a Gantt chart; `bench` records one
and `tune` draws with its matplotlib import) and `feeding` (three ways of feeding a compiled
TensorFlow step; it imports TensorFlow); and `_command_args`, the argument types and progress
bar the three commands share. Imported by `prefetch.cli` and by users who call them, never by
the core: `import prefetch` does not import this package. Importing the package imports none
of its modules; importing `tune` imports neither `bench` nor `feeding`.
"""
