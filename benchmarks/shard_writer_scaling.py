"""Benchmark: `prefetch shards write` images/s for 1, 2, 4, ... worker processes.

Writes the image folder `--root` into tar shards (`write_shards`, `--fit-crop 224` unless told
otherwise) once per worker count, into a fresh temporary folder each time, and prints one row
per count: wall seconds (from the call to the set in place, worker start-up included), images/s,
the speed-up over the first row and the efficiency (speed-up / workers), and the CPU time per
image of all the processes together and of the writer (the parent: its serial share, which
bounds the speed-up at about CPU / writer CPU). The CPU columns hold on a busy machine, where
the wall-clock ones do not. Worker counts: 1, 2, 4,
... up to the usable cores, and the usable cores themselves (or `--workers 1,3,8`). One run per
count, in that order; the page cache is warmed by a listing read of every file first, so the
first row does not pay the disk. Imports no framework (TensorFlow is not needed, and is checked
not to be loaded).

Note: `--fit-crop 224` re-encodes only images larger than about 0.84 MP (the smallest size at
which every RandomResizedCrop window is still 224 pixels); ImageNet-sized photos (about 500x375)
are then copied as stored, and the row measures reading, checking and writing. The last line
says how many images were re-encoded. For the re-encoding rate use 2 MP photos:

    python ../shared/tools/make_photo_folder.py --root /tmp/photos-large --n 300 --large
    python benchmarks/shard_writer_scaling.py --root /tmp/photos-large [--workers 1,2]
        [--fit-crop 224 | --fit-crop 0 (off)] [--shard-size 25] [--out /tmp]

The shard size is 25 by default (the command's is 1000) so that 4,000 photos make 160 shards:
the writer gives whole shards to the workers when there are at least 4 per worker (and shares
each shard's samples among them otherwise; both give the same bytes), and with 10 shards per
worker the last round, where some workers have no shard left, costs little. A real dataset
has thousands of shards of 1,000. Rows after the first pay
the workers' start-up (about 0.3 to 0.6 s: each imports prefetch), a visible share of a run of
a few seconds. About 4,000 ImageNet-sized photos take well under 2 minutes on 16 cores for all
rows.

The last column is the machine's own ceiling for that many processes: the same `fit_image`
work on the same files, split into N contiguous slices, run by N independent processes that
share nothing (each reads its files first, then all start together at a barrier; timed from
the barrier to the last one done), as a speed-up over one such process. A CPU-bound job on a
host whose per-core speed falls as cores fill (shared hyperthreads, a lower all-core clock,
memory bandwidth) cannot beat it; the writer's efficiency is judged against it. `--no-ceiling`
skips it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

from prefetch.runtime import usable_cores
from prefetch.sources import ImageFolder
from prefetch.tools.shards import fit_image, write_shards


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below `cores`, then `cores`."""
    counts = []
    count = 1
    while count < cores:
        counts.append(count)
        count *= 2
    return [*counts, cores]


def warm(root: str) -> int:
    """Read every image once (into the page cache); return how many there are."""
    listing = ImageFolder(root)
    for path in listing.paths:
        with open(str(path), "rb") as file:
            while file.read(1 << 20):
                pass
    return len(listing)


def _ceiling_worker(paths: list[str], size: int, barrier: Any, ends: Any) -> None:
    datas = []
    for path in paths:
        with open(path, "rb") as file:
            datas.append(file.read())
    barrier.wait()
    for data in datas:
        fit_image(data, size)
    ends.put(time.perf_counter())  # CLOCK_MONOTONIC: one clock for every process


def ceiling_seconds(paths: list[str], size: int, count: int) -> float:
    """Seconds for `count` independent processes to `fit_image` `paths` in contiguous slices,
    from their common start to the last one done (start-up and reading not included)."""
    context = multiprocessing.get_context("spawn")
    step = -(-len(paths) // count)
    slices = [paths[i : i + step] for i in range(0, len(paths), step)]
    barrier, ends = context.Barrier(len(slices) + 1), context.Queue()
    processes = [
        context.Process(target=_ceiling_worker, args=(part, size, barrier, ends), daemon=True)
        for part in slices
    ]
    for process in processes:
        process.start()
    barrier.wait()
    started = time.perf_counter()
    last = max(ends.get(timeout=600) for _ in processes)
    for process in processes:
        process.join()
    return last - started


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="image folder (ROOT/<class>/<image>)")
    parser.add_argument("--fit-crop", type=int, default=224, help="SIZE, or 0 for off (224)")
    parser.add_argument("--workers", default=None, help="comma-separated counts (1,2,4,...,N)")
    parser.add_argument("--shard-size", type=int, default=25, help="samples per shard (25)")
    parser.add_argument("--out", default=None, help="where the temporary sets go (system temp)")
    parser.add_argument(
        "--no-ceiling", action="store_true", help="skip the independent-processes ceiling"
    )
    args = parser.parse_args()
    cores = usable_cores()
    counts = (
        [int(text) for text in args.workers.split(",")] if args.workers else worker_counts(cores)
    )
    fit_crop = args.fit_crop or None
    images = warm(args.root)
    paths = [str(path) for path in ImageFolder(args.root).paths]
    ceiling_one = None
    print(
        f"{images} images in {args.root}; {cores} usable cores; --fit-crop {fit_crop}; "
        f"shard size {args.shard_size}"
    )
    print(
        f"{'workers':>7}  {'seconds':>8}  {'images/s':>9}  {'speed-up':>8}  {'efficiency':>10}  "
        f"{'CPU ms/image':>12}  {'writer CPU ms/image':>19}  {'ceiling speed-up':>16}"
    )
    first_rate = None
    resized = 0
    for count in counts:
        folder = tempfile.mkdtemp(prefix="shard-scaling-", dir=args.out)
        try:
            started = time.perf_counter()
            parent_before = _cpu_s(resource.RUSAGE_SELF)
            children_before = _cpu_s(resource.RUSAGE_CHILDREN)
            shards = write_shards(
                args.root,
                folder,
                format="tar",
                shard_size=args.shard_size,
                fit_crop=fit_crop,
                workers=count,
            )
            seconds = time.perf_counter() - started
            parent_cpu = _cpu_s(resource.RUSAGE_SELF) - parent_before
            workers_cpu = _cpu_s(resource.RUSAGE_CHILDREN) - children_before
            manifest = os.path.join(folder, "shard-tar.manifest.json")
            with open(manifest, encoding="utf-8") as file:
                options = json.load(file)["options"]
            resized = options.get("fit_crop", {}).get("resized", 0)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        rate = images / seconds
        first_rate = rate if first_rate is None else first_rate
        speedup = rate / first_rate
        efficiency = speedup / count
        ceiling = "-"
        if fit_crop is not None and not args.no_ceiling:
            alone = ceiling_seconds(paths, fit_crop, count)
            ceiling_one = alone if ceiling_one is None else ceiling_one
            ceiling = f"{ceiling_one / alone:.2f}x"
        print(
            f"{count:>7}  {seconds:>8.2f}  {rate:>9.1f}  {speedup:>7.2f}x  {efficiency:>10.2f}  "
            f"{1000 * (parent_cpu + workers_cpu) / images:>12.1f}  "
            f"{1000 * parent_cpu / images:>19.2f}  {ceiling:>16}",
            flush=True,
        )
    print(f"{resized} of {images} images re-encoded by --fit-crop; {len(shards)} shards")
    assert "tensorflow" not in sys.modules, "the writer imported TensorFlow"


if __name__ == "__main__":
    main()
