"""`prefetch shards`: its arguments, and running it (`_writer` writes).

`add_shards_parser(subparsers)` registers the subcommand and its actions: `write`
(`handler=run_shards_write`: at once a line on stderr saying what it lists, then how many files
it checks, then a progress line (`_progress`; none of these with --quiet), a line per shard
with --verbose, then a summary naming the files skipped and the Python lines that read the
shards back (`read_back`)) and `verify` (`handler=run_shards_verify`, `_verify_command`: each
manifest in OUT against its set, with every check a reader makes and then each shard's
SHA-256; exit status 1 on any difference). A refusal at run time is one line on stderr, exit
status 2 (`_verify_command.refuse`); a mistake in the command line gets argparse's usage.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from prefetch._messages import counted
from prefetch.runtime import usable_cores
from prefetch.sources.shards import read_manifest, reproducible
from prefetch.tools._command_args import positive_int
from prefetch.tools.shards._fit_crop import DEFAULT_QUALITY, quality_problem
from prefetch.tools.shards._job import ALREADY_COMPLETE
from prefetch.tools.shards._names import DEFAULT_PREFIX, check_prefix, shard_pattern
from prefetch.tools.shards._progress import ProgressLine
from prefetch.tools.shards._resume import progress_name
from prefetch.tools.shards._set import CLASSES_FILE, classes_text
from prefetch.tools.shards._verify_command import refuse, run_shards_verify, said
from prefetch.tools.shards._writer import FORMATS, write_shards

# `prefetch shards write` defaults.
DEFAULT_FORMAT = "tar"
DEFAULT_SHARD_SIZE = 1000

_SHUFFLE_WHY = (
    "Samples are shuffled once before they are cut into shards: a streaming reader's shuffle "
    "buffer only mixes samples that are near each other, so shards in the folder's class order "
    "would give batches of one class."
)


def add_shards_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `prefetch shards` and its actions `write` and `verify`."""
    parser = subparsers.add_parser(
        "shards",
        help="write an image folder into tar (WebDataset) or TFRecord shards (shards write), "
        "or check a set of them against its manifest (shards verify)",
        description=(
            "Work with shards: a dataset packed into a few large files that stream fast from "
            "disks and object stores. `write FOLDER OUT` packs an image folder (defaults: "
            f"--format {DEFAULT_FORMAT}, --shard-size {DEFAULT_SHARD_SIZE}, shuffled with "
            f"--seed 0). {_SHUFFLE_WHY} `verify OUT` checks the set in OUT against its manifest."
        ),
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    write = actions.add_parser(
        "write",
        help="pack an image folder (FOLDER/<class>/<image>) into shards in OUT",
        description=(
            "Pack the images of FOLDER (one subfolder per class, listed with Keras's rules) "
            "into shards in OUT, copying the image bytes as stored (re-encoded only with "
            "--fit-crop). tar: WebDataset layout, PREFIX-000000.tar, ..., sample k as the "
            "members <k:09d>.<ext> (the image) and <k:09d>.cls (its label). tfrecord: "
            "PREFIX-00000-of-0000N.tfrecord, ..., one tf.train.Example per sample "
            f"(image/encoded, image/class/label, image/format, image/filename). {_SHUFFLE_WHY} "
            "Each image's header is read: an empty file, one that is not an image or one over "
            "the readers' limits is skipped and named in the summary (--strict: refused). "
            "Every shard is written under a temporary name, then the set is put in place "
            "together and its manifest (OUT/PREFIX-FORMAT.manifest.json: names, sizes, "
            "sample counts, SHA-256, class names) written last, so an interrupted or failed "
            "run leaves the earlier set or the new one, never a mix; the same input and "
            "options give the same bytes, for any --workers. An interrupted run keeps the "
            "shards it finished (hidden): the same command again continues from them. One "
            "writer at a time: OUT is locked while a write runs. OUT/classes.txt (line i names "
            "label i) is written when no class name holds a line break."
        ),
    )
    write.add_argument("folder", metavar="FOLDER", help="image folder (FOLDER/<class>/<image>)")
    write.add_argument("out", metavar="OUT", help="folder to write the shards into (created)")
    write.add_argument(
        "--format",
        choices=FORMATS,
        default=DEFAULT_FORMAT,
        help=f"shard format (default {DEFAULT_FORMAT})",
    )
    write.add_argument(
        "--shard-size",
        type=positive_int,
        default=DEFAULT_SHARD_SIZE,
        metavar="N",
        help=f"samples per shard; the last shard holds the rest (default {DEFAULT_SHARD_SIZE})",
    )
    write.add_argument(
        "--seed", type=int, default=0, help="seed of the one shuffle before sharding (default 0)"
    )
    write.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        help="keep the folder's listing order (default: shuffle)",
    )
    write.add_argument(
        "--prefix",
        type=_prefix,
        default=DEFAULT_PREFIX,
        help=f"start of the shard file names (default {DEFAULT_PREFIX})",
    )
    write.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the set of shards with the same names in OUT, as a whole (default: "
        "refuse to write over them)",
    )
    write.add_argument(
        "--strict",
        action="store_true",
        help="refuse a file that is empty, not an image, over the readers' limits or (with "
        "--fit-crop) one that cannot be decoded (default: skip it and name it)",
    )
    write.add_argument(
        "--fit-crop",
        type=positive_int,
        default=None,
        metavar="SIZE",
        help="re-encode each image larger than needed at the smallest size at which every "
        "RandomResizedCrop window (scale 0.08-1, ratio 3/4-4/3) is still at least SIZE "
        "pixels on each side; smaller images are kept byte for byte. Lossy (JPEGs are "
        "compressed again, at --fit-crop-quality): not for evaluation data, other crop "
        "recipes or a larger image size later (default: off, every image copied as stored)",
    )
    write.add_argument(
        "--fit-crop-quality",
        type=_jpeg_quality,
        default=None,
        metavar="Q",
        help="JPEG quality (1-100) of the images --fit-crop re-encodes (default "
        f"{DEFAULT_QUALITY}: fewer bytes and faster reads; 95 keeps the crops closer "
        "to the original pixels); needs --fit-crop",
    )
    write.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="worker processes that read, check and re-encode the images (default: the cores "
        "this process may use); the shards are the same bytes for any N; 1 works in this "
        "process",
    )
    shown = write.add_mutually_exclusive_group()
    shown.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line, only the summary at the end (default: a progress line on "
        "stderr, redrawn on a terminal, else a line every few seconds)",
    )
    shown.add_argument(
        "--verbose",
        action="store_true",
        help="also a line for each shard as it is written (default: off)",
    )
    write.set_defaults(handler=run_shards_write, parser=write)
    verify = actions.add_parser(
        "verify",
        help="check the set of shards in OUT against its manifest (all a reader checks, "
        "then SHA-256)",
        description=(
            "Check each set of shards in OUT against its manifest (PREFIX-FORMAT.manifest.json, "
            "as `write` leaves): everything a reader checks when a source is made (one manifest "
            "per format, no unfinished write, every shard there at its size, no extra shard of "
            "the set's names, classes.txt naming the manifest's classes, each shard's sample "
            "count), sizes first, then the SHA-256 of every shard of the right size, reading "
            "every byte. Exit status 0 when all match, 1 on any difference (each named)."
        ),
    )
    verify.add_argument("out", metavar="OUT", help="the folder of the shards")
    verify.set_defaults(handler=run_shards_verify, parser=verify)


