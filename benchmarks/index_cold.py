"""Benchmark: building shard indexes from a cold page cache
(`prefetch.sources.shards._index.build_index`).

Indexes every shard matching `--shards` (default: TFRecord shards in /tmp/shl, written by
`prefetch shards write /tmp/photos_large /tmp/shl --format tfrecord --shard-size 150`) after
`sync; echo 3 > /proc/sys/vm/drop_caches` (needs root; says so when the write fails), `--repeats`
times, and prints the seconds and the seconds per 10,000 samples of each run. Nothing is kept:
`build_index` only reads.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import time

from prefetch.sources.shards import _index as shard_index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="/tmp/shl/*.tfrecord", help="a pattern (%(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs (%(default)s)")
    args = parser.parse_args()
    files = sorted(glob.glob(args.shards))
    if not files:
        parser.error(f"no shards match {args.shards!r}: write some with `prefetch shards write`")
    spec = shard_index.IndexSpec("tfrecord" if ".tfrecord" in files[0] else "tar")
    print(f"{len(files)} {spec.format} shards, load average {os.getloadavg()[0]:.2f}")
    for run in range(args.repeats):
        subprocess.run(["sync"], check=False)
        try:
            with open("/proc/sys/vm/drop_caches", "w") as caches:
                caches.write("3\n")
            state = "cold"
        except OSError as error:
            state = f"warm (could not drop caches: {error})"
        began = time.perf_counter()
        samples = sum(len(shard_index.build_index(path, spec)) for path in files)
        spent = time.perf_counter() - began
        print(
            f"run {run + 1}: {state}, {samples} samples in {spent:.3f} s, "
            f"{spent / samples * 10_000:.2f} s per 10,000"
        )


if __name__ == "__main__":
    main()
