"""prefetch.tools: the measurement programs behind the `prefetch` command.

`bench` (loaders against the machine's decode limit; its rows, report and hint in the
`bench_*` modules), `tune` (the smallest loader configuration that keeps up with a step:
`from prefetch.tools.tune import tune`, or `prefetch tune`), `timeline` (spans of work, as
text or a Gantt chart) and `feeding` (three ways of feeding a compiled TensorFlow step; it
imports TensorFlow). Imported by `prefetch.cli` and by users who call them, never by the core:
`import prefetch` does not import this package. Importing the package imports none of its
modules.
"""
