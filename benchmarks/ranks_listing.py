"""N ranks of one host list one folder at once: each lists it, or one lists and the rest read.

Starts `--ranks` processes; each imports prefetch, says it is ready, and waits until all are;
then all are released together (as torchrun starts its ranks) and each builds
`ImageFolder(root)` and, with `--batch`, a default `Loader` of it sharded to its rank
(`shard(ranks, rank)`) and takes its first batch (32 images at 224x224). The clock starts at
the release: imports are not counted. Each rank prints how it got its listing (listed, or
read from the kept listing), the seconds it took (waiting for the lister not counted), the
seconds it waited, the CPU seconds of the listing or the read (the waiting polls included), its
first batch, and its memory just after the listing: resident (RSS) and
proportional (PSS: pages shared by N processes count 1/N in each).

Modes (`--modes`, run in this order):
- `before`: `keep_listing=False`, every rank lists (the old behaviour);
- `first`: a fresh kept-listing folder: one rank lists and keeps it, the others wait and read;
- `later`: the same folder again (a later run): every rank reads the kept listing.

Build the tree first (benchmarks/make_tree.py):

  .venv/bin/python benchmarks/make_tree.py /tmp/trees/1281167 --files 1281167
  .venv/bin/python benchmarks/ranks_listing.py /tmp/trees/1281167 --ranks 8 --batch
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
import prefetch
from prefetch.sources import ImageFolder
root, keep, rank, ranks, batch = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
def memory():
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split()[:2] for line in f if line.split()[0] in ("Rss:", "Pss:"))
    return int(fields["Rss:"]) * 1024, int(fields["Pss:"]) * 1024
print("ready", flush=True)
sys.stdin.readline()
start, cpu = time.perf_counter(), time.process_time()
folder = ImageFolder(root, keep_listing=False if keep == "-" else keep)
listed, cpu = time.perf_counter() - start, time.process_time() - cpu
rss, pss = memory()
result = dict(read=folder.listing.read, seconds=folder.listing.seconds, cpu_s=cpu,
              waited_s=folder.listing.waited_s, returned_s=listed, files=len(folder),
              paths_mb=folder.paths.nbytes / 1e6, rss_mb=rss / 1e6, pss_mb=pss / 1e6)
if batch:
    loader = prefetch.Loader(folder, batch_size=32, image_size=224, seed=1)
    loader.shard(ranks, rank)
    with loader:
        next(iter(loader))
    result["first_batch_s"] = time.perf_counter() - start
print(json.dumps(result), flush=True)
"""


def run_ranks(root: Path, keep: str, ranks: int, batch: bool) -> list[dict[str, float]]:
    """Start `ranks` processes, release them together, and return their reports."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), keep, str(rank), str(ranks), str(int(batch))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("a rank failed to start")
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode:
            raise SystemExit(f"a rank failed (exit {child.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def show(mode: str, reports: list[dict[str, float]]) -> None:
    print(f"-- {mode}: {len(reports)} ranks, {int(reports[0]['files'])} files")
    print(
        f"{'rank':>4} {'how':>6} {'list/read s':>12} {'CPU s':>6} {'waited s':>9}"
        f" {'returned s':>11} {'1st batch s':>12} {'RSS MB':>7} {'PSS MB':>7} {'paths MB':>9}"
    )
    for rank, r in enumerate(reports):
        batch = f"{r['first_batch_s']:>12.2f}" if "first_batch_s" in r else f"{'-':>12}"
        print(
            f"{rank:>4} {'read' if r['read'] else 'listed':>6} {r['seconds']:>12.2f}"
            f" {r['cpu_s']:>6.2f} {r['waited_s']:>9.2f} {r['returned_s']:>11.2f}{batch}"
            f" {r['rss_mb']:>7.0f} {r['pss_mb']:>7.0f} {r['paths_mb']:>9.1f}"
        )
    for key, unit in (("seconds", "s"), ("cpu_s", "s of CPU")):
        listers = [r[key] for r in reports if not r["read"]]
        readers = [r[key] for r in reports if r["read"]]
        line = f"listed by {len(listers)} rank(s)"
        if listers:
            line += f", listing {min(listers):.2f}-{max(listers):.2f} {unit}"
        if readers:
            line += f"; read by {len(readers)}: {min(readers):.2f}-{max(readers):.2f} {unit}"
            if listers:
                line += f" (at most {max(readers) / min(listers):.2f}x the listing)"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the tree (benchmarks/make_tree.py)")
    parser.add_argument("--ranks", type=int, default=8, help="processes (%(default)s)")
    parser.add_argument("--batch", action="store_true", help="also each rank's first batch")
    parser.add_argument("--modes", default="before,first,later", help="(%(default)s)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="prefetch-ranks-"))
    kept = work / "listings"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; load {os.getloadavg()}")
    try:
        for mode in args.modes.split(","):
            if mode == "first":
                shutil.rmtree(kept, ignore_errors=True)
            started = time.perf_counter()
            reports = run_ranks(args.root, "-" if mode == "before" else str(kept), args.ranks,
                                args.batch)  # fmt: skip
            show(mode, reports)
            print(f"   ({time.perf_counter() - started:.1f} s in all)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
