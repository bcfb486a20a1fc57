"""How the loader scales with the cores: the curve 1, 2, 4, ... workers per backend, the
defaults, PyTorch's own pipelines beside them, and (with CUDA) a GPU fed by each.

Every row is one long-lived pipeline read as a training job reads it: opened once, warmed up
untimed (`--warmup-s`), then timed for `--seconds`; images/s is what the consumer received.
Rows (RandomResizedCrop to `--image-size` and a left-right flip, batch `--batch-size`):

- `thread N`, `process N`: `Loader(workers=N, backend=...)` for N = 1, 2, 4, ... up to the
  usable cores; `default`: `Loader(...)` with no backend or workers given (what `auto` picks is
  shown with its reason).
- `torch decode_jpeg`, `torch pillow`: `torch.utils.data.DataLoader(num_workers=cores)` over
  `torchvision.io.decode_jpeg` + v2 RandomResizedCrop + flip, and over the Pillow ImageFolder
  recipe (skipped with one line where torchvision is missing).
- `feed ...` (CUDA only): ResNet-50 (torchvision, bf16 autocast, channels_last, SGD) trained
  on a batch kept on the GPU (the ceiling), fed by `prefetch.torch.DeviceLoader` over the
  default Loader, and by the DataLoader with decode_jpeg; with the share of the time the loop
  spent in `next()` (which overlaps the GPU's queued work) and the share the GPU sat idle
  between steps (CUDA events: from the end of a step's kernels to the moment the next batch
  was ready on the stream).

- `ceiling N`: the machine's limit for this work at N processes (the default's worker count
  and the usable cores): N independent processes running the loader's per-sample code on
  their own slices of the files, no loader around them; `default / ceiling` is printed.

Then a model of the curve from what was measured: one worker's CPU per image, the GIL share of
a thread worker's sample (a Python thread spinning beside one worker thread: the share of time
the spinner could not run), and the parent's own CPU per image with processes; from these the
rate predicted for 16 and 64 cores, so a reader on 2 cores sees where each curve bends.

    python benchmarks/scaling.py --root /tmp/photos [--json scaling.json]

Nothing here imports TensorFlow. Under 5 minutes on 16 cores with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from prefetch import Augment, Loader, RandomResizedCrop
from prefetch.runtime import usable_cores
from prefetch.sample import BatchTask, Slot

Row = dict[str, Any]


def powers_of_two(top: int) -> list[int]:
    """1, 2, 4, ... up to `top`, and `top` itself."""
    counts = [1]
    while counts[-1] * 2 < top:
        counts.append(counts[-1] * 2)
    return sorted({*counts, top})


def timed(batches: Iterator[int], warmup_s: float, seconds: float) -> tuple[float, float]:
    """(images/s, parent CPU s per image) over `seconds` after `warmup_s` of `batches`, an
    endless iterator of batch sizes."""
    end_warmup = time.perf_counter() + warmup_s
    while time.perf_counter() < end_warmup:
        next(batches)
    images, began, cpu = 0, time.perf_counter(), _self_cpu()
    while time.perf_counter() - began < seconds:
        images += next(batches)
    elapsed, used = time.perf_counter() - began, _self_cpu() - cpu
    return images / elapsed, used / max(images, 1)


def _self_cpu() -> float:
    """CPU seconds of this process (all its threads; not its children)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def make_loader(args: argparse.Namespace, **tuning: Any) -> Loader:
    return Loader(
        args.root,
        batch_size=args.batch_size,
        image_size=(args.image_size, args.image_size),
        augment=Augment(RandomResizedCrop(), flip=True),
        **tuning,
    )


def loader_sizes(loader: Loader) -> Iterator[int]:
    while True:
        for images, _ in loader:
            yield len(images)


def prefetch_row(args: argparse.Namespace, name: str, **tuning: Any) -> Row:
    with make_loader(args, **tuning) as loader:
        rate, parent_s = timed(loader_sizes(loader), args.warmup_s, args.seconds)
        stats = loader.stats()
    return {
        "row": name,
        "images_per_s": rate,
        "workers": stats.workers,
        "backend": stats.backend,
        "parent_us_per_image": 1e6 * parent_s,
        "note": stats.backend_reason if name == "default" else "",
    }


