"""Does prefetch.torch hide the host-to-device copy? A small conv net trained from a Loader.

On a CUDA machine it trains a few-conv-layer model (no torchvision) from a Loader over an image
folder three ways and prints, per step: the wall time, the time the training thread waited for
data (in `next()`), the time it spent copying and converting the batch itself, and images/s.

- `resident`: one batch kept on the GPU, no loading at all: the step's own time, the floor.
- `plain`: the Loader's numpy batch, copied from pageable memory on the training thread
  (`torch.from_numpy(x).to(device)`, then permute, float, normalise): what a user writes today.
- `overlapped`: `prefetch.torch.DeviceLoader`: pinned memory, `non_blocking` copies on a side
  stream one batch ahead, conversion on the device.

Each mode runs twice from an in-memory source (images decoded once: the loader is not the
bottleneck, so the rows differ only in the copy), then once from the folder (decoding).

Without a folder it writes its own JPEG files (Pillow). Needs torch, numpy and Pillow; no
TensorFlow. Without a CUDA GPU it prints one line and exits 0; `--device cpu` runs the same
loop on the CPU as a smoke test (its numbers say nothing about overlap).

    python benchmarks/gpu_overlap.py [--root FOLDER] [--device cuda|cpu] [--steps 60]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import google_crc32c  # noqa: F401  prefetch's TFRecord checksum; no TFRecord is read here
except ModuleNotFoundError:  # an empty stand-in, importable by spawned worker processes too
    _STUB = Path(tempfile.mkdtemp(prefix="prefetch_stub_"))
    (_STUB / "google_crc32c.py").write_text('"""Stand-in: this benchmark reads no TFRecord."""\n')
    sys.path.insert(0, str(_STUB))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_STUB), os.environ.get("PYTHONPATH")])
    )

import numpy as np
import torch

import prefetch
import prefetch.torch
from prefetch.testing import SHAPES, write_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def sample_folder(root: Path | None, per_class: int) -> Path:
    """The folder to read: the given one, or JPEG files written once into a temp folder."""
    if root is not None:
        return root
    folder = Path(tempfile.gettempdir()) / f"prefetch_gpu_overlap_{per_class}"
    if not (folder / "done").exists():
        write_image_folder(folder, class_names=SHAPES[:4], per_class=per_class, size=(320, 240))
        (folder / "done").touch()
    return folder


def small_convnet(classes: int, width: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    channels = 3
    for out in (width, width, 2 * width, 2 * width):
        layers += [
            torch.nn.Conv2d(channels, out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(out),
            torch.nn.ReLU(inplace=True),
            torch.nn.MaxPool2d(2),
        ]
        channels = out
    layers += [
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(channels, classes),
    ]
    return torch.nn.Sequential(*layers)


class InMemory:
    """A Source of images decoded once, at the target size: a loader as fast as a memcpy, so
    that the rows differ only in how the batch reaches the device."""

    def __init__(self, loader: prefetch.Loader, batches: int) -> None:
        images, labels = [], []
        for batch in itertools.islice(loader, batches):  # at most one epoch
            images.append(batch.images.copy())
            labels.append(batch.labels.copy())
        self.images, self.labels = np.concatenate(images), np.concatenate(labels)
        self.class_names = loader.class_names

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])


class Trainer:
    def __init__(self, device: torch.device, classes: int, width: int) -> None:
        self.device = device
        self.model = small_convnet(classes, width).to(device, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp = torch.autocast(device.type, dtype=torch.bfloat16)

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with self.amp:
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class PlainBatches:
    """The Loader's batches converted on the training thread, as a user writes it today;
    `copy_s` adds up the time that takes (the copy from pageable memory blocks the thread)."""

    def __init__(self, loader: prefetch.Loader, device: torch.device) -> None:
        self.loader, self.device, self.copy_s = loader, device, 0.0
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self.loader:
            start = time.perf_counter()
            images = torch.from_numpy(batch.images).to(self.device).permute(0, 3, 1, 2).float()
            images = ((images - self.mean) / self.std).contiguous(memory_format=torch.channels_last)
            labels = torch.from_numpy(batch.labels).to(self.device).long()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            self.copy_s += time.perf_counter() - start
            yield images, labels


def endless(batches: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield from batches


def run(
    mode: str, loader: prefetch.Loader, trainer: Trainer, steps: int, warmup: int
) -> dict[str, float]:
    device = trainer.device
    if mode == "resident":
        resident = next(iter(prefetch.torch.DeviceLoader(loader, device=device)))
        batches: Any = [resident]
    elif mode == "plain":
        batches = PlainBatches(loader, device)
    else:
        batches = prefetch.torch.DeviceLoader(loader, device=device, mean=MEAN, std=STD)
    iterator = endless(batches)
    for _ in range(warmup):
        trainer.step(*next(iterator))
    trainer.sync()
    copy_before = getattr(batches, "copy_s", 0.0)
    wait = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        asked = time.perf_counter()
        images, labels = next(iterator)
        wait += time.perf_counter() - asked
        trainer.step(images, labels)
    trainer.sync()
    elapsed = time.perf_counter() - start
    copy = getattr(batches, "copy_s", 0.0) - copy_before
    return {
        "step_ms": 1e3 * elapsed / steps,
        "wait_ms": 1e3 * (wait - copy) / steps,
        "copy_ms": 1e3 * copy / steps,
        "images_s": steps * loader.options.batch_size / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="an image folder (default: write JPEGs)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--width", type=int, default=128, help="channels of the first conv")
    parser.add_argument("--workers", type=int, default=None, help="loader workers (default: cores)")
    parser.add_argument(
        "--backend", default="auto", help="the folder loader's: auto, thread, process"
    )
    parser.add_argument("--per-class", type=int, default=400, help="images per generated class")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_overlap: skipped: no CUDA GPU (torch.cuda.is_available() is False); "
            "--device cpu runs the loop as a smoke test"
        )
        return 0
    root = sample_folder(args.root, args.per_class)
    loader = prefetch.Loader(
        root,
        batch_size=args.batch_size,
        image_size=args.image_size,
        workers=args.workers,
        seed=0,
        drop_remainder=True,
        backend=args.backend,
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"gpu_overlap: {name}, torch {torch.__version__}, {os.cpu_count()} cores, "
        f"{len(loader.source)} files in {root}, batch {args.batch_size}, {args.image_size} px, "
        f"{args.steps} timed steps per mode after {args.warmup}"
    )
    trainer = Trainer(device, len(loader.class_names), args.width)
    rows = []
    with loader:
        memory = prefetch.Loader(
            InMemory(loader, batches=8),
            batch_size=args.batch_size,
            workers=args.workers,
            image_size=args.image_size,
            seed=0,
            drop_remainder=True,
            backend="thread",
        )
        with memory:
            for mode in ("resident", "plain", "overlapped", "plain", "overlapped"):
                rows.append(("memory", mode, run(mode, memory, trainer, args.steps, args.warmup)))
        for mode in ("plain", "overlapped"):
            rows.append(("folder", mode, run(mode, loader, trainer, args.steps, args.warmup)))
    stats = loader.stats()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"folder loader: {stats.backend} backend, {stats.workers} workers, {stats.decoder}, "
        f"{cores} usable cores; model width {args.width}"
    )
    print(
        f"{'source':<7} {'mode':<11} {'step ms':>8} {'wait ms':>8} {'copy ms':>8} {'images/s':>9}"
    )
    for source, mode, row in rows:
        print(
            f"{source:<7} {mode:<11} {row['step_ms']:8.2f} {row['wait_ms']:8.2f} "
            f"{row['copy_ms']:8.2f} {row['images_s']:9.0f}"
        )
    print(
        "wait: the training thread blocked in next() for data (overlapped: includes the "
        "memcpy into pinned memory); copy: host-to-device copy and conversion on the "
        "training thread (overlapped: on a side stream, not on this thread)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
