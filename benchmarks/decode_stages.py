"""Benchmark: where one sample's time goes on the crop path, stage by stage, against the floor.

For each JPEG of a folder (sample i of epoch 0, seed 0), the work `Loader(crop=...)` does for
one sample is timed stage by stage, each stage over all images in turn (CPU time of this
thread, so other processes on the machine count less; median of --rounds):

  read          the file's bytes (`storage.read_whole`; page cache warm)
  plan          the sample's generator, the JPEG header, the crop's box, the DCT scale, the flip
  entropy       libjpeg-turbo's Huffman decoding of the rows down to the window's last
                (`window_decode.entropy_decode_rows`): the floor no DCT scale or window avoids
  libjpeg       the rest of libjpeg-turbo's decode that is neither IDCT nor colour: keeping
                the coefficients, the rows around the window that upsampling needs, set-up
                (a gray decode of the window at 1/8, whose IDCT is a DC copy, less entropy)
  IDCT          inverse DCTs of the window's blocks at the DCT scale used: a gray decode at
                that scale less the one at 1/8 (the luma IDCT), times the file's blocks per
                luma block (1.5 for 4:2:0)
  colour        chroma upsampling and YCbCr->RGB of the window: the RGB decode less the gray
                one at the same scale, less the chroma IDCT
  resize        the window to 224x224, straight into its row of the batch slot
                (`window_decode.resize_window(..., out=row)`: no copy of the sample is made)
  flip          the flipped samples (about half of them) mirrored in place in the slot
  overhead      `SampleReader.read_into` of all samples into a slot (what a worker runs per
                batch chunk) less all of the above: Python per sample, checks, bookkeeping

Prints ms per image and share of the whole, and the entropy floor's images/s per core.

    python benchmarks/decode_stages.py --folder /tmp/photos [--images 300] [--crop center]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from prefetch import FileList, window_decode
from prefetch.augment import Augment, Box, CenterCrop, Crop, RandomResizedCrop
from prefetch.backends.base import BatchTask, Slot
from prefetch.backends.reader import SampleReader
from prefetch.decode import DecodeOptions, decode_image
from prefetch.storage import read_whole

SIZE = (224, 224)


def blocks_per_luma_block(data: bytes) -> float:
    """All components' blocks per block of the first (luma) component, from the header."""
    with Image.open(io.BytesIO(data)) as image:
        layers = getattr(image, "layer", None)
    if not layers:
        return 1.0
    sampling = [h * v for _, h, v, _ in layers]
    return sum(sampling) / sampling[0]


class Sample:
    """One sample's inputs to each stage, computed once outside the timed loops."""

    def __init__(self, path: str, index: int, augment: Augment, options: DecodeOptions) -> None:
        jpeg = window_decode._jpegwindow
        assert jpeg is not None
        self.path = path
        self.data = read_whole(path)
        rng = augment.rng(0, 0, index)
        width, height, _, _ = jpeg.header(self.data)
        assert augment.crop is not None
        box = augment.crop.box(height, width, options.image_size, rng)
        self.scale = window_decode.dct_scale(box, options.image_size)
        self.window: Box = window_decode.scaled_box(box, (height, width), self.scale)
        self.eighth: Box = window_decode.scaled_box(box, (height, width), 8)
        self.last_row = box.top + box.height - 1
        self.flipped = augment.flipped(rng)
        self.blocks = blocks_per_luma_block(self.data)
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
        FileList(paths, [0] * count), decode_image, options, None, False, True, augment=augment
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
        "read": cpu_ms(lambda: [read_whole(s.path) for s in samples], count, rounds),
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
    blocks = statistics.mean(s.blocks for s in samples)
    luma_idct = max(gray - gray_eighth, 0.0)
    ms["libjpeg"] = max(gray_eighth - ms["entropy"], 0.0)
    ms["IDCT"] = luma_idct * blocks
    ms["colour"] = max(rgb - gray - luma_idct * (blocks - 1), 0.0)
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
    ms["overhead"] = max(total - sum(ms.values()), 0.0)
    ms["total"] = total
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", required=True)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--crop", choices=("random-resized", "center", "both"), default="both")
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
        print(f"  {'stage':<10} {'ms/image':>9} {'share':>7}")
        for stage, value in ms.items():
            if stage != "total":
                print(f"  {stage:<10} {value:9.3f} {value / total:7.1%}")
        print(f"  {'total':<10} {total:9.3f} {1:7.1%}")
        print(
            f"  entropy floor: {1e3 / ms['entropy']:.0f} images/s per core; the sample path: "
            f"{1e3 / total:.0f} images/s per core ({ms['entropy'] / total:.0%} of the floor)"
        )


if __name__ == "__main__":
    main()
