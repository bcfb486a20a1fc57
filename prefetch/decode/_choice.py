"""A decoder by name: what `Loader(decoder=...)` accepts, turned into a decoder and a window
engine.

`get_decoder("auto")`, the default, is the `fast` extra's libjpeg-turbo decoder when it is
installed (faster on every option, docs/decoders.md), else Pillow's `decode_image`; "pillow"
and "turbo" name one of them; a callable is taken as it is. `window_engine` is the engine that
decodes crop windows for the same choice. Above both decoders' modules, so neither imports the
other to choose. Pure functions; thread-safe.
"""

from __future__ import annotations

from prefetch.decode import _turbo as turbo
from prefetch.decode._decoders import Decoder, decode_image

# The decoder names `get_decoder` (and so `Loader(decoder=...)`) accepts.
DECODER_NAMES = ("auto", "pillow", "turbo")


def get_decoder(decoder: Decoder | str | None) -> Decoder:
    """The decoder for a name in `DECODER_NAMES`, or `decoder` itself if it is a callable.

    "auto" (and None) is `prefetch.decode._turbo.decode_turbo` when the `fast` extra is
    installed, else `decode_image`; "pillow" is `decode_image`; "turbo" is `decode_turbo`, and
    raises ImportError naming the extra when it is missing. Any other name is a ValueError.
    """
    if callable(decoder):
        return decoder
    if decoder is None:
        decoder = "auto"
    if decoder not in DECODER_NAMES:
        raise ValueError(
            f"decoder must be one of {DECODER_NAMES} or a callable (path, options) -> array, "
            f"got {decoder!r}"
        )
    if decoder == "pillow":
        return decode_image
    if decoder == "turbo":
        if not turbo.fast_available():
            raise ImportError(f'decoder="turbo" needs the fast extra: {turbo.INSTALL_HINT}')
        return turbo.decode_turbo
    return turbo.decode_turbo if turbo.fast_available() else decode_image


def window_engine(decoder: Decoder | str | None) -> str:
    """The engine `decode_window` uses for crops under `Loader(decoder=decoder)`: "pillow"
    when Pillow alone was asked for, else "turbo" (the fastest this machine has: the compiled
    window decoder, simplejpeg, then Pillow; `prefetch.decode._window.ENGINES`)."""
    return "pillow" if decoder == "pillow" else "turbo"
