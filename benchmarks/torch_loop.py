"""A PyTorch training loop fed three ways, and Keras fit under two backends (issue 27's targets).

In one process, on an image folder (RandomResizedCrop + flip, 224x224, batch 64, a small conv
model on the CPU), a steady state of `--epochs` timed epochs after one untimed warm-up epoch:

- `prefetch.torch`: `prefetch.torch.DeviceLoader` over a Loader (crop and flip in its workers);
- `plain Loader`: the same Loader, the batch converted in the loop (permute, float,
  normalise, `.long()`), as a user writes it without prefetch.torch;
- `DataLoader`: `torch.utils.data.DataLoader(num_workers=2)` over a Dataset that opens each
  file with Pillow and applies torchvision's RandomResizedCrop and RandomHorizontalFlip, then
  ToTensor and Normalize: a line-by-line transcription of torchvision's algorithm (torchvision
  is not installed here), what a PyTorch user writes today.

Per loop: images/s and the share of the time the loop waited for data; then each pipeline
alone, iterated without a model (its ceiling on this machine), with its CPU time per image.
Then, with `--keras`, Keras `fit` images/s from `prefetch.keras.dataset` under
`KERAS_BACKEND=tensorflow` and `torch` (each in a subprocess of this script), steady state
(epochs after the first), beside the same model fed the same batches from memory (the
backend's own ceiling on this model) and Keras's own data path for the backend iterated with
no model (what the adapter delivers); `--keras-model linear` makes the model's step small.

    python benchmarks/torch_loop.py --root /tmp/photos [--epochs 2] [--keras]
    python benchmarks/torch_loop.py --root /tmp/photos --skip-torch --keras --keras-model linear
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from PIL import Image

import prefetch

SIZE, BATCH = 224, 64
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---- what a PyTorch user writes today: torchvision's transforms, transcribed ------------------


def random_resized_crop_params(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, line by line: (i, j, h, w)."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,)).item())
            j = int(torch.randint(0, width - w + 1, size=(1,)).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)  # fallback to a central crop
    if in_ratio < min(ratio):
        w = width
        h = round(w / min(ratio))
    elif in_ratio > max(ratio):
        h = height
        w = round(h * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class PillowFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """torchvision's ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip() + ToTensor()
    + Normalize(MEAN, STD), transcribed: pil_loader, then F.resized_crop (PIL bilinear)."""

    def __init__(self, source: prefetch.ImageFolder) -> None:
        self.paths = source.paths.tolist()
        self.labels = source.labels.tolist()
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with open(self.paths[index], "rb") as file:
            image = Image.open(file).convert("RGB")
        i, j, h, w = random_resized_crop_params(*image.size)
        image = image.crop((j, i, j + w, i + h)).resize((SIZE, SIZE), Image.BILINEAR)
        if torch.rand(1) < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1).contiguous()
        tensor = tensor.float().div(255)
        return (tensor - self.mean) / self.std, self.labels[index]


# ---- the loops ---------------------------------------------------------------------------------


def training_options(workers: int) -> dict[str, Any]:
    """The Loader's keywords for every prefetch row: the training recipe at SIZE, batch BATCH."""
    return dict(
        batch_size=BATCH,
        image_size=SIZE,
        seed=0,
        workers=workers,
        augment=prefetch.Augment(prefetch.RandomResizedCrop(), flip=True),
    )


def small_convnet(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 5, stride=4, padding=2),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, classes),
    ).to(memory_format=torch.channels_last)


