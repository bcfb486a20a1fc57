"""The scale table: listing, memory, start-up, resume and the epoch plan at 10 k to 5 M files.

For each tree given (built by benchmarks/make_tree.py: N real JPEGs in 1,000 class folders),
every row runs in a fresh interpreter (its imports before the clock) and prints seconds and
bytes a file:

- `prefetch listed`: `ImageFolder(root, keep_listing=False)`; bytes a file: its paths and
  labels (`PathArray.nbytes` + 4), and the resident growth (RSS after, less before);
- `prefetch kept`: `ImageFolder(root)` reading the listing kept by a run before it (one
  listing written first, untimed); its arrays are a mapping of the kept file (page cache,
  shared by every rank of the host);
- `torchvision`: `torchvision.datasets.ImageFolder(root)` (a list of (path, class) tuples);
- `Keras`: `keras.utils.image_dataset_from_directory(root, image_size=(224, 224), seed=1)`,
  TensorFlow imported before the clock;
- `first batch, listed` / `first batch, kept`: from nothing to a default `Loader`'s first
  batch (32 images, 224x224), listing the folder or reading the kept listing;
- `resume mid-epoch`: a Loader that loads a state at the middle of the epoch, to its first
  batch, against the same Loader from the epoch's start (one process, the listing kept);
  the state's size in bytes (JSON);
- `epoch plan`: `loader.batch_indices(epoch)`: the epoch's shuffled order in batches.

The resident growth counts the Python objects a lister keeps (torchvision's tuples, Keras's
strings and tensors); torchvision is loaded from `--torchvision DIR` (an unpacked wheel) when
`import torchvision` fails beside this torch: only its `datasets/folder.py` is imported (pure
Python), with stand-ins for the package's `__init__` that would load its compiled operators.

  .venv/bin/python benchmarks/make_tree.py /tmp/trees/10000 --files 10000
  .venv/bin/python benchmarks/scale.py /tmp/trees/10000 /tmp/trees/1281167 --torchvision DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import gc, json, os, sys, time
mode, root, kept, torchvision_dir = sys.argv[1:5]

def memory(field="VmRSS"):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))
if mode == "keras":
    import tensorflow as tf, keras
    tf.zeros(1)
if mode == "torchvision":
    try:
        from torchvision.datasets import ImageFolder as TorchFolder
    except (ImportError, RuntimeError):
        import types
        for name in ("torchvision", "torchvision.datasets"):
            module = types.ModuleType(name)
            module.__path__ = [os.path.join(torchvision_dir, *name.split("."))]
            sys.modules[name] = module
        from torchvision.datasets.folder import ImageFolder as TorchFolder
import numpy as np
import prefetch
from prefetch.sources import ImageFolder
gc.collect()
before, result = memory(), {}
start = time.perf_counter()
if mode in ("listed", "kept"):
    folder = ImageFolder(root, keep_listing=False if mode == "listed" else kept)
    result["seconds"] = time.perf_counter() - start
    result["arrays"] = folder.paths.nbytes + folder.labels.nbytes
    result["files"], result["read"] = len(folder), folder.listing.read
elif mode == "torchvision":
    folder = TorchFolder(root)
    result["seconds"], result["files"] = time.perf_counter() - start, len(folder.samples)
elif mode == "keras":
    data = keras.utils.image_dataset_from_directory(
        root, image_size=(224, 224), batch_size=32, seed=1, verbose=False)
    result["seconds"], result["files"] = time.perf_counter() - start, len(data.file_paths)
elif mode in ("batch-listed", "batch-kept"):
    folder = ImageFolder(root, keep_listing=False if mode == "batch-listed" else kept)
    with prefetch.Loader(folder, batch_size=32, image_size=224, seed=1) as loader:
        next(iter(loader))
    result["seconds"], result["files"] = time.perf_counter() - start, len(folder)
elif mode == "resume":
    folder = ImageFolder(root, keep_listing=kept)
    result["files"] = len(folder)
    for name in ("start", "resume", "start", "resume"):
        begin = time.perf_counter()
        with prefetch.Loader(folder, batch_size=32, image_size=224, seed=1) as loader:
            state = {"seed": 1, "epoch": 0, "position": len(loader) // 2}
            if name == "resume":
                loader.load_state_dict(state)
                result["state_bytes"] = len(json.dumps(loader.state_dict()))
            next(iter(loader))
        result.setdefault(name, []).append(time.perf_counter() - begin)
    loader = prefetch.Loader(folder, batch_size=32, image_size=224, seed=1)
    begin = time.perf_counter()
    loader.batch_indices(1)
    result["plan_s"] = time.perf_counter() - begin
    loader.close()
gc.collect()
result.update(held=memory() - before, peak=memory("VmHWM") - before)
print(json.dumps(result))
"""


