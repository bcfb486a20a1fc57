"""The rows and cells of benchmarks/current.py: one loader on one shape of the work, as a
training job runs it (a helper module, not a program; current.py's docstring says what each
row measures). `ROWS` names the rows, `cells_of` lists their cells, `setup_of` gives a cell
the settings its row shares, `floors` measures each row's entropy floor.

A cell is named by a `Cell` (its row, its loader, and for the rank rows its rank), which
travels to the cell's own spawned process as the `key` of `prefetch.tools.bench.measure_row`
(JSON); `make(key, setup)` builds its contender there. Three loaders:

- `prefetch`: one open `prefetch.Loader` with its defaults (workers, backend, decoder) and the
  row's `Augment`; on a rank, `loader.shard(ranks, rank)`, as the framework adapters do;
- `tf.data`: `prefetch bench`'s tf.data row (`TfDataContender`: Model Garden's recipe with
  `decode_and_crop_jpeg` for a crop, AUTOTUNE, `.repeat()` and one iterator); on a rank, its
  share of the files (`files[rank::ranks]`, what `Dataset.shard` before the map reads);
- `DataLoader`: `prefetch bench`'s torch row (`TorchContender`: `DataLoader(num_workers=...,
  persistent_workers=True)`, spawned workers) over `PillowWindow`, the per-sample code a
  PyTorch user writes with Pillow; on a rank, its `Subset` (what `DistributedSampler` gives)
  with the rank's share of the cores as workers.

`measure_ranks` runs the `ranks` cells: one spawned process per rank, the environment torchrun
sets (`LOCAL_WORLD_SIZE`, `LOCAL_RANK`), every batch taken together (a barrier per step, as the
collective of synchronous training makes them); the host's images/s is the sum of the ranks'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import queue as queue_module
import statistics
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
from PIL import Image

import prefetch
from prefetch.decode import DecodeOptions, decode_image
from prefetch.plan import Box, CenterCrop, Crop
from prefetch.runtime import usable_cores
from prefetch.tools import bench
from prefetch.tools.bench import Contender, RowFailed, RowResult, Setup, Span, make_contender

LOADERS = ("prefetch", "tf.data", "DataLoader")
# Seconds a rank may wait for the others at one step before the row is taken for hung (every
# rank takes as many batches as the others: a longer wait is a rank that failed or hung).
RANK_WAIT_S = 120.0
SIZE, BATCH = 224, 64
# row -> (what it is, the folder option it reads, its crop: see Cell.crop)
ROWS: dict[str, tuple[str, str, str | None]] = {
    "train": ("training crop", "photos", "train"),
    "eval": ("centre crop", "photos", "eval"),
    "large": ("2 MP photos, training crop", "large", "train"),
    "fit-crop": ("fit-crop shards of the 2 MP photos", "large", "train"),
    "ranks": ("{ranks} ranks, training crop", "photos", "train"),
    "resize": ("whole image resized", "photos", None),
}
DEFAULT_ROWS = "train,eval,large,fit-crop,ranks"
# The row whose cells a row's ratios and floor are taken against (fit-crop: the originals).
REFERENCE_ROW = {"fit-crop": "large"}


@dataclass(frozen=True)
class Cell:
    """One loader (`loader`, one of LOADERS) on one row: its crop (None: the whole image
    resized), the tar shards it reads instead of the folder (`shards`, prefetch only), for a
    rank row `ranks` and this process's `rank`, and the images of its untimed warm-up."""

    row: str
    loader: str
    crop: str | None = "train"  # "train": RandomResizedCrop + flip; "eval": CenterCrop(0.875)
    shards: str | None = None
    ranks: int = 1
    rank: int | None = None
    warmup: int = 0  # images untimed before the timed span (its CPU time starts after them)

    def key(self) -> str:
        """The cell as JSON: the key its spawned process gets (`parse` reads it back)."""
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def parse(key: str) -> Cell:
        return Cell(**json.loads(key))

    def augment(self) -> prefetch.Augment | None:
        """The `Augment` of the cell's crop, as a user passes it to the Loader."""
        if self.crop is None:
            return None
        if self.crop == "eval":
            return prefetch.Augment(CenterCrop(0.875))
        return prefetch.Augment(prefetch.RandomResizedCrop(), flip=True)


def cells_of(
    rows: Sequence[str], loaders: Sequence[str], shards: str | None, ranks: int
) -> list[Cell]:
    """The cells of `rows` x `loaders`, in that order (the fit-crop row: prefetch only,
    on `shards`; the ranks row on `ranks` ranks)."""
    cells = []
    for row in rows:
        for loader in loaders:
            if row == "fit-crop" and loader != "prefetch":
                continue  # its references are the large row's cells
            cell = Cell(row, loader, ROWS[row][2])
            if row == "fit-crop":
                cell = dataclasses.replace(cell, shards=shards)
            elif row == "ranks":
                cell = dataclasses.replace(cell, ranks=ranks)
            cells.append(cell)
    return cells


