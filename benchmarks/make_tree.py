"""Build an ImageNet-shaped folder of N real JPEGs in 1,000 class folders, for the scale rows.

ROOT/n{class:08d}/n{class:08d}_{i}.JPEG, every file a hard link of one of a few real photos
(`--photos`, default /tmp/photos: the first `--sources` JPEGs found there are copied once into
ROOT.photos/ beside the tree, so the tree never changes the link counts or times of your own
files, and a tree on another filesystem than the photos still works). Hard links share their
photo's inode: each file of the tree costs a directory entry (about 30 bytes of directory
blocks), not an inode or its bytes; ext4 allows 65,000 links per inode, so 5 M files need at
least 77 photos (the default takes 200). The N files are spread as evenly as N allows: the
first N % classes folders hold one more.

Idempotent: the tree is complete when ROOT/.make_tree.json (written last) names the same
files, classes and sources; then nothing is done. A tree left half built (interrupted) is
finished: existing links are kept, missing ones made. A tree built with other numbers is
refused (remove it first, or pass another ROOT).

  .venv/bin/python benchmarks/make_tree.py /tmp/trees/1281167 --files 1281167
  .venv/bin/python benchmarks/make_tree.py /tmp/trees/10k --files 10000 --photos /tmp/photos
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

# ext4's limit of links per inode is 65,000: stay below it.
MAX_LINKS = 60_000
MARKER = ".make_tree.json"
EXTENSIONS = (".jpg", ".jpeg")


def find_photos(folder: Path, count: int) -> list[Path]:
    """The first `count` JPEGs under `folder`, in sorted path order."""
    found = sorted(
        path for path in folder.rglob("*") if path.suffix.lower() in EXTENSIONS and path.is_file()
    )
    if not found:
        raise SystemExit(
            f"no JPEGs under {str(folder)!r}: pass --photos a folder of real photos (make one "
            "with ../shared/tools/make_photo_folder.py --root FOLDER --n 200)"
        )
    return found[:count]


def copy_sources(photos: list[Path], folder: Path) -> list[str]:
    """The photos copied into `folder` (kept when already there with the same size)."""
    folder.mkdir(parents=True, exist_ok=True)
    sources = []
    for number, photo in enumerate(photos):
        target = folder / f"source_{number:04d}{photo.suffix.lower()}"
        if not target.exists() or target.stat().st_size != photo.stat().st_size:
            shutil.copyfile(photo, target)
        sources.append(str(target))
    return sources


def per_class(files: int, classes: int) -> list[int]:
    """How many files each class folder holds: `files` spread as evenly as possible."""
    base, extra = divmod(files, classes)
    return [base + (1 if c < extra else 0) for c in range(classes)]


def build(root: Path, files: int, classes: int, sources: list[str]) -> int:
    """Make every missing link of the tree; the number made."""
    made, link, count, number = 0, os.link, len(sources), 0
    for c, size in enumerate(per_class(files, classes)):
        name = f"n{c:08d}"
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        prefix = f"{folder}/{name}_"
        have = set(os.listdir(folder))  # a half-built tree: keep what is there
        for i in range(size):
            if f"{name}_{i}.JPEG" not in have:
                link(sources[number % count], f"{prefix}{i}.JPEG")
                made += 1
            number += 1
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the tree's folder (created; kept)")
    parser.add_argument("--files", type=int, required=True, help="image files in all")
    parser.add_argument("--classes", type=int, default=1000, help="class folders (%(default)s)")
    parser.add_argument("--photos", type=Path, default=Path("/tmp/photos"), help="real JPEGs")
    parser.add_argument("--sources", type=int, default=200, help="photos linked (%(default)s)")
    args = parser.parse_args()
    if args.files < args.classes or args.classes < 1:
        parser.error(f"--files ({args.files}) must be at least --classes ({args.classes}) >= 1")
    wanted = {"files": args.files, "classes": args.classes, "sources": args.sources}
    marker = args.root / MARKER
    if marker.exists():
        built = json.loads(marker.read_text())
        if built == wanted:
            print(f"{args.root}: complete already ({args.files} files)")
            return
        raise SystemExit(
            f"{args.root} holds another tree ({built}): remove it (rm -r) or pass another folder"
        )
    photos = find_photos(args.photos, args.sources)
    if -(-args.files // len(photos)) > MAX_LINKS:
        raise SystemExit(
            f"{args.files} files need at least {-(-args.files // MAX_LINKS)} photos "
            f"({MAX_LINKS} links each), found {len(photos)}: pass --photos a bigger folder"
        )
    sources = copy_sources(photos, args.root.with_name(args.root.name + ".photos"))
    args.root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    made = build(args.root, args.files, args.classes, sources)
    os.sync()  # the directory blocks written out now, not during a measurement
    marker.write_text(json.dumps(wanted))
    seconds = time.perf_counter() - started
    print(f"{args.root}: {made} links made in {seconds:.1f} s ({args.files} files)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
