"""A Timeline of one prefetch loader's first batches.

`record_timeline(root, ...)` (exported by `prefetch.tools.bench`) records which worker decoded
each image when, how many batches were in flight, and when the consumer waited and stepped.
`run(timeline_batches=...)` records the same for its own setup.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable

from prefetch._checks import positive
from prefetch.decode import DecodeOptions, Decoder, decode_image
from prefetch.runtime import Loader, usable_cores
from prefetch.sources import ImageFolder
from prefetch.tools.bench._loaders import Setup, batch_sizes
from prefetch.tools.timeline import TimedDecoder, Timeline


def step(step_s: float) -> None:
    """A simulated training step: sleep `step_s` seconds (nothing when 0)."""
    if step_s > 0:
        time.sleep(step_s)


def record_timeline(
    root: str | os.PathLike[str],
    *,
    batches: int = 8,
    batch_size: int = 32,
    image_size: tuple[int, int] = (224, 224),
    workers: int | None = None,
    depth: int = 2,
    step_ms: float = 0.0,
    backend: str = "thread",
    decoder: Decoder | None = None,
    seed: int = 0,
) -> Timeline:
    """The first `batches` batches of one epoch of a fresh prefetch `Loader`, as a Timeline.

    Lanes: each worker thread or process ("decode" spans, one per image, recorded by a
    `TimedDecoder`), "in flight" ("produce" spans: a batch's first decode start to its last
    decode end; stacked rows show how many batches were in flight at once), and "consumer"
    ("wait" for each batch, then "step": a sleep of `step_ms`). Other arguments as in `run`.
    """
    folder = ImageFolder(root)
    options = DecodeOptions((int(image_size[0]), int(image_size[1])))
    workers = positive("workers", workers if workers is not None else usable_cores())
    setup = Setup(folder, options, batch_size, workers, depth, seed, decoder or decode_image)
    return record_setup_timeline(setup, positive("batches", batches), step_ms / 1000, backend)


def record_setup_timeline(
    setup: Setup,
    batches: int,
    step_s: float,
    backend: str,
    tick: Callable[[], None] = lambda: None,
) -> Timeline:
    """The Timeline of `setup`'s first `batches` batches; `tick()` after each."""
    consumer: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="prefetch-timeline-") as spool:
        timed = TimedDecoder(setup.decoder, spool)
        loader = Loader(
            setup.folder,
            batch_size=setup.batch_size,
            image_size=setup.options.image_size,
            workers=setup.workers,
            depth=setup.depth,
            seed=setup.seed,
            decoder=timed,
            backend=backend,
        )
        batch_of = {
            str(setup.folder.paths[index]): number
            for number, indices in enumerate(loader.batch_indices(0))
            for index in indices
        }
        with loader, contextlib.closing(batch_sizes(loader)) as epoch:
            for number in range(min(batches, len(loader))):
                asked = time.perf_counter()
                next(epoch)
                got = time.perf_counter()
                step(step_s)
                consumer.append(("wait", asked, got, number))
                consumer.append(("step", got, time.perf_counter(), number))
                tick()
        spans = timed.read_spans()
    timeline = Timeline()
    produced: dict[int, list[float]] = {}
    for span in spans:
        number = batch_of[span.path]
        timeline.record("decode", span.start_s, span.end_s, number, lane=span.worker)
        first_last = produced.setdefault(number, [span.start_s, span.end_s])
        first_last[0] = min(first_last[0], span.start_s)
        first_last[1] = max(first_last[1], span.end_s)
    for number, (first, last) in sorted(produced.items()):
        timeline.record("produce", first, last, number, lane="in flight")
    for kind, start, end, number in consumer:
        timeline.record(kind, start, end, number)
    return timeline
