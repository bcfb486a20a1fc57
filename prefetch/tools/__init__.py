"""prefetch.tools: the measurement programs behind the `prefetch` command.

`bench` (loaders against the machine's decode limit; its rows, report and hint in the
`bench_*` modules), `tune` (the smallest loader configuration that keeps up with a step) and
`timeline` (spans of work, as text or a Gantt chart). Imported by `prefetch.cli` and on first
use of `prefetch.tune`, never by the core: `import prefetch` does not import this package.
Importing the package imports none of its modules.
"""
