"""Benchmark: where one sample's time goes on the crop path, stage by stage, against the floor.

For each JPEG of a folder (sample i of epoch 0, seed 0), the work
`Loader(augment=Augment(crop=...))` does for one sample is timed stage by stage, each stage over
all images in turn (CPU time of this thread, so other processes on the machine count less;
median of --rounds):

  read          the file's bytes (`storage.read_location`; page cache warm)
  plan          the sample's generator, the JPEG header, the crop's box, the DCT scale, the flip
  entropy       libjpeg-turbo's Huffman decoding of the rows down to the window's last
                (`window_decode.entropy_decode_rows`): the floor no DCT scale or window avoids
  set-up        the rest of libjpeg-turbo's decode of the window that is neither IDCT nor
                colour: set-up, the rows next to the window that upsampling needs (a gray
                decode of the window at 1/8, whose IDCT is a DC copy, less entropy)
  luma IDCT     the luma blocks' AC coefficients, decoded into blocks (the floor parses and
                drops them), and their inverse DCT at the DCT scale used (a gray decode at
                that scale less the one at 1/8)
  chroma+colour the chroma blocks' coefficients and IDCT, upsampling and YCbCr->RGB (the RGB
                decode less the gray one at the same scale)
  resize        the window to 224x224, straight into its row of the batch slot
                (`window_decode.resize_window(..., out=row)`: no copy of the sample is made)
  flip          the flipped samples (about half of them) mirrored in place in the slot
  overhead      `SampleReader.read_into` of all samples into a slot (what a worker runs per
                batch chunk) less all of the above: Python per sample, checks, bookkeeping
                (a difference of measurements: below zero within the noise)

Each row but `overhead` is a measurement or a difference of two. Prints ms per image and
share of the whole, the entropy floor's images/s per core, and libjpeg-turbo's decode of the
window alone (entropy to colour): the most any loader that makes these pixels with
libjpeg-turbo can reach.

With --loader-epochs N, also one open default Loader (`Loader(files, batch_size=64,
image_size=224, augment=Augment(crop=..., flip=...))`, threads or processes as "auto" picks)
on the same files: a warm-up epoch untimed, then N epochs timed; its images/s and CPU time per
image (every thread of this process), against the entropy floor of the same epochs' windows
(one thread, times the cores this process may use).
On a busy machine the CPU-time fraction is the steadier.

    python benchmarks/decode_stages.py --folder /tmp/photos [--images 300] [--crop center]
        [--loader-epochs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from prefetch import FileList, Loader
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.io import read_location
from prefetch.plan._crops import Augment, Box, CenterCrop, Crop, RandomResizedCrop
from prefetch.sample import BatchTask, SampleReader, Slot

SIZE = (224, 224)


class Sample:
    """One sample's inputs to each stage, computed once outside the timed loops."""

    def __init__(self, path: str, index: int, augment: Augment, options: DecodeOptions) -> None:
        jpeg = window_decode._jpegwindow
        assert jpeg is not None
        self.path = path
        self.data = read_location(path)
        rng = augment.rng(0, 0, index)
        width, height, _, _ = jpeg.header(self.data)
        assert augment.crop is not None
        box = augment.crop.box(height, width, options.image_size, rng)
        self.scale = window_decode.dct_scale(box, options.image_size)
        self.window: Box = window_decode.scaled_box(box, (height, width), self.scale)
        self.eighth: Box = window_decode.scaled_box(box, (height, width), 8)
        self.last_row = box.top + box.height - 1
        self.flipped = augment.flipped(rng)
        raw = jpeg.decode(self.data, *self.window, self.scale, 3, True)
        self.pixels = np.frombuffer(raw, np.uint8).reshape(self.window.height, self.window.width, 3)


def cpu_ms(work: Callable[[], object], count: int, rounds: int) -> float:
    """Median over `rounds` of this thread's CPU ms for one call of `work`, per image."""
    spent = []
    for _ in range(rounds):
        began = time.thread_time()
        work()
        spent.append((time.thread_time() - began) * 1e3 / count)
    return statistics.median(spent)


def stages(paths: list[str], crop: Crop, flip: bool, rounds: int) -> dict[str, float]:
    """ms per image of each stage, and of the whole per-sample read ("total")."""
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    options = DecodeOptions(SIZE)
    augment = Augment(crop, flip)
    samples = [Sample(path, index, augment, options) for index, path in enumerate(paths)]
    count = len(samples)
    slot = Slot(np.zeros((count, *options.shape), np.uint8), np.zeros(count, np.int32))
    reader = SampleReader(
        FileList(paths, [0] * count), decode_image, options, False, True, augment=augment
    )
    task = BatchTask(np.arange(count), epoch=0, seed=0)

    def plan() -> None:
        for index, sample in enumerate(samples):
            rng = augment.rng(0, 0, index)
            header = window_decode._jpeg_header(sample.data)
            assert header is not None and augment.crop is not None
            box = augment.crop.box(*header, options.image_size, rng)
            window_decode.scaled_box(box, header, window_decode.dct_scale(box, SIZE))
            augment.flipped(rng)

    def decode(channels: int, eighth: bool = False) -> Callable[[], None]:
        def run() -> None:
            for s in samples:
                if eighth:
                    jpeg.decode(s.data, *s.eighth, 8, channels, True)
                else:
                    jpeg.decode(s.data, *s.window, s.scale, channels, True)

        return run

    flips = [slot.images[row] for row, s in enumerate(samples) if s.flipped]
    ms = {
        "read": cpu_ms(lambda: [read_location(s.path) for s in samples], count, rounds),
        "plan": cpu_ms(plan, count, rounds),
        "entropy": cpu_ms(
            lambda: [window_decode.entropy_decode_rows(s.data, s.last_row) for s in samples],
            count,
            rounds,
        ),
    }
    gray_eighth = cpu_ms(decode(1, eighth=True), count, rounds)
    gray = cpu_ms(decode(1), count, rounds)
    rgb = cpu_ms(decode(3), count, rounds)
    ms["set-up"] = gray_eighth - ms["entropy"]
    ms["luma IDCT"] = gray - gray_eighth
    ms["chroma+colour"] = rgb - gray
    ms["resize"] = cpu_ms(
        lambda: [
            window_decode.resize_window(s.pixels, options, slot.images[row])
            for row, s in enumerate(samples)
        ],
        count,
        rounds,
    )
    ms["flip"] = cpu_ms(lambda: [window_decode.flip_left_right(f, f) for f in flips], count, rounds)
    total = cpu_ms(lambda: reader.read_into(task, slot, 0, count, "bench"), count, rounds)
    ms["overhead"] = total - sum(ms.values())
    ms["total"] = total
    ms["decode"] = rgb
    return ms


