"""Image decoders: a file path (or an in-memory image) to an HxWxC uint8 array at the target size.

A decoder is any picklable callable `decoder(path, options) -> ndarray` returning an array of
shape `(height, width, channels)` and dtype uint8. Decoders hold no state and are safe to call
from many threads. `prefetch.decode._choice.get_decoder` turns the names a Loader accepts ("auto",
"pillow", "turbo") into decoders.

`decode_image` uses Pillow; with `antialias=True` it decodes JPEGs at a reduced scale (DCT
scaling, Pillow's `draft`) when the file is much larger than the target, before resizing.

Every built-in decoder gets a file's bytes through `prefetch.io._images.read_image` (or checks
bytes it was given with `check_image_bytes`): an empty file and a JPEG of more than
`MAX_JPEG_SCANS` scans are refused there, before any decoder runs, with errors that name the
file; `open_bytes` is Pillow's `Image.open` of bytes whose "cannot identify" error names the
file too.

`DecodeOptions(antialias=False)`, the default, is the Keras-parity path: full-size decode (no
draft) and `prefetch.decode._resize`, which reproduces `tf.image.resize` (no antialiasing,
half-pixel
centres), Keras's crop box and `tf.image.resize_with_pad`, so pixels match what
`keras.utils.image_dataset_from_directory` produces up to rounding and decoder differences.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

from prefetch._messages import suggest_keywords
from prefetch.decode import _resize as resize
from prefetch.io import DEFAULT_MAX_PIXELS, Location, check_image_bytes, open_bytes, open_image

# Pillow filters for Keras's interpolation names. Keras's "gaussian" and "mitchellcubic" have no
# Pillow equivalent and are refused with a message that lists these.
INTERPOLATIONS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "area": Image.Resampling.BOX,
    "lanczos3": Image.Resampling.LANCZOS,
    "lanczos5": Image.Resampling.LANCZOS,
    "hamming": Image.Resampling.HAMMING,
}

# Channels per Keras color_mode.
COLOR_MODES: dict[str, int] = {"grayscale": 1, "rgb": 3, "rgba": 4}

# JPEG DCT scaling is used only while the decoded image stays at least this many times larger
# than the target (Pillow's `thumbnail` uses the same reducing gap), so quality is unchanged.
DRAFT_REDUCING_GAP = 2.0

_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def image_size_pair(image_size: object) -> tuple[int, int]:
    """`image_size` as `(height, width)`: an int >= 1 is a square, a (height, width) tuple or
    list of two ints >= 1 is taken as is. Anything else (0, -1, a float, three numbers, a
    bool) raises ValueError naming `image_size` and the accepted forms."""
    pair = (image_size, image_size) if _is_size(image_size) else image_size
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(map(_is_size, pair))):
        raise ValueError(
            f"image_size must be an int >= 1 (a square, e.g. 224) or (height, width), two ints "
            f">= 1 (e.g. (224, 224)); got {image_size!r}"
        )
    return int(pair[0]), int(pair[1])


def check_max_pixels(value: object) -> None:
    """Refuse (ValueError naming it) a `max_pixels` that is not an int >= 1 or None."""
    if value is not None and not _is_size(value):
        raise ValueError(
            f"max_pixels must be an int >= 1 (pixels, width x height) or None for no limit, "
            f"got {value!r}"
        )


def _is_size(value: object) -> bool:
    """Whether `value` is an int >= 1 (numpy ints too, bools not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 1)


