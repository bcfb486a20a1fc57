"""The `prefetch` command (also `python -m prefetch`): subcommands, each in its own function.

`main(argv)` parses and dispatches; it returns the exit status (0 success, 2 bad input, 130
Ctrl-C). A subcommand is added with an `add_<name>_parser(subparsers)` function that registers
its arguments and sets `handler=<function(args) -> int>`; `build_parser` calls each one.
Bad input is reported as `prefetch <command>: error: <message>` on stderr, without traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import TextIO

import prefetch
from prefetch.augment import CenterCrop, Crop, RandomResizedCrop
from prefetch.backends.shm import sweep_stale
from prefetch.tools import bench, tune
from prefetch.tools.timeline import MATPLOTLIB_HINT

# Width of the progress bar, in characters.
BAR_WIDTH = 30
# `prefetch bench --crop`: the training and evaluation shapes of the work.
CROP_CHOICES: dict[str, Crop] = {"random-resized": RandomResizedCrop(), "center": CenterCrop()}
# The progress bar redraws at most this often (and at the end).
BAR_REDRAW_S = 0.1


class ProgressBar:
    """A one-line text progress bar on `stream`, redrawn in place; inert when not enabled.

    Call it as `bar(done, total, label)`; `close()` erases the line. Needs no dependency.
    """

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self._drawn = 0
        self._last = 0.0

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < BAR_REDRAW_S:
            return
        self._last = now
        fraction = min(done / total, 1.0) if total > 0 else 1.0
        filled = round(fraction * BAR_WIDTH)
        line = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:4.0%} {label}"
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

    def close(self) -> None:
        """Erase the bar's line."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def image_size(text: str) -> tuple[int, int]:
    """Parse "224" or "224x192" (height x width) into (height, width)."""
    parts = text.lower().split("x")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"image size must be SIZE or HEIGHTxWIDTH in pixels, like 224 or 224x192; got {text!r}"
        )
    return values[0], values[1]


def positive_int(text: str) -> int:
    """Parse an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `prefetch bench`."""
    parser = subparsers.add_parser(
        "bench",
        help="compare loaders on an image folder against the machine's decode limit",
        description=(
            "Measure, on one image folder (root/<class>/<image>), the single-core decode rate "
            "(the decode limit is usable cores x the best rate) and the images/s and consumer "
            "wait of a Python loop, a 15-line thread pool, prefetch.Loader with its defaults, "
            "prefetch threads and processes, and tf.data AUTOTUNE, Keras "
            "image_dataset_from_directory and torch DataLoader where installed. Without the "
            "fast extra, it estimates what installing it would gain. On a terminal a progress "
            "bar runs on stderr; when the output is not a terminal (a pipe, a file), each "
            "round's figures are printed as they are measured, then the table."
        ),
    )
    _add_bench_folder_arguments(parser)
    _add_bench_measure_arguments(parser)
    _add_bench_output_arguments(parser)
    parser.set_defaults(handler=run_bench, parser=parser)


def _add_bench_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `prefetch bench`'s ROOT and --generate."""
    parser.add_argument(
        "root", nargs="?", help="image folder; with --generate, a new folder to generate into"
    )
    parser.add_argument(
        "--generate",
        type=positive_int,
        metavar="N",
        help="first write N sample JPEGs of {}x{} into ROOT (kept), or into a temporary "
        "folder (removed) when ROOT is not given (default: none; ROOT is measured as it "
        "is)".format(*bench.SAMPLE_SIZE),
    )


