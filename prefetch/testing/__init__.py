"""Test helpers that ship with prefetch: tiny image trees, fault-injecting decoders, a server.

Image trees are real JPEG/PNG files with learnable classes (one shape per class), written with
Pillow. The fakes wrap the default decoder to sleep or raise at chosen files (a `marker` in
the path; for a shard's sample, in its `str`: shard, member key, offset); they are plain
picklable classes, so they work in thread and process workers alike. `serve_folder`
(prefetch.testing.server) serves a folder over loopback HTTP with injected latency and faults;
`serve_hostile` (prefetch.testing.hostile) answers chosen paths the way a hostile server would.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageDraw

from prefetch.decode._choice import get_decoder
from prefetch.decode._decoders import DecodeOptions, decode_bytes
from prefetch.io._members import Location
from prefetch.testing.bombs import PILLOW_DEFAULT_MAX_PIXELS as PILLOW_DEFAULT_MAX_PIXELS
from prefetch.testing.bombs import write_decompression_bomb as write_decompression_bomb
from prefetch.testing.bombs import write_scan_bomb as write_scan_bomb
from prefetch.testing.hostile import Reply as Reply
from prefetch.testing.hostile import index_page as index_page
from prefetch.testing.hostile import redirect as redirect
from prefetch.testing.hostile import serve_hostile as serve_hostile
from prefetch.testing.server import serve_folder as serve_folder

SHAPES = ("circle", "square", "triangle", "cross", "ring", "stripes")


def draw_shape(shape: str, size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """An RGB image (width, height = size) of `shape` in a random colour, place and scale."""
    width, height = size
    background = tuple(int(v) for v in rng.integers(0, 90, size=3))
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    colour = tuple(int(v) for v in rng.integers(140, 256, size=3))
    radius = min(width, height) * rng.uniform(0.22, 0.38)
    cx = width / 2 + rng.uniform(-0.12, 0.12) * width
    cy = height / 2 + rng.uniform(-0.12, 0.12) * height
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    line = max(2, int(radius / 3))
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon(
            [(cx, cy - radius), (cx - radius, cy + radius), (cx + radius, cy + radius)], colour
        )
    elif shape == "cross":
        draw.rectangle((cx - radius, cy - line / 2, cx + radius, cy + line / 2), fill=colour)
        draw.rectangle((cx - line / 2, cy - radius, cx + line / 2, cy + radius), fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=line)
    elif shape == "stripes":
        for x in range(0, width, 2 * line):
            draw.rectangle((x, 0, x + line - 1, height), fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}; choose from {SHAPES}")
    noise = rng.integers(-12, 13, size=(height, width, 3))
    return Image.fromarray(np.clip(np.asarray(image, np.int16) + noise, 0, 255).astype(np.uint8))


def write_image_folder(
    root: str | os.PathLike[str],
    *,
    class_names: Sequence[str] = ("circle", "square", "triangle"),
    per_class: int = 8,
    size: tuple[int, int] = (48, 40),
    image_format: str = "JPEG",
    seed: int = 0,
) -> Path:
    """Write `root/<class>/<class>_<i>.<ext>` images and return `root`.

    A class named after one of `SHAPES` draws that shape; other names take the shapes in turn.
    `size` is (width, height) in Pillow order. `image_format` is a Pillow format name.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    extension = {"JPEG": "jpg"}.get(image_format.upper(), image_format.lower())
    for class_index, name in enumerate(class_names):
        shape = name if name in SHAPES else SHAPES[class_index % len(SHAPES)]
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            draw_shape(shape, size, rng).save(folder / f"{name}_{i:04d}.{extension}", image_format)
    return root


# The kinds of bad input that `write_bad_files` writes; the first four are its default.
BAD_FILE_KINDS = ("corrupt", "truncated", "zero_byte", "text", "bomb", "scans", "unreadable")


