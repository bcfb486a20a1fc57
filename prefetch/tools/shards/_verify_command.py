"""`prefetch shards verify`, and how both actions refuse: one line, no usage block.

`run_shards_verify` checks each manifest in OUT against its set (every check a reader makes,
then each shard's SHA-256: `prefetch.sources.shards.verify`), prints a line per difference and
then how to repair the set (`_repair`: copy the files again, or the `prefetch shards write`
command that writes it again, with the options its manifest records); exit status 1 on any
difference. `refuse` prints a refusal at run time (the command line was right; the folder or
its files were not) as `prefetch shards <action>: error: <message>`, exit status 2, without
argparse's usage block; `said` gives an error's own words (an OSError without `[Errno N] `).
"""

from __future__ import annotations

import argparse
import os
import sys

from prefetch.sources.shards import (
    MAX_MANIFEST_BYTES,
    Manifest,
    is_manifest_name,
    manifests_of,
)
from prefetch.sources.shards import verify as verify_manifest
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._set import CLASSES_FILE


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
        flags += [f"--shard-size {options['shard_size']}"] if "shard_size" in options else []
        flags += [f"--seed {options['seed']}"] if "seed" in options else []
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


# How `prefetch.sources.shards.verify` names a file of the set's names that its manifest does
# not list (its words: keep the two alike).
_STRAY = ": not in the manifest (left from another write?)"
