"""Training and evaluation crops, planned from the image's size before any pixel is decoded.

`RandomResizedCrop` and `CenterCrop` are the `Augment(crop=...)` values: small frozen value
objects whose `box(height, width, target, rng)` picks the window of the ORIGINAL image that
becomes the sample (the window is then resized to `image_size`). Only the image's size is
needed, which a JPEG's header gives, so the decoder can decode that window alone
(prefetch.decode._window). `Augment` holds a loader's crop, flip and transform and the
per-sample random generator the crop and flip draw from.

Determinism: a sample's generator is seeded by (seed, epoch, index) and a constant of its own
(`AUGMENT_STREAM`, so it is not the generator `transform` receives), so the same seed gives the
same crops and flips for any worker count, either backend and after `load_state_dict`, and a
new crop in every epoch. Pure Python and numpy; safe to share between threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from prefetch._messages import short, suggest_keywords

# Drawn last into each sample's seed so that crops and flips never reuse the draws of the
# generator that `transform` receives (seeded by (seed, epoch, index) alone).
AUGMENT_STREAM = 0x63726F70  # "crop"

# A user's function of (image, its generator) -> image, run on each sample (`Augment.transform`).
Transform = Callable[[np.ndarray, np.random.Generator], Any]

# torchvision's RandomResizedCrop: draws tried before the centred fallback.
ATTEMPTS = 10


class Box(NamedTuple):
    """A window of an image in pixels: rows [top, top + height), columns [left, left + width)."""

    top: int
    left: int
    height: int
    width: int


def _pair(name: str, value: object) -> tuple[float, float]:
    """`value` as a (low, high) pair of finite floats, or ValueError naming the option."""
    try:
        low, high = (float(v) for v in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return low, high


@suggest_keywords
@dataclass(frozen=True)
class RandomResizedCrop:
    """A random window of the original image, then resized to `image_size` (training).

    torchvision's `RandomResizedCrop` and TensorFlow's `sample_distorted_bounding_box`: the
    window's area is a fraction of the image's drawn uniformly from `scale` (0 < low <= high
    <= 1), its aspect ratio (width / height) drawn log-uniformly from `ratio` (0 < low <=
    high). A draw that does not fit inside the image is drawn again, up to 10 times (torchvision's
    algorithm); then the whole image, its aspect ratio clamped into `ratio`, centred.

    - `scale`: `(low, high)`, the range of the window's area as a fraction of the image's,
      drawn uniformly; `0 < low <= high <= 1`. Default `(0.08, 1.0)`, torchvision's.
    - `ratio`: `(low, high)`, the range of the window's aspect ratio (width / height), drawn
      log-uniformly; `0 < low <= high`. Default `(3/4, 4/3)`, torchvision's.

    A bad value is a `ValueError` naming the range, raised here.
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        low, high = _pair("scale", self.scale)
        if not 0 < low <= high <= 1:
            raise ValueError(
                f"scale must satisfy 0 < low <= high <= 1 (fractions of the image's area), "
                f"got {self.scale!r}"
            )
        ratio_low, ratio_high = _pair("ratio", self.ratio)
        if not 0 < ratio_low <= ratio_high:
            raise ValueError(
                f"ratio must satisfy 0 < low <= high (width / height), got {self.ratio!r}"
            )
        object.__setattr__(self, "scale", (low, high))
        object.__setattr__(self, "ratio", (ratio_low, ratio_high))

    def __repr__(self) -> str:
        scale, ratio = (f"({short(low)}, {short(high)})" for low, high in (self.scale, self.ratio))
        return f"RandomResizedCrop(scale={scale}, ratio={ratio})"

    def box(
        self, height: int, width: int, target: tuple[int, int], rng: np.random.Generator
    ) -> Box:
        """The window of a `height` x `width` image for one sample (`target` is unused: the
        window does not depend on the output size).

        C twin: `random_box` in prefetch/decode/_c/boxes.c (the compiled chunk path), in the
        same double arithmetic and draws; change both."""
        area = height * width
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        # Every attempt's two draws at once (one call: a loader draws a box per sample).
        draws = rng.random((ATTEMPTS, 2)).tolist()
        for area_draw, ratio_draw in draws:
            target_area = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * area_draw)
            aspect = math.exp(log_low + (log_high - log_low) * ratio_draw)
            crop_w = round(math.sqrt(target_area * aspect))
            crop_h = round(math.sqrt(target_area / aspect))
            if 0 < crop_w <= width and 0 < crop_h <= height:
                # Uniform positions: top in [0, height - crop_h], left in [0, width - crop_w].
                row, column = rng.random(2).tolist()
                top = min(int(row * (height - crop_h + 1)), height - crop_h)
                left = min(int(column * (width - crop_w + 1)), width - crop_w)
                return Box(top, left, crop_h, crop_w)
        # The fallback: the whole image, its aspect ratio clamped into `ratio`, centred.
        aspect = width / height
        if aspect < self.ratio[0]:
            crop_w, crop_h = width, max(1, round(width / self.ratio[0]))
        elif aspect > self.ratio[1]:
            crop_w, crop_h = max(1, round(height * self.ratio[1])), height
        else:
            crop_w, crop_h = width, height
        return Box((height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w)


@suggest_keywords
@dataclass(frozen=True)
class CenterCrop:
    """The central window of the image, `fraction` of the largest window with the target's
    aspect ratio, resized to `image_size` (evaluation).

    For a square target this is the `crop_pct` convention of torchvision, timm and TF's Model
    Garden: with `fraction=0.875` and 224x224, resize the short side to 256 and take the
    central 224x224, i.e. a square of 0.875 x the short side (Model Garden's arithmetic:
    `int(fraction * short side)`, offsets rounded up).

    - `fraction`: the share of the largest window with the target's aspect ratio that is
      kept, in (0, 1]; default `0.875` (for 224x224: the central 224x224 of the image resized
      to a short side of 256). Another value is a `ValueError`, raised here.
    """

    fraction: float = 0.875

    def __post_init__(self) -> None:
        fraction = self.fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.number)):
            raise ValueError(f"fraction must be a number in (0, 1], got {fraction!r}")
        if not 0 < float(fraction) <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        object.__setattr__(self, "fraction", float(fraction))

    def __repr__(self) -> str:
        return f"CenterCrop(fraction={short(self.fraction)})"

    def box(
        self, height: int, width: int, target: tuple[int, int], rng: np.random.Generator
    ) -> Box:
        """The central window of a `height` x `width` image (`rng` is unused).

        C twin: `center_box` in prefetch/decode/_c/boxes.c (the compiled chunk path); change
        both."""
        target_h, target_w = target
        # The largest window with the target's aspect ratio, then `fraction` of it.
        full_h = min(float(height), width * target_h / target_w)
        full_w = min(float(width), height * target_w / target_h)
        crop_h = max(1, int(self.fraction * full_h))
        crop_w = max(1, int(self.fraction * full_w))
        return Box((height - crop_h + 1) // 2, (width - crop_w + 1) // 2, crop_h, crop_w)


Crop = RandomResizedCrop | CenterCrop
CROPS = (RandomResizedCrop, CenterCrop)


@suggest_keywords
@dataclass(frozen=True)
class Augment:
    """What a loader does to each sample beyond Keras's resize: `Loader(augment=Augment(...))`.

    All three run in the workers and draw from generators seeded by `(seed, epoch, index)`, so
    the same seed gives the same samples for any worker count, backend or resume.

    - `crop`: the window of the original image each sample becomes, then resized to
      `image_size`: `RandomResizedCrop()` for training (a new window every epoch),
      `CenterCrop(0.875)` for evaluation. Only the window is decoded. None: the whole image.
    - `flip`: flip each sample left-right with probability 0.5 (drawn after its crop).
    - `transform`: `transform(image, rng) -> image`, run on each image at `image_size` after
      the crop and flip, with a generator of its own; it must keep the shape and return uint8.

    For one sample, the crop's window is drawn first, then the flip, both from
    `rng(seed, epoch, index)`.
    """

    crop: Crop | None = None
    flip: bool = False
    transform: Transform | None = None

    def __post_init__(self) -> None:
        if self.crop is not None and not isinstance(self.crop, CROPS):
            raise ValueError(
                "crop must be None, prefetch.RandomResizedCrop(...) or "
                f"prefetch.CenterCrop(...), got {self.crop!r}"
            )
        if not isinstance(self.flip, (bool, np.bool_)):
            raise ValueError(f"flip must be True or False, got {self.flip!r}")
        if self.transform is not None and not callable(self.transform):
            raise ValueError(
                f"transform must be a function transform(image, rng) -> image or None, got "
                f"{self.transform!r}"
            )

    def __bool__(self) -> bool:
        """Whether a crop or flip draws from the sample's generator (`rng`)."""
        return self.crop is not None or bool(self.flip)

    @staticmethod
    def rng(seed: int, epoch: int, index: int) -> np.random.Generator:
        """The generator of one sample's crop and flip.

        C twin: `sample_rng` and `pcg64_double` in prefetch/decode/_c/generator.c (numpy's
        SeedSequence and PCG64, transcribed for the compiled chunk path)."""
        return np.random.default_rng([seed, epoch, index, AUGMENT_STREAM])

    def flipped(self, rng: np.random.Generator) -> bool:
        """Whether this sample is flipped (draw after the crop's window). C twin: the
        T_FLIPPED draw of `plan_window` in prefetch/decode/_c/chunk.c."""
        return bool(self.flip) and bool(rng.random() < 0.5)
