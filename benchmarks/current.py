"""What the current code does: images/s against tf.data and PyTorch's DataLoader, per shape.

The table that opens docs/performance.md. Rows (`--rows`, in this order; 224x224, batch 64):

  train     training crop, `Augment(RandomResizedCrop(), flip=True)`, on `--photos`
            (ImageNet-sized photos)
  eval      centre crop, `Augment(CenterCrop(0.875))`, resized like Keras (bilinear, no
            antialiasing: the Loader's default), on `--photos`
  large     the training crop on `--large` (camera-sized photos, 2 megapixels and more)
  fit-crop  the training crop on tar shards of `--large` written by `prefetch shards write
            --format tar --fit-crop 224` (into a temporary folder, once per run; not timed).
            prefetch only: tf.data and the DataLoader have no reader of these shards, so the
            row's ratios are to their `large` cells (the same photos, as stored)
  ranks     the training crop on `--photos`, `--ranks` ranks of one host, each its own
            process and pipeline over its share (benchmarks/current_rows.py), every batch
            taken by all ranks together; images/s of the host
  resize    (not by default) the whole image resized: `Loader(folder)` as it comes

Loaders (`--loaders`): `prefetch` (one open `prefetch.Loader` with its defaults: workers,
backend, decoder), `tf.data` (TF Model Garden's input recipe, AUTOTUNE, `.repeat()`: the row of
`prefetch bench`) and `DataLoader` (`torch.utils.data.DataLoader(num_workers=usable cores,
persistent_workers=True)` over a Dataset written with Pillow as a user writes it: open, `draft`,
the window cut and resized, flip; torchvision's algorithm, no torchvision needed).

Every cell is one long-lived pipeline as a training job runs it, in a fresh spawned process
(`prefetch.tools.bench.measure_row`): `--warmup-epochs` untimed, then `--epochs` timed; the
consumer sleeps `--step-ms` after each batch (a training step; default 14 ms per 64 images,
ResNet-50 on the H200 of issue 34, 4,700 images/s: "wait" is the share of the timed span such a
GPU would wait for data; `--step-ms 0`: no step, no wait column). `--rounds` rounds, the cells'
order reversed every other round; images/s is the median with its (min-max) over the rounds,
and a ratio is of the medians with the range of the rounds' own ratios. "CPU ms/image" is the
CPU time (user + system) of the cell's processes over the timed span (its threads and worker
processes; the ranks row: every rank's) per image: what the work costs, which other load on
the machine moves far less than images/s. "of floor" is images/s over the row's entropy floor
(`prefetch.tools.bench.floor_rate`'s work, libjpeg-turbo's entropy decoding alone of the rows
each sample needs, timed by CPU time on one core, x usable cores: no libjpeg-turbo loader
passes it on this machine; the fit-crop row's is the originals' floor, which fewer stored
pixels can pass).

    .venv/bin/python benchmarks/current.py --photos /work/photos --large /work/photos-large \\
        --markdown --plot docs/img/current.png [--rounds 3] [--rows train,eval] [--json F]

Prints the machine, the load average before and after, the command, the table (text, and
with `--markdown` the Markdown of docs/performance.md), and writes the chart (`--plot`,
matplotlib: the `plot` extra). Photo folders: `python ../shared/tools/make_photo_folder.py
--root /tmp/photos --n 1000` and `... --root /tmp/photos-large --n 300 --large`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from current_rows import (  # benchmarks/current_rows.py, beside this file
    BATCH,
    DEFAULT_ROWS,
    LOADERS,
    REFERENCE_ROW,
    ROWS,
    SIZE,
    Cell,
    cells_of,
    floors,
    make,
    measure_ranks,
    setup_of,
)

import prefetch
from prefetch.runtime import usable_cores
from prefetch.tools.bench import (
    RowResult,
    Span,
    cpu_model,
    measure_rounds,
    measure_row,
    median_range,
)
from prefetch.tools.shards import write_shards


def measure(
    cells: list[Cell], folders: dict[str, prefetch.ImageFolder], args: argparse.Namespace
) -> dict[str, list[RowResult]]:
    """Every cell, `args.rounds` rounds alternating; key -> its rounds (a failed cell: none)."""
    by_key = {cell.key(): cell for cell in cells}
    step_s = args.step_ms / 1000

    def one(key: str) -> RowResult:
        cell = by_key[key]
        folder = folders[ROWS[cell.row][1]]
        setup = setup_of(folder, cell)
        span = Span(args.warmup_epochs * len(folder), args.epochs * len(folder))
        if cell.row == "ranks":
            return measure_ranks(cell, setup, span, step_s)
        metered = dataclasses.replace(cell, warmup=span.warmup).key()
        return measure_row(metered, setup, span, step_s, lambda: None, make=make)

    def said(number: int, key: str, result: RowResult | str) -> None:
        cell = by_key[key]
        shown = result if isinstance(result, str) else f"{result.images_per_s:.0f} images/s"
        print(f"round {number}: {cell.row:<8} {cell.loader:<10} {shown}", file=sys.stderr)

    results, failed = measure_rounds(list(by_key), args.rounds, one, said)
    for key, why in failed.items():
        print(f"{by_key[key].row} {by_key[key].loader}: {why}", file=sys.stderr)
    return {key: runs for key, runs in results.items() if key not in failed}


def ratio(top: list[RowResult], bottom: list[RowResult]) -> str:
    """Ratio of the medians, and the range of the rounds' own ratios (rounds measured by both)."""
    if not top or not bottom:
        return "-"
    middle = statistics.median(r.images_per_s for r in top) / statistics.median(
        r.images_per_s for r in bottom
    )
    pairs = [a.images_per_s / b.images_per_s for a, b in zip(top, bottom, strict=True)]
    if len(pairs) < 2:
        return f"{middle:.2f}x"
    return f"{middle:.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"