def _add_bench_measure_arguments(parser: argparse.ArgumentParser) -> None:
    """Register what `prefetch bench` measures and how: --batch-size to --antialias."""
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="images per batch (default 32)"
    )
    parser.add_argument(
        "--image-size",
        type=image_size,
        default=(224, 224),
        metavar="HxW",
        help="size every image is decoded to: SIZE or HEIGHTxWIDTH (default 224x224)",
    )
    parser.add_argument(
        "--workers", type=positive_int, help="workers per loader (default: the usable cores)"
    )
    parser.add_argument(
        "--depth",
        type=positive_int,
        default=2,
        help="batches in flight for the prefetch threads and processes rows (default 2)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="simulated training step per batch, in ms (default 0: the loaders alone)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        help="rounds: every loader runs one epoch per round; medians are reported (default 3)",
    )
    parser.add_argument(
        "--loaders",
        default=",".join(bench.LOADER_NAMES),
        help=f"comma-separated subset of {','.join(bench.LOADER_NAMES)} (default: all available)",
    )
    parser.add_argument(
        "--decode-sample",
        type=positive_int,
        default=bench.DECODE_SAMPLE,
        metavar="N",
        help=f"images per single-core decode measurement (default {bench.DECODE_SAMPLE})",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of every loader's shuffle (default 0)"
    )
    parser.add_argument(
        "--crop",
        choices=tuple(CROP_CHOICES),
        help="the training shape of the work (random-resized: RandomResizedCrop() and a random "
        "flip; tf.data runs TF Model Garden's decode_and_crop_jpeg recipe) or the evaluation "
        "shape (center: CenterCrop(0.875)); default: whole images resized",
    )
    parser.add_argument(
        "--antialias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the loop, pool, prefetch threads and prefetch processes rows resize "
        "with antialiasing (default: the Loader's default); --no-antialias resizes like "
        "tf.data and Keras (bilinear without antialiasing), so all loaders do the same work",
    )


def _add_bench_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `prefetch bench`'s outputs: --json, --plot, the timeline's options, --quiet."""
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON (default: none)")
    parser.add_argument(
        "--plot", metavar="PNG", help="draw images/s per loader (matplotlib; default: none)"
    )
    parser.add_argument(
        "--timeline",
        metavar="PNG",
        help="record a timeline; draw its Gantt chart (matplotlib; default: none)",
    )
    parser.add_argument(
        "--timeline-text", action="store_true", help="record a timeline; print it as text only"
    )
    parser.add_argument(
        "--timeline-batches",
        type=positive_int,
        default=8,
        metavar="N",
        help="batches the timeline records (default 8)",
    )
    parser.add_argument(
        "--timeline-backend",
        choices=("thread", "process"),
        default="thread",
        help="backend of the loader the timeline records (default thread)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar, notes or rows as measured: the table only",
    )


def run_bench(args: argparse.Namespace) -> int:
    """`prefetch bench`: measure, print the table, write JSON and PNGs."""
    parser: argparse.ArgumentParser = args.parser
    loaders = _checked_bench_loaders(args, parser)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    bar = ProgressBar(sys.stderr, enabled=sys.stderr.isatty() and not args.quiet)
    rows = print_measurement if _prints_rows(args) else None
    with ExitStack() as stack:
        root = _bench_root(args, parser, stack)
        timeline_batches = args.timeline_batches if args.timeline or args.timeline_text else 0
        try:
            report = bench.run(
                root,
                batch_size=args.batch_size,
                image_size=args.image_size,
                workers=args.workers,
                depth=args.depth,
                step_ms=args.step_ms,
                repeats=args.repeats,
                loaders=loaders,
                decode_sample=args.decode_sample,
                seed=args.seed,
                timeline_batches=timeline_batches,
                timeline_backend=args.timeline_backend,
                progress=bar,
                antialias=args.antialias,
                crop=CROP_CHOICES[args.crop] if args.crop else None,
                on_measured=rows,
            )
        except (ValueError, FileNotFoundError) as error:
            bar.close()
            parser.error(str(error))
        finally:
            bar.close()
    _write_bench_outputs(args, report)
    return 0


def _prints_rows(args: argparse.Namespace) -> bool:
    """Whether `prefetch bench` prints each round's figures as measured: when stdout is not
    a terminal (where the progress bar shows progress instead) and not --quiet."""
    return not args.quiet and not sys.stdout.isatty()


def print_measurement(measurement: bench.Measurement) -> None:
    """Print one round's figure on stdout at once (a pipe or a file buffers it otherwise)."""
    print(measurement.text(), flush=True)


