"""`prefetch bench`: its arguments, and running it (`prefetch.tools.bench` measures).

`add_bench_parser(subparsers)` registers the subcommand with `handler=run_bench`. Rows are
printed as they are measured when stdout is not a terminal; a progress bar is drawn on one.
A mistake in the command line gets argparse's usage; a folder refused at run time (missing,
empty, not one of class subfolders) is one line (`refuse`), exit status 2 either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
from contextlib import ExitStack
from typing import NoReturn

from prefetch.plan import CenterCrop, Crop, RandomResizedCrop
from prefetch.tools._command_args import (
    ProgressBar,
    add_batch_shape_arguments,
    positive_int,
)
from prefetch.tools.bench._loaders import LOADER_NAMES
from prefetch.tools.bench._machine import SAMPLE_SIZE, write_sample_folder
from prefetch.tools.bench._report import BenchReport, Measurement
from prefetch.tools.bench._run import DECODE_SAMPLE, run
from prefetch.tools.bench._steady import SPAN_EPOCH_CAP, TIMED_EPOCHS
from prefetch.tools.timeline import MATPLOTLIB_HINT

# `prefetch bench --crop`: the training and evaluation shapes of the work.
CROP_CHOICES: dict[str, Crop] = {"random-resized": RandomResizedCrop(), "center": CenterCrop()}


def add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `prefetch bench`."""
    parser = subparsers.add_parser(
        "bench",
        help="compare loaders on an image folder against the machine's decode limit",
        description=(
            "Measure, on one image folder (root/<class>/<image>), the single-core decode rate "
            "(the decode limit is usable cores x the best rate), the entropy floor (entropy "
            "decoding alone x usable cores: the limit of any libjpeg-turbo loader) and the "
            "steady-state images/s of a Python loop, a 15-line thread pool, prefetch.Loader "
            "with its defaults, prefetch threads and processes, and tf.data AUTOTUNE, Keras "
            "image_dataset_from_directory and torch DataLoader where installed, each as a "
            "training job runs it: one long-lived pipeline in a fresh process, a warm-up "
            "untimed, then several epochs timed. Without the "
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
        "is)".format(*SAMPLE_SIZE),
    )


def _add_bench_measure_arguments(parser: argparse.ArgumentParser) -> None:
    """Register what `prefetch bench` measures and how: --batch-size to --antialias."""
    add_batch_shape_arguments(parser)
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
        help="rounds: every loader is measured once per round, rows alternating; medians "
        "are reported (default 3)",
    )
    parser.add_argument(
        "--warmup-images",
        type=positive_int,
        metavar="N",
        help="images each row takes untimed after its pipeline starts (default: one epoch, "
        f"at most {SPAN_EPOCH_CAP})",
    )
    parser.add_argument(
        "--timed-images",
        type=positive_int,
        metavar="N",
        help=f"images each row is timed on after its warm-up (default: {TIMED_EPOCHS} epochs, "
        f"at most {TIMED_EPOCHS * SPAN_EPOCH_CAP})",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="measure every row in this process instead of a fresh one each (quicker to "
        "start; rows then share TensorFlow's runtime and the memory of the rows before)",
    )
    parser.add_argument(
        "--loaders",
        default=",".join(LOADER_NAMES),
        help=f"comma-separated subset of {','.join(LOADER_NAMES)} (default: all available)",
    )
    parser.add_argument(
        "--decode-sample",
        type=positive_int,
        default=DECODE_SAMPLE,
        metavar="N",
        help=f"images per single-core decode measurement (default {DECODE_SAMPLE})",
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
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no TensorFlow C++ log in the table
    bar = ProgressBar(sys.stderr, enabled=sys.stderr.isatty() and not args.quiet)
    rows = print_measurement if _prints_rows(args) else None
    with ExitStack() as stack:
        root = _bench_root(args, parser, stack)
        timeline_batches = args.timeline_batches if args.timeline or args.timeline_text else 0
        try:
            report = run(
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
                warmup_images=args.warmup_images,
                timed_images=args.timed_images,
                isolate=not args.in_process,
            )
        except (ValueError, FileNotFoundError) as error:
            bar.close()
            refuse(parser, str(error))
        finally:
            bar.close()
    _write_bench_outputs(args, report)
    return 0


def _prints_rows(args: argparse.Namespace) -> bool:
    """Whether `prefetch bench` prints each round's figures as measured: when stdout is not
    a terminal (where the progress bar shows progress instead) and not --quiet."""
    return not args.quiet and not sys.stdout.isatty()


def print_measurement(measurement: Measurement) -> None:
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
    unknown = [key for key in loaders if key not in LOADER_NAMES]
    if unknown:
        parser.error(f"--loaders: unknown {unknown}; choose from {','.join(LOADER_NAMES)}")
    return loaders


def _bench_root(args: argparse.Namespace, parser: argparse.ArgumentParser, stack: ExitStack) -> str:
    """ROOT, after --generate writes its sample into it (or into a temporary folder on `stack`)."""
    root = args.root
    if args.generate is not None:
        if root is None:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="prefetch-bench-"))
        width, height = SAMPLE_SIZE
        note = f"writing {args.generate} sample JPEGs of {width}x{height} into {root}"
        if not args.quiet:
            print(note, file=sys.stderr)
        try:
            write_sample_folder(root, args.generate)
        except (ValueError, FileExistsError) as error:
            refuse(parser, str(error))
    return str(root)


def refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Exit with status 2 and `prefetch bench: error: <message>` on stderr, as argparse does,
    without its usage: the command line was right, the folder it names was not."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _write_bench_outputs(args: argparse.Namespace, report: BenchReport) -> None:
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
