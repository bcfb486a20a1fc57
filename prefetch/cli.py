"""The `prefetch` command (also `python -m prefetch`): subcommands, each in its own function.

`main(argv)` parses and dispatches; it returns the exit status (0 success, 2 bad input, 130
Ctrl-C). A subcommand is added with an `add_<name>_parser(subparsers)` function that registers
its arguments and sets `handler=<function(args) -> int>`; `build_parser` calls each one.
Bad input is reported as `prefetch <command>: error: <message>` on stderr, without traceback.
"""

from __future__ import annotations

from prefetch._as_command import hush_interrupt, restore_excepthook

hush_interrupt()  # Ctrl-C while the command still imports: one line, not a traceback

import argparse
import sys
from collections.abc import Sequence

import prefetch
from prefetch.backends import sweep_stale
from prefetch.tools.bench import add_bench_parser
from prefetch.tools.shards import add_shards_parser
from prefetch.tools.tune import add_tune_parser


def build_parser() -> argparse.ArgumentParser:
    """The `prefetch` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="prefetch",
        description="prefetch: keep GPUs fed. Tools to measure and tune loading, and to write "
        "and verify shards.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"prefetch {prefetch.__version__}",
        help="print the version and exit",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_bench_parser(subparsers)
    add_tune_parser(subparsers)
    add_shards_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `prefetch` command with `argv` (default: sys.argv[1:]); returns the exit status."""
    restore_excepthook()  # Ctrl-C is caught here from now on (prefetch._as_command)
    command = "prefetch"
    try:
        sweep_stale()  # segments of process-backend loaders that died (prefetch.backends._shm)
        args = build_parser().parse_args(argv)
        command = f"prefetch {args.command}"
        status: int = args.handler(args)
    except KeyboardInterrupt:
        print(f"\n{command}: interrupted", file=sys.stderr)
        return 130
    return status
