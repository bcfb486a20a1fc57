"""`prefetch tune`: its arguments, and running it (`prefetch.tools.tune` measures).

`add_tune_parser(subparsers)` registers the subcommand with `handler=run_tune`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from prefetch.tools._command_args import (
    ProgressBar,
    add_batch_shape_arguments,
    positive_int,
)
from prefetch.tools.timeline import MATPLOTLIB_HINT
from prefetch.tools.tune._report import SPREAD_PER_TOLERANCE, STEP_HOW_TO, TRIAL_BATCHES
from prefetch.tools.tune._tune import REPEATS, TOLERANCE, tune


def add_tune_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `prefetch tune`."""
    parser = subparsers.add_parser(
        "tune",
        help="find the smallest loader configuration that keeps up with a training step",
        description=(
            "Run short Loader trials on an image folder over backend x depth x workers, with a "
            "simulated training step of --step-ms per batch, stopping early along workers, and "
            "measure each configuration found in --repeats rounds; print the table (medians "
            "and the spread of the rounds) and the smallest configuration within --tolerance "
            "of the best. When the figures are noise (the load average before the search above "
            "the usable cores, or the rounds of a configuration that could be chosen spread "
            "over --max-spread), that configuration is still given, as the best answer the "
            "data supports, with its range, what it cannot be told from and what would "
            "sharpen it."
        ),
    )
    _add_tune_work_arguments(parser)
    _add_tune_search_arguments(parser)
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (default: none)")
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="draw images/s against workers (matplotlib; default: none)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or notes")
    parser.set_defaults(handler=run_tune, parser=parser)


def _add_tune_work_arguments(parser: argparse.ArgumentParser) -> None:
    """Register what `prefetch tune` loads and the step: ROOT, --step-ms to --image-size."""
    parser.add_argument("root", help="image folder (root/<class>/<image>)")
    parser.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="your training step per batch, in ms (default: none: the loader alone, which "
        "needs more workers than a step that takes time). To measure it, time a few hundred "
        "steps of model.train_on_batch on one batch held in memory, or read Keras's ms/step "
        "from a fit on data already in memory",
    )
    add_batch_shape_arguments(parser)


def _add_tune_search_arguments(parser: argparse.ArgumentParser) -> None:
    """Register what `prefetch tune` tries and how it judges: --backends to --max-spread."""
    parser.add_argument(
        "--backends",
        default="thread,process",
        help="comma-separated backends to try (default thread,process)",
    )
    parser.add_argument(
        "--depths", default="1,2,4", help="comma-separated depths to try (default 1,2,4)"
    )
    parser.add_argument(
        "--max-workers",
        type=positive_int,
        help="most workers tried (default: 2 x the usable cores)",
    )
    parser.add_argument(
        "--trial-batches",
        type=positive_int,
        default=TRIAL_BATCHES,
        help=f"batches timed per trial, after a warm-up batch (default {TRIAL_BATCHES})",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=REPEATS,
        help=f"rounds per configuration; medians and spread are reported (default "
        f"{REPEATS}; 1 cannot tell noise)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help="the recommendation is the smallest configuration within this share of the best "
        f"(default {TOLERANCE:g})",
    )
    parser.add_argument(
        "--max-spread",
        type=float,
        metavar="SHARE",
        help="largest (highest - lowest) / median of a configuration's rounds that counts as "
        f"steady (default: {SPREAD_PER_TOLERANCE:g} x --tolerance, "
        f"{SPREAD_PER_TOLERANCE * TOLERANCE:g})",
    )


def run_tune(args: argparse.Namespace) -> int:
    """`prefetch tune`: search, print the table and the recommendation."""
    parser: argparse.ArgumentParser = args.parser
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"--plot needs matplotlib: {MATPLOTLIB_HINT}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in ("thread", "process") for b in backends):
        parser.error(f"--backends: choose from thread,process; got {args.backends!r}")
    try:
        depths = [int(d) for d in args.depths.split(",") if d.strip()]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1:
        parser.error(f"--depths: give ints >= 1 like 1,2,4; got {args.depths!r}")
    if args.step_ms is None and not args.quiet:
        print(
            "prefetch tune: no --step-ms: measuring the loader alone, without a training step; "
            f"to size the loader for your training, {STEP_HOW_TO}",
            file=sys.stderr,
        )
    bar = ProgressBar(sys.stderr, enabled=sys.stderr.isatty() and not args.quiet)
    try:
        report = tune(
            args.root,
            step_ms=0.0 if args.step_ms is None else args.step_ms,
            batch_size=args.batch_size,
            image_size=args.image_size,
            backends=backends,
            depths=depths,
            max_workers=args.max_workers,
            trial_batches=args.trial_batches,
            tolerance=args.tolerance,
            progress=bar,
            repeats=args.repeats,
            max_spread=args.max_spread,
        )
    except (ValueError, FileNotFoundError) as error:
        bar.close()
        parser.error(str(error))
    finally:
        bar.close()
    print(report.format_table())
    written = []
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report.as_dict(), out, indent=2)
        written.append(f"the report to {args.json}")
    if args.plot:
        report.plot(args.plot)
        written.append(f"the plot to {args.plot}")
    if written:
        print(f"wrote {' and '.join(written)}")
    return 0
