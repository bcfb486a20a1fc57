"""Benchmark: single-core decode + resize cost and pixel fidelity of each decoder, and a GIL check.

On ImageNet-sized JPEGs (500x375, textured: a shape plus noise, `write_photos`) decoded to
224x224 RGB, one image at a time on one thread (OpenCV and TensorFlow limited to one thread):

1. per decoder: CPU ms per image (this process's CPU time, robust to other busy processes) and
   wall ms per image, the median of `--repeats` passes over the folder, and the mean / 99th
   percentile absolute difference per pixel value from `decode_image` (Pillow with draft) and
   from Keras (`tf.io.decode_jpeg` + `tf.image.resize` bilinear, rounded to uint8);
2. the GIL check: the share of calls of each stage during which a pure-Python counter thread
   made progress (about 100%: the stage releases the GIL; about 0%: it holds it throughout;
   `time.sleep` and `sorted()` of a large list are the two controls);
3. the 2-thread scaling check: wall ms per image in one and two threads, and `decode_turbo`
   with antialias=False (the path that resizes with OpenCV) in two threads with OpenCV's own
   thread pool on (its default) and off (`cv2.setNumThreads(1)`, what fast_decode does in
   worker processes).

    python benchmarks/decoders.py [--images 64] [--repeats 5] [--size 500x375] [--noise 30]

TensorFlow rows are left out when TensorFlow does not import; the turbo rows when the `fast`
extra (simplejpeg, OpenCV) is missing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from prefetch.decode._decoders import DecodeOptions, Decoder, decode_image, to_target_size
from prefetch.decode._turbo import _dct_factor, decode_turbo, fast_available
from prefetch.testing import draw_shape

TARGET = (224, 224)
# How long each GIL-check measurement runs, and the photo it decodes (a large one, so that each
# call is long enough for the other thread to be scheduled).
GIL_CHECK_S = 0.5
# The interpreter's switch interval during the GIL check (its default is 5 ms).
SWITCH_INTERVAL_S = 0.05
GIL_CHECK_SIZE = (1600, 1200)


def write_photos(folder: Path, count: int, size: tuple[int, int], noise: int) -> list[str]:
    """`count` JPEGs (width, height = size, quality 90): a shape plus uniform noise +-noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        image = np.asarray(draw_shape("circle", size, rng)).astype(np.int16)
        image += rng.integers(-noise, noise + 1, size=image.shape, dtype=np.int16)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(str(path))
    return paths


def pillow_no_draft(path: str, options: DecodeOptions) -> np.ndarray:
    """Pillow at full size, then its antialiased resize: `decode_image` without DCT scaling."""
    with Image.open(path) as image:
        image.load()
        return to_target_size(image, options)