def plain(loader: prefetch.Loader) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    mean = torch.tensor(MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    for images, labels in loader:
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
        yield (x - mean) / std, torch.from_numpy(labels).long()


def train(batches: Any, classes: int, epochs: int) -> dict[str, float]:
    """One untimed epoch, then `epochs` timed ones: images/s and the share spent waiting."""
    torch.manual_seed(0)
    model = small_convnet(classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images_seen, wait, start = 0, 0.0, 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:
            images_seen, wait, start = 0, 0.0, time.perf_counter()
        iterator = iter(batches())
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            wait += time.perf_counter() - asked
            if batch is None:
                break
            images, labels = batch
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            images_seen += len(labels)
    elapsed = time.perf_counter() - start
    return {"images_s": images_seen / elapsed, "wait_share": wait / elapsed, "s": elapsed}


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its living children (DataLoader's worker
    processes, prefetch's when its backend is processes)."""
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def read(batches: Any, classes: int, epochs: int) -> dict[str, float]:
    """The pipeline alone, no model: one untimed epoch, then `epochs` timed: images/s, and the
    CPU time it spent per image (all its threads and processes): while the cores are the limit,
    the ratio of two pipelines' CPU per image bounds the ratio of their images/s in training."""
    images_seen, start, cpu = 0, 0.0, 0.0
    for epoch in range(epochs + 1):
        if epoch == 1:
            images_seen, start, cpu = 0, time.perf_counter(), cpu_seconds()
        for _, labels in batches():
            images_seen += len(labels)
    elapsed = time.perf_counter() - start
    cpu_ms = 1000 * (cpu_seconds() - cpu) / images_seen
    return {"images_s": images_seen / elapsed, "wait_share": 1.0, "s": elapsed, "cpu_ms": cpu_ms}


def torch_rows(
    root: Path, epochs: int, workers: int, step: Any
) -> list[tuple[str, dict[str, float]]]:
    import prefetch.torch

    source = prefetch.ImageFolder(root)
    classes = len(source.class_names)
    options = training_options(workers)
    rows = []
    loader = prefetch.Loader(source, **options)
    with loader:
        device_loader = prefetch.torch.DeviceLoader(loader, mean=MEAN, std=STD)
        rows.append(("prefetch.torch", step(lambda: device_loader, classes, epochs)))
    loader = prefetch.Loader(source, **options)
    with loader:
        rows.append(("plain Loader", step(lambda: plain(loader), classes, epochs)))
    data = torch.utils.data.DataLoader(
        PillowFolder(source),
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
    )
    rows.append(("DataLoader(2)", step(lambda: data, classes, epochs)))
    return rows


# ---- Keras fit under one backend (run in a subprocess) -------------------------------------


def keras_fit(root: Path, epochs: int, workers: int, model_name: str) -> dict[str, float]:
    """Keras fit images/s under this process's backend: from `prefetch.keras.dataset`, and the
    same model on the same batches held in memory (the backend's own ceiling). `model_name`:
    "conv" (two conv layers: the backend's own speed shows) or "linear" (pooling and a dense
    layer: the smallest step; the data path alone is timed beside it, with no model)."""
    import keras

    import prefetch.keras

    loader = prefetch.Loader(root, **training_options(workers))

    class InMemory(keras.utils.PyDataset):  # type: ignore[misc]
        def __init__(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> None:
            super().__init__()
            self.batches = batches

        def __len__(self) -> int:
            return len(self.batches)

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            return self.batches[index]

    def images_s(data: Any) -> float:
        keras.utils.set_random_seed(0)
        convolutions = [
            keras.layers.Conv2D(16, 5, strides=4, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu"),
        ]
        model = keras.Sequential(
            [
                keras.Input((SIZE, SIZE, 3)),
                keras.layers.Rescaling(1 / 255),
                *(convolutions if model_name == "conv" else []),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(len(loader.class_names)),
            ]
        )
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        times: list[float] = []

        class Clock(keras.callbacks.Callback):  # type: ignore[misc]
            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                times.append(time.perf_counter())

            def on_train_end(self, logs: Any = None) -> None:
                times.append(time.perf_counter())

        model.fit(data, epochs=epochs + 1, verbose=0, callbacks=[Clock()])
        return epochs * len(loader.source) / (times[-1] - times[1])  # epochs after the first

    def data_path_images_s(data: Any) -> float:
        """What `fit` iterates under this backend, with no model: Keras's own data adapter
        (an internal of Keras, the one `fit` builds) over `data`, epochs after the first."""
        from keras.src.trainers.data_adapters import get_data_adapter

        adapter = get_data_adapter(data)
        iterate = {
            "tensorflow": adapter.get_tf_dataset,
            "torch": adapter.get_torch_dataloader,
            "jax": adapter.get_jax_iterator,
        }[keras.backend.backend()]
        images, start = 0, 0.0
        for epoch in range(epochs + 1):
            if epoch == 1:
                images, start = 0, time.perf_counter()
            adapter.on_epoch_begin()
            for _, labels in iterate():
                images += len(labels)
            adapter.on_epoch_end()
        return images / (time.perf_counter() - start)

    with loader:
        fed = images_s(prefetch.keras.dataset(loader))
        alone = data_path_images_s(prefetch.keras.dataset(loader))
        held = InMemory([(x.copy(), y.copy()) for x, y in loader])
    return {"images_s": fed, "memory_images_s": images_s(held), "data_path_images_s": alone}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="an image folder")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after a warm-up")
    parser.add_argument("--workers", type=int, default=2, help="the Loader's workers")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the three loops")
    parser.add_argument("--keras", action="store_true", help="also Keras fit per backend")
    parser.add_argument(
        "--keras-model",
        choices=("conv", "linear"),
        default="conv",
        help="conv: two conv layers (each backend's own speed shows); linear: pooling and a "
        "dense layer (the smallest step; Keras's data path alone is timed beside it)",
    )
    parser.add_argument("--keras-backend", help=argparse.SUPPRESS)  # the subprocess's own run
    parser.add_argument("--skip-torch", action="store_true", help="only the Keras rows")
    args = parser.parse_args()
    if args.keras_backend:
        print(json.dumps(keras_fit(args.root, args.epochs, args.workers, args.keras_model)))
        return 0
    print(
        f"torch_loop: {args.root} ({len(prefetch.ImageFolder(args.root))} files), {SIZE}px, "
        f"batch {BATCH}, {args.epochs} timed epochs after 1, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.1f}, torch {torch.__version__}"
    )
    if not args.skip_torch:
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(args.repeats):  # the loops take turns, so the load hits each alike
            for name, row in torch_rows(args.root, args.epochs, args.workers, train):
                results.setdefault(name, []).append(row)
            for name, row in torch_rows(args.root, args.epochs, args.workers, read):
                results.setdefault(f"{name}, no model", []).append(row)
        print(
            f"{'loop':<26} {'images/s':>9} {'waiting':>8} {'CPU ms/image':>13}"
            f"  (median of {args.repeats}; each run)"
        )
        for name, rows in results.items():
            speed = statistics.median(r["images_s"] for r in rows)
            if "cpu_ms" in rows[0]:  # a pipeline alone: its CPU per image, no waiting share
                wait, cpu = "", f"{statistics.median(r['cpu_ms'] for r in rows):.2f}"
                each = " ".join(f"{r['images_s']:.0f}/{r['cpu_ms']:.2f}ms" for r in rows)
            else:
                wait, cpu = f"{statistics.median(r['wait_share'] for r in rows):.0%}", ""
                each = " ".join(f"{r['images_s']:.0f}/{r['wait_share']:.0%}" for r in rows)
            print(f"{name:<26} {speed:9.1f} {wait:>8} {cpu:>13}  {each}")
    if args.keras:
        keras_rows: dict[str, list[dict[str, float]]] = {}
        for repeat in range(args.repeats):  # the backends take turns, as the loops do
            backends = ("tensorflow", "torch")
            for backend in backends if repeat % 2 == 0 else backends[::-1]:
                command = [
                    sys.executable,
                    __file__,
                    "--root",
                    str(args.root),
                    "--epochs",
                    str(args.epochs),
                    "--workers",
                    str(args.workers),
                    "--keras-model",
                    args.keras_model,
                    "--keras-backend",
                    backend,
                ]
                environment = {
                    **os.environ,
                    "KERAS_BACKEND": backend,
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                }
                result = subprocess.run(command, env=environment, capture_output=True, text=True)
                if result.returncode != 0:
                    print(f"{backend:<16} failed: {result.stderr[-2000:]}")
                    continue
                row = json.loads(result.stdout.strip().splitlines()[-1])
                keras_rows.setdefault(backend, []).append(row)
        print(
            f"{'Keras backend':<16} {'images/s':>9} {'from memory':>12} {'ratio':>6}"
            f" {'data path alone':>16}  (model {args.keras_model}; median of {args.repeats};"
            " each run: fit, data path)"
        )
        for backend, rows in keras_rows.items():
            fed = statistics.median(r["images_s"] for r in rows)
            held = statistics.median(r["memory_images_s"] for r in rows)
            alone = statistics.median(r["data_path_images_s"] for r in rows)
            each = " ".join(f"{r['images_s']:.0f}/{r['data_path_images_s']:.0f}" for r in rows)
            print(f"{backend:<16} {fed:9.1f} {held:12.1f} {fed / held:6.0%} {alone:16.1f}  {each}")
        if len(keras_rows) == 2:
            for column, what in (
                ("images_s", "fit from a Loader"),
                ("data_path_images_s", "data path alone"),
            ):
                ratio = statistics.median(r[column] for r in keras_rows["torch"]) / (
                    statistics.median(r[column] for r in keras_rows["tensorflow"])
                )
                print(f"torch backend / tensorflow backend, {what}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
