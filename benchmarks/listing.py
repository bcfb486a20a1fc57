"""Listing large folders: prefetch's one lister at ImageNet scale, and the drop-in's first batch.

Builds ImageNet-shaped folders ROOT/nXXXXXXXX/nXXXXXXXX_N.JPEG in a temporary folder from hard
links of a few hundred real JPEGs (500x375 crops of the Debian wallpaper photos when installed,
else Pillow-drawn shapes), at most LINKS_PER_FILE links each (ext4 allows 65,000 per inode),
measures, and removes the folders. Each row runs in a fresh subprocess and reports seconds and
the peak resident growth (VmHWM minus the resident size just before the timed call). The
folders were just written, so their directory entries are in the page cache: a cold disk adds
its reading time.

Rows: `os.walk` alone (the floor: one walk per class folder, nothing sorted or kept),
`index_directory` (the one lister, Keras's order and path strings), `ImageFolder(root)`, and
the Keras drop-in after TensorFlow is imported: the call, then the call plus its first batch
(32 images to 224x224). `--keras` adds Keras's own lister
(`keras.src.utils.dataset_utils.index_directory`) on the first size, for the ratio.

  .venv/bin/python benchmarks/listing.py                        # 200,000 and 1,281,000 files
  .venv/bin/python benchmarks/listing.py --sizes 200000:100 --keras
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

# ext4's limit is 65,000 links per inode; stay well below it.
LINKS_PER_FILE = 60_000
# Where the wallpaper photos are (plasma-workspace-wallpapers), and the photographic ones.
WALLPAPERS = "/usr/share/wallpapers"
PHOTOS = ["BytheWater", "ColdRipple", "ColorfulCups", "EveningGlow", "FallenLeaf", "Kite", "Path"]
# ImageNet's typical train image and the drop-in's batch.
CROP = (500, 375)
BATCH, SIZE = 32, (224, 224)


def write_sources(folder: Path, count: int) -> list[str]:
    """`count` real JPEGs (quality 90): crops of wallpaper photos, or drawn shapes without them."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    photos = [
        max(files, key=os.path.getsize)
        for name in PHOTOS
        if (files := glob.glob(f"{WALLPAPERS}/{name}/contents/images/*.jpg"))
    ]
    images = []
    for path in photos:
        with Image.open(path) as photo:
            photo.draft("RGB", (photo.width // 2, photo.height // 2))
            images.append(photo.convert("RGB"))
    paths = []
    for i in range(count):
        if images:
            image = images[i % len(images)]
            left = int(rng.integers(0, image.width - CROP[0]))
            top = int(rng.integers(0, image.height - CROP[1]))
            crop = image.crop((left, top, left + CROP[0], top + CROP[1]))
        else:
            from prefetch.testing import draw_shape

            crop = draw_shape(("circle", "square", "triangle")[i % 3], CROP, rng)
        path = folder / f"source_{i:04d}.jpg"
        crop.save(path, "JPEG", quality=90)
        paths.append(str(path))
    return paths


def build(root: Path, classes: int, per_class: int, sources: list[str]) -> None:
    """root/n{class:08d}/n{class:08d}_{i}.JPEG, each a hard link of one of `sources`."""
    if -(-classes * per_class // len(sources)) > LINKS_PER_FILE:
        raise SystemExit(f"{classes * per_class} files need more than {len(sources)} sources")
    link, count = os.link, len(sources)
    for c in range(classes):
        name = f"n{c:08d}"
        folder = root / name
        folder.mkdir(parents=True)
        prefix = f"{folder}/{name}_"
        for i in range(per_class):
            link(sources[(c * per_class + i) % count], f"{prefix}{i}.JPEG")


CHILD = r"""
import json, os, sys, time
mode, root = sys.argv[1], sys.argv[2]
if mode.startswith("dropin"):
    import tensorflow as tf  # imported before the clock starts, as the target says
    import prefetch.tf
    tf.zeros(1)
def rss(field="VmRSS"):  # VmHWM: the peak of this process image (ru_maxrss counts the fork)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
import numpy as np
import prefetch
from prefetch.sources._folders import index_directory
before, start = rss(), time.perf_counter()
result = {}
if mode == "walk":
    count = 0
    for entry in os.scandir(root):
        for _, _, names in os.walk(entry.path):
            count += len(names)
elif mode == "keras":
    from keras.src.utils import dataset_utils
    paths, _, _ = dataset_utils.index_directory(
        root, "inferred", formats=(".bmp", ".gif", ".jpeg", ".jpg", ".png"), shuffle=False,
        verbose=False)
    count = len(paths)
else:
    if mode == "index":
        paths, _, _ = index_directory(root)
    elif mode == "folder":
        paths = prefetch.ImageFolder(root).paths
    else:
        ds = prefetch.tf.image_dataset_from_directory(
            root, image_size=(224, 224), batch_size=32, seed=1, verbose=False)
        if mode == "dropin+batch":
            next(iter(ds))
        paths = ds.loader.source.paths
    count = len(paths)
    widest = int(np.diff(paths._starts).max()) - 1
    result.update(paths_mb=paths.nbytes / 1e6, str_mb=4 * widest * count / 1e6)
result.update(
    seconds=time.perf_counter() - start, files=count,
    rss_mb=(rss("VmHWM") - before) / 1e6)
print(json.dumps(result))
"""


def measure(mode: str, root: Path) -> dict[str, float]:
    """One row, in a fresh interpreter (so that the peak resident size is this call's)."""
    return run_child(CHILD, mode, str(root))


def run_child(child: str, mode: str, *args: str) -> dict[str, float]:
    """The JSON the program `child` prints last, run with `mode` and `args` in a fresh
    interpreter (benchmarks/scale.py's rows too); SystemExit with its stderr when it fails."""
    done = subprocess.run(
        [sys.executable, "-c", child, mode, *args],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ | {"TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if done.returncode:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


ROWS = {
    "walk": "os.walk alone (floor)",
    "keras": "Keras's index_directory",
    "index": "index_directory",
    "folder": "ImageFolder(root)",
    "dropin": "drop-in: returns",
    "dropin+batch": "drop-in: + first batch",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default="200000:100,1281000:1000",
        help="FILES:CLASSES,... (default: the drop-in target, then ImageNet train)",
    )
    parser.add_argument("--sources", type=int, default=300, help="distinct JPEGs to link")
    parser.add_argument("--keras", action="store_true", help="add Keras's lister (slow)")
    parser.add_argument("--tmp", default=None, help="where to build (default: the temp dir)")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in size.split(":")) for size in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="prefetch-listing-", dir=args.tmp))
    header = f"{'case':<28}{'files':>10}{'seconds':>9}{'peak RSS +MB':>14}{'paths MB':>10}"
    try:
        sources = write_sources(work / "sources", args.sources)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, {len(sources)} JPEGs")
        print(f"{header}{'as str_ MB':>12}")
        for number, (files, classes) in enumerate(sizes):
            root = work / f"train{files}"
            started = time.perf_counter()
            build(root, classes, files // classes, sources)
            os.sync()  # the new directories written out, so that their writeback does not run
            built = time.perf_counter() - started  # during the rows
            print(f"-- {files} files in {classes} classes (built in {built:.0f} s)")
            modes = ["walk", "index", "folder", "dropin", "dropin+batch"]
            if number == 0 and args.keras:
                modes.append("keras")
            for mode in modes:
                row = measure(mode, root)
                extra = (
                    f"{row['paths_mb']:>10.1f}{row['str_mb']:>12.1f}" if "paths_mb" in row else ""
                )
                print(
                    f"{ROWS[mode]:<28}{int(row['files']):>10}{row['seconds']:>9.2f}"
                    f"{row['rss_mb']:>14.0f}{extra}",
                    flush=True,
                )
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