def turbo_then_opencv(method_name: str) -> Decoder:
    """The alternative measured for antialias=True and not kept: libjpeg-turbo at
    decode_turbo's DCT scale, then `cv2.resize` with `method_name` (INTER_LINEAR, INTER_AREA)
    instead of Pillow's filter. Stretch layout and RGB only."""
    import cv2
    import simplejpeg

    method = getattr(cv2, method_name)

    def decode(path: str, options: DecodeOptions) -> np.ndarray:
        data = Path(path).read_bytes()
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        factor = _dct_factor(height, width, options)
        pixels = simplejpeg.decode_jpeg(
            data, min_height=-(-height // factor), min_width=-(-width // factor)
        )
        resized: np.ndarray = cv2.resize(pixels, options.image_size[::-1], interpolation=method)
        return resized

    return decode


def single_threaded_tensorflow() -> Any:
    """TensorFlow limited to one thread (so it times one core, like the other rows), or None."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
    except ImportError:
        return None
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf


def tensorflow_decoder() -> Decoder | None:
    """What Keras does per image: decode_jpeg, then tf.image.resize bilinear (one TF thread)."""
    tf = single_threaded_tensorflow()
    if tf is None:
        return None

    def decode(path: str, options: DecodeOptions) -> np.ndarray:
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=options.channels)
        resized = tf.image.resize(image, options.image_size, options.interpolation)
        result: np.ndarray = np.clip(np.rint(resized.numpy()), 0, 255).astype(np.uint8)
        return result

    return decode


def ms_per_image(
    decode: Callable[[str], object], paths: list[str], repeats: int
) -> tuple[float, float]:
    """(CPU ms, wall ms) per image: medians over `repeats` passes over `paths`."""
    decode(paths[0])  # warm up: imports, lazily built tables
    cpu, wall = [], []
    for _ in range(repeats):
        cpu_began, wall_began = time.process_time(), time.perf_counter()
        for path in paths:
            decode(path)
        cpu.append((time.process_time() - cpu_began) / len(paths))
        wall.append((time.perf_counter() - wall_began) / len(paths))
    return 1000 * statistics.median(cpu), 1000 * statistics.median(wall)


def differences(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float]:
    """(mean, 99th percentile) absolute difference per pixel value, over all images."""
    diff = np.concatenate(
        [
            np.abs(a.astype(np.int16) - b.astype(np.int16)).ravel()
            for a, b in zip(got, want, strict=True)
        ]
    )
    return float(diff.mean()), float(np.percentile(diff, 99))


def calls_with_other_thread_running(work: Callable[[], object], seconds: float) -> float:
    """Share of calls of `work` during which a pure-Python counter thread made progress.

    The counter can only run while this thread does not hold the GIL. With a long switch
    interval (`SWITCH_INTERVAL_S`) the interpreter rarely forces this thread to hand the GIL
    over between calls, so a call that holds it throughout shows progress only on those rare
    switches, however busy the machine; a call that releases it lets the counter run.
    """
    stop = threading.Event()
    count = [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    spinner = threading.Thread(target=spin, name="gil-check-counter")
    spinner.start()
    calls = progressed = 0
    try:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            before = count[0]
            work()
            progressed += count[0] != before
            calls += 1
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(interval)
    return progressed / calls


def gil_rows(path: str, options: DecodeOptions) -> list[tuple[str, float]]:
    """(stage, share of its calls during which another Python thread ran) per stage."""
    big = np.random.default_rng(0).integers(0, 1 << 30, 50_000).tolist()
    stages: dict[str, Callable[[], object]] = {
        "sleep 1 ms (releases the GIL)": lambda: time.sleep(0.001),
        "sorted() of 50k ints (holds the GIL)": lambda: sorted(big),
        "decode_image (Pillow)": lambda: decode_image(path, options),
    }
    if fast_available():
        import cv2
        import simplejpeg

        data = Path(path).read_bytes()
        full = simplejpeg.decode_jpeg(data)
        stages["simplejpeg.decode_jpeg"] = lambda: simplejpeg.decode_jpeg(data)
        twice = (2 * full.shape[1], 2 * full.shape[0])  # long enough to schedule the counter
        stages["cv2.resize INTER_LINEAR, 2x up"] = lambda: cv2.resize(
            full, twice, interpolation=cv2.INTER_LINEAR
        )
        stages["decode_turbo"] = lambda: decode_turbo(path, options)
        keras = DecodeOptions(options.image_size, antialias=False)
        stages["decode_turbo antialias=False"] = lambda: decode_turbo(path, keras)
    return [
        (name, calls_with_other_thread_running(work, GIL_CHECK_S)) for name, work in stages.items()
    ]


def thread_rows(
    paths: list[str], options: DecodeOptions, keras_options: DecodeOptions, repeats: int
) -> list[str]:
    """Wall ms per image in 1 and 2 threads: the 2-thread scaling check (threads run in
    parallel only while the decoder releases the GIL), and OpenCV's own pool on and off for
    the path that resizes with OpenCV (antialias=False)."""
    runs: dict[str, tuple[Callable[[str], object], int, int | None]] = {
        "decode_image, 1 thread": (lambda p: decode_image(p, options), 1, None),
        "decode_image, 2 threads": (lambda p: decode_image(p, options), 2, None),
    }
    if fast_available():
        import cv2

        cores, original = cv2.getNumberOfCPUs(), cv2.getNumThreads()
        turbo: Callable[[str], object] = lambda p: decode_turbo(p, options)  # noqa: E731
        keras: Callable[[str], object] = lambda p: decode_turbo(p, keras_options)  # noqa: E731
        runs["decode_turbo, 1 thread"] = (turbo, 1, 1)
        runs["decode_turbo, 2 threads"] = (turbo, 2, 1)
        runs["decode_turbo antialias=False, 1 thread"] = (keras, 1, 1)
        runs["decode_turbo antialias=False, 2 threads"] = (keras, 2, 1)
        runs[f"decode_turbo antialias=False, 2 threads, OpenCV pool of {cores}"] = (keras, 2, cores)
    spent: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # alternate, so that changing load hits every row alike
        for name, (decode, threads, opencv_threads) in runs.items():
            if opencv_threads is not None:
                cv2.setNumThreads(opencv_threads)
            with ThreadPoolExecutor(threads, thread_name_prefix="decoder-bench") as pool:
                began = time.perf_counter()
                list(pool.map(decode, paths))
                spent[name].append((time.perf_counter() - began) / len(paths))
    if fast_available():
        cv2.setNumThreads(original)
    lines = []
    single: dict[str, float] = {}
    for name, times in spent.items():
        ms = 1000 * statistics.median(times)
        decoder = name.split(",")[0]
        single.setdefault(decoder, ms)
        lines.append(f"{name:62s} {ms:6.2f} wall ms/image  x{single[decoder] / ms:4.2f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", default="500x375", help="photo width x height")
    parser.add_argument("--noise", type=int, default=30, help="uniform noise amplitude")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    options = DecodeOptions(TARGET, antialias=True)
    keras_options = DecodeOptions(TARGET, antialias=False)
    decoders: dict[str, Callable[[str], np.ndarray]] = {
        "pillow, no draft (antialiased)": lambda p: pillow_no_draft(p, options),
        "decode_image (pillow + draft)": lambda p: decode_image(p, options),
        "decode_image antialias=False": lambda p: decode_image(p, keras_options),
    }
    if fast_available():
        decoders["decode_turbo"] = lambda p: decode_turbo(p, options)
        decoders["decode_turbo antialias=False"] = lambda p: decode_turbo(p, keras_options)
        for method in ("INTER_AREA", "INTER_LINEAR"):
            alternative = turbo_then_opencv(method)
            decoders[f"(not kept) turbo + {method}"] = lambda p, a=alternative: a(p, options)
    tf_decode = tensorflow_decoder()
    if tf_decode is not None:
        decoders["tf decode_jpeg + image.resize"] = lambda p: tf_decode(p, options)
    with tempfile.TemporaryDirectory(prefix="decoders-bench-") as folder:
        paths = write_photos(Path(folder), args.images, (width, height), args.noise)
        outputs = {name: [decode(p) for p in paths] for name, decode in decoders.items()}
        rows = []
        for name, decode in decoders.items():
            cpu_ms, wall_ms = ms_per_image(decode, paths, args.repeats)
            rows.append((name, cpu_ms, wall_ms))
        (large,) = write_photos(Path(folder) / "large", 1, GIL_CHECK_SIZE, args.noise)
        gil = gil_rows(large, options)
        threads = thread_rows(paths, options, keras_options, args.repeats)
    print(
        f"\n{args.images} JPEGs {width}x{height} (noise +-{args.noise}, quality 90) -> "
        f"{TARGET[0]}x{TARGET[1]} RGB, one thread, median of {args.repeats}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n"
    )
    reference = outputs["decode_image (pillow + draft)"]
    keras = outputs.get("tf decode_jpeg + image.resize")
    header = f"{'decoder':32s} {'CPU ms':>7s} {'wall ms':>8s} {'vs decode_image':>16s}"
    print(header + (f" {'vs Keras (TF)':>14s}" if keras is not None else ""))
    print(
        f"{'':32s} {'':>7s} {'':>8s} {'mean':>7s} {'p99':>8s}"
        + (f" {'mean':>6s} {'p99':>7s}" if keras else "")
    )
    for name, cpu_ms, wall_ms in rows:
        mean, p99 = differences(outputs[name], reference)
        line = f"{name:32s} {cpu_ms:7.2f} {wall_ms:8.2f} {mean:7.2f} {p99:8.0f}"
        if keras is not None:
            k_mean, k_p99 = differences(outputs[name], keras)
            line += f" {k_mean:6.2f} {k_p99:7.0f}"
        print(line)
    print(
        f"\nGIL check on a {GIL_CHECK_SIZE[0]}x{GIL_CHECK_SIZE[1]} JPEG: share of calls "
        "during which another Python thread ran"
    )
    for name, share in gil:
        print(f"  {name:40s} {share:6.0%}")
    print("\nThreads (speed-up over 1 thread of the same decoder):")
    for line in threads:
        print(f"  {line}")


if __name__ == "__main__":
    main()