def _ceiling_worker(
    reader: Any, indices: np.ndarray, size: int, barrier: Any, seconds: float, out: Any
) -> None:
    chunk = min(16, len(indices))  # samples per call: a short overshoot past `seconds`
    slot = Slot(np.empty((chunk, size, size, 3), np.uint8), np.empty(chunk, np.int32))
    reader.prepare()
    reader.read_into(BatchTask(indices[:chunk], 0, 0), slot, 0, chunk, "warm-up")
    barrier.wait()
    done, began, epoch, position = 0, time.perf_counter(), 1, 0
    while time.perf_counter() - began < seconds:
        if position + chunk > len(indices):
            position, epoch = 0, epoch + 1
        task = BatchTask(indices[position : position + chunk], epoch, 0)
        reader.read_into(task, slot, 0, chunk, "ceiling")
        position, done = position + chunk, done + chunk
    out.put(done / (time.perf_counter() - began))


def ceiling_rows(args: argparse.Namespace, counts: list[int]) -> list[Row]:
    """The machine's own limit for this work: N processes that share nothing, each running the
    loader's per-sample code (`SampleReader.read_into`, the same crop, flip and decoder) on its
    own slice of the files, with no loader around them (no parent, no pipes, no ring); the
    sum of their rates. A loader at N workers is judged against it: the host's per-core speed
    as its cores fill (hyperthreads, an all-core clock, memory bandwidth) bends this curve
    too, and no loader can beat it."""
    with make_loader(args, workers=1, backend="thread") as loader:
        reader = loader._epochs.workers.reader  # the per-sample code every backend runs
        total = len(loader.source)
    context = multiprocessing.get_context("spawn")
    rows = []
    for count in counts:
        barrier, out = context.Barrier(count + 1), context.Queue()
        processes = [
            context.Process(
                target=_ceiling_worker,
                args=(reader, mine, args.image_size, barrier, args.seconds, out),
                daemon=True,
            )
            for mine in (np.arange(first, total, count) for first in range(count))
        ]
        for process in processes:
            process.start()
        barrier.wait(timeout=300)
        rate = sum(out.get(timeout=300 + args.seconds) for _ in processes)
        for process in processes:
            process.join()
        note = "independent processes, the loader's per-sample code, no loader"
        rows.append({"row": f"ceiling {count}", "images_per_s": rate, "note": note})
    return rows


def beside_python_rows(args: argparse.Namespace) -> list[Row]:
    """The default loader drained by a thread of its own (as prefetch.torch and Keras drain it)
    while this thread runs pure Python (the worst training loop): images/s alone and beside it,
    and the Python thread's own rate beside the loader as a share of its rate alone."""

    def drain(loader: Loader, seconds: float, out: list[float]) -> None:
        out.append(timed(loader_sizes(loader), 0.0, seconds)[0])

    def spin(seconds: float) -> float:
        count, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            count += 1
        return count / seconds

    with make_loader(args) as loader:
        timed(loader_sizes(loader), args.warmup_s, 0.0)
        alone: list[float] = []
        drain(loader, args.seconds, alone)
        solo = spin(args.seconds / 2)
        beside: list[float] = []
        thread = threading.Thread(target=drain, args=(loader, args.seconds, beside))
        thread.start()
        spun = spin(args.seconds)
        thread.join()
        stats = loader.stats()
    note = f"{stats.backend}, {stats.workers} workers; the Python thread kept {spun / solo:.0%}"
    return [
        {"row": "default, drained alone", "images_per_s": alone[0], "note": ""},
        {"row": "default, beside Python", "images_per_s": beside[0], "note": note},
    ]


