"""Decoding on a Ray cluster (issue 47): what a CPU node adds, and what the engine costs.

Two comparisons, each row one long-lived Loader in a fresh process, read as training reads it
(`with loader:`, epochs back to back; `--warmup-s` untimed, then `--seconds` timed), on real
photos with the training crop (`RandomResizedCrop` to `--image-size`, a flip, batch
`--batch-size`); rounds alternate the rows, and each row prints its median (min-max):

- confined: the training process and its local workers on core 0 (an affinity mask that every
  process it starts inherits): `process, core 0` is the default Loader there; `ray, core 0
  alone` the Loader with `backend=RayOptions(...)` on a one-node local cluster
  (`ray.cluster_utils.Cluster`) on core 0, its one worker an actor there; `ray, core 0 + a node
  on core 1` the same Loader on a two-node cluster: the head, this process's node, on core 0,
  and a decode node on core 1, each with its own raylet and workers. The ratio of the last two
  is what a CPU node adds; the issue asks for at least 1.7x.
- overhead: both cores for each: `process, cores 0-1` (the default Loader) against
  `ray alone, cores 0-1` (one Ray node on both cores, the Loader's two workers as its actors:
  every row through the object store). Their ratio is the engine's cost; at least 0.85x asked.

Each row also says the CPU its images cost: CPU seconds over the timed span of every process
this program started (the row's, its workers, and the Ray cluster's daemons, workers and
actors), per image. Then what a decoded row costs on the wire: one part of `RAY_PART_ROWS`
rows as an actor answers it, serialized as Ray does (pickle 5, its arrays out of band), per
row, against the row's pixels; and what a part's task costs the other way (sample indices; the
reader with its paths travels once per actor, not per part).

    python benchmarks/ray_decode.py --root /work/photos [--only confined,overhead] [--rounds 3]

Ray's processes are all this program's children, started and shut down here (never `ray
stop`, which would end every Ray cluster on the machine). Linux only (affinity masks).
About 4 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

import prefetch
from prefetch.backends import RAY_PART_ROWS
from prefetch.decode import get_decoder
from prefetch.sample import BatchTask, SampleReader, Slot

RESOURCE = "prefetch"
# Each comparison's rows: (name, backend, the row's cores, the Ray cluster: its head's cores and
# each decode node's, or None). The ratio is the last row's rate over the one before it.
Nodes = tuple[set[int], list[set[int]]] | None
ROWS: dict[str, list[tuple[str, str, set[int], Nodes]]] = {
    "confined": [
        ("process, core 0", "process", {0}, None),
        ("ray, core 0 alone", "ray", {0}, ({0}, [])),
        ("ray, core 0 + a node on core 1", "ray", {0}, ({0}, [{1}])),
    ],
    "overhead": [
        ("process, cores 0-1", "process", {0, 1}, None),
        ("ray alone, cores 0-1", "ray", {0, 1}, ({0, 1}, [])),
    ],
}
WANTED = {"confined": 1.7, "overhead": 0.85}


def loader(args: argparse.Namespace, backend: Any) -> prefetch.Loader:
    crop = prefetch.Augment(crop=prefetch.RandomResizedCrop(), flip=True)
    return prefetch.Loader(
        args.root,
        batch_size=args.batch_size,
        image_size=args.image_size,
        seed=0,
        augment=crop,
        backend=backend,
    )


def child(args: argparse.Namespace) -> None:
    """One row, in this process: print {"images_per_s", "stats"} as JSON."""
    backend: Any = "auto"
    if args.child == "ray":
        import ray

        ray.init(address=args.address, log_to_driver=False)
        backend = prefetch.RayOptions(resource=RESOURCE)
    timed = loader(args, backend)
    with timed:
        images, began, cpu = 0, time.perf_counter(), 0.0
        warm = began + args.warmup_s
        while True:
            for batch in timed:
                now = time.perf_counter()
                if now < warm:
                    began, cpu = now, tree_cpu_s()
                    continue
                images += len(batch.labels)
                if now - began >= args.seconds:
                    break
            else:
                continue
            break
        rate = images / (time.perf_counter() - began)
        cpu_ms = (tree_cpu_s() - cpu) / images * 1000
        stats = str(timed.stats())
    result = {"images_per_s": rate, "cpu_ms": cpu_ms, "stats": stats}
    print(json.dumps({**result, "reason": timed.backend_reason}))


def tree_cpu_s() -> float:
    """CPU seconds used so far by every process this program started: this row's process and
    its workers, and the Ray cluster's daemons, workers and actors (all under the parent)."""
    import psutil

    total = 0.0
    for process in psutil.Process(os.getppid()).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def run_row(
    args: argparse.Namespace, backend: str, cores: set[int], address: str
) -> dict[str, Any]:
    """One row in a fresh process confined to `cores`."""
    command = [sys.executable, __file__, "--child", backend, "--address", address]
    command += ["--root", args.root, "--batch-size", str(args.batch_size)]
    command += ["--image-size", str(args.image_size), "--warmup-s", str(args.warmup_s)]
    command += ["--seconds", str(args.seconds)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    if done.returncode != 0:
        raise RuntimeError(f"row {backend} on cores {sorted(cores)} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def cluster(head: set[int], decode_nodes: list[set[int]]) -> Iterator[str]:
    """A local Ray cluster: the head (no Ray CPUs: the Loader's workers reserve none) on the
    cores `head`, and a decode node on each set of `decode_nodes` (as many Ray CPUs, and
    `RESOURCE`); every process of a node is confined to its cores (they inherit the mask of
    this process when it starts them). Yields its address; shuts it all down at the end."""
    import ray
    from ray.cluster_utils import Cluster

    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, head)
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for cores in decode_nodes:
            os.sched_setaffinity(0, cores)
            nodes.add_node(num_cpus=len(cores), resources={RESOURCE: 1})
        os.sched_setaffinity(0, head)
        ray.init(address=nodes.address, log_to_driver=False)
        nodes.wait_for_nodes()
        ray.shutdown()
        yield nodes.address
    finally:
        nodes.shutdown()
        os.sched_setaffinity(0, mine)


def wire_bytes(args: argparse.Namespace) -> tuple[float, int, int]:
    """(bytes per row an actor's answer costs, the row's pixel bytes, bytes of a part's task):
    one part read as a decode actor reads it (`SampleReader.read_into` into a slot of its
    own), serialized as Ray serializes it (pickle 5, arrays out of band)."""
    made = loader(args, "thread")
    options = made.options
    reader = SampleReader(
        source=made.source,
        decoder=get_decoder("auto"),
        options=options.decode,
        skip_errors=False,
        labelled=True,
        augment=options.augment,
    )
    rows = min(RAY_PART_ROWS, args.batch_size)
    task = BatchTask(np.arange(rows), 0, options.seed)
    height, width, channels = options.decode.shape
    slot = Slot(
        np.empty((rows, height, width, channels), np.uint8),
        np.empty((rows,), np.int32),
        started=np.zeros((rows,), np.float64),
    )
    outcome = reader.read_into(task, slot, 0, rows, "benchmark")
    buffers: list[pickle.PickleBuffer] = []
    answer = (slot.images, slot.labels, outcome, None)
    inband = pickle.dumps(answer, protocol=5, buffer_callback=buffers.append)
    total = len(inband) + sum(memoryview(b).nbytes for b in buffers)
    return total / rows, height * width * channels, len(pickle.dumps(task, protocol=5))


def machine() -> list[str]:
    try:
        with open("/proc/cpuinfo") as info:
            model = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        model = platform.processor() or "unknown CPU"
    commit = subprocess.run(
        ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    import ray

    return [
        f"Machine: {model}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"Ray {ray.__version__}; commit {commit or 'unknown'}.",
        f"Command: `python {shlex.join(['benchmarks/ray_decode.py', *sys.argv[1:]])}`",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/work/photos", help="photos, ROOT/<class>/<image>")
    parser.add_argument(
        "--only", default="confined,overhead", help="comma list of: confined, overhead"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds, rows alternating")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--warmup-s", type=float, default=15.0, help="untimed, actors start")
    parser.add_argument("--seconds", type=float, default=30.0, help="timed")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    for line in machine():
        print(line)
    print(f"Load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| comparison | row | images/s | CPU ms per image | ratio | asked |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for name in args.only.split(","):
        rates: dict[str, list[float]] = {row[0]: [] for row in ROWS[name]}
        cpu: dict[str, list[float]] = {row[0]: [] for row in ROWS[name]}
        for _ in range(args.rounds):
            for row, backend, cores, nodes in ROWS[name]:
                if nodes is not None:
                    with cluster(*nodes) as address:
                        result = run_row(args, backend, cores, address)
                else:
                    result = run_row(args, backend, cores, "")
                rates[row].append(result["images_per_s"])
                cpu[row].append(result["cpu_ms"])
                print(f"# {row}: {result['reason']}\n#   {result['stats']}", file=sys.stderr)
        base, other = (row[0] for row in ROWS[name][-2:])
        ratio = statistics.median(rates[other]) / statistics.median(rates[base])
        for row, *_ in ROWS[name]:
            got = rates[row]
            spread = f" ({min(got):.0f}-{max(got):.0f})" if len(got) > 1 else ""
            last = f"{ratio:.2f}x" if row == other else ""
            asked = f">= {WANTED[name]}x" if row == other else ""
            used = statistics.median(cpu[row])
            print(
                f"| {name} | {row} | {statistics.median(got):.0f}{spread} | {used:.2f} | "
                f"{last} | {asked} |"
            )
    per_row, pixels, task = wire_bytes(args)
    print(
        f"On the wire: a decoded row costs {per_row:,.0f} bytes ({pixels:,} of pixels, "
        f"{per_row / pixels - 1:.2%} more); a part's task, {task:,} bytes for "
        f"{min(RAY_PART_ROWS, args.batch_size)} rows (sample indices, not paths or bytes)."
    )
    print(f"Load average (1, 5, 15 min) after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
