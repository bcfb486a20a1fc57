"""Benchmark: reading a dataset stored in shards (TFRecord, WebDataset tar) against its folder.

The image folder (`--folder`, default /tmp/photos; `--large`: /tmp/photos_large) is written once
into tar shards and TFRecord shards of `--shard-size` samples (`prefetch.tools.shards.
write_shards(folder, out, format=..., shard_size=N)`, which shuffles the samples once and leaves
each shard's offset index beside it as `<shard>.prefetch-index.npz`, plus `classes.txt`), in a
temporary folder removed at the end. Four parts, each its own table; every rate is images/s of
224x224 uint8 batches of 32, and every ratio is taken between rows of the same round (rows are
interleaved round by round, `--repeats` rounds; a table shows the median and the min-max range
over the rounds, and the rounds' own values):

1. Local. `prefetch.Loader(source, batch_size=32, image_size=224, seed=0)` with the default
   decoder, backend and workers (one open Loader per row, epoch after epoch, as a job runs
   it, in a fresh process per row: this script again, `--row`), on (a) the folder path, (b)
   `prefetch.TFRecordSource(dir)`,
   (c) `prefetch.TarSource(dir)` (local shards are read at random, one pread per sample, each
   epoch an exact permutation); and the same three with
   `augment=prefetch.Augment(prefetch.RandomResizedCrop(), flip=True)`. Order in a round:
   folder, tfrecord, tar (plain), then the same (crop), reversed every other round. A row is
   one warm-up epoch, then whole epochs until `--seconds` have passed (the rate is over those
   epochs). Ratio: the row / the folder row of the same round and augmentation.
   Target: shards >= 0.95x the folder.

2. Index build. The time to construct `TarSource(dir)` / `TFRecordSource(dir)` when no index is
   kept: every `*.prefetch-index.npz` in `dir` deleted and `PREFETCH_CACHE_DIR` pointed at a
   new empty folder before each build, so the constructor lists the folder, indexes every shard
   (8 at a time) and writes the indexes beside the shards (that write is included). Measured on
   copies of the shards (the dataset as written) and on `--index-samples` or more samples made
   by copying those shard files under other names (real copies, not links, so a cold read is
   cold for every copy). "cold": `sync` then `echo 3 > /proc/sys/vm/drop_caches` just before
   (the table says whether the kernel took it: it needs root, and the "Cached" line of
   /proc/meminfo has to drop); "warm": every shard file read whole just before. "kept": the
   constructor again right after, loading the indexes it just wrote (warm). Reported also as
   seconds per 10,000 samples (the >= 10,000-sample rows are measured, not scaled up).
   Target: < 1 s per 10,000 samples.

3. Remote. A loopback HTTP server (`prefetch.testing.serve_folder`, in a spawned child process
   so that it does not share the readers' GIL, as in benchmarks/remote_latency.py) serves a
   folder holding the image folder (`images/`, a link) and both shard folders (`tar/`,
   `tfrecord/`, with their index files and classes.txt) with `--latency-ms` per request (80 ms
   by default; listings and index files pay it too). Rows in a round: (a) `Loader(url +
   "images/", ...)` (no cache_dir: every image one GET, every epoch), (b) `Loader(TarSource(url +
   "tar/shard-*.tar"), ...)` and (c) `Loader(TFRecordSource(url + "tfrecord/shard-*.tfrecord"),
   ...)`, both streamed (the defaults for URLs: each epoch fetches whole shards, 4 at a time and
   4 ahead, into a private spool folder, and a shuffle buffer of 4,096 samples orders them),
   then (d), (e) the same two on the local shard folders (read at random, as in part 1). Every
   row: defaults as in part 1, one warm-up epoch, then whole epochs until `--remote-seconds`.
   "setup" is constructing the Loader (listing the folder, or listing the shards and fetching
   their index files: "index" says where the index came from). Ratios: shards remote / folder
   remote (target >= 5x) and shards remote / the same shards local (target >= 0.8x); also
   shards local / folder remote, the ceiling of the first ratio (no remote reader decodes
   faster than the local one: when the folder URL's tuned workers already come near the
   decode rate, 5x is out of reach). "first batch of an epoch" is the median time from an
   epoch's start to its first batch over the timed epochs (a streamed epoch waits for the
   shards its first batch reads: with the default buffer of 4,096 samples and a smaller
   dataset, all of them).

4. tf.data. On the same TFRecord files: `tf.data.TFRecordDataset(files,
   num_parallel_reads=AUTOTUNE)` -> `.shuffle(--tf-shuffle)` -> `.map(parse_single_example,
   tf.io.decode_jpeg(channels=3), tf.image.resize((224, 224)) (bilinear), cast to uint8;
   num_parallel_calls=AUTOTUNE)` -> `.batch(32)` -> `.prefetch(AUTOTUNE)`, against
   `prefetch.Loader(prefetch.TFRecordSource(dir), batch_size=32, image_size=224, seed=0)`. Both
   shuffle: the tf.data buffer of 1,000 samples is the whole dataset for the default folders, as
   prefetch's exact permutation is (`--tf-shuffle 0` drops the shuffle from both:
   `shuffle=False` for prefetch). The crop pair: tf.data with Model Garden's ImageNet training
   recipe (`prefetch bench --crop`'s and benchmarks/current.py's: extract_jpeg_shape,
   sample_distorted_bounding_box with area 0.08-1 and ratio 3/4-4/3, 10 attempts, the whole
   image when the draw fails, decode_and_crop_jpeg, bilinear resize, random_flip_left_right)
   after the same parse, against prefetch with `Augment(prefetch.RandomResizedCrop(), flip=True)`.
   Each row as a training job runs it, in a fresh process (this script again, `--row`):
   tf.data `.repeat()`ed with ONE iterator, prefetch one open Loader; one epoch's worth of
   images untimed, then batches until `--seconds` have passed (at least an epoch's worth).
   Order in a round: tf.data, prefetch, tf.data crop, prefetch crop, reversed every other
   round. Target: prefetch >= 1.3x tf.data.

    .venv/bin/python benchmarks/shards.py [--folder /tmp/photos | --large] [--repeats 3]
        [--seconds 4] [--remote-seconds 8] [--latency-ms 80] [--shard-size 250]
        [--index-samples 10000] [--tf-shuffle 1000] [--skip-index] [--skip-remote] [--skip-tf]

"CPU ms/image" (parts 1, 3, 4) is this process's CPU time (all its threads: the thread
backend's decoders, tf.data's pool) over a row's timed epochs per image; "n/a" for a process
backend (its decoding is in the workers). On a machine whose cores are all busy, images/s is
about cores / CPU per image, and CPU per image moves far less than images/s when other programs
take the cores for a while, so its ratios (part 1: the row / the folder, lower is cheaper; part
4: tf.data / prefetch) check the images/s ratios. The machine's cores are shared by everything
here (the server included); rates on a busy or small machine are noisy, which is why ratios
are taken within a round and ranges are shown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from remote_latency import served_in_child

import prefetch
from prefetch.decode import DecodeOptions
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.tools.bench._frameworks import model_garden_crop
from prefetch.tools.shards import write_shards

BATCH = 32
SIZE = 224
FORMATS = ("tfrecord", "tar")
PATTERNS = {"tar": "shard-*.tar", "tfrecord": "shard-*.tfrecord"}
LABEL = {"folder": "folder", "tfrecord": "TFRecordSource", "tar": "TarSource"}


# ---------------------------------------------------------------------------------------------
# shared helpers


def shard_source(format: str, files: str) -> prefetch.TFRecordSource | prefetch.TarSource:
    return prefetch.TFRecordSource(files) if format == "tfrecord" else prefetch.TarSource(files)


def augment(crop: bool) -> dict[str, Any]:
    return {"augment": prefetch.Augment(prefetch.RandomResizedCrop(), flip=True)} if crop else {}


def timed(epoch: Callable[[], int], seconds: float) -> dict[str, Any]:
    """One warm-up epoch, then whole epochs until `seconds` have passed (as
    a training job reads them): images/s over those, and this process's
    CPU time per image (all its threads; not the children of a process backend)."""
    epoch()
    began, cpu = time.perf_counter(), time.process_time()
    images = epochs = 0
    while epochs == 0 or time.perf_counter() - began < seconds:
        images += epoch()
        epochs += 1
    return {
        "rate": images / (time.perf_counter() - began),
        "cpu_ms": (time.process_time() - cpu) / images * 1000,
        "images": images,
        "epochs": epochs,
    }


def loader_row(source: Any, seconds: float, **options: Any) -> dict[str, Any]:
    """A Loader on `source` (defaults as a user gets them): construction time, then `timed`."""
    began = time.perf_counter()
    loader = prefetch.Loader(source, batch_size=BATCH, image_size=SIZE, seed=0, **options)
    setup = time.perf_counter() - began
    waits: list[float] = []  # each epoch's time to its first batch

    def epoch() -> int:
        began, images = time.perf_counter(), 0
        for batch in loader:
            if not images:
                waits.append(time.perf_counter() - began)
            images += len(batch.images)
        return images

    with loader:
        row = timed(epoch, seconds)
        stats = loader.stats()
    if stats.backend != "thread":
        row["cpu_ms"] = float("nan")  # the decoding is in other processes
    return row | {
        "setup": setup,
        "first": statistics.median(waits[1:]) if len(waits) > 1 else float("nan"),
        "how": f"{stats.backend} x{stats.workers}",
    }


def spread(values: Sequence[float], digits: int = 0, suffix: str = "") -> str:
    """The median of `values`, then (min-max) when there are several."""
    if not values:
        return "-"
    f = f"{{:.{digits}f}}"
    median = f.format(statistics.median(values)) + suffix
    if len(values) == 1:
        return median
    return f"{median} ({f.format(min(values))}-{f.format(max(values))})"


def cpu(rows: Sequence[dict[str, Any]]) -> str:
    """The rows' CPU ms per image, "median (min-max)"; n/a for a process backend."""
    values = [r["cpu_ms"] for r in rows if r["cpu_ms"] == r["cpu_ms"]]
    return spread(values, 2) if values else "n/a"


