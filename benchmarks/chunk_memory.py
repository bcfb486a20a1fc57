"""Peak memory of a worker whose files are much larger than their images, with the chunk path
(one call of the compiled window decoder per task, holding at most `CHUNK_BYTES` of files and
windows: issue 40.4) and the per-sample path (a `transform` forces it), alternated in one run.

    python benchmarks/chunk_memory.py [--files 32] [--mb 64] [--root FOLDER]

Writes `--files` JPEGs (a 640x480 photo each, followed by zeros up to `--mb` MB: valid files
whose bytes are mostly padding; sparse on disk) into `--root` (kept, and reused by a later run;
by default a private temporary folder, removed at the end), then reads them once per row, each
row in a
fresh process: one epoch of `Loader(batch_size=files, workers=1, RandomResizedCrop to 224)`,
thread and process backends. Prints, per row, the peak RSS (MB) of the process that decodes
(the loader's own with threads, its worker's with processes), and that peak over the
per-sample path's. The row "chunk, unbounded" sets `CHUNK_BYTES` past any file (the chunk path
before issue 40: all 32 files held at once), thread backend only (a worker process imports
prefetch afresh, with the default).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import prefetch
from prefetch.decode import _window

# (name, backend, path): the rows, in the order printed.
ROWS = (
    ("per-sample", "thread", "sample"),
    ("chunk", "thread", "chunk"),
    ("chunk, unbounded", "thread", "unbounded"),
    ("per-sample", "process", "sample"),
    ("chunk", "process", "chunk"),
)


def identity(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The transform that sends every sample the per-sample way (and changes nothing)."""
    return image


def write_files(root: Path, files: int, megabytes: int) -> None:
    """`files` JPEGs of 640x480 noise padded with zeros to `megabytes` MB, in root/a/."""
    folder = root / "a"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for number in range(files):
        path = folder / f"{number:03d}.jpg"
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
        if path.exists():  # written by an earlier run (the pixels drawn all the same)
            if path.stat().st_size != megabytes << 20:
                raise SystemExit(f"{path} is not {megabytes} MB: remove it, or pick another --root")
            continue
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        with open(path, "xb") as out:  # never through a link left in the folder
            out.write(buffer.getvalue())
            out.truncate(megabytes << 20)  # zeros, sparse


def child(root: str, backend: str, path: str, files: int) -> None:
    """One row, in this process: print {"peak_mb": ...} as JSON."""
    if path == "unbounded":
        _window.CHUNK_BYTES = 1 << 50
    augment = prefetch.Augment(
        prefetch.RandomResizedCrop(), flip=True, transform=identity if path == "sample" else None
    )
    with prefetch.Loader(
        root, batch_size=files, image_size=224, workers=1, backend=backend, augment=augment
    ) as loader:
        delivered = sum(len(batch.labels) for batch in loader)
    assert delivered == files, delivered
    who = resource.RUSAGE_SELF if backend == "thread" else resource.RUSAGE_CHILDREN
    print(json.dumps({"peak_mb": resource.getrusage(who).ru_maxrss / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=32, help="files (one batch, one task)")
    parser.add_argument("--mb", type=int, default=64, help="each file's size in MB")
    parser.add_argument(
        "--root", help="where the files are written (default: a private temporary folder)"
    )
    parser.add_argument("--child", nargs=2, metavar=("BACKEND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.root, args.child[0], args.child[1], args.files)
        return
    temporary = args.root is None
    if temporary:
        args.root = tempfile.mkdtemp(prefix="chunk-memory-")
    try:
        write_files(Path(args.root), args.files, args.mb)
        run_rows(args)
    finally:
        if temporary:
            shutil.rmtree(args.root, ignore_errors=True)


def run_rows(args: argparse.Namespace) -> None:
    """Print the table: each row measured in a child process."""
    print(
        f"{args.files} files of {args.mb} MB (a 640x480 JPEG and zeros), one epoch, 1 worker, "
        f"RandomResizedCrop to 224; CHUNK_BYTES = {_window.CHUNK_BYTES >> 20} MiB"
    )
    print(f"{'path':<18} {'backend':<8} {'peak RSS MB':>12} {'/ per-sample':>13}")
    per_sample: dict[str, float] = {}
    for name, backend, path in ROWS:
        command = [sys.executable, os.path.abspath(__file__), "--root", args.root]
        command += ["--files", str(args.files), "--child", backend, path]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        peak = json.loads(done.stdout.splitlines()[-1])["peak_mb"]
        if path == "sample":
            per_sample[backend] = peak
        print(f"{name:<18} {backend:<8} {peak:>12.0f} {peak / per_sample[backend]:>12.2f}x")


if __name__ == "__main__":
    main()