def _checked_bench_loaders(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The --loaders keys, after checking the arguments run_bench needs; exits on bad input."""
    for option, value in (("--plot", args.plot), ("--timeline", args.timeline)):
        if value and importlib.util.find_spec("matplotlib") is None:
            parser.error(f"{option} needs matplotlib: {MATPLOTLIB_HINT}")
    if args.root is None and args.generate is None:
        parser.error("give an image folder ROOT, or --generate N to measure a sample folder")
    if not args.step_ms >= 0:
        parser.error(f"--step-ms must be >= 0, got {args.step_ms}")
    loaders = [key.strip() for key in args.loaders.split(",") if key.strip()]
    unknown = [key for key in loaders if key not in bench.LOADER_NAMES]
    if unknown:
        parser.error(f"--loaders: unknown {unknown}; choose from {','.join(bench.LOADER_NAMES)}")
    return loaders


def _bench_root(args: argparse.Namespace, parser: argparse.ArgumentParser, stack: ExitStack) -> str:
    """ROOT, after --generate writes its sample into it (or into a temporary folder on `stack`)."""
    root = args.root
    if args.generate is not None:
        if root is None:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="prefetch-bench-"))
        width, height = bench.SAMPLE_SIZE
        note = f"writing {args.generate} sample JPEGs of {width}x{height} into {root}"
        if not args.quiet:
            print(note, file=sys.stderr)
        try:
            bench.write_sample_folder(root, args.generate)
        except (ValueError, FileExistsError) as error:
            parser.error(str(error))
    return str(root)


def _write_bench_outputs(args: argparse.Namespace, report: bench.BenchReport) -> None:
    """Print the table, write --json, --plot and --timeline, and say what was written."""
    if _prints_rows(args):
        print()  # after the rows printed as measured
    print(report.format_table())
    written = []
    if args.json:
        report.to_json(args.json)
        written.append(args.json)
    if args.plot:
        report.plot(args.plot)
        written.append(args.plot)
    if args.timeline and report.timeline is not None:
        report.timeline.plot(args.timeline, title=report.timeline_title())
        written.append(args.timeline)
    if written and not args.quiet:
        print(f"wrote {', '.join(written)}", file=sys.stderr)


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
            "of the best. No configuration is recommended when the figures are noise: the "
            "load average before the search above the usable cores, or the rounds of a "
            "configuration that could be chosen spread over --max-spread."
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
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="images per batch (default 32)"
    )
    parser.add_argument(
        "--image-size",
        type=image_size,
        default=(224, 224),
        metavar="HxW",
        help="size every image is decoded to: SIZE or HEIGHTxWIDTH (default 224x224)",
    )


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
        default=tune.TRIAL_BATCHES,
        help=f"batches timed per trial, after a warm-up batch (default {tune.TRIAL_BATCHES})",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=tune.REPEATS,
        help=f"rounds per configuration; medians and spread are reported (default "
        f"{tune.REPEATS}; 1 cannot tell noise)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=tune.TOLERANCE,
        help="the recommendation is the smallest configuration within this share of the best "
        f"(default {tune.TOLERANCE:g})",
    )
    parser.add_argument(
        "--max-spread",
        type=float,
        metavar="SHARE",
        help="largest (highest - lowest) / median of a configuration's rounds that counts as "
        f"steady (default: {tune.SPREAD_PER_TOLERANCE:g} x --tolerance, "
        f"{tune.SPREAD_PER_TOLERANCE * tune.TOLERANCE:g})",
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
            f"to size the loader for your training, {tune.STEP_HOW_TO}",
            file=sys.stderr,
        )
    bar = ProgressBar(sys.stderr, enabled=sys.stderr.isatty() and not args.quiet)
    try:
        report = tune.tune(
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
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report.as_dict(), out, indent=2)
    if args.plot:
        report.plot(args.plot)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The `prefetch` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="prefetch", description="prefetch: keep GPUs fed. Tools to measure and tune loading."
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `prefetch` command with `argv` (default: sys.argv[1:]); returns the exit status."""
    sweep_stale()  # segments of process-backend loaders that died (safe: prefetch.backends.shm)
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except KeyboardInterrupt:
        print(f"\nprefetch {args.command}: interrupted", file=sys.stderr)
        return 130
    return status