def table(
    cells: list[Cell], results: dict[str, list[RowResult]], floor: dict[str, float], ranks: int
) -> list[dict[str, str]]:
    """One line per cell: its row, loader, images/s (min-max), ratios, wait, of floor."""
    lines = []
    for cell in cells:
        runs = results.get(cell.key(), [])
        reference = REFERENCE_ROW.get(cell.row, cell.row)
        other = {c.loader: results.get(c.key(), []) for c in cells if c.row == reference}
        waits = [r.wait_fraction for r in runs if r.wait_fraction is not None]
        cpu = [
            r.described["cpu_s"] / r.described["cpu_images"]
            for r in runs
            if r.described.get("cpu_images")
        ]
        rate = statistics.median(r.images_per_s for r in runs) if runs else None
        lines.append({
            "row": ROWS[cell.row][0].format(ranks=ranks),
            "loader": cell.loader,
            "images/s": median_range([r.images_per_s for r in runs]) if runs else "failed",
            "vs tf.data": ratio(runs, other.get("tf.data", [])),
            "vs DataLoader": ratio(runs, other.get("DataLoader", [])),
            "wait": f"{statistics.median(waits):.0%}" if waits else "-",
            "CPU ms/image": f"{1000 * statistics.median(cpu):.2f}" if cpu else "-",
            "of floor": f"{rate / floor[reference]:.2f}x" if rate and reference in floor else "-",
        })  # fmt: skip
    return lines


COLUMNS = (
    "row", "loader", "images/s", "vs tf.data", "vs DataLoader", "wait", "CPU ms/image", "of floor"
)  # fmt: skip


def print_text(lines: list[dict[str, str]]) -> None:
    widths = {c: max(len(c), *(len(line[c]) for line in lines)) for c in COLUMNS}
    for line in [dict(zip(COLUMNS, COLUMNS, strict=True)), *lines]:
        left = [line[c].ljust(widths[c]) for c in COLUMNS[:2]]
        print("  ".join(left + [line[c].rjust(widths[c]) for c in COLUMNS[2:]]))


