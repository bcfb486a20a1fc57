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