def gil_share(args: argparse.Namespace, samples: int = 48) -> float:
    """The share of a thread worker's sample that holds the GIL: one thread reads `samples`
    samples (the loader's own per-sample code) while this thread counts spins of a pure-Python
    loop; the share of the spinner's solo rate it lost is the share the GIL was held."""
    sys.setswitchinterval(1e-4)  # the spinner takes the GIL as soon as the worker drops it
    try:
        with make_loader(args, workers=1, backend="thread") as loader:
            reader = loader._epochs.workers.reader  # the per-sample code every backend runs
            height, width = args.image_size, args.image_size
            slot = Slot(
                np.empty((samples, height, width, 3), np.uint8), np.empty(samples, np.int32)
            )
            indices = np.arange(samples) % len(loader.source)
            reader.read_into(BatchTask(indices, 0, 0), slot, 0, samples, "warm-up")

            def spin(stop: threading.Event) -> float:
                count, began = 0, time.perf_counter()
                while not stop.is_set():
                    count += 1
                return count / (time.perf_counter() - began)

            timer = threading.Event()
            threading.Timer(0.5, timer.set).start()
            solo = spin(timer)
            done = threading.Event()

            def work() -> None:
                reader.read_into(BatchTask(indices, 1, 0), slot, 0, samples, "gil")
                done.set()

            worker = threading.Thread(target=work)
            worker.start()
            beside = spin(done)
            worker.join()
    finally:
        sys.setswitchinterval(0.005)
    return max(0.0, min(1.0, 1.0 - beside / solo))


def torch_rows(args: argparse.Namespace, workers: int) -> list[Row]:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("torch rows: skipped (torch or torchvision is not installed)")
        return []
    rows = []
    for name, load in (("torch decode_jpeg", _decode_jpeg), ("torch pillow", _pillow)):
        data = torch_data_loader(args, workers, load, pin_memory=False)

        def sizes(data: Any = data) -> Iterator[int]:
            while True:
                for images, _ in data:
                    yield len(images)

        rate, parent_s = timed(sizes(), args.warmup_s, args.seconds)
        rows.append(
            {
                "row": name,
                "images_per_s": rate,
                "workers": workers,
                "backend": "torch DataLoader",
                "parent_us_per_image": 1e6 * parent_s,
                "note": "",
            }
        )
        del data
    return rows


def torch_data_loader(
    args: argparse.Namespace, workers: int, load: Callable[[str, int], Any], pin_memory: bool
) -> Any:
    """PyTorch's own pipeline over the folder: `DataLoader(num_workers=workers)` of
    `load(path, size)` (decode, v2 RandomResizedCrop + flip), persistent workers."""
    import torch
    import torchvision

    folder = torchvision.datasets.ImageFolder(args.root)
    paths = [path for path, _ in folder.samples]
    dataset = _PathDataset(paths, folder.targets, functools.partial(load, size=args.image_size))
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        prefetch_factor=4,
        pin_memory=pin_memory,
        drop_last=True,
    )


class _PathDataset:
    """A map-style dataset of (path, label) pairs read with `load` (picklable, top level)."""

    def __init__(self, paths: list[str], labels: list[int], load: Callable[[str], Any]) -> None:
        self.paths, self.labels, self.load = paths, labels, load

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.load(self.paths[index]), self.labels[index]


def _augment(image: Any, size: int) -> Any:
    from torchvision.transforms import v2

    crop = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    return crop(image)


def _decode_jpeg(path: str, size: int) -> Any:
    """torchvision's `decode_jpeg` recipe (top level: DataLoader workers pickle it)."""
    import torchvision

    data = torchvision.io.read_file(path)
    image = torchvision.io.decode_jpeg(data, mode=torchvision.io.ImageReadMode.RGB)
    return _augment(image, size)


def _pillow(path: str, size: int) -> Any:
    """The Pillow `ImageFolder` recipe."""
    from PIL import Image
    from torchvision.transforms import v2

    with Image.open(path) as image:
        return _augment(v2.functional.pil_to_tensor(image.convert("RGB")), size)


