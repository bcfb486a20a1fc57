"""Timeline: produce and consume spans of a loader's batches, as text or as a Gantt chart.

A `Timeline` keeps `Span`s (lane, kind, start, end, batch); `record` is thread-safe. Times are
`time.perf_counter()` seconds, which on Linux is CLOCK_MONOTONIC, shared by all processes, so
spans recorded in worker processes line up with the consumer's. `TimedDecoder` wraps a decoder
and records one span per decoded image into files under a spool folder (so it works in worker
threads and spawned worker processes alike); `TimedDecoder.read_spans` collects them.
Rendering: `render_text` needs nothing; `plot` imports matplotlib when called.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefetch.decode import DecodeOptions, Decoder
from prefetch.io import Location

# Characters of the text rendering's time axis, unless asked otherwise.
TEXT_WIDTH = 96
# Character the text rendering draws for each span kind; other kinds draw the batch number's
# last digit.
KIND_CHARS = {"wait": "."}
# Bar colours of the Gantt chart, by span kind (other kinds are grey).
KIND_COLOURS = {
    "decode": "tab:blue",
    "produce": "tab:green",
    "step": "tab:orange",
    "wait": "tab:red",
}
# What the Gantt chart's legend calls each span kind, in the rows' own words (other kinds
# are shown by their name).
KIND_LABELS = {
    "decode": "decode: a worker decodes one image",
    "produce": "in flight: a batch, from its first decode to its last",
    "wait": "consumer waits for a batch",
    "step": "consumer step (works on a batch)",
}
MATPLOTLIB_HINT = "pip install matplotlib (or, in a checkout, pip install '.[plot]')"


@dataclass(frozen=True)
class Span:
    """`kind` of work on `lane` (a row: a worker, the consumer) from `start_s` to `end_s`.

    `batch` is the batch's number in the epoch (-1 when unknown). Kinds used by prefetch:
    "decode" (a worker decodes one image of the batch), "produce" (first decode start to last
    decode end of a batch), "wait" (the consumer waits for the batch), "step" (the consumer
    works on it).
    """

    lane: str
    kind: str
    start_s: float
    end_s: float
    batch: int


class Timeline:
    """A thread-safe recorder of spans, rendered as rows of text or a Gantt chart (PNG)."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def record(
        self, kind: str, start_s: float, end_s: float, batch: int, *, lane: str = "consumer"
    ) -> None:
        """Add a span of `kind` for `batch` on `lane`; `end_s` must not precede `start_s`."""
        if end_s < start_s:
            raise ValueError(
                f"span {kind!r} of batch {batch} ends ({end_s}) before it starts "
                f"({start_s}); pass time.perf_counter() values in order"
            )
        with self._lock:
            self._spans.append(Span(lane, kind, float(start_s), float(end_s), int(batch)))

    @property
    def spans(self) -> list[Span]:
        """All spans, sorted by start time (a copy)."""
        with self._lock:
            return sorted(self._spans, key=lambda span: (span.start_s, span.end_s))

    def lanes(self) -> list[str]:
        """Lane names in the order they were first used."""
        with self._lock:
            return list(dict.fromkeys(span.lane for span in self._spans))

    def as_dicts(self) -> list[dict[str, Any]]:
        """The spans as JSON-ready dicts, times in seconds since the earliest start."""
        spans = self.spans
        origin = spans[0].start_s if spans else 0.0
        return [
            {**asdict(s), "start_s": s.start_s - origin, "end_s": s.end_s - origin} for s in spans
        ]

    def rows(self) -> list[tuple[str, list[Span]]]:
        """One row per lane; a lane whose spans overlap (batches in flight) takes several rows.

        Spans go to the first row of their lane that is free at their start (greedy interval
        partitioning, so a lane takes as many rows as it has spans overlapping at once). A
        lane with one row is labelled with its name; a lane with several, "<lane> 1",
        "<lane> 2", ... (for "in flight": how many batches were in flight at once).
        """
        rows: list[tuple[str, list[Span]]] = []
        spans = self.spans
        for lane in self.lanes():
            lane_rows: list[list[Span]] = []
            for span in (s for s in spans if s.lane == lane):
                for row in lane_rows:
                    if row[-1].end_s <= span.start_s:
                        row.append(span)
                        break
                else:
                    lane_rows.append([span])
            if len(lane_rows) == 1:
                rows.append((lane, lane_rows[0]))
            else:
                rows.extend((f"{lane} {i}", row) for i, row in enumerate(lane_rows, 1))
        return rows

    def render_text(self, width: int = TEXT_WIDTH) -> str:
        """The timeline as text: one line per row, `width` characters of time across.

        A span draws the last digit of its batch number ("." for a consumer's wait) on every
        character whose time bucket it touches; blanks are idle time.
        """
        if width < 10:
            raise ValueError(f"width must be >= 10 characters, got {width}")
        spans = self.spans
        if not spans:
            return "(empty timeline)"
        origin = spans[0].start_s
        total = max(s.end_s for s in spans) - origin
        bucket = total / width if total > 0 else 1.0
        rows = self.rows()
        label_width = max(len(name) for name, _ in rows)
        right = f"{total:.3f} s"
        lines = [f"{'':{label_width}} |0 s{right:>{width - 3}}|"]
        for name, row in rows:
            chars = [" "] * width
            # Background kinds (a wait) first, so that a short step on top of them shows.
            for span in sorted(row, key=lambda s: s.kind not in KIND_CHARS):
                first = min(int((span.start_s - origin) / bucket), width - 1)
                last = min(max(first, int(np.ceil((span.end_s - origin) / bucket)) - 1), width - 1)
                mark = KIND_CHARS.get(span.kind, str(span.batch % 10) if span.batch >= 0 else "#")
                chars[first : last + 1] = [mark] * (last + 1 - first)
            lines.append(f"{name:>{label_width}} |{''.join(chars)}|")
        lines.append(
            f"{'':{label_width}}  one character = {bucket * 1000:.2f} ms; digits: batch number "
            "mod 10; '.': the consumer waits for a batch"
        )
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike[str], title: str = "prefetch timeline") -> None:
        """Draw `figure(title)` into the image file `path` (PNG by its extension).

        Needs matplotlib; raises ImportError saying how to install it when it is missing.
        """
        self.figure(title).savefig(os.fspath(path), dpi=110)

    def figure(self, title: str = "prefetch timeline") -> Any:
        """A matplotlib `Figure`: the rows as a Gantt chart titled `title` (name the loader
        there), every row labelled (`rows`), and a legend naming each kind in the rows' words
        (`KIND_LABELS`). ValueError when there are no spans; ImportError without matplotlib.
        """
        figure_class, rectangle_class = import_matplotlib("Timeline.plot")
        spans = self.spans
        if not spans:
            raise ValueError("the timeline has no spans to plot; record some first")
        origin = spans[0].start_s
        rows = self.rows()
        figure = figure_class(figsize=(12, 1.0 + 0.35 * len(rows)))
        axes = figure.subplots()
        for index, (_, row) in enumerate(rows):
            for kind in dict.fromkeys(span.kind for span in row):
                axes.broken_barh(
                    [
                        ((span.start_s - origin) * 1000, (span.end_s - span.start_s) * 1000)
                        for span in row
                        if span.kind == kind
                    ],
                    (index - 0.4, 0.8),
                    facecolors=KIND_COLOURS.get(kind, "tab:gray"),
                    # A worker's images are too short to outline: back to back they read as
                    # one busy bar, gaps as idle time. Longer spans are outlined apart.
                    edgecolor="none" if kind == "decode" else "white",
                    linewidth=0.5,
                )
        axes.set_yticks(range(len(rows)), [name for name, _ in rows])
        axes.invert_yaxis()
        axes.set_xlabel("time (ms)")
        axes.set_title(title)
        kinds = sorted(
            dict.fromkeys(span.kind for span in spans),
            key=lambda kind: list(KIND_LABELS).index(kind) if kind in KIND_LABELS else 99,
        )  # in the order of the rows: workers, batches in flight, consumer
        handles = [
            rectangle_class((0, 0), 1, 1, color=KIND_COLOURS.get(k, "tab:gray")) for k in kinds
        ]
        labels = [KIND_LABELS.get(kind, kind) for kind in kinds]
        axes.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        figure.tight_layout()
        return figure