def write_bad_files(
    folder: str | os.PathLike[str],
    kinds: Sequence[str] = ("corrupt", "truncated", "zero_byte", "text"),
) -> dict[str, Path]:
    """Write one file of each of `kinds` of bad input into `folder`; returns {kind: path}.

    Kinds (see `BAD_FILE_KINDS`): "corrupt" (JPEG header, garbage body), "truncated" (a JPEG
    cut in half), "zero_byte", "text" (a text file named .jpg), "bomb" (`bad_bomb.png`, see
    `write_decompression_bomb`), "scans" (a JPEG of too many scans, `write_scan_bomb`) and
    "unreadable" (a valid JPEG with permission bits 000; a
    process with CAP_DAC_OVERRIDE, such as root, still reads it: check with `os.access`).
    """
    unknown = [kind for kind in kinds if kind not in BAD_FILE_KINDS]
    if unknown:
        raise ValueError(f"unknown bad file kinds {unknown}; choose from {BAD_FILE_KINDS}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    good = folder / "_good.tmp.jpg"
    draw_shape("circle", (64, 64), rng).save(good, "JPEG")
    data = good.read_bytes()
    good.unlink()
    garbage = rng.integers(0, 256, 2000, dtype=np.uint8).tobytes()
    paths = {}
    for kind in kinds:
        target = folder / (f"bad_{kind}.png" if kind == "bomb" else f"bad_{kind}.jpg")
        target.unlink(missing_ok=True)  # an earlier "unreadable" file cannot be overwritten
        if kind == "corrupt":
            target.write_bytes(data[:20] + garbage)
        elif kind == "truncated":
            target.write_bytes(data[: len(data) // 2])
        elif kind == "zero_byte":
            target.write_bytes(b"")
        elif kind == "text":
            target.write_text("this is not an image\n")
        elif kind == "bomb":
            write_decompression_bomb(target)
        elif kind == "scans":
            write_scan_bomb(target)
        else:
            target.write_bytes(data)
            target.chmod(0)
        paths[kind] = target
    return paths


class OddImage(NamedTuple):
    """A valid image in an unusual mode, and what a correct decoder makes of it.

    `rgba` is the expected (height, width, 4) uint8 result at the file's own size with
    `color_mode="rgba"`; `rgba[..., :3]` is the expected "rgb" result. Each channel may differ
    from it by at most `tolerance` (JPEG is lossy; PNGs are exact).
    """

    path: Path
    rgba: np.ndarray
    tolerance: int


def write_odd_images(
    folder: str | os.PathLike[str], size: tuple[int, int] = (16, 16)
) -> dict[str, OddImage]:
    """Write valid images in unusual modes into `folder`; returns {kind: OddImage}.

    `size` is (width, height), even. Kinds: "gray_jpeg" (mode L, gray 200), "cmyk_jpeg" (CMYK
    (0, 200, 255, 55), which is RGB (200, 43, 0)), "gray16_png" (16-bit gray, 0x3210 on the
    left half and 0xC8FF on the right: 50 and 200 in 8 bits, where clipping would give 255),
    and "palette_png" (a palette PNG whose left half is a transparent magenta palette entry and
    whose right half is opaque (0, 128, 255)).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    width, height = size
    half = width // 2

    def expected(left: tuple[int, ...], right: tuple[int, ...]) -> np.ndarray:
        rgba = np.empty((height, width, 4), np.uint8)
        rgba[:, :half], rgba[:, half:] = left, right
        return rgba

    gray, orange = (200, 200, 200, 255), (200, 43, 0, 255)
    images = {
        "gray_jpeg": OddImage(folder / "odd_gray.jpg", expected(gray, gray), 3),
        "cmyk_jpeg": OddImage(folder / "odd_cmyk.jpg", expected(orange, orange), 3),
        "gray16_png": OddImage(
            folder / "odd_gray16.png", expected((50, 50, 50, 255), (200, 200, 200, 255)), 0
        ),
        "palette_png": OddImage(
            folder / "odd_palette.png", expected((255, 0, 255, 0), (0, 128, 255, 255)), 0
        ),
    }
    Image.new("L", size, 200).save(images["gray_jpeg"].path, "JPEG")
    Image.new("CMYK", size, (0, 200, 255, 55)).save(images["cmyk_jpeg"].path, "JPEG")
    gray16 = np.full((height, width), 0xC8FF, np.uint16)
    gray16[:, :half] = 0x3210
    Image.fromarray(gray16).save(images["gray16_png"].path)
    indices = np.zeros((height, width), np.uint8)
    indices[:, half:] = 1
    palette = Image.fromarray(indices, "P")
    palette.putpalette([255, 0, 255, 0, 128, 255])
    palette.save(images["palette_png"].path, transparency=0)
    return images


class SlowDecoder:
    """The default decoder, after sleeping `delay_s` per image (a slow disk or heavy decode).

    With `marker`, it sleeps only for paths containing it. With `once_flag` (a file path), it
    sleeps only the first time, in whichever process: it creates the file before sleeping.
    Sleeping and decoding both release the GIL, so `backend="auto"` keeps threads for it.
    """

    releases_gil = True

    def __init__(
        self, delay_s: float, marker: str | None = None, once_flag: str | None = None
    ) -> None:
        self.delay_s = delay_s
        self.marker = marker
        self.once_flag = once_flag

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if (self.marker is None or self.marker in str(path)) and _first_time(self.once_flag):
            time.sleep(self.delay_s)
        return get_decoder("auto")(path, options)


class PlainReadDecoder:
    """A decoder of your own that reads the file with a plain `open(path).read()`, then decodes
    the bytes with `decode_bytes`. prefetch's decoders refuse a FIFO or a device at once; this
    one blocks on a FIFO without a writer, as a read from a dead network mount blocks: the
    stuck sample that `sample_timeout_s` bounds. Picklable; safe in many threads."""

    releases_gil = True

    def __call__(self, path: str, options: DecodeOptions) -> np.ndarray:
        with open(path, "rb") as file:  # blocks on a FIFO until a writer comes
            data = file.read()
        return decode_bytes(data, options)


class FailingDecoder:
    """The default decoder, raising `error(message)` for any path containing `marker`."""

    releases_gil = True  # the default decoder's: `backend="auto"` keeps threads for it

    def __init__(self, marker: str, error: type[Exception] = ValueError) -> None:
        self.marker = marker
        self.error = error

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if self.marker in str(path):
            raise self.error(f"injected failure for {path}")
        return get_decoder("auto")(path, options)


def small_cnn(size: int, classes: int) -> Any:
    """A compiled Keras CNN (3 conv layers) that learns the shape classes in a few epochs.

    Takes uint8 images (size, size, 3); imports Keras when called.
    """
    import keras

    model = keras.Sequential(
        [
            keras.Input((size, size, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            keras.layers.GlobalMaxPooling2D(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def assert_same_batches(
    got: Sequence[tuple[np.ndarray, np.ndarray]], expected: Sequence[tuple[np.ndarray, np.ndarray]]
) -> None:
    """Assert two runs gave the same number of batches with equal images and labels, in order."""
    assert len(got) == len(expected), f"{len(got)} batches, expected {len(expected)}"
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def random_flip_and_noise(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A sample augmentation that uses its random generator: flip half the images, add noise."""
    if rng.random() < 0.5:
        image = image[:, ::-1]
    noisy = image.astype(np.int16) + rng.integers(-8, 9, size=image.shape, dtype=np.int16)
    result: np.ndarray = np.clip(noisy, 0, 255).astype(np.uint8)
    return result


class CrashingDecoder:
    """The default decoder, killing its worker process (`os._exit`) at any path with `marker`.

    With `once_flag` (a file path), it crashes only the first time: it creates the file before
    dying, so the restarted worker decodes the file normally. Use with backend="process".
    """

    def __init__(self, marker: str, once_flag: str | None = None, exit_code: int = 13) -> None:
        self.marker = marker
        self.once_flag = once_flag
        self.exit_code = exit_code

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        if self.marker in str(path) and _first_time(self.once_flag):
            os._exit(self.exit_code)
        return get_decoder("auto")(path, options)


class RendezvousDecoder:
    """The default decoder, whose first call in each process or thread first waits, up to
    `timeout_s`, until `parties` of them have arrived (arrivals are files in `folder`).

    It proves that `parties` workers read at the same time: when fewer ever get a sample, the
    wait ends with a `TimeoutError` that the loader raises. Works across worker processes.
    """

    releases_gil = True

    def __init__(self, folder: str | os.PathLike[str], parties: int, timeout_s: float = 30.0):
        self.folder = os.fspath(folder)
        self.parties = parties
        self.timeout_s = timeout_s

    def __call__(self, path: Location, options: DecodeOptions) -> np.ndarray:
        me = os.path.join(self.folder, f"{os.getpid()}-{threading.get_ident()}")
        if not os.path.exists(me):
            open(me, "x").close()
            deadline = time.monotonic() + self.timeout_s
            while len(os.listdir(self.folder)) < self.parties:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"only {len(os.listdir(self.folder))} of {self.parties} workers "
                        f"were reading at once after {self.timeout_s:g} s"
                    )
                time.sleep(0.01)
        return get_decoder("auto")(path, options)


def _first_time(once_flag: str | None) -> bool:
    """True without a flag file; with one, True only for the call that creates it."""
    if once_flag is None:
        return True
    try:
        with open(once_flag, "x"):
            return True
    except FileExistsError:
        return False


class GilHoldingTransform:
    """A transform that holds the GIL (a pure-Python busy loop) for `delay_s` per image.

    It stands in for Python-heavy augmentation, the case `backend="auto"` sends to processes.
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        deadline = time.perf_counter() + self.delay_s
        while time.perf_counter() < deadline:
            pass
        return image


def worker_processes(pid: int | None = None) -> list[Any]:
    """The live worker processes (psutil.Process) of process `pid` (default: this one).

    Spawned workers are its children; forkserver workers are children of its forkserver. The
    multiprocessing helpers themselves (resource tracker, forkserver) are left out.
    """
    import psutil  # type: ignore[import-untyped]  # a test dependency, not prefetch's

    parent = psutil.Process(pid)
    workers = []
    for child in parent.children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            command = " ".join(child.cmdline())
            if "resource_tracker" in command:
                continue
            if "forkserver" in command and child.ppid() == parent.pid:
                continue
        except psutil.NoSuchProcess:
            continue
        workers.append(child)
    return workers