def run_shards_write(args: argparse.Namespace) -> int:
    """`prefetch shards write`: say what it lists at once, write the shards with a progress
    line, then the summary. A refusal at run time (OUT holds a set, another writer holds its
    lock, every file skipped, `--strict` refusing a file) is one line on stderr, exit status 2."""
    parser: argparse.ArgumentParser = args.parser
    skipped: list[tuple[str, str]] = []
    line = None if args.quiet else ProgressLine(sys.stderr)
    complete: list[str] = []

    def report(path: str, samples: int, size: int) -> None:
        if args.verbose:
            if line is not None:
                line.interrupt()
            print(f"{path}  {counted(samples, 'sample')}  {size / 1e6:.1f} MB", flush=True)

    def note(text: str) -> None:
        if text.startswith(ALREADY_COMPLETE):
            complete.append(text)
        if line is not None:
            line.interrupt()
        print(text, flush=True)

    if args.fit_crop_quality is not None and args.fit_crop is None:
        parser.error(
            f"--fit-crop-quality {args.fit_crop_quality} needs --fit-crop SIZE (it is the "
            "quality of the images --fit-crop re-encodes): add --fit-crop 224, or leave "
            "--fit-crop-quality out"
        )
    quality = DEFAULT_QUALITY if args.fit_crop_quality is None else args.fit_crop_quality
    workers = usable_cores() if args.workers is None else args.workers
    started = time.monotonic()
    if line is not None:
        line.say(f"listing {args.folder} (one subfolder per class) ...")
    try:
        paths = write_shards(
            args.folder,
            args.out,
            format=args.format,
            shard_size=args.shard_size,
            seed=args.seed,
            shuffle=args.shuffle,
            prefix=args.prefix,
            overwrite=args.overwrite,
            strict=args.strict,
            fit_crop=args.fit_crop,
            fit_crop_quality=quality,
            workers=workers,
            on_shard=report,
            on_skip=lambda path, reason: skipped.append((path, reason)),
            on_progress=None if line is None else line.update,
            on_note=note,
            on_status=None if line is None else line.say,
        )
    except (ValueError, OSError) as error:
        if line is not None:
            line.interrupt()
        return refuse(args, said(error))
    except BaseException:
        if line is not None:
            line.interrupt()
        journal = os.path.join(args.out, progress_name(args.format, args.prefix))
        if os.path.isfile(journal):
            print(
                "the shards finished so far are kept (hidden) in "
                f"{args.out}: run the same command again to continue from them",
                file=sys.stderr,
            )
        raise
    if line is not None:
        line.finish()
    elapsed = time.monotonic() - started
    written = read_manifest(paths[:1], args.format)
    entries = written[0].shards if written is not None else ()
    samples = sum(entry.samples for entry in entries)
    size = sum(entry.size for entry in entries)
    if not complete:
        print(
            f"wrote {counted(samples, 'sample')} in {counted(len(paths), args.format + ' shard')} "
            f"({size / 1e6:.1f} MB) and their manifest to {args.out} in {elapsed:.1f} s "
            f"({counted(workers, 'worker')})" + (f", skipped {len(skipped)}:" if skipped else "")
        )
    if written is not None and classes_text(written[0].class_names) is None:
        print(
            f"  {CLASSES_FILE} not written: a class name holds a line break (the "
            "manifest names the classes; the sources read them from it)"
        )
    if written is not None and args.fit_crop is not None and not complete:
        resized = written[0].options.get("fit_crop", {}).get("resized", 0)
        print(
            f"  --fit-crop {args.fit_crop}: {resized} images re-encoded smaller (lossy, JPEG "
            f"quality {quality}), the others stored as they were"
        )
    for path, reason in skipped[:_SKIPS_SHOWN]:
        print(f"  skipped {path}: {reproducible(reason)}")
    if len(skipped) > _SKIPS_SHOWN:
        print(f"  and {len(skipped) - _SKIPS_SHOWN} more (all are listed in the manifest)")
    for text in read_back(args.out, args.format, args.prefix, args.fit_crop):
        print(text)
    return 0


