"""Benchmark: the memory of a tar source's member table, in the loader's process and in each
worker process (`prefetch.backends._shared_arrays`; docs/shards.md, "Bounds on one sample").

Writes one tar shard of `--samples` one-pixel PNGs (1 KiB of tar each) whose member names are
`--name-bytes` long (ustar names up to 255 bytes, GNU long names above) into `--folder`
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
from prefetch.sources.shards import TAR_END, tar_header, tar_padding

# GNU long-name headers: the name's bytes follow a header named this, of kind 'L'.
_LONG_LINK = "././@LongLink"


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 30, 30)).save(buffer, "PNG")
    return buffer.getvalue()


def long_name_header(name: bytes) -> bytes:
    """The GNU 'L' header and data block that give the next member the name `name`."""
    header = tar_header(_LONG_LINK, len(name) + 1)
    header = header[:156] + b"L" + header[157:]
    header = header[:148] + b" " * 8 + header[156:]
    header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    return header + name + b"\0" + tar_padding(len(name) + 1)


def write_shard(path: str, samples: int, name_bytes: int) -> None:
    """A tar of `samples` PNG members named `<number><x...>.png`, `name_bytes` long each."""
    image = png()
    with open(path + ".partial", "wb") as file:
        for number in range(samples):
            stem = f"{number:09d}"
            name = stem + "x" * (name_bytes - len(stem) - 4) + ".png"
            if len(name) <= 100:
                member = tar_header(name, len(image))
            elif len(name) <= 255:  # ustar: a prefix of up to 155 bytes, a slash, the rest
                member = tar_header(name[:154] + "/" + name[155:], len(image))
            else:
                member = long_name_header(name.encode()) + tar_header(stem + ".png", len(image))
            file.write(member + image + tar_padding(len(image)))
        file.write(TAR_END)
    os.replace(path + ".partial", path)


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
        write_shard(path, args.samples, args.name_bytes)
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
