"""Test helpers that ship with prefetch: tiny image trees, fault-injecting decoders, a server.

Image trees are real JPEG/PNG files with learnable classes (one shape per class), written with
Pillow. The fakes wrap the default decoder to sleep or raise at chosen files (a `marker` in
the path; for a shard's sample, in its `str`: shard, member key, offset); they are plain
picklable classes, so they work in thread and process workers alike. `serve_folder`
(prefetch.testing.server) serves a folder over loopback HTTP with injected latency and faults;
`serve_hostile` (prefetch.testing.hostile) answers chosen paths the way a hostile server would;
`prefetch.testing.corpus` writes a seeded corpus of mutated JPEGs for differential tests of the
decoders. `fake_jax` stands in for a multi-process JAX job (`sys.modules["jax"]`, in a process
of its own); `run_together` runs the ranks of a job as processes on loopback, `run_python` a
program with this prefetch;
`FolderSizeSampler` samples how large a folder (a bounded cache) grows while a block runs.
The names are exported here; image trees and bad files are written in _images.py, the fakes
live in _fakes.py, the model and checks in _helpers.py. Modules used by name: `bombs` (pixel
and scan bombs, and the tricks that hide a size from a header walk), `corpus` (the mutated JPEG
corpus), `rewrites` (files rewritten in place while read), `flaky_listings` (folders whose
listing fails: a flaky mount, a low open-file limit, a failing `ls`), `shards`.
"""

from __future__ import annotations

from prefetch.testing._fakes import (
    CrashingDecoder,
    FailingDecoder,
    FileLimitDecoder,
    GilHoldingTransform,
    HangingDecoder,
    PlainReadDecoder,
    RecordingDecoder,
    RendezvousDecoder,
    SleepingSource,
    SlowDecoder,
    random_flip_and_noise,
)
from prefetch.testing._folder_size import FolderSizeSampler, folder_bytes
from prefetch.testing._helpers import assert_same_batches, small_cnn, worker_processes
from prefetch.testing._images import (
    BAD_FILE_KINDS,
    SHAPES,
    OddImage,
    draw_shape,
    write_bad_files,
    write_image_folder,
    write_odd_images,
)
from prefetch.testing._jax import BackendStarted, fake_jax
from prefetch.testing._processes import free_ports, log_tails, run_python, run_together
from prefetch.testing.bombs import (
    PILLOW_DEFAULT_MAX_PIXELS,
    write_decompression_bomb,
    write_scan_bomb,
)
from prefetch.testing.hostile import Reply, index_page, redirect, serve_hostile
from prefetch.testing.server import serve_folder

__all__ = [
    "BAD_FILE_KINDS",
    "PILLOW_DEFAULT_MAX_PIXELS",
    "SHAPES",
    "BackendStarted",
    "CrashingDecoder",
    "FailingDecoder",
    "FileLimitDecoder",
    "FolderSizeSampler",
    "GilHoldingTransform",
    "HangingDecoder",
    "OddImage",
    "PlainReadDecoder",
    "RecordingDecoder",
    "RendezvousDecoder",
    "Reply",
    "SleepingSource",
    "SlowDecoder",
    "assert_same_batches",
    "draw_shape",
    "fake_jax",
    "folder_bytes",
    "free_ports",
    "index_page",
    "log_tails",
    "random_flip_and_noise",
    "redirect",
    "run_python",
    "run_together",
    "serve_folder",
    "serve_hostile",
    "small_cnn",
    "worker_processes",
    "write_bad_files",
    "write_decompression_bomb",
    "write_image_folder",
    "write_odd_images",
    "write_scan_bomb",
]