def read_back(out: str, format: str, prefix: str, fit_crop: int | None) -> list[str]:
    """The summary's lines that show how to read the shards back: with `fit_crop`, at that
    size with the RandomResizedCrop the shards were fitted to (the windows of a larger size
    would be scaled up); otherwise at a size to choose (224 shown)."""
    pattern = os.path.join(out, shard_pattern(format, prefix))
    source = "TarSource" if format == "tar" else "TFRecordSource"
    lines = ["read them back with:", "  import prefetch"]
    if fit_crop is None:
        lines.append(
            f"  loader = prefetch.Loader(prefetch.{source}({pattern!r}), batch_size=32, "
            "image_size=(224, 224))  # the size your model takes"
        )
        return lines
    lines += [
        f"  # --fit-crop {fit_crop}: every RandomResizedCrop window (its default scale and ratio) "
        f"holds at least {fit_crop}x{fit_crop} pixels: train at image_size {fit_crop} or less",
        f"  loader = prefetch.Loader(prefetch.{source}({pattern!r}), batch_size=32, "
        f"image_size=({fit_crop}, {fit_crop}), "
        "augment=prefetch.Augment(prefetch.RandomResizedCrop(), flip=True))",
    ]
    return lines


def _prefix(text: str) -> str:
    """Parse --prefix: the start of a file name (`check_prefix`)."""
    try:
        check_prefix(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _jpeg_quality(text: str) -> int:
    """Parse --fit-crop-quality: an int from 1 to 100 (`quality_problem`)."""
    try:
        value: int | str = int(text)
    except ValueError:
        value = text
    problem = quality_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    assert isinstance(value, int)
    return value


# Skipped files named one by one in the summary (the manifest lists them all).
_SKIPS_SHOWN = 20
