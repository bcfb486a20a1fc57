"""`prefetch shards`: its arguments, and running it (`_writer` writes).

`add_shards_parser(subparsers)` registers the subcommand and its actions: `write`
(`handler=run_shards_write`: a progress line on stderr (`_progress`; none
with --quiet), a line per shard with --verbose, then a summary naming the files skipped and the
Python lines that read the shards back) and `verify` (`handler=run_shards_verify`: each manifest
in OUT against its set, with every check a reader makes and then each shard's SHA-256; exit
status 1 on any difference).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from prefetch._messages import counted
from prefetch.runtime import usable_cores
from prefetch.sources.shards import (
    MAX_MANIFEST_BYTES,
    Manifest,
    is_manifest_name,
    manifests_of,
    read_manifest,
    reproducible,
)
from prefetch.sources.shards import verify as verify_manifest
from prefetch.tools._command_args import positive_int
from prefetch.tools.shards._fit_crop import DEFAULT_QUALITY, quality_problem
from prefetch.tools.shards._names import DEFAULT_PREFIX, shard_pattern
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._progress import ProgressLine
from prefetch.tools.shards._resume import progress_name
from prefetch.tools.shards._set import CLASSES_FILE, classes_text
from prefetch.tools.shards._writer import ALREADY_COMPLETE, FORMATS, write_shards

# `prefetch shards write` defaults.
DEFAULT_FORMAT = "tar"
DEFAULT_SHARD_SIZE = 1000

_SHUFFLE_WHY = (
    "Samples are shuffled once before they are cut into shards: a streaming reader's shuffle "
    "buffer only mixes samples that are near each other, so shards in the folder's class order "
    "would give batches of one class."
)


def add_shards_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `prefetch shards` and its action `write`."""
    parser = subparsers.add_parser(
        "shards",
        help="write an image folder into tar (WebDataset) or TFRecord shards",
        description=(
            "Work with shards: a dataset packed into a few large files that stream fast from "
            "disks and object stores. `write FOLDER OUT` packs an image folder (defaults: "
            f"--format {DEFAULT_FORMAT}, --shard-size {DEFAULT_SHARD_SIZE}, shuffled with "
            f"--seed 0). {_SHUFFLE_WHY}"
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


def run_shards_verify(args: argparse.Namespace) -> int:
    """`prefetch shards verify`: each manifest's shards against their sizes and SHA-256; what
    to do after a difference."""
    if not os.path.isdir(args.out):
        return refuse(args, f"{args.out!r} is not a folder")
    try:
        failed, found = _verify_all(args.out)
    except OSError as error:
        return refuse(args, said(error))
    if not found:
        alone = (
            f" ({CLASSES_FILE} alone is not one)"
            if os.path.exists(os.path.join(args.out, CLASSES_FILE))
            else ""
        )
        return refuse(
            args,
            f"no manifest in {args.out!r}{alone}: write the shards with `prefetch shards "
            "write` to get one",
        )
    return 1 if failed else 0


def refuse(args: argparse.Namespace, message: str) -> int:
    """Print `prefetch shards <action>: error: <message>` on stderr (one line, no usage: the
    command line was right, the folder or the files refused); return exit status 2."""
    print(f"prefetch shards {args.action}: error: {message}", file=sys.stderr, flush=True)
    return 2


def said(error: BaseException) -> str:
    """An error as a person reads it: an OSError's own words without Python's `[Errno 11] `
    prefix (with the file it names, as `str` gives it)."""
    if isinstance(error, OSError) and error.strerror:
        text = error.strerror
        if error.filename is not None:
            text += f": {error.filename!r}"
        if error.filename2 is not None:
            text += f" -> {error.filename2!r}"
        return text
    return str(error)


def _verify_all(folder: str) -> tuple[bool, int]:
    """Verify every manifest in `folder`, printing one line each (and one per problem);
    return (whether one failed, how many manifests there are)."""
    failed = False
    found = 0
    with OutFolder(folder) as out:
        names = sorted(out.names())
        for format in ("tar", "tfrecord"):
            several = manifests_of(names, format)
            if len(several) > 1:
                print(
                    f"{folder}: {len(several)} manifests of {format} shards "
                    f"({', '.join(several)}): a reader refuses a folder of two sets"
                )
                failed = True
        for name in names:
            if not is_manifest_name(name):
                continue
            found += 1
            try:
                data = out.read_small(name, MAX_MANIFEST_BYTES)
                manifest = Manifest.from_bytes(data or b"", out.where(name))
            except (ValueError, OSError) as error:
                print(f"{out.where(name)}: {error}")
                failed = True
                continue
            if not manifest.complete:
                print(f"{out.where(name)}: an interrupted write (run the write again)")
                failed = True
                continue
            problems = verify_manifest(folder, manifest, names)
            for problem in problems:
                print(f"{out.where(problem)}")  # "<shard>: what differs"
            if problems:
                print(_repair(folder, manifest, problems))
            failed = failed or bool(problems)
            if not problems:
                samples = sum(entry.samples for entry in manifest.shards)
                print(f"{out.where(name)}: {len(manifest.shards)} shards, {samples} samples: OK")
    return failed, found


def _repair(folder: str, manifest: Manifest, problems: list[str]) -> str:
    """What to do after `verify` found `problems` in the set of `manifest` in `folder`."""
    stray = [p for p in problems if p.endswith(_STRAY)]
    steps = []
    if len(stray) < len(problems):
        options = manifest.options
        flags = [f"--format {manifest.format}", f"--prefix {manifest.prefix}"]
        flags.append(f"--shard-size {options.get('shard_size', DEFAULT_SHARD_SIZE)}")
        flags.append(f"--seed {options.get('seed', 0)}")
        flags += ["--no-shuffle"] if options.get("shuffle") is False else []
        flags += ["--strict"] if options.get("strict") else []
        fit = options.get("fit_crop")
        if isinstance(fit, dict) and "size" in fit:
            flags.append(f"--fit-crop {fit['size']}")
            flags += [f"--fit-crop-quality {fit['jpeg_quality']}"] if "jpeg_quality" in fit else []
        steps.append(
            "copy the files named above again from a good copy of the set, or write the set "
            f"again from its image folder: prefetch shards write FOLDER {folder} --overwrite "
            + " ".join(flags)
        )
    if stray:
        steps.append(
            "remove the shards not in the manifest (or move them to a folder of their own)"
        )
    return "  to repair it: " + "; ".join(steps)


# How `verify` names a file of the set's names that its manifest does not list.
_STRAY = ": not in the manifest (left from another write?)"


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