@suggest_keywords
@dataclass(frozen=True)
class DecodeOptions:
    """What a decoder produces: an image of `image_size`, with `channels` channels.

    Parameters (also the attributes of the same names):

    - `image_size`: `(height, width)` of the decoded image, like Keras; an int is a square
      (`224` is `(224, 224)`). Stored as a `(height, width)` tuple of ints.
    - `channels`: 1 (grayscale), 3 (RGB) or 4 (RGBA).
    - `interpolation`: the resize filter by Keras name (`"bilinear"`, `"nearest"`,
      `"bicubic"`, `"area"`, `"lanczos3"`, `"lanczos5"`, `"hamming"`, and with
      `antialias=False` also `"gaussian"` and `"mitchellcubic"`).
    - `crop_to_aspect_ratio`: crop the largest centred region with the target's aspect ratio
      before resizing, instead of stretching.
    - `pad_to_aspect_ratio`: instead resize the whole image to fit and pad it with zeros
      (Keras's `tf.image.resize_with_pad` layout). At most one of the two may be set.
    - `antialias`: `False` (the default, as in Keras and tf.data) decodes at full size and
      resizes like `tf.image.resize` (Keras parity; `interpolation` may then be any of
      `prefetch.decode._resize.METHODS`); `True` resizes with filters that widen when shrinking,
      after
      JPEG DCT scaling (docs/decoders.md, "Choosing antialias").
    - `max_pixels`: the most pixels (width x height, read from the file's header before any
      pixel is decoded) of an image the built-in decoders decode; a larger one raises
      `PIL.Image.DecompressionBombError` naming the file and the limit. None: no limit of
      ours. Default `prefetch.io.DEFAULT_MAX_PIXELS` (64 megapixels); a `Loader` sets it
      from `ErrorPolicy(max_pixels=...)`.

    A bad value raises ValueError naming the option and what is accepted.
    """

    image_size: tuple[int, int]
    channels: int = 3
    interpolation: str = "bilinear"
    crop_to_aspect_ratio: bool = False
    pad_to_aspect_ratio: bool = False
    antialias: bool = False
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __init__(
        self,
        image_size: int | tuple[int, int] | list[int],
        channels: int = 3,
        interpolation: str = "bilinear",
        crop_to_aspect_ratio: bool = False,
        pad_to_aspect_ratio: bool = False,
        antialias: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ) -> None:
        # Written out (not the dataclass's) so that the signature says an int is accepted.
        for name, value in (
            ("image_size", image_size),
            ("channels", channels),
            ("interpolation", interpolation),
            ("crop_to_aspect_ratio", crop_to_aspect_ratio),
            ("pad_to_aspect_ratio", pad_to_aspect_ratio),
            ("antialias", antialias),
            ("max_pixels", max_pixels),
        ):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def __post_init__(self) -> None:
        # Also run by the generated __init__ of a dataclass subclass.
        object.__setattr__(self, "image_size", image_size_pair(self.image_size))
        check_max_pixels(self.max_pixels)
        if self.channels not in _PIL_MODES:
            raise ValueError(f"channels must be 1, 3 or 4, got {self.channels}")
        if self.crop_to_aspect_ratio and self.pad_to_aspect_ratio:
            raise ValueError(
                "crop_to_aspect_ratio and pad_to_aspect_ratio are both True; set at most one"
            )
        if self.antialias and self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {sorted(INTERPOLATIONS)} with antialias=True, "
                f"got {self.interpolation!r}; antialias=False also allows {list(resize.METHODS)}"
            )
        if not self.antialias and self.interpolation not in resize.METHODS:
            raise ValueError(
                f"interpolation must be one of {list(resize.METHODS)} with antialias=False "
                f"(tf.image.resize's methods), got {self.interpolation!r}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """The decoded array's shape: (height, width, channels)."""
        return (self.image_size[0], self.image_size[1], self.channels)


class Decoder(Protocol):
    """A picklable callable from a file's location to an array of `options.shape`, dtype
    uint8. The location is a path or URL (`str`), or for a sample of a shard a
    `prefetch.io.Member` (`prefetch.io.read_location` reads either)."""

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray: ...


def decoder_name(decoder: Decoder) -> str:
    """A short name for `decoder`, for stats and reports: "pillow", "turbo", or its own name."""
    if decoder is decode_image:
        return "pillow"
    name = getattr(decoder, "name", None)
    if isinstance(name, str):
        return name
    return str(getattr(decoder, "__qualname__", None) or type(decoder).__qualname__)


def decode_image(path: Location, options: DecodeOptions) -> np.ndarray:
    """Decode the image file at `path` to `options.shape` with Pillow (the default decoder).

    Raises what Pillow raises for a bad file (`PIL.UnidentifiedImageError` for a non-image or
    an empty file, `OSError` for a truncated or corrupt one, `Image.DecompressionBombError` for
    a bomb, of pixels or of JPEG scans: `check_image_bytes`), naming the file.

    - `path`: the image file, a local path (`str`) or an fsspec URL (`read_image`).
    - `options`: the `DecodeOptions`: the size, channels and resizing of the result.
    """
    with open_image(path, options.max_pixels) as image:
        return _decode_opened(image, options)


def decode_bytes(data: bytes, options: DecodeOptions, name: str | None = None) -> np.ndarray:
    """`decode_image` of an encoded image held in memory (the bytes of a file or an object);
    `name` (its file) is what errors name, else "<N bytes in memory>"."""
    name = _in_memory(data) if name is None else name
    check_image_bytes(data, name, options.max_pixels)
    with open_bytes(data, name) as image:
        return _decode_opened(image, options)


def _decode_opened(image: Image.Image, options: DecodeOptions) -> np.ndarray:
    if options.antialias:  # DCT scaling would change the pixels of the Keras-parity path
        _draft(image, options)
    image.load()
    return to_target_size(image, options)


def _in_memory(data: bytes) -> str:
    return f"<{len(data)} bytes in memory>"


def _draft(image: Image.Image, options: DecodeOptions) -> None:
    """Ask the JPEG decoder for the smallest DCT scale that keeps the reducing gap."""
    if image.format != "JPEG":
        return
    crop_w, crop_h = crop_size(image.size, options)
    scale_x = image.size[0] / crop_w
    scale_y = image.size[1] / crop_h
    height, width = options.image_size
    wanted = (
        math.ceil(width * scale_x * DRAFT_REDUCING_GAP),
        math.ceil(height * scale_y * DRAFT_REDUCING_GAP),
    )
    if wanted[0] < image.size[0] or wanted[1] < image.size[1]:
        image.draft(None, wanted)


def crop_size(size: tuple[int, int], options: DecodeOptions) -> tuple[float, float]:
    """The (width, height) of the centred region that keeps the target aspect ratio."""
    width, height = size
    if not options.crop_to_aspect_ratio:
        return float(width), float(height)
    target_h, target_w = options.image_size
    crop_w = min(float(width), height * target_w / target_h)
    crop_h = min(float(height), width * target_h / target_w)
    return crop_w, crop_h


def to_target_size(image: Image.Image | np.ndarray, options: DecodeOptions) -> np.ndarray:
    """Convert a Pillow image or an HxW[xC] array to `options.shape` uint8.

    Modes are converted like `tf.io.decode_image`: palette images through RGBA (so transparency
    is honoured), 16-bit images scaled to 8 bits, CMYK to RGB, alpha dropped for "rgb". A uint8
    array already of `options.shape` is returned as it is (not a copy) where resizing to the
    same size would change nothing: an in-memory source that stores images at the target size
    pays no conversion per sample.
    """
    if isinstance(image, np.ndarray):
        if (
            image.dtype == np.uint8
            and image.shape == options.shape
            and _same_size_is_identity(options)
        ):
            return image
        image = _array_to_pil(image)
    image = convert_mode(image, _PIL_MODES[options.channels])
    if not options.antialias:
        return _resize_image_like_keras(image, options)
    if options.pad_to_aspect_ratio:
        return _pad_with_pillow(image, options)
    height, width = options.image_size
    crop_w, crop_h = crop_size(image.size, options)
    box = (
        (image.size[0] - crop_w) / 2,
        (image.size[1] - crop_h) / 2,
        (image.size[0] + crop_w) / 2,
        (image.size[1] + crop_h) / 2,
    )
    if image.size != (width, height) or box != (0, 0, *image.size):
        image = image.resize((width, height), INTERPOLATIONS[options.interpolation], box=box)
    array = np.asarray(image)
    return array.reshape(options.shape)


def resize_like_keras(
    array: np.ndarray,
    options: DecodeOptions,
    resize_with: Callable[[np.ndarray, tuple[int, int], str], np.ndarray] = resize.resize,
) -> np.ndarray:
    """The Keras-parity path: Keras's crop box or padding around `resize_with(array, size,
    method)` (by default `prefetch.decode._resize.resize`, TensorFlow's arithmetic in numpy)."""
    height, width = array.shape[:2]
    size, method = options.image_size, options.interpolation
    if options.crop_to_aspect_ratio:
        top, left, crop_h, crop_w = resize.crop_box(height, width, size)
        return resize_with(array[top : top + crop_h, left : left + crop_w], size, method)
    if options.pad_to_aspect_ratio:
        top, left, inner_h, inner_w = resize.pad_layout(height, width, size)
        padded = np.zeros(options.shape, np.uint8)
        padded[top : top + inner_h, left : left + inner_w] = resize_with(
            array, (inner_h, inner_w), method
        )
        return padded
    return resize_with(array, size, method)


def _resize_image_like_keras(image: Image.Image, options: DecodeOptions) -> np.ndarray:
    """`resize_like_keras(np.asarray(image), options)` straight from the Pillow image, through
    `prefetch.decode._resize.resize_image` (Pillow's nearest where it picks TensorFlow's pixels, a
    rows-first bilinear), which resizes the crop box in place rather than a copy of it."""
    size, method = options.image_size, options.interpolation
    if options.pad_to_aspect_ratio:
        top, left, inner_h, inner_w = resize.pad_layout(image.height, image.width, size)
        padded = np.zeros(options.shape, np.uint8)
        inner = resize.resize_image(image, (inner_h, inner_w), method)
        padded[top : top + inner_h, left : left + inner_w] = inner
        return padded
    box = None
    if options.crop_to_aspect_ratio:
        box = resize.crop_box(image.height, image.width, size)
    return resize.resize_image(image, size, method, box).reshape(options.shape)


def _pad_with_pillow(image: Image.Image, options: DecodeOptions) -> np.ndarray:
    """Fit the whole image inside the target with a Pillow filter, then pad with zeros."""
    top, left, inner_h, inner_w = resize.pad_layout(image.height, image.width, options.image_size)
    if image.size != (inner_w, inner_h):
        image = image.resize((inner_w, inner_h), INTERPOLATIONS[options.interpolation])
    padded = np.zeros(options.shape, np.uint8)
    inner = np.asarray(image).reshape(inner_h, inner_w, options.channels)
    padded[top : top + inner_h, left : left + inner_w] = inner
    return padded


# Interpolations whose resize to the same size returns every pixel unchanged (their kernels are
# zero at whole-pixel distances; Pillow's antialiased resize returns a copy at the same size).
# TensorFlow's "gaussian" and "mitchellcubic" blur even then.
SAME_SIZE_IDENTITY = frozenset({"bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5"})


def _same_size_is_identity(options: DecodeOptions) -> bool:
    return options.antialias or options.interpolation in SAME_SIZE_IDENTITY


def _array_to_pil(array: np.ndarray) -> Image.Image:
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.dtype != np.uint8:
        raise TypeError(
            f"images from a source must be uint8 arrays or PIL images, got dtype {array.dtype}; "
            "convert them in the source's __getitem__"
        )
    return Image.fromarray(array)


def convert_mode(image: Image.Image, mode: str) -> Image.Image:
    """`image` in Pillow mode `mode` ("L", "RGB", "RGBA"), converted as `tf.io.decode_image`
    would (see `to_target_size`)."""
    if image.mode == mode:
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16-bit (or 32-bit integer) gray: keep the top 8 bits rather than clipping at 255.
        wide = np.asarray(image).astype(np.int64)
        image = Image.fromarray((np.clip(wide, 0, 65535) >> 8).astype(np.uint8), mode="L")
    elif image.mode == "P" or image.mode == "PA":
        image = image.convert("RGBA")
    elif image.mode in ("LA", "La") and mode == "L":
        image = image.convert("L")
    return image.convert(mode) if image.mode != mode else image