def import_matplotlib(needed_by: str) -> tuple[Any, Any]:
    """matplotlib's `Figure` and `Rectangle` classes, imported now (no pyplot, no global state).

    Raises ImportError naming `needed_by` and the install command when matplotlib is missing.
    """
    try:
        figure = importlib.import_module("matplotlib.figure")
        patches = importlib.import_module("matplotlib.patches")
    except ImportError as error:
        raise ImportError(f"{needed_by} needs matplotlib: {MATPLOTLIB_HINT}") from error
    return figure.Figure, patches.Rectangle


@dataclass(frozen=True)
class DecodeSpan:
    """One image decoded by `worker` (thread or process name) from `start_s` to `end_s`."""

    worker: str
    path: str
    start_s: float
    end_s: float


class TimedDecoder:
    """Wrap `decoder`, writing one line per decoded image into files under `spool_dir`.

    Each worker thread (or process) appends to its own file, so no lock is shared; the
    wrapper is picklable and works with `backend="process"`. `spool_dir` must exist; the
    caller owns it (a temporary folder). Costs one small file append per image.
    """

    def __init__(self, decoder: Decoder, spool_dir: str | os.PathLike[str]) -> None:
        self.decoder = decoder
        self.spool_dir = os.fspath(spool_dir)
        if not os.path.isdir(self.spool_dir):
            raise FileNotFoundError(
                f"spool_dir {self.spool_dir!r} is not a folder; create it (a temporary folder)"
            )

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        began = time.perf_counter()
        try:
            return self.decoder(path, options)
        finally:
            ended = time.perf_counter()
            worker = _worker_name()
            file_name = f"spans-{os.getpid()}-{threading.get_ident()}.tsv"
            with open(os.path.join(self.spool_dir, file_name), "a", encoding="utf-8") as spool:
                spool.write(f"{worker}\t{began!r}\t{ended!r}\t{path}\n")

    def read_spans(self) -> list[DecodeSpan]:
        """Every image decoded so far, in start order."""
        spans = []
        for spool in sorted(Path(self.spool_dir).glob("spans-*.tsv")):
            for line in spool.read_text(encoding="utf-8").splitlines():
                worker, began, ended, path = line.split("\t", 3)
                spans.append(DecodeSpan(worker, path, float(began), float(ended)))
        return sorted(spans, key=lambda span: span.start_s)


def _worker_name() -> str:
    """The thread's name in the main process; the process's name in a worker process."""
    process = multiprocessing.current_process()
    if process.name == "MainProcess":
        return threading.current_thread().name
    return f"{process.name} (pid {os.getpid()})"
