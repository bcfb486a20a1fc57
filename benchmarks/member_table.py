"""Benchmark: the memory of a tar source's member table, in the loader's process and in each
worker process (`prefetch.backends._shared_arrays`; docs/shards.md, "Bounds on one sample").

Writes one tar shard of `--samples` one-pixel PNGs (1 KiB of tar each) whose member names are
`--name-bytes` long (`prefetch.testing.shards.named_tar`: ustar names up to 255 bytes, GNU
long names above) into `--folder`
(kept, with its index, for the next run), makes a `TarSource` of it, then reads a few batches
with `--workers` worker processes and prints each process's memory from
/proc/PID/smaps_rollup: RSS, PSS (shared pages divided among the processes mapping them) and
USS (the private pages: what the process alone costs). Linux only.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import time

import psutil
from PIL import Image

import prefetch
from prefetch.testing.shards import named_tar


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def rollup(pid: int) -> dict[str, int]:
    """Rss, Pss and Uss (Private_Clean + Private_Dirty) of `pid`, in MB."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    uss = fields["Private_Clean"] + fields["Private_Dirty"]
    return {"rss": fields["Rss"] >> 10, "pss": fields["Pss"] >> 10, "uss": uss >> 10}


def shared_segment_mb(pid: int) -> int:
    """The size of the shared arrays' segment that `pid` maps, in MB (0: none)."""
    size, inside = 0, False
    with open(f"/proc/{pid}/smaps") as file:
        for line in file:
            first = line.split(maxsplit=1)[0]
            if not first.endswith(":"):  # a mapping's first line
                inside = "memfd:prefetch-shared-arrays" in line
            elif inside and first == "Size:":
                size += int(line.split()[1])
    return size >> 10


def show(what: str, pid: int) -> None:
    memory = rollup(pid)
    line = (
        f"{what:<28} RSS {memory['rss']:5} MB  PSS {memory['pss']:5} MB  USS {memory['uss']:5} MB"
    )
    segment = shared_segment_mb(pid)
    print(line + (f"  (maps the shared arrays: {segment} MB)" if segment else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="(%(default)s)")
    parser.add_argument("--name-bytes", type=int, default=13, help="(%(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="(%(default)s)")
    parser.add_argument("--folder", default="/tmp/member-table", help="(%(default)s)")
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    path = os.path.join(args.folder, f"names-{args.name_bytes}-{args.samples}.tar")
    if not os.path.exists(path):
        began = time.perf_counter()
        named_tar(path + ".partial", args.samples, args.name_bytes, png())
        os.replace(path + ".partial", path)
        print(f"wrote {path} in {time.perf_counter() - began:.0f} s")
    print(f"{path}: {os.path.getsize(path) / 1e6:.0f} MB")
    show("this process, at start", os.getpid())
    began = time.perf_counter()
    source = prefetch.TarSource(path, label_ext="")
    spent = time.perf_counter() - began
    print(f"{source!r} made in {spent:.1f} s")
    show("this process, with source", os.getpid())
    with prefetch.Loader(
        source,
        batch_size=64,
        image_size=8,
        workers=args.workers,
        backend="process",
        label_mode=None,
    ) as loader:
        for number, _ in enumerate(loader):
            if number == 20:
                break
        show("this process, reading", os.getpid())
        for child in psutil.Process().children():
            if "resource_tracker" not in " ".join(child.cmdline()):
                show(f"worker pid {child.pid}", child.pid)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    print(f"this process's peak RSS: {peak} MB")


if __name__ == "__main__":
    main()
