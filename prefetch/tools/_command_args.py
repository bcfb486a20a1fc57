"""What the `prefetch` command's subcommands share: argument types and a progress bar.

`image_size` and `positive_int` are argparse types whose errors say what is accepted;
`ProgressBar` draws one line in place on a terminal and nothing elsewhere.
"""

from __future__ import annotations

import argparse
import time
from typing import TextIO

# Width of the progress bar, in characters.
BAR_WIDTH = 30
# The progress bar redraws at most this often (and at the end).
BAR_REDRAW_S = 0.1


class ProgressBar:
    """A one-line text progress bar on `stream`, redrawn in place; inert when not enabled.

    Call it as `bar(done, total, label)`; `close()` erases the line. Needs no dependency.
    """

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self._drawn = 0
        self._last = 0.0

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < BAR_REDRAW_S:
            return
        self._last = now
        fraction = min(done / total, 1.0) if total > 0 else 1.0
        filled = round(fraction * BAR_WIDTH)
        line = f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:4.0%} {label}"
        self.stream.write("\r" + line.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(line)

    def close(self) -> None:
        """Erase the bar's line."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def image_size(text: str) -> tuple[int, int]:
    """Parse "224" or "224x192" (height x width) into (height, width)."""
    parts = text.lower().split("x")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"image size must be SIZE or HEIGHTxWIDTH in pixels, like 224 or 224x192; got {text!r}"
        )
    return values[0], values[1]


def positive_int(text: str) -> int:
    """Parse an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def add_batch_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --batch-size and --image-size, the shape of the work every subcommand loads."""
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="images per batch (default 32)"
    )
    parser.add_argument(
        "--image-size",
        type=image_size,
        default=(224, 224),
        metavar="HxW",
        help="size every image is decoded to: SIZE or HEIGHTxWIDTH (default 224x224)",
    )