def run_child(child: str, mode: str, *args: str) -> dict[str, float]:
    """The JSON the program `child` prints last, run with `mode` and `args` in a fresh
    interpreter; SystemExit with its stderr when it fails."""
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


def measure(mode: str, root: Path, kept: Path, torchvision: str) -> dict[str, float]:
    """One row, in a fresh interpreter."""
    return run_child(CHILD, mode, str(root), str(kept), torchvision)


def row(name: str, seconds: float, files: int, note: str = "") -> None:
    print(f"  {name:<26}{seconds:>9.2f} s  {note}", flush=True)


def per_file(value: float, files: int) -> str:
    return f"{value / files:>6.0f} B/file"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path, help="trees (benchmarks/make_tree.py)")
    parser.add_argument("--torchvision", default="", help="an unpacked torchvision wheel")
    parser.add_argument(
        "--rows",
        default="listed,kept,torchvision,keras,batch,resume",
        help="which rows (%(default)s)",
    )
    parser.add_argument("--keras-max", type=int, default=5_000_000, help="skip Keras above")
    args = parser.parse_args()
    rows = set(args.rows.split(","))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()}")
    for root in args.roots:
        work = Path(tempfile.mkdtemp(prefix="prefetch-scale-"))
        kept = work / "listings"
        try:
            first = measure("listed", root, kept, args.torchvision)
            files = int(first["files"])
            print(f"-- {root}: {files} files")
            if "listed" in rows:
                note = f"{per_file(first['arrays'], files)} held in arrays, "
                note += f"RSS {per_file(first['held'], files)}"
                row("prefetch listed", first["seconds"], files, note)
            measure("kept", root, kept, args.torchvision)  # writes the kept listing
            if "kept" in rows:
                got = measure("kept", root, kept, args.torchvision)
                assert got["read"], "the kept listing was not read"
                row("prefetch kept", got["seconds"], files, f"RSS {per_file(got['held'], files)}")
            if "torchvision" in rows:
                got = measure("torchvision", root, kept, args.torchvision)
                row("torchvision", got["seconds"], files, f"RSS {per_file(got['held'], files)}")
            if "keras" in rows and files <= args.keras_max:
                got = measure("keras", root, kept, args.torchvision)
                row("Keras", got["seconds"], files, f"RSS {per_file(got['held'], files)}")
            if "batch" in rows:
                for mode in ("batch-listed", "batch-kept"):
                    got = measure(mode, root, kept, args.torchvision)
                    row(f"first batch, {mode[6:]}", got["seconds"], files)
            if "resume" in rows:
                got = measure("resume", root, kept, args.torchvision)
                starts = ", ".join(f"{s:.2f}" for s in got["start"])
                resumes = ", ".join(f"{s:.2f}" for s in got["resume"])
                row("resume mid-epoch", min(got["resume"]), files,
                    f"(from the start: {starts}; resumed: {resumes}; state "
                    f"{int(got['state_bytes'])} bytes)")  # fmt: skip
                row("epoch plan", got["plan_s"], files)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
