"""The fast-extra hint of `prefetch bench`: what installing libjpeg-turbo + OpenCV would gain.

An estimate, not a measurement: this run's Pillow rate x the Pillow/turbo CPU-time ratio
measured in docs/decoders.md (`TURBO_MEASURED`), interpolated to the folder's photo size.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PIL import Image

from prefetch.decode import fast_available
from prefetch.runtime import usable_cores

if TYPE_CHECKING:
    from prefetch.tools.bench._report import DecoderRate

# CPU ms per image decoded and resized to 224x224 by (decode_image, decode_turbo), at two photo
# sizes (width x height pixels), with and without antialiasing: the "Speed" table of
# docs/decoders.md (update both together). `FastHint` scales this machine's Pillow rate by them.
TURBO_MEASURED: dict[bool, tuple[tuple[int, float, float], ...]] = {
    True: ((500 * 375, 2.29, 2.34), (1600 * 1200, 8.87, 6.90)),
    False: ((500 * 375, 2.08, 1.13), (1600 * 1200, 12.49, 7.64)),
}
FAST_INSTALL = 'pip install "prefetch[fast]"'


@dataclass(frozen=True)
class FastHint:
    """What installing the `fast` extra would gain here: an estimate, not a measurement.

    `pillow_images_per_s` is Pillow's single-core decode + resize rate measured in this run;
    `speedup` the ratio of Pillow's to libjpeg-turbo's CPU time per image measured in
    docs/decoders.md (`TURBO_MEASURED`) for photos of `photo_pixels` (this folder's median,
    interpolated between the measured sizes) and this run's antialias setting;
    `speedup_other_antialias` the same with the other setting.
    """

    pillow_images_per_s: float
    speedup: float
    speedup_other_antialias: float
    photo_pixels: int
    antialias: bool
    cores: int

    def text(self) -> str:
        """The hint `prefetch bench` prints under its table (three lines)."""
        pillow, cores = self.pillow_images_per_s, self.cores
        turbo = pillow * self.speedup
        setting, other = ("with", "without") if self.antialias else ("without", "with")
        return (
            f"hint: the fast extra (libjpeg-turbo + OpenCV) is not installed: {FAST_INSTALL}\n"
            f"  estimated here, {setting} antialiasing as this run: decode + resize "
            f"{self.speedup:.2f}x as fast, {turbo:.0f} instead of {pillow:.0f} images/s per "
            f"core (decode limit {turbo * cores:.0f} instead of {pillow * cores:.0f}); "
            f"{other} antialiasing: {self.speedup_other_antialias:.2f}x\n"
            f"  (an estimate: Pillow's rate measured in this run x the Pillow/turbo CPU-time "
            f"ratio measured in docs/decoders.md for photos of {self.photo_pixels / 1e6:.2f} MP)"
        )


def fast_hint(
    rates: Sequence[DecoderRate], sample: Sequence[str], antialias: bool
) -> FastHint | None:
    """What installing the `fast` extra would gain (see `FastHint`), or None when it is
    installed or Pillow ("pillow" in `rates`) was not measured."""
    pillow = [rate.images_per_s for rate in rates if rate.name == "pillow"]
    if fast_available() or not pillow or not sample:
        return None
    sizes = []
    for path in sample:
        with contextlib.suppress(OSError), Image.open(path) as image:  # reads the header only
            sizes.append(image.width * image.height)
    pixels = int(statistics.median(sizes)) if sizes else TURBO_MEASURED[True][0][0]

    def speedup(flag: bool) -> float:
        (small, *small_ms), (large, *large_ms) = TURBO_MEASURED[flag]
        where = min(max(math.log(pixels / small) / math.log(large / small), 0.0), 1.0)
        small_ratio, large_ratio = (ms[0] / ms[1] for ms in (small_ms, large_ms))
        return small_ratio + where * (large_ratio - small_ratio)

    return FastHint(
        pillow[0], speedup(antialias), speedup(not antialias), pixels, antialias, usable_cores()
    )
