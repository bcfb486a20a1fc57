"""`prefetch shards`: its arguments, and running it (`prefetch.tools.shard_writer` writes).

`add_shards_parser(subparsers)` registers the subcommand and its action `write` with
`handler=run_shards_write`. One line is printed per shard as it is put in place, then a summary
with the Python lines that read the shards back.
"""

from __future__ import annotations

import argparse
import os

from prefetch.messages import counted
from prefetch.tools import shard_writer
from prefetch.tools.command_args import positive_int

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
            "into shards in OUT, copying the image bytes as stored (no re-encode), and write "
            "OUT/classes.txt (line i names label i). tar: WebDataset layout, "
            "PREFIX-000000.tar, ..., sample k as the members <k:09d>.<ext> (the image) and "
            "<k:09d>.cls (its label). tfrecord: PREFIX-00000-of-0000N.tfrecord, ..., one "
            "tf.train.Example per sample (image/encoded, image/class/label, image/format, "
            f"image/filename). {_SHUFFLE_WHY} Each shard is written under a temporary name "
            "and renamed when complete, so an interrupted run leaves no shard that looks "
            "complete; the same input and options give the same bytes."
        ),
    )
    write.add_argument("folder", metavar="FOLDER", help="image folder (FOLDER/<class>/<image>)")
    write.add_argument("out", metavar="OUT", help="folder to write the shards into (created)")
    write.add_argument(
        "--format",
        choices=shard_writer.FORMATS,
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
        default=shard_writer.DEFAULT_PREFIX,
        help=f"start of the shard file names (default {shard_writer.DEFAULT_PREFIX})",
    )
    write.add_argument(
        "--overwrite",
        action="store_true",
        help="replace shards with the same names in OUT (default: refuse to write over them)",
    )
    write.set_defaults(handler=run_shards_write, parser=write)


def run_shards_write(args: argparse.Namespace) -> int:
    """`prefetch shards write`: write the shards, one line each, then the summary."""
    parser: argparse.ArgumentParser = args.parser
    totals = {"samples": 0, "bytes": 0}

    def report(path: str, samples: int) -> None:
        size = os.path.getsize(path)
        totals["samples"] += samples
        totals["bytes"] += size
        print(f"{path}  {counted(samples, 'sample')}  {size / 1e6:.1f} MB", flush=True)

    try:
        paths = shard_writer.write_shards(
            args.folder,
            args.out,
            format=args.format,
            shard_size=args.shard_size,
            seed=args.seed,
            shuffle=args.shuffle,
            prefix=args.prefix,
            overwrite=args.overwrite,
            on_shard=report,
        )
    except (ValueError, OSError) as error:
        parser.error(str(error))
    print(
        f"wrote {counted(totals['samples'], 'sample')} in "
        f"{counted(len(paths), args.format + ' shard')} "
        f"({totals['bytes'] / 1e6:.1f} MB) and {shard_writer.CLASSES_FILE} to {args.out}"
    )
    pattern = os.path.join(args.out, shard_writer.shard_pattern(args.format, args.prefix))
    source = "TarSource" if args.format == "tar" else "TFRecordSource"
    print("read them back with:")
    print("  import prefetch")
    print(
        f"  loader = prefetch.Loader(prefetch.{source}({pattern!r}), batch_size=32, "
        "image_size=(224, 224))"
    )
    return 0