def setup_of(folder: prefetch.ImageFolder, cell: Cell) -> Setup:
    """What every loader of the cell's row shares (the DataLoader's workers: usable cores)."""
    options = DecodeOptions((SIZE, SIZE))
    crop = crop_of(cell)
    return Setup(folder, options, BATCH, usable_cores(), 2, 0, decode_image, "pillow", crop)


def floors(
    cells: list[Cell], folders: dict[str, prefetch.ImageFolder], passes: int
) -> dict[str, float]:
    """Row (fit-crop's: its reference row's) -> its entropy floor in images/s: `bench.floor_rate`'s
    work timed by this thread's CPU time (other processes on the machine do not lower it),
    median of `passes` passes after an untimed one, x usable cores; empty when this build has
    no entropy-only decoder."""
    decode = bench.entropy_decoder()
    found: dict[str, float] = {}
    if decode is None:
        return found
    for row, cell in {REFERENCE_ROW.get(cell.row, cell.row): cell for cell in cells}.items():
        paths = [str(path) for path in folders[ROWS[row][1]].paths]
        sample = bench.floor_sample(paths, crop_of(cell), DecodeOptions((SIZE, SIZE)))
        rates = []
        for _ in range(passes + 1):  # the first pass untimed
            began = time.thread_time()
            bench.floor_rate(sample, decode)
            rates.append(len(sample.data) / (time.thread_time() - began))
        found[row] = statistics.median(rates[1:]) * usable_cores()
    return found


def crop_of(cell: Cell) -> Crop | None:
    """The cell's crop: what `Setup.crop`, the tf.data recipe and the floor take."""
    augment = cell.augment()
    return None if augment is None else augment.crop


class PillowWindow:
    """The per-sample code a PyTorch user writes with Pillow (torchvision's RandomResizedCrop,
    CenterCrop and RandomHorizontalFlip do the same on a PIL image): open the file, draw the
    window (prefetch's own `box`: torchvision's algorithm), `draft` the JPEG to the smallest
    DCT scale that keeps the window at least the target, cut and resize the window (bilinear),
    flip half of the training samples, return uint8 HxWx3. Draws come from a generator of its
    own per process (random every epoch, as torch's are). Picklable."""

    def __init__(self, crop: Crop | None, flip: bool) -> None:
        self.crop, self.flip = crop, flip
        self.rng: np.random.Generator | None = None

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        if self.rng is None:
            self.rng = np.random.default_rng()
        height, width = options.image_size
        with Image.open(path) as image:
            full_w, full_h = image.size
            box = Box(0, 0, full_h, full_w)
            if self.crop is not None:
                box = self.crop.box(full_h, full_w, options.image_size, self.rng)
            image.draft("RGB", (math.ceil(full_w * width / box.width),
                                math.ceil(full_h * height / box.height)))  # fmt: skip
            x, y = image.width / full_w, image.height / full_h
            window = (box.left * x, box.top * y, (box.left + box.width) * x,
                      (box.top + box.height) * y)  # fmt: skip
            out = image.convert("RGB").resize((width, height), Image.BILINEAR, box=window)
        if self.flip and self.rng.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return np.array(out)  # writable: torch makes a tensor of it


class PrefetchCell(bench.OpenLoader):
    """One open `prefetch.Loader` with its defaults, as a user makes it for the cell."""

    def __init__(self, cell: Cell, setup: Setup) -> None:
        source: Any = setup.folder if cell.shards is None else prefetch.TarSource(cell.shards)
        augment = cell.augment()
        self.loader = prefetch.Loader(
            source,
            batch_size=setup.batch_size,
            image_size=setup.options.image_size,
            seed=setup.seed,
            **({} if augment is None else {"augment": augment}),
        )
        if cell.rank is not None:
            self.loader.shard(cell.ranks, cell.rank)