def print_markdown(lines: list[dict[str, str]], header: list[str]) -> None:
    """The table as docs/performance.md shows it: the header lines, then one line per cell
    (a row's name on its first cell only; prefetch's figures in bold)."""
    print("\n".join(f"{text}  " for text in header) + "\n")
    print("| " + " | ".join(COLUMNS) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in COLUMNS[2:]) + " |")
    shown = ""
    for line in lines:
        cells = [line[c] for c in COLUMNS[1:]]
        if line["loader"] == "prefetch":
            cells[:2] = [f"**{cells[0]}**", f"**{cells[1]}**"]
        print("| " + " | ".join([line["row"] if line["row"] != shown else "", *cells]) + " |")
        shown = line["row"]


def plot(
    lines: list[dict[str, str]],
    results: dict[str, list[RowResult]],
    cells: list[Cell],
    floor: dict[str, float],
    path: str,
    title: str,
) -> None:
    """Images/s per row, one bar per loader with its rounds' range, and the row's floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys(line["row"] for line in lines))
    colours = {"prefetch": "#1f77b4", "tf.data": "#ff7f0e", "DataLoader": "#2ca02c"}
    figure, axes = plt.subplots(figsize=(9, 0.9 + 0.75 * len(rows)))
    height = 0.8 / len(LOADERS)
    for line, cell in zip(lines, cells, strict=True):
        runs = [r.images_per_s for r in results.get(cell.key(), [])]
        if not runs:
            continue
        y = rows.index(line["row"]) + LOADERS.index(cell.loader) * height
        middle = statistics.median(runs)
        spread = [[middle - min(runs)], [max(runs) - middle]]
        axes.barh(y, middle, height, color=colours[cell.loader], xerr=spread, label=cell.loader)
        axes.text(middle, y, f" {middle:.0f}", va="center", fontsize=8)
    for line, cell in zip(lines, cells, strict=True):
        reference = REFERENCE_ROW.get(cell.row, cell.row)
        if reference in floor and cell.loader == cells[0].loader:
            top = rows.index(line["row"]) - height / 2
            axes.plot([floor[reference]] * 2, [top, top + 0.8], "k:", label="entropy floor")
    labelled = dict(zip(*reversed(axes.get_legend_handles_labels()), strict=True))
    axes.legend(labelled.values(), labelled.keys(), loc="lower right", fontsize=8)
    axes.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], rows)
    axes.invert_yaxis()
    axes.set_xlabel("images/s (median of the rounds; whiskers: min-max)")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def installed(name: str) -> str:
    """The installed version of distribution `name` (without importing it), or "missing"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def machine(args: argparse.Namespace, folders: dict[str, prefetch.ImageFolder]) -> list[str]:
    """The lines that say what was measured where: machine, load, photos, protocol, command."""
    here = str(Path(__file__).parent)
    git = ["git", "-C", here, "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True, check=False).stdout.strip()
    changed = ["git", "-C", here, "status", "--porcelain", "--", "../prefetch"]
    if subprocess.run(changed, capture_output=True, text=True, check=False).stdout.strip():
        commit += " with uncommitted changes to prefetch/"
    names = ("tensorflow", "torch", "pillow", "numpy")
    versions = ", ".join(
        [f"Python {platform.python_version()}"] + [f"{n} {installed(n)}" for n in names]
    )
    photos = ", ".join(f"{len(folder)} photos in {folder.root}" for folder in folders.values())
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"Machine: {cpu_model()}, {usable_cores()} usable cores ({os.cpu_count()} in all); "
        f"{versions}; commit {commit or 'unknown'}.",
        f"Load average (1, 5, 15 min) before: {load}. Photos: {photos}.",
        f"Each cell one pipeline in a fresh process: {args.warmup_epochs} epoch(s) untimed, "
        f"{args.epochs} timed; a step of {args.step_ms:g} ms per batch of {BATCH}; "
        f"median of {args.rounds} round(s) (min-max), cells alternating.",
        f"Command: `python {shlex.join(['benchmarks/current.py', *sys.argv[1:]])}`",
    ]


OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("--photos", {"default": "/tmp/photos", "help": "ImageNet-sized photos, ROOT/<class>/<image>"}),
    ("--large", {"default": "/tmp/photos-large", "help": "2 MP+ photos, ROOT/<class>/<image>"}),
    ("--rows", {"default": DEFAULT_ROWS, "help": f"comma list of: {', '.join(ROWS)}"}),
    ("--loaders", {"default": ",".join(LOADERS), "help": "comma list"}),
    ("--ranks", {"type": int, "default": 2, "help": "ranks of the ranks row"}),
    ("--rounds", {"type": int, "default": 3, "help": "rounds, cells alternating"}),
    ("--warmup-epochs", {"type": int, "default": 2, "help": "untimed epochs per cell"}),
    ("--epochs", {"type": int, "default": 6, "help": "timed epochs per cell"}),
    ("--step-ms", {"type": float, "default": 14.0, "help": "consumer step per batch (0: none)"}),
    ("--floor-passes", {"type": int, "default": 3, "help": "timed passes of each floor"}),
    ("--markdown", {"action": "store_true", "help": "also print the table as Markdown"}),
    ("--plot", {"help": "write the chart to this PNG (matplotlib: the plot extra)"}),
    ("--json", {"help": "write the table and every round of every cell to this file"}),
]


def parse(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str], list[str]]:
    """The arguments, the rows and the loaders, checked: a bad name or a missing folder is
    one line that names it and the fix."""
    for flag, settings in OPTIONS:
        if "default" in settings:
            settings = {**settings, "help": settings["help"] + " (default: %(default)s)"}
        parser.add_argument(flag, **settings)
    args = parser.parse_args()
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    loaders = [loader.strip() for loader in args.loaders.split(",") if loader.strip()]
    for name, known in [(r, ROWS) for r in rows] + [(x, LOADERS) for x in loaders]:
        if name not in known:
            parser.error(f"unknown name {name!r}: rows are {', '.join(ROWS)}; loaders "
                         f"{', '.join(LOADERS)}")  # fmt: skip
    if "prefetch" not in loaders and "fit-crop" in rows:
        rows.remove("fit-crop")  # a prefetch row only
    for row in rows:
        option = ROWS[row][1]
        folder = getattr(args, option)
        if not os.path.isdir(folder):
            make = (
                f"--root {folder} --n 1000"
                if option == "photos"
                else f"--root {folder} --n 300 --large"
            )
            parser.error(f"--{option} {folder}: no such folder. Make one with `python "
                         f"../shared/tools/make_photo_folder.py {make}`, give another with "
                         f"--{option}, or leave out row {row!r} (--rows)")  # fmt: skip
    return args, rows, loaders


def main() -> None:
    args, rows, loaders = parse(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the TensorFlow cells' C++ log
    needed = dict.fromkeys(ROWS[row][1] for row in rows)
    folders = {option: prefetch.ImageFolder(getattr(args, option)) for option in needed}
    header = machine(args, folders)
    print("\n".join(header), flush=True)
    with tempfile.TemporaryDirectory(prefix="current-") as temp:
        shards = str(Path(temp) / "fit-crop") if "fit-crop" in rows else None
        if shards is not None:
            began = time.perf_counter()
            write_shards(args.large, shards, format="tar", shard_size=100, fit_crop=SIZE,
                         workers=usable_cores())  # fmt: skip
            print(f"fit-crop shards written in {time.perf_counter() - began:.0f} s (untimed)")
        cells = cells_of(rows, loaders, shards, args.ranks)
        floor = floors(cells, folders, args.floor_passes)
        results = measure(cells, folders, args)
    lines = table(cells, results, floor, args.ranks)
    after = f"Load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}."
    print()
    print_text(lines)
    print(after)
    if args.markdown:
        print()
        print_markdown(lines, [*header, after])
    if args.plot:
        load = f"load {os.getloadavg()[0]:.1f}"
        title = f"{cpu_model()}, {usable_cores()} cores; {load}; {time.strftime('%Y-%m-%d')}"
        plot(lines, results, cells, floor, args.plot, title)
        print(f"chart: {args.plot}")
    if args.json:
        rounds = {key: [r.__dict__ for r in runs] for key, runs in results.items()}
        report = {"header": [*header, after], "floor": floor, "lines": lines, "rounds": rounds}
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
