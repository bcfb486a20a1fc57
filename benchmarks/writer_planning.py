"""Benchmark: how soon `prefetch shards write` speaks and starts writing, against the listing.

For an image folder `--root` (build a large one with hard links, e.g. `benchmarks/make_tree.py`
when it is there), each run:

1. times `ImageFolder(root)` in a fresh process (the listing's own time: what the writer must
   at least do before it knows its plan), after one untimed listing that warms the page cache;
2. runs `python -m prefetch shards write ROOT OUT` as a user would, stderr a pipe, and notes
   from its start: its first line on stderr, and the first image bytes in OUT (a hidden
   temporary shard that is no longer empty: polled every 10 ms);
3. sends it Ctrl-C (SIGINT) once the first images are written, and notes its exit status and
   whether OUT holds a shard afterwards (it must hold none: no shard was finished).

One row per run: the listing's seconds, the first line's seconds and its text, the first
images' seconds, their ratio to the listing (the target: within 3x the listing + 3 s), the exit
status and what OUT held. The writer's own progress lines (`elapsed`) are printed as received
with their times. Nothing is kept: OUT is a fresh temporary folder each run, removed after.
A write left to run would copy the whole folder: the run is always stopped at its first images.

    .venv/bin/python benchmarks/writer_planning.py --root /tmp/tree-1281167 [--runs 2]
        [--workers N] [--out /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# How often OUT is looked at for the first image bytes.
POLL_S = 0.01
# The longest a run may take to write its first images before it is stopped anyway.
GIVE_UP_S = 600.0

_LISTING = (
    "import sys, time; from prefetch.sources import ImageFolder; "
    "began = time.perf_counter(); folder = ImageFolder(sys.argv[1]); "
    "print(len(folder), time.perf_counter() - began)"
)


def listing_time(root: str) -> tuple[int, float]:
    """(files, seconds) of `ImageFolder(root)` in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", _LISTING, root], check=True, capture_output=True, text=True
    )
    files, seconds = done.stdout.split()
    return int(files), float(seconds)


def first_bytes(out: str) -> bool:
    """Whether a temporary file in `out` holds bytes (the first images are written)."""
    try:
        with os.scandir(out) as entries:
            return any(
                entry.name.endswith(".partial") and entry.stat(follow_symlinks=False).st_size > 0
                for entry in entries
            )
    except FileNotFoundError:
        return False


def one_run(root: str, out_parent: str, workers: int | None) -> dict[str, object]:
    """Run the command until its first images are written, then Ctrl-C it (module docstring)."""
    out = os.path.join(tempfile.mkdtemp(prefix="writer-planning-", dir=out_parent), "shards")
    command = [sys.executable, "-m", "prefetch", "shards", "write", root, out]
    if workers is not None:
        command += ["--workers", str(workers)]
    lines: list[tuple[float, str, str]] = []
    began = time.perf_counter()
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(stream: object, name: str) -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.append((time.perf_counter() - began, name, line.rstrip("\n")))

    readers = [
        threading.Thread(target=read, args=(stream, name), daemon=True)
        for stream, name in ((process.stderr, "stderr"), (process.stdout, "stdout"))
    ]
    for reader in readers:
        reader.start()
    images_s = None
    while process.poll() is None and time.perf_counter() - began < GIVE_UP_S:
        if first_bytes(out):
            images_s = time.perf_counter() - began
            break
        time.sleep(POLL_S)
    process.send_signal(signal.SIGINT)
    status = process.wait(timeout=120)
    for reader in readers:
        reader.join(timeout=10)
    try:
        left = sorted(os.listdir(out))
    except FileNotFoundError:
        left = ["(no OUT folder)"]
    shutil.rmtree(os.path.dirname(out))
    return {"images_s": images_s, "status": status, "lines": lines, "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the image folder (ROOT/<class>/<image>)")
    parser.add_argument("--runs", type=int, default=1, help="runs (default 1)")
    parser.add_argument("--workers", type=int, default=None, help="--workers of the command")
    parser.add_argument("--out", default=None, help="where the temporary OUT goes (default /tmp)")
    args = parser.parse_args()
    listing_time(args.root)  # warm the page cache
    print(
        f"{'files':>10} {'listing s':>10} {'1st line s':>10} {'images s':>9} "
        f"{'/listing':>8} {'target s':>8} {'exit':>5}  OUT after Ctrl-C"
    )
    for _ in range(args.runs):
        files, listed_s = listing_time(args.root)
        run = one_run(args.root, args.out or tempfile.gettempdir(), args.workers)
        lines = run["lines"]
        assert isinstance(lines, list)
        stderr_first = min((at for at, name, _ in lines if name == "stderr"), default=float("nan"))
        images_s = run["images_s"]
        shown = f"{images_s:9.1f} {images_s / listed_s:7.1f}x" if images_s else f"{'-':>9} {'-':>8}"
        print(
            f"{files:>10,} {listed_s:10.2f} {stderr_first:10.2f} {shown} "
            f"{3 * listed_s + 3:8.1f} {run['status']:>5}  {run['left'] or 'nothing'}"
        )
        for at, name, text in sorted(lines):
            print(f"    {at:7.2f} s  {name}: {text}")


if __name__ == "__main__":
    main()