def rank_share(setup: Setup, cell: Cell) -> Setup:
    """The setup of a tf.data or DataLoader rank: its share of the files and of the cores (its
    DataLoader's workers). The share is `DistributedSampler`'s (and `Loader.shard`'s count):
    every `ranks`-th file from `rank`, the first files again at the end so that every rank has
    as many, hence as many batches as the others at every step."""
    if cell.rank is None:
        return setup
    files = np.arange(len(setup.folder))
    padded = np.concatenate([files, files[: -len(files) % cell.ranks]])
    folder = setup.folder.subset(padded[cell.rank :: cell.ranks])
    folder.root = setup.folder.root  # type: ignore[attr-defined]  # what the tf.data row names
    workers = max(1, usable_cores() // cell.ranks)
    return dataclasses.replace(setup, folder=folder, workers=workers)  # type: ignore[arg-type]


def make(key: str, setup: Setup) -> Contender:
    """The contender of cell `key` (`Cell.key()`), in the cell's own process, metered."""
    cell = Cell.parse(key)
    if cell.loader == "prefetch":
        return Metered(PrefetchCell(cell, setup), cell.warmup)
    setup = rank_share(setup, cell)
    if cell.loader == "tf.data":
        return Metered(make_contender("tf.data", setup), cell.warmup)
    crop = crop_of(cell)
    window = PillowWindow(crop, flip=crop is not None and not isinstance(crop, CenterCrop))
    torch_setup = dataclasses.replace(setup, decoder=window, decoder_name="pillow")
    return Metered(make_contender("torch", torch_setup), cell.warmup)


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live children: the cell's threads
    and its worker processes (prefetch's, the DataLoader's)."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child that just exited
            times = process.cpu_times()
            total += times.user + times.system
    return total


class Metered:
    """A contender whose CPU time over the timed span is measured: from the first batch asked
    after `warmup` images (where `steady_rate` starts its clock) to `describe()` (called as
    the span ends); `describe()` adds `cpu_s` and `cpu_images`. What the work costs, which
    the machine's load moves far less than images/s."""

    def __init__(self, inner: Contender, warmup: int) -> None:
        self.inner, self.warmup = inner, warmup
        self.images = 0
        self.started: tuple[float, int] | None = None  # (CPU s, images) as the span began

    def open(self, stack: contextlib.ExitStack) -> None:
        self.inner.open(stack)

    def stream(self) -> Generator[int, None, None]:
        with contextlib.closing(self.inner.stream()) as batches:
            for count in batches:
                self.images += count
                yield count
                if self.started is None and self.images >= self.warmup:
                    self.started = (tree_cpu_s(), self.images)

    def describe(self) -> dict[str, Any]:
        described = dict(self.inner.describe())
        if self.started is not None:
            cpu, images = self.started
            described.update(cpu_s=tree_cpu_s() - cpu, cpu_images=self.images - images)
        return described


def rank_span(span: Span, ranks: int) -> Span:
    """A rank's part of `span`: each rank reads its share of every epoch."""
    return Span(math.ceil(span.warmup / ranks), math.ceil(span.timed / ranks))


def measure_ranks(cell: Cell, setup: Setup, span: Span, step_s: float) -> RowResult:
    """Cell `cell` on `cell.ranks` spawned ranks taking each batch together (module
    docstring): images/s and cold start of the host (the ranks' sums), and the share of the
    timed span a rank did not step (waiting for its batch or at the barrier for another's).
    Raises `RowFailed` naming the rank when one fails or exits."""
    context = multiprocessing.get_context("spawn")
    barrier: Any = context.Barrier(cell.ranks)
    answers: Any = context.Queue()
    share = rank_span(span, cell.ranks)
    ranks = [
        context.Process(
            target=_rank,
            args=(
                dataclasses.replace(cell, rank=r, warmup=share.warmup).key(),
                setup,
                share,
                step_s,
                barrier,
                answers,
            ),
            name=f"current-rank-{r}",
        )
        for r in range(cell.ranks)
    ]
    for process in ranks:
        process.start()
    results: dict[int, RowResult] = {}
    try:
        while len(results) < cell.ranks:
            try:
                rank, outcome = answers.get(timeout=0.5)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(ranks) if not p.is_alive() and r not in results]
                if dead:
                    code = ranks[dead[0]].exitcode
                    raise RowFailed(f"rank {dead[0]} exited with code {code}") from None
                continue
            if isinstance(outcome, str):
                raise RowFailed(f"rank {rank}: {outcome}")
            results[rank] = outcome
    finally:
        barrier.abort()  # a rank still waiting at a step gives up at once
        bench.end_children(ranks, answers)
    rows = [results[r] for r in range(cell.ranks)]
    host = sum(r.images_per_s for r in rows)
    # A rank that waits at the barrier for another's batch idles as if waiting for its own:
    # the wait is the share of the span not stepping (each rank steps once per batch).
    stepping = host / cell.ranks / setup.batch_size * step_s
    wait = max(0.0, 1.0 - stepping) if step_s > 0 else None
    described = dict(rows[0].described)
    for field in ("cpu_s", "cpu_images"):
        described[field] = sum(r.described.get(field, 0) for r in rows)
    return RowResult(host, wait, sum(r.cold_images_per_s for r in rows), described)


def _rank(key: str, setup: Setup, span: Span, step_s: float, barrier: Any, answers: Any) -> None:
    """One rank: the launcher's environment, then the cell, a barrier after every batch."""
    cell = Cell.parse(key)
    os.environ.update(LOCAL_WORLD_SIZE=str(cell.ranks), LOCAL_RANK=str(cell.rank))
    try:
        result: RowResult | str = bench.measure_stream(
            key, setup, span, step_s, lambda: barrier.wait(RANK_WAIT_S), make
        )
    except Exception as error:
        lines = str(error).strip().splitlines()
        result = f"{type(error).__name__}: {lines[0] if lines else ''}"
    answers.put((cell.rank, result))
    answers.close()
    answers.join_thread()
