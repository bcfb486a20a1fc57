"""What `prefetch bench` measures with and on: the decoders, the machine, a sample folder, and
local copies of a remote folder's decode sample."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefetch.decode import Decoder, decode_image, get_decoder
from prefetch.decode import decoder_name as short_decoder_name
from prefetch.io import ObjectCache, is_url, local_path
from prefetch.runtime import usable_cores
from prefetch.testing import SHAPES, write_image_folder

# Typical ImageNet photo size, (width, height) in Pillow order, for generated sample folders.
SAMPLE_SIZE = (500, 375)

# The decoders whose single-core rate is measured, by name. Add one here (or to the
# `available_decoders()` of a module in DECODER_PROVIDERS) and it appears in the table.
DECODERS: dict[str, Decoder] = {"pillow": decode_image}
# Modules whose `available_decoders() -> dict[str, Decoder]`, when the module and the function
# exist, adds to DECODERS (a decoder module added later needs no change here).
DECODER_PROVIDERS = ("prefetch.decode._decoders", "prefetch.decode._turbo")


def available_decoders() -> dict[str, Decoder]:
    """The decoders to measure: `DECODERS`, plus each provider's `available_decoders()`.

    A provider is a module named in `DECODER_PROVIDERS` ("prefetch.decode._decoders",
    "prefetch.decode._turbo"); one that does not exist, or has no `available_decoders` function,
    adds nothing. So a faster decoder added there appears in the bench without a change here.
    """
    decoders = dict(DECODERS)
    for name in DECODER_PROVIDERS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError:  # a provider whose optional dependencies are missing
            continue
        provider = getattr(module, "available_decoders", None)
        if callable(provider):
            decoders.update(provider())
    return decoders


def decoder_name(decoder: Decoder, decoders: Mapping[str, Decoder]) -> str:
    """`decoder`'s name in `decoders`, else its short name as `LoaderStats.decoder` gives it
    ("pillow", "turbo", or its own name)."""
    for name, candidate in decoders.items():
        if candidate is decoder:
            return name
    return short_decoder_name(decoder)


def default_decoder() -> Decoder:
    """The decoder a `Loader` runs by default (`decoder="auto"`, `get_decoder("auto")`)."""
    return get_decoder("auto")


def machine_info() -> dict[str, Any]:
    """The machine and package versions the figures were measured with (JSON-ready)."""
    versions: dict[str, str | None] = {}
    for name in ("numpy", "pillow", "tensorflow", "keras", "torch"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu_model(),
        "usable_cores": usable_cores(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_sample_folder(
    root: str | os.PathLike[str],
    images: int,
    *,
    classes: int = 2,
    size: tuple[int, int] = SAMPLE_SIZE,
    seed: int = 0,
) -> Path:
    """Write `images` JPEGs of `size` (width, height; default ImageNet's typical 500x375).

    The images (shapes with noise, Pillow's default JPEG quality) are spread over `classes`
    class folders (at most 6) under `root`, which must not exist yet or be empty. Returns root.
    """
    root = Path(root)
    if images < 1:
        raise ValueError(f"images must be >= 1, got {images}")
    if not 1 <= classes <= len(SHAPES):
        raise ValueError(f"classes must be in [1, {len(SHAPES)}], got {classes}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(
            f"{str(root)!r} exists and is not an empty folder; pass a new folder to generate into"
        )
    for index in range(classes):
        per_class = images // classes + (1 if index < images % classes else 0)
        if per_class:
            write_image_folder(
                root,
                class_names=(SHAPES[index],),
                per_class=per_class,
                size=size,
                seed=seed + index,
            )
    return root


# Objects of a remote decode sample read at once (`local_sample`): the reads wait on storage.
SAMPLE_READERS = 32


def local_sample(paths: Sequence[str], folder: str) -> list[str]:
    """The files of a decode sample on local disk: local paths as they are; URLs copied once
    (`SAMPLE_READERS` at a time) into `folder` by an `ObjectCache`, keeping their extensions,
    so that a single-core decode rate measures the CPU, not the storage."""
    paths = [str(path) for path in paths]
    if not any(is_url(path) for path in paths):
        return [local_path(path) for path in paths]
    cache = ObjectCache.open(folder)
    with ThreadPoolExecutor(SAMPLE_READERS, thread_name_prefix="prefetch-bench-sample") as pool:
        return [path for path, _ in pool.map(cache.local_copy, paths)]