def feeding_rows(args: argparse.Namespace, workers: int) -> list[Row]:
    """ResNet-50 on the GPU: a resident batch (the ceiling), prefetch.torch, the DataLoader."""
    try:
        import torch
        import torchvision
    except ImportError:
        print("feeding rows: skipped (torch or torchvision is not installed)")
        return []
    if not torch.cuda.is_available():
        print("feeding rows: skipped (no CUDA device)")
        return []
    from prefetch.torch import DeviceLoader

    torch.backends.cudnn.benchmark = True
    model = (
        torchvision.models.resnet50(num_classes=1000).cuda().to(memory_format=torch.channels_last)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_of = torch.nn.CrossEntropyLoss()

    def step(images: Any, labels: Any) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def marker() -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def train(batches: Iterator[tuple[Any, Any]], warmup: int) -> Row:
        """images/s, the share of the time spent in `next()`, and the share the GPU was idle
        between steps, after `warmup` steps (an epoch's worth where the last batch is
        smaller: cuDNN tunes each new shape once). A step's end and the next batch's arrival
        are events on the stream: the gap between them is time the GPU had nothing queued."""
        for _ in range(warmup):
            step(*next(batches))
        torch.cuda.synchronize()
        images, waited, began = 0, 0.0, time.perf_counter()
        gaps, previous = [], marker()
        first = previous
        while time.perf_counter() - began < args.seconds:
            asked = time.perf_counter()
            batch = next(batches)
            waited += time.perf_counter() - asked
            gaps.append((previous, marker()))
            step(*batch)
            previous = marker()
            images += len(batch[0])
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - began
        idle_ms = sum(done.elapsed_time(ready) for done, ready in gaps)
        return {
            "images_per_s": images / elapsed,
            "wait_share": waited / elapsed,
            "gpu_idle_share": idle_ms / first.elapsed_time(previous),
        }

    size = args.image_size
    resident = (
        torch.rand(args.batch_size, 3, size, size, device="cuda").to(
            memory_format=torch.channels_last
        ),
        torch.randint(0, 1000, (args.batch_size,), device="cuda"),
    )
    rows = []

    def endless_resident() -> Iterator[tuple[Any, Any]]:
        while True:
            yield resident

    rows.append({"row": "feed resident batch", **train(endless_resident(), args.feed_warmup_steps)})
    variants: list[tuple[str, dict[str, Any]]] = [("feed prefetch.torch", {})]
    if args.feed_variants:
        variants += [
            (f"feed prefetch.torch, {workers} processes", {"workers": workers}),
            ("feed prefetch.torch, threads", {"backend": "thread"}),
        ]
    for name, tuning in variants:
        with make_loader(args, **tuning) as loader:
            device_loader = DeviceLoader(loader, device="cuda", dtype=torch.float32)

            def endless_prefetch(device_loader: Any = device_loader) -> Iterator[tuple[Any, Any]]:
                while True:
                    yield from device_loader

            row = train(endless_prefetch(), len(device_loader) + args.feed_warmup_steps)
            stats = loader.stats()
        rows.append({"row": name, **row, "note": f"{stats.backend}, {stats.workers} workers"})
    torch_data = torch_data_loader(args, workers, _decode_jpeg, pin_memory=True)

    def endless_torch() -> Iterator[tuple[Any, Any]]:
        while True:
            for images, labels in torch_data:
                images = images.cuda(non_blocking=True).float().div_(255)
                yield images.contiguous(memory_format=torch.channels_last), labels.cuda()

    rows.append({"row": "feed torch decode_jpeg", **train(endless_torch(), args.feed_warmup_steps)})
    return rows


def model(rows: list[Row], share: float, cores: int) -> list[Row]:
    """Predicted images/s at 16 and 64 cores from one worker's rate, the GIL share (threads:
    Amdahl, the held share runs one at a time) and the parent's CPU per image (processes: the
    parent serves every worker, so it caps the rate at 1 / its CPU per image)."""
    by_name = {row["row"]: row for row in rows}
    predicted = []
    for backend in ("thread", "process"):
        one = by_name.get(f"{backend} 1")
        if one is None:
            continue
        rate = one["images_per_s"]
        parent_s = by_name.get(f"{backend} {cores}", one)["parent_us_per_image"] / 1e6
        for n in (16, 64):
            if backend == "thread":
                value = rate * n / (1 + share * (n - 1))
                bound = f"Amdahl with a GIL share of {share:.1%}"
            else:
                cap = 1 / parent_s if parent_s > 0 else float("inf")
                value = min(rate * n, cap)
                bound = f"parent {1e6 * parent_s:.1f} us/image caps at {cap:,.0f}/s"
            predicted.append({"row": f"model {backend} {n}", "images_per_s": value, "note": bound})
    return predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="an image folder (class subfolders)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--max-workers", type=int, default=usable_cores())
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--feed-warmup-steps", type=int, default=15)
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="parts to leave out: thread, process, ceiling, beside, torch, feed",
    )
    parser.add_argument(
        "--feed-variants",
        action="store_true",
        help="also feed the GPU from all cores' worth of processes, and from threads",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()
    cores = usable_cores()
    print(
        f"# {platform.node()}: {cores} usable cores, {platform.processor() or platform.machine()}"
        f", python {platform.python_version()}, batch {args.batch_size}, RRC {args.image_size} "
        "+ flip"
    )
    rows: list[Row] = []

    def show(row: Row) -> None:
        rows.append(row)
        extra = (
            f"  parent {row['parent_us_per_image']:.1f} us/image"
            if "parent_us_per_image" in row
            else ""
        )
        if "wait_share" in row:
            extra = f"  in next() {row['wait_share']:.0%}, GPU idle {row['gpu_idle_share']:.0%}"
        print(
            f"{row['row']:<24} {row['images_per_s']:>9,.0f} images/s{extra}  {row.get('note', '')}"
        )
        sys.stdout.flush()

    def guarded(part: str, make: Callable[[], list[Row]]) -> None:
        """Run one part of the table; a failure is one line, and the rest still runs."""
        try:
            for row in make():
                show(row)
        except Exception as error:  # a benchmark reports and goes on
            print(f"{part}: failed: {type(error).__name__}: {error}")
        if args.json:  # rewritten after each part: what was measured survives a time limit
            with open(args.json + ".part", "w") as out:
                json.dump({"cores": cores, "gil_share": share, "rows": rows}, out, indent=1)
            os.replace(args.json + ".part", args.json)

    share = gil_share(args)
    print(f"GIL held for {share:.1%} of a thread worker's sample")
    guarded("default", lambda: [prefetch_row(args, "default")])
    for backend in ("thread", "process"):
        if backend not in args.skip:
            for n in powers_of_two(args.max_workers):
                name = f"{backend} {n}"
                row = functools.partial(prefetch_row, args, name, workers=n, backend=backend)
                guarded(name, lambda row=row: [row()])
    if "ceiling" not in args.skip:
        default_workers = next((r["workers"] for r in rows if r["row"] == "default"), None)
        counts = sorted({1, args.max_workers, *([default_workers] if default_workers else [])})
        guarded("ceiling", lambda: ceiling_rows(args, counts))
    if "beside" not in args.skip:
        guarded("beside Python", lambda: beside_python_rows(args))
    if "torch" not in args.skip:
        guarded("torch rows", lambda: torch_rows(args, args.max_workers))
    if "feed" not in args.skip:
        guarded("feeding rows", lambda: feeding_rows(args, args.max_workers))
    guarded("model", lambda: model(rows, share, args.max_workers))
    by_name = {row["row"]: row["images_per_s"] for row in rows}
    default = next((row for row in rows if row["row"] == "default"), None)
    if default is not None:
        ceiling = f"ceiling {default['workers']}"
        for name in ("torch decode_jpeg", "torch pillow", ceiling):
            if by_name.get(name):
                print(f"default / {name}: {default['images_per_s'] / by_name[name]:.2f}x")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        main()