def loader_row(paths: list[str], crop: Crop, flip: bool, epochs: int) -> None:
    """The default Loader at steady state on `paths`, against the entropy floor of the same
    epochs' windows."""
    source = FileList(paths, [0] * len(paths))
    options = {"batch_size": 64, "image_size": SIZE, "augment": Augment(crop, flip), "seed": 0}
    count = 0
    with Loader(source, **options) as loader:  # type: ignore[arg-type]  # (a dict of options)
        for _ in loader:  # epoch 0: warm-up, untimed
            pass
        began, began_cpu = time.perf_counter(), time.process_time()
        for _ in range(epochs):
            for batch in loader:
                count += len(batch.images)
        wall_s, cpu_s = time.perf_counter() - began, time.process_time() - began_cpu
        backend = loader.stats().backend
    jpeg = window_decode._jpegwindow
    assert jpeg is not None
    datas = [read_location(path) for path in paths]
    sizes = [jpeg.header(data)[1::-1] for data in datas]  # (height, width)
    last_rows = [
        (data, box.top + box.height - 1)
        for epoch in range(1, epochs + 1)
        for index, (data, size) in enumerate(zip(datas, sizes, strict=True))
        for box in [crop.box(*size, SIZE, Augment.rng(0, epoch, index))]
    ]
    began = time.thread_time()
    for data, last_row in last_rows:
        window_decode.entropy_decode_rows(data, last_row)
    floor_ms = (time.thread_time() - began) * 1e3 / len(last_rows)
    cores = len(os.sched_getaffinity(0))
    rate, floor_rate = count / wall_s, cores * 1e3 / floor_ms
    cpu_ms = cpu_s * 1e3 / count
    by_cpu = (  # worker processes' CPU time is not this process's
        f", {floor_ms / cpu_ms:.0%} by CPU time ({cpu_ms:.3f} ms/image)"
        if backend == "thread"
        else ""
    )
    print(
        f"  Loader ({backend}), {epochs} epochs after a warm-up: {rate:.0f} images/s; floor "
        f"{floor_ms:.3f} ms/image x {cores} cores = {floor_rate:.0f} images/s: the Loader at "
        f"{rate / floor_rate:.0%} of it by the clock{by_cpu}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--crop", choices=("random-resized", "center", "both"), default="both")
    parser.add_argument("--loader-epochs", type=int, default=0)
    args = parser.parse_args()
    cv2.setNumThreads(1)  # as in a worker process: all of a resize's CPU time on this thread
    if not window_decode.compiled_available():
        raise SystemExit("needs the compiled window decoder: python setup.py build_ext --inplace")
    paths = sorted(str(p) for p in Path(args.folder).rglob("*.jpg"))[: args.images]
    recipes = {
        "random-resized": ("RandomResizedCrop(), flip=True", RandomResizedCrop(), True),
        "center": ("CenterCrop(0.875)", CenterCrop(0.875), False),
    }
    names = list(recipes) if args.crop == "both" else [args.crop]
    print(f"{args.folder}: {len(paths)} JPEGs, 224x224, CPU ms per image (median of {args.rounds})")
    for name in names:
        label, crop, flip = recipes[name]
        ms = stages(paths, crop, flip, args.rounds)
        total = ms["total"]
        print(f"\n{label}")
        print(f"  {'stage':<13} {'ms/image':>9} {'share':>7}")
        for stage, value in ms.items():
            if stage not in ("total", "decode"):
                print(f"  {stage:<13} {value:9.3f} {value / total:7.1%}")
        print(f"  {'total':<13} {total:9.3f} {1:7.1%}")
        floor, decode = ms["entropy"], ms["decode"]
        print(
            f"  per core: entropy floor {1e3 / floor:.0f} images/s; libjpeg-turbo's window "
            f"decode alone {1e3 / decode:.0f} ({floor / decode:.0%} of the floor); the sample "
            f"path {1e3 / total:.0f} ({floor / total:.0%} of the floor)"
        )
        if args.loader_epochs:
            loader_row(paths, crop, flip, args.loader_epochs)


if __name__ == "__main__":
    main()
