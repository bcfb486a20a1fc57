"""The progress of `prefetch shards write` as a person reads it: one line, kept up to date.

`ProgressLine(stream)` is given the writer's `Progress` after each chunk of samples
(`update`) and shows: images done of the total (with the share), images/s and MB/s of this run
(images resumed from an interrupted run are counted as done, not in the rates; the rates are
per second of writing, the listing and planning before it left out), files skipped, the time
elapsed since the write began (its planning included) and the time left at this run's rate.
`say(text)` prints a line of its own (the planning's lines), flushed at once, also where the
stream is a pipe. On a terminal it redraws one line in
place (a carriage return), at most every `TERMINAL_INTERVAL_S`; elsewhere (a log file, a
pipe) it prints the same text as a line of its own every `PLAIN_INTERVAL_S`. `finish` draws
the last state (unless it is shown already) and ends the line. Written by hand rather than
with tqdm or rich: it is one line of text, the plain mode is needed anyway, and the base
install stays numpy and Pillow.
Not thread-safe (the writer calls it from its one thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from prefetch.tools.shards._pass import Progress

# Seconds between redraws of the line on a terminal (a redraw costs little; more is flicker).
TERMINAL_INTERVAL_S = 0.2
# Seconds between progress lines where the output is not a terminal (a log grows slowly).
PLAIN_INTERVAL_S = 5.0


def describe(progress: Progress) -> str:
    """The line for `progress`: `1,200/10,000 images (12%)  95.2 images/s  3.1 MB/s  skipped 0
    elapsed 0:00:12  left 0:01:32`."""
    share = progress.done / progress.total if progress.total else 1.0
    fresh = progress.done - progress.resumed
    elapsed = progress.elapsed_s
    writing = elapsed if progress.writing_s is None else progress.writing_s
    rate = fresh / writing if writing > 0 else 0.0
    remaining = progress.total - progress.done
    if remaining == 0:
        left = "0:00:00"
    elif rate > 0:
        left = _clock(remaining / rate)
    else:
        left = "?"
    resumed = f" ({progress.resumed:,} resumed)" if progress.resumed else ""
    return (
        f"{progress.done:,}/{progress.total:,} images ({share:.0%}){resumed}  "
        f"{rate:.1f} images/s  {progress.bytes / 1e6 / writing if writing > 0 else 0.0:.1f} MB/s  "
        f"skipped {progress.skipped:,}  elapsed {_clock(elapsed)}  left {left}"
    )


def _clock(seconds: float) -> str:
    """`seconds` as H:MM:SS."""
    whole = int(seconds + 0.5)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class ProgressLine:
    """Shows a write's progress on `stream` (module docstring); `terminal` defaults to whether
    `stream` is one."""

    def __init__(
        self,
        stream: TextIO,
        *,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.terminal = stream.isatty() if terminal is None else terminal
        self.clock = clock
        self.interval_s = TERMINAL_INTERVAL_S if self.terminal else PLAIN_INTERVAL_S
        self._shown_at = clock()  # a plain line first after an interval, not at once
        self._width = 0
        self._last: Progress | None = None
        self._shown: Progress | None = None

    def update(self, progress: Progress) -> None:
        """Take the latest state; show it if the interval has passed."""
        self._last = progress
        now = self.clock()
        if now - self._shown_at >= self.interval_s:
            self._shown_at = now
            self._show(progress)

    def say(self, text: str) -> None:
        """Print `text` as a line of its own (after ending a line drawn in place), flushed."""
        self.interrupt()
        self.stream.write(text + "\n")
        self.stream.flush()

    def interrupt(self) -> None:
        """End a line drawn in place, so that other output starts on a line of its own."""
        if self.terminal and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0

    def finish(self) -> None:
        """Show the last state taken and end the line."""
        if self._last is not None and self._last is not self._shown:
            self._show(self._last)
        self.interrupt()

    def _show(self, progress: Progress) -> None:
        self._shown = progress
        text = describe(progress)
        if self.terminal:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
