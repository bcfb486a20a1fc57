"""Bytes to pixels: a location's image as an HxWxC uint8 array at the target size.

A decoder is any picklable, stateless callable `decoder(location, DecodeOptions) -> ndarray`.
Built in: `decode_image` (Pillow, DCT-scaled with `draft`), `decode_turbo` (libjpeg-turbo and
OpenCV: the `fast` extra), chosen by name with `get_decoder`; `decode_window`, the crop path,
decodes only a crop box (the compiled `_jpegwindow` extension where built). Every built-in
decoder reads through `read_image`, which refuses what no decoder should be given
(`check_image_bytes`: empty files, scan bombs). The resizes match `tf.image.resize` (Keras
parity) or Pillow's antialiasing. Thread-safe throughout. Imports `prefetch.plan`,
`prefetch.io` and the top level.
"""

from prefetch.decode._choice import DECODER_NAMES, get_decoder, window_engine
from prefetch.decode._decoders import (
    COLOR_MODES,
    DecodeOptions,
    Decoder,
    check_max_pixels,
    convert_mode,
    decode_bytes,
    decode_image,
    decoder_name,
    image_size_pair,
    to_target_size,
)
from prefetch.decode._resize import METHODS
from prefetch.decode._turbo import (
    TurboDecoder,
    available_decoders,
    best_decoder,
    decode_turbo,
    fast_available,
)
from prefetch.decode._window import (
    chunk_available,
    compiled_available,
    decode_chunk,
    decode_window,
    entropy_decode_rows,
    window_engine_name,
)
from prefetch.decode._window_resize import crop_image, flip_left_right

__all__ = [
    "COLOR_MODES",
    "DECODER_NAMES",
    "METHODS",
    "DecodeOptions",
    "Decoder",
    "TurboDecoder",
    "available_decoders",
    "best_decoder",
    "check_max_pixels",
    "chunk_available",
    "compiled_available",
    "convert_mode",
    "crop_image",
    "decode_bytes",
    "decode_chunk",
    "decode_image",
    "decode_turbo",
    "decode_window",
    "decoder_name",
    "entropy_decode_rows",
    "fast_available",
    "flip_left_right",
    "get_decoder",
    "image_size_pair",
    "to_target_size",
    "window_engine",
    "window_engine_name",
]