def listing(values: Sequence[float], digits: int = 0) -> str:
    f = f"{{:.{digits}f}}"
    return ", ".join(f.format(v) for v in values)


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), cpu)
    return (
        f"{cpu}; {len(os.sched_getaffinity(0))} cores; {platform.platform()}; Python "
        f"{platform.python_version()}; prefetch {prefetch.__version__}; load average (1 min) "
        f"{os.getloadavg()[0]:.2f}"
    )


def folder_summary(folder: str) -> str:
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    sizes = []
    from PIL import Image

    for path in files[:: max(1, len(files) // 100)]:
        with Image.open(path) as image:
            sizes.append(image.width * image.height)
    total = sum(p.stat().st_size for p in files)
    return (
        f"{folder}: {len(files)} images, median {np.median(sizes) / 1e3:.0f} kpixel, "
        f"{total / len(files) / 1024:.0f} KiB mean, {total / 2**20:.0f} MiB"
    )


def meminfo_cached_mib() -> float:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("Cached:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drop_caches() -> str | None:
    """sync and drop the page cache; None when done, else why not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as knob:
            knob.write("3\n")
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


@contextlib.contextmanager
def fresh_cache_dir(parent: str) -> Iterator[str]:
    """PREFETCH_CACHE_DIR set to a new empty folder under `parent` for the block."""
    before = os.environ.get("PREFETCH_CACHE_DIR")
    folder = tempfile.mkdtemp(prefix="cache-", dir=parent)
    os.environ["PREFETCH_CACHE_DIR"] = folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop("PREFETCH_CACHE_DIR", None)
        else:
            os.environ["PREFETCH_CACHE_DIR"] = before
        shutil.rmtree(folder, ignore_errors=True)


def shard_files(folder: str) -> list[str]:
    return sorted(
        os.path.join(folder, name)
        for name in os.listdir(folder)
        if (name.endswith(".tar") or ".tfrecord" in name) and not name.endswith(INDEX_SUFFIX)
    )


def remove_indexes(folder: str) -> int:
    removed = 0
    for name in os.listdir(folder):
        if name.endswith(INDEX_SUFFIX):
            os.unlink(os.path.join(folder, name))
            removed += 1
    return removed


def read_whole(paths: Sequence[str]) -> None:
    for path in paths:
        with open(path, "rb") as file:
            while file.read(8 << 20):
                pass


# ---------------------------------------------------------------------------------------------
# part 1: local


def part_local(
    folder: str, dirs: dict[str, str], repeats: int, seconds: float
) -> list[dict[str, Any]]:
    """Each row in a fresh process (`in_child`), rows alternating by round."""
    paths = {"folder": folder, **{f: dirs[f] for f in FORMATS}}
    order = [(name, crop) for crop in (False, True) for name in paths]
    rows = []
    for round_ in range(repeats):
        measured: dict[tuple[str, bool], dict[str, Any]] = {}
        for name, crop in order if round_ % 2 == 0 else order[::-1]:
            row = in_child(f"local,{name},{paths[name]},{int(crop)}", seconds, 0)
            measured[name, crop] = row
            print(
                f"  [local] round {round_ + 1} {name}{' crop' if crop else ''}: "
                f"{row['rate']:.0f} images/s ({row['epochs']} epochs, {row['how']})",
                file=sys.stderr,
                flush=True,
            )
        for name, crop in order:
            row, base = measured[name, crop], measured["folder", crop]
            row |= {
                "round": round_,
                "name": name,
                "crop": crop,
                "ratio": row["rate"] / base["rate"],
                "cpu_ratio": row["cpu_ms"] / base["cpu_ms"],
            }
            rows.append(row)
    return rows


def in_child(spec: str, seconds: float, shuffle: int) -> dict[str, Any]:
    """Row `spec` measured in a fresh process (this script with --row); see `one_row`."""
    command = [sys.executable, __file__, "--row", spec, "--seconds", str(seconds)]
    command += ["--tf-shuffle", str(shuffle)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"row {spec} failed: {error}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def one_row(spec: str, seconds: float, shuffle: int) -> dict[str, Any]:
    """The row `spec`, measured in this (fresh) process: "local,NAME,PATH,CROP" (part 1: a
    Loader on the folder, or on the "tfrecord" or "tar" shards under PATH) or
    "tf,NAME,DIR,CROP" (part 4: "tf.data" or "prefetch" on the TFRecord shards in DIR)."""
    part, name, path, crop = spec.split(",")
    if part == "local":
        source = path if name == "folder" else shard_source(name, path)
        return loader_row(source, seconds, **augment(crop == "1"))
    if name == "tf.data":
        return tf_row(shard_files(path), crop == "1", shuffle, seconds)
    source = shard_source("tfrecord", path)
    return loader_row(source, seconds, shuffle=bool(shuffle), **augment(crop == "1"))


def print_local(rows: list[dict[str, Any]], target: float = 0.95) -> None:
    print("\n## 1. Local: folder vs shards (prefetch.Loader, defaults)\n")
    print(
        "| source | augment | images/s median (min-max) | rounds | vs folder, same round | "
        "rounds | target | CPU ms/image | CPU vs folder, same round | backend x workers |"
    )
    print("|---|---|---:|---|---:|---|---|---:|---:|---|")
    for crop in (False, True):
        for name in ("folder", *FORMATS):
            mine = [r for r in rows if r["name"] == name and r["crop"] == crop]
            rates = [r["rate"] for r in mine]
            ratios = [r["ratio"] for r in mine]
            cpu_ratios = [r["cpu_ratio"] for r in mine]
            met = ""
            if name != "folder":
                met = "met" if statistics.median(ratios) >= target else "MISSED"
                met += f" (>= {target}x)"
            print(
                f"| {LABEL[name]} | {'RandomResizedCrop+flip' if crop else 'resize'} | "
                f"{spread(rates)} | {listing(rates)} | "
                f"{'1' if name == 'folder' else spread(ratios, 2, 'x')} | "
                f"{'' if name == 'folder' else listing(ratios, 2)} | {met} | {cpu(mine)} | "
                f"{'1' if name == 'folder' else spread(cpu_ratios, 2, 'x')} | {mine[-1]['how']} |"
            )


# ---------------------------------------------------------------------------------------------
# part 2: index build


def part_index(
    dirs: dict[str, str], work: str, repeats: int, target_samples: int
) -> tuple[list[dict[str, Any]], str]:
    """Index build times; also the line that says whether dropping the page cache worked."""
    rows: list[dict[str, Any]] = []
    before = meminfo_cached_mib()
    why = drop_caches()
    after = meminfo_cached_mib()
    dropped = why is None and after < before
    cache_note = (
        f"drop_caches: written, page cache {before:.0f} -> {after:.0f} MiB "
        f"({'took effect' if dropped else 'NO EFFECT: cold rows are not cold'})"
        if why is None
        else f"drop_caches not permitted ({why}): the cold rows are skipped"
    )
    for format in FORMATS:
        originals = shard_files(dirs[format])
        samples_each = len(shard_source(format, dirs[format]))
        one = os.path.join(work, f"index-{format}-one")
        many = os.path.join(work, f"index-{format}-many")
        os.makedirs(one)
        os.makedirs(many)
        for path in originals:
            shutil.copyfile(path, os.path.join(one, os.path.basename(path)))
        copies = -(-target_samples // samples_each)
        for k in range(copies):
            for path in originals:
                shutil.copyfile(path, os.path.join(many, f"r{k:03d}-{os.path.basename(path)}"))
        sets = {"as written": one, "replicated": many}
        try:
            for round_ in range(repeats):
                for label, place in sets.items():
                    for cache in ("cold", "warm") if dropped else ("warm",):
                        files = shard_files(place)
                        remove_indexes(place)
                        with fresh_cache_dir(work):
                            if cache == "cold":
                                drop_caches()
                            else:
                                read_whole(files)
                            began = time.perf_counter()
                            source = shard_source(format, place)
                            built = time.perf_counter() - began
                            began = time.perf_counter()
                            again = shard_source(format, place)
                            kept = time.perf_counter() - began
                        assert len(again) == len(source)
                        row = {
                            "format": format,
                            "set": label,
                            "cache": cache,
                            "round": round_,
                            "samples": len(source),
                            "shards": len(files),
                            "bytes": sum(os.path.getsize(f) for f in files),
                            "build": built,
                            "kept": kept,
                        }
                        rows.append(row)
                        print(
                            f"  [index] round {round_ + 1} {format} {label} {cache}: "
                            f"{len(source)} samples in {built:.3f} s (kept: {kept:.3f} s)",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            shutil.rmtree(one, ignore_errors=True)
            shutil.rmtree(many, ignore_errors=True)
    return rows, cache_note


def print_index(rows: list[dict[str, Any]], cache_note: str, target_s: float = 1.0) -> None:
    print("\n## 2. Index build: constructing the source with no kept index\n")
    print(f"{cache_note}\n")
    print(
        "| source | shards | samples | MiB | page cache | build s median (min-max) | "
        "s per 10,000 samples | target | kept index: load s |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|---:|")
    seen: list[tuple[str, str, str]] = []
    for row in rows:
        key = (row["format"], row["set"], row["cache"])
        if key in seen:
            continue
        seen.append(key)
        mine = [r for r in rows if (r["format"], r["set"], r["cache"]) == key]
        builds = [r["build"] for r in mine]
        per = [b / row["samples"] * 10_000 for b in builds]
        met = ("met" if statistics.median(per) < target_s else "MISSED") + f" (< {target_s:g} s)"
        print(
            f"| {LABEL[row['format']]} | {row['set']}, {row['shards']} | {row['samples']} | "
            f"{row['bytes'] / 2**20:.0f} | {row['cache']} | {spread(builds, 3)} | "
            f"{spread(per, 3)} | {met} | {spread([r['kept'] for r in mine], 3)} |"
        )


# ---------------------------------------------------------------------------------------------
# part 3: remote


def part_remote(
    serve_root: str, dirs: dict[str, str], repeats: int, seconds: float, latency_ms: float
) -> list[dict[str, Any]]:
    rows = []
    with served_in_child(serve_root, latency_ms / 1000, None) as url:
        for round_ in range(repeats):
            makers: dict[str, Callable[[], Any]] = {
                "folder url": lambda: url + "images/",
                "tfrecord url": lambda: shard_source(
                    "tfrecord", url + "tfrecord/" + PATTERNS["tfrecord"]
                ),
                "tar url": lambda: shard_source("tar", url + "tar/" + PATTERNS["tar"]),
                "tfrecord local": lambda: shard_source("tfrecord", dirs["tfrecord"]),
                "tar local": lambda: shard_source("tar", dirs["tar"]),
            }
            for name, make in makers.items():
                # A new index folder each row: a URL shard's index comes from the server.
                with fresh_cache_dir(os.path.dirname(serve_root)):
                    began = time.perf_counter()
                    source = make()
                    made = time.perf_counter() - began
                    row = loader_row(source, seconds)
                row["setup"] += made
                if isinstance(source, str):
                    where = "-"
                else:
                    # mtime_ns is -1 for an index built from a downloaded copy; the index file
                    # beside a shard (written locally) records the shard's mtime.
                    sidecar = all(index.mtime_ns != -1 for index in source.indexes)
                    where = "index file" if sidecar else "built from a download"
                    if "local" in name:
                        where = "index file (local)"
                    where += ", streamed" if source.streaming else ", random reads"
                row |= {"round": round_, "name": name, "index": where}
                rows.append(row)
                print(
                    f"  [remote] round {round_ + 1} {name}: {row['rate']:.0f} images/s "
                    f"({row['epochs']} epochs, setup {row['setup']:.2f} s, {row['how']}, "
                    f"{where})",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def print_remote(rows: list[dict[str, Any]], latency_ms: float) -> None:
    print(f"\n## 3. Remote: loopback server, {latency_ms:g} ms per request\n")
    print(
        "| reader | index | setup s | images/s median (min-max) | rounds | "
        "first batch of an epoch, s | CPU ms/image | backend x workers |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|")
    names = list(dict.fromkeys(r["name"] for r in rows))
    for name in names:
        mine = [r for r in rows if r["name"] == name]
        rates = [r["rate"] for r in mine]
        print(
            f"| {name} | {mine[0]['index']} | {spread([r['setup'] for r in mine], 2)} | "
            f"{spread(rates)} | {listing(rates)} | {spread([r['first'] for r in mine], 2)} | "
            f"{cpu(mine)} | {mine[-1]['how']} |"
        )
    print("\n| ratio, same round | median (min-max) | rounds | target |")
    print("|---|---:|---|---|")
    rounds = sorted({r["round"] for r in rows})
    rate = {(r["round"], r["name"]): r["rate"] for r in rows}
    for top, bottom, target in [
        ("tfrecord url", "folder url", 5.0),
        ("tar url", "folder url", 5.0),
        ("tfrecord url", "tfrecord local", 0.8),
        ("tar url", "tar local", 0.8),
        ("tfrecord local", "folder url", None),
        ("tar local", "folder url", None),
    ]:
        ratios = [rate[(k, top)] / rate[(k, bottom)] for k in rounds]
        if target is None:  # the most any remote reader could reach: decoding locally
            print(
                f"| {top} / {bottom} (the ceiling) | {spread(ratios, 2, 'x')} | "
                f"{listing(ratios, 2)} | - |"
            )
            continue
        met = "met" if statistics.median(ratios) >= target else "MISSED"
        print(
            f"| {top} / {bottom} | {spread(ratios, 2, 'x')} | {listing(ratios, 2)} | "
            f"{met} (>= {target:g}x) |"
        )


# ---------------------------------------------------------------------------------------------
# part 4: tf.data


def tf_dataset(files: list[str], crop: bool, shuffle: int) -> Any:
    """tf.data on TFRecord files (the module docstring, part 4)."""
    import tensorflow as tf

    tf.random.set_seed(0)
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def load(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, features)
        contents = example["image/encoded"]
        if crop:  # Model Garden's recipe: prefetch bench's tf.data row with a crop
            recipe = prefetch.RandomResizedCrop()
            image = model_garden_crop(tf, contents, recipe, DecodeOptions((SIZE, SIZE)))
        else:
            image = tf.io.decode_jpeg(contents, channels=3)
            image = tf.image.resize(image, (SIZE, SIZE), method="bilinear")
        return tf.cast(image, tf.uint8), example["image/class/label"]

    data = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
    if shuffle:
        data = data.shuffle(shuffle, seed=0, reshuffle_each_iteration=True)
    data = data.map(load, num_parallel_calls=tf.data.AUTOTUNE)
    return data.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def tf_row(files: list[str], crop: bool, shuffle: int, seconds: float) -> dict[str, Any]:
    """tf.data as a training job runs it: the dataset `.repeat()`ed, ONE iterator; one epoch's
    worth of images untimed (warm-up: AUTOTUNE's ramp, the shuffle buffer), then batches until
    `seconds` have passed and at least one epoch's worth was timed."""
    samples = len(shard_source("tfrecord", os.path.dirname(files[0])))
    batches = (int(images.shape[0]) for images, _ in tf_dataset(files, crop, shuffle).repeat())
    taken = 0
    while taken < samples:
        taken += next(batches)
    began, cpu = time.perf_counter(), time.process_time()
    images = 0
    while images < samples or time.perf_counter() - began < seconds:
        images += next(batches)
    return {
        "rate": images / (time.perf_counter() - began),
        "cpu_ms": (time.process_time() - cpu) / images * 1000,
        "images": images,
        "epochs": round(images / samples, 1),
        "how": "AUTOTUNE, .repeat(), one iterator",
    }


def part_tf(tfrecord_dir: str, repeats: int, seconds: float, shuffle: int) -> list[dict[str, Any]]:
    """Each row in a fresh process (`in_child`), rows alternating by round."""
    order = [(name, crop) for crop in (False, True) for name in ("tf.data", "prefetch")]
    rows = []
    for round_ in range(repeats):
        for name, crop in order if round_ % 2 == 0 else order[::-1]:
            row = in_child(f"tf,{name},{tfrecord_dir},{int(crop)}", seconds, shuffle)
            row |= {"round": round_, "name": name, "crop": crop}
            rows.append(row)
            print(
                f"  [tf] round {round_ + 1} {name}{' crop' if crop else ''}: "
                f"{row['rate']:.0f} images/s ({row['epochs']} epochs, {row['how']})",
                file=sys.stderr,
                flush=True,
            )
    return rows


def print_tf(rows: list[dict[str, Any]], shuffle: int, target: float = 1.3) -> None:
    print(
        f"\n## 4. tf.data vs prefetch on the same TFRecord files "
        f"({f'both shuffle: tf.data shuffle({shuffle}), prefetch shuffle=True' if shuffle else 'neither shuffles'})\n"  # noqa: E501
    )
    print(
        "| reader | augment | images/s median (min-max) | rounds | CPU ms/image | "
        "backend x workers |"
    )
    print("|---|---|---:|---|---:|---|")
    for crop in (False, True):
        for name in ("tf.data", "prefetch"):
            mine = [r for r in rows if r["name"] == name and r["crop"] == crop]
            rates = [r["rate"] for r in mine]
            what = "resize"
            if crop:
                what = "Model Garden crop + flip" if name == "tf.data" else "RandomResizedCrop+flip"
            print(
                f"| {name} | {what} | {spread(rates)} | {listing(rates)} | {cpu(mine)} | "
                f"{mine[-1]['how']} |"
            )
    print("\n| ratio, same round | median (min-max) | rounds | target |")
    print("|---|---:|---|---|")
    for crop in (False, True):
        rate = {(r["round"], r["name"]): r["rate"] for r in rows if r["crop"] == crop}
        rounds = sorted({k for k, _ in rate})
        ratios = [rate[(k, "prefetch")] / rate[(k, "tf.data")] for k in rounds]
        met = "met" if statistics.median(ratios) >= target else "MISSED"
        print(
            f"| prefetch / tf.data{', crop' if crop else ''} | {spread(ratios, 2, 'x')} | "
            f"{listing(ratios, 2)} | {met} (>= {target:g}x) |"
        )
        cost = {(r["round"], r["name"]): r["cpu_ms"] for r in rows if r["crop"] == crop}
        ratios = [cost[(k, "tf.data")] / cost[(k, "prefetch")] for k in rounds]
        print(
            f"| CPU per image: tf.data / prefetch{', crop' if crop else ''} | "
            f"{spread(ratios, 2, 'x')} | {listing(ratios, 2)} | - |"
        )


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--folder",
        help="image folder ROOT/<class>/<image>; None: /tmp/photos (--large: /tmp/photos_large)",
    )
    parser.add_argument("--large", action="store_true", help="use /tmp/photos_large")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per part")
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="timed seconds per part-1/4 row, after warm-up"
    )
    parser.add_argument(
        "--remote-seconds", type=float, default=8.0, help="timed seconds per part-3 row"
    )
    parser.add_argument("--latency-ms", type=float, default=80.0, help="server latency")
    parser.add_argument("--shard-size", type=int, default=250, help="samples per shard")
    parser.add_argument(
        "--index-samples", type=int, default=10_000, help="part 2: copy shards up to this many"
    )
    parser.add_argument(
        "--tf-shuffle", type=int, default=1000, help="tf.data shuffle buffer; 0: no shuffle in both"
    )
    parser.add_argument("--skip-index", action="store_true", help="leave out part 2")
    parser.add_argument("--skip-remote", action="store_true", help="leave out part 3")
    parser.add_argument("--skip-tf", action="store_true", help="leave out part 4")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # parts 1 and 4: a row's own process
    args = parser.parse_args()
    if args.row:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        print(json.dumps(one_row(args.row, args.seconds, args.tf_shuffle)), flush=True)
        os._exit(0)  # TensorFlow's threads end with the process (the Loader is closed)
    folder = args.folder or ("/tmp/photos_large" if args.large else "/tmp/photos")
    if not os.path.isdir(folder):
        parser.error(
            f"no folder {folder}: make one with ../shared/tools/make_photo_folder.py "
            f"--root {folder} --n 1000 (--n 300 --large)"
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.perf_counter()
    print(f"$ {shlex.join([sys.executable.replace(os.getcwd() + '/', ''), *sys.argv])}")
    print(machine_line())
    print(folder_summary(os.path.abspath(folder)))

    work = tempfile.mkdtemp(prefix="prefetch-shards-bench-")
    outer_cache = os.environ.get("PREFETCH_CACHE_DIR")
    os.environ["PREFETCH_CACHE_DIR"] = os.path.join(work, "cache")
    times: dict[str, float] = {}
    try:
        serve_root = os.path.join(work, "serve")
        os.makedirs(serve_root)
        os.symlink(os.path.abspath(folder), os.path.join(serve_root, "images"))
        dirs = {f: os.path.join(serve_root, f) for f in FORMATS}
        began = time.perf_counter()
        for format in FORMATS:
            write_shards(folder, dirs[format], format=format, shard_size=args.shard_size)
        wrote = time.perf_counter() - began
        counts = {f: len(shard_files(dirs[f])) for f in FORMATS}
        print(
            f"shards: {args.shard_size} samples each; {counts['tfrecord']} TFRecord and "
            f"{counts['tar']} tar files written in {wrote:.1f} s (write_shards, both formats); "
            f"batch {BATCH}, {SIZE}x{SIZE}; {args.repeats} rounds; {args.seconds:g} s per local "
            f"row, {args.remote_seconds:g} s per remote row, after a warm-up epoch",
            flush=True,
        )

        began = time.perf_counter()
        local = part_local(folder, dirs, args.repeats, args.seconds)
        times["1 local"] = time.perf_counter() - began
        print_local(local)
        sys.stdout.flush()

        if not args.skip_index:
            began = time.perf_counter()
            index_rows, note = part_index(dirs, work, args.repeats, args.index_samples)
            times["2 index"] = time.perf_counter() - began
            print_index(index_rows, note)
            sys.stdout.flush()
            read_whole(shard_files(dirs["tar"]) + shard_files(dirs["tfrecord"]))

        if not args.skip_remote:
            began = time.perf_counter()
            remote = part_remote(
                serve_root, dirs, args.repeats, args.remote_seconds, args.latency_ms
            )
            times["3 remote"] = time.perf_counter() - began
            print_remote(remote, args.latency_ms)
            sys.stdout.flush()

        if not args.skip_tf:
            began = time.perf_counter()
            tf_rows = part_tf(dirs["tfrecord"], args.repeats, args.seconds, args.tf_shuffle)
            times["4 tf.data"] = time.perf_counter() - began
            print_tf(tf_rows, args.tf_shuffle)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if outer_cache is None:
            os.environ.pop("PREFETCH_CACHE_DIR", None)
        else:
            os.environ["PREFETCH_CACHE_DIR"] = outer_cache
    parts = ", ".join(f"part {k} {v:.0f} s" for k, v in times.items())
    print(
        f"\nwall time {time.perf_counter() - started:.0f} s ({parts}); "
        f"load average (1 min) after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
