"""What a worker does with a batch: read each sample, convert, transform, write into the slot.

`SampleReader` is the whole per-batch task and is picklable, so every backend runs the same
code: in a worker thread, or in a worker process on a shared-memory slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefetch.augment import Augment
from prefetch.autoscale import thread_clocks
from prefetch.backends.base import BatchTask, ChunkOutcome, Skipped, Slot
from prefetch.cache import ObjectCache
from prefetch.decode import DecodeOptions, Decoder, to_target_size
from prefetch.errors import add_note
from prefetch.labels import check_label
from prefetch.storage import filesystem_for, is_url
from prefetch.window_decode import crop_image, decode_window, flip_left_right

Transform = Callable[[np.ndarray, np.random.Generator], Any]


@dataclass(frozen=True)
class SampleReader:
    """Reads samples of `source` into slots: decode, transform, write. Picklable.

    For file sources (with `paths` and `labels` arrays) it decodes files with `decoder` (remote
    objects from their local copies in `cache`, when given); for any other source it calls
    `source[index] -> (image, label)` (or just `image` when `labelled` is False) and converts
    the image to the target size. With `augment` (a crop, a flip) the crop's window is drawn
    from the image's size and decoded alone (`prefetch.window_decode`, by `window_engine`),
    or cut from the source's image; the flip is a view; then `transform` runs.
    """

    source: Any
    decoder: Decoder
    options: DecodeOptions
    transform: Transform | None
    skip_errors: bool
    labelled: bool
    num_classes: int | None = None
    cache: ObjectCache | None = None
    augment: Augment = field(default_factory=Augment)
    window_engine: str = "turbo"

    def prepare(self) -> None:
        """Import and set up what reading needs: the decoder's libraries (its `prepare()`, if
        it has one) and the filesystem of URL paths. A worker process calls this before its
        first task, so that task's samples (and `sample_timeout_s`) do not pay for it."""
        prepare = getattr(self.decoder, "prepare", None)
        if callable(prepare):
            prepare()
        paths = getattr(self.source, "paths", None)
        if paths is not None and len(paths) and is_url(str(paths[0])):
            filesystem_for(str(paths[0]))

    def describe(self, index: int) -> str:
        """The file (or sample) behind `index`, for messages."""
        paths = getattr(self.source, "paths", None)
        return str(paths[index]) if paths is not None else f"{type(self.source).__name__}[{index}]"

    def read_into(
        self, task: BatchTask, slot: Slot, start: int, stop: int, worker: str
    ) -> ChunkOutcome:
        """Fill rows [start, stop) of `slot` with the samples task.indices[start:stop]."""
        began = time.perf_counter()
        began_cpu, began_runnable = thread_clocks()
        outcome = ChunkOutcome()
        started = slot.started
        for position in range(start, stop):
            index = int(task.indices[position])
            if position in task.timed_out:
                error = TimeoutError(f"{self.describe(index)!r} never returned: skipped")
                outcome.skipped.append(Skipped(position, self.describe(index), error))
                continue
            began_sample = time.monotonic()
            try:
                if started is not None:
                    started[position] = began_sample
                slot.images[position], label = self._read(index, task, outcome)
                slot.labels[position] = label
                outcome.read_s.append(time.monotonic() - began_sample)
            except Exception as error:
                what = self.describe(index)
                if not self.skip_errors:
                    add_note(
                        error,
                        f"prefetch: while reading {what!r} (sample {index}, epoch {task.epoch}) "
                        f"in {worker}; pass on_error='skip' to drop unreadable samples",
                    )
                    raise
                outcome.skipped.append(Skipped(position, what, error))
            finally:
                if started is not None:
                    started[position] = 0.0
        outcome.busy_s = time.perf_counter() - began
        cpu, runnable = thread_clocks()
        outcome.cpu_s, outcome.runnable_s = cpu - began_cpu, runnable - began_runnable
        return outcome

    def decode_file(self, path: str, rng: np.random.Generator | None) -> np.ndarray:
        """The image file at `path` at the target size: the crop's window when there is a
        crop (drawn from `rng`, the sample's `Augment.rng`), else the whole image."""
        if self.augment.crop is not None and rng is not None:
            return decode_window(path, self.augment.crop, rng, self.options, self.window_engine)
        return self.decoder(path, self.options)

    def _read(self, index: int, task: BatchTask, outcome: ChunkOutcome) -> tuple[np.ndarray, int]:
        augment = self.augment
        rng = augment.rng(task.seed, task.epoch, index) if augment else None
        paths = getattr(self.source, "paths", None)
        if paths is not None:
            path = str(paths[index])
            if self.cache is not None:
                path, kept = self.cache.local_copy(path)
                if kept:
                    outcome.cache_hits += 1
                else:
                    outcome.cache_misses += 1
            image = self.decode_file(path, rng)
            label = int(self.source.labels[index])
        else:
            item = self.source[index]
            image, label = item if self.labelled else (item, 0)
            label = check_label(label, self.num_classes)
            crop = augment.crop
            if crop is not None and rng is not None:
                image = crop_image(image, crop, rng, self.options)
            else:
                image = to_target_size(image, self.options)
        _check_image(image, self.options, "decoder")
        if rng is not None and augment.flipped(rng):
            image = flip_left_right(image)
        if self.transform is not None:
            transform_rng = np.random.default_rng([task.seed, task.epoch, index])
            image = self.transform(image, transform_rng)
            _check_image(image, self.options, "transform")
        return image, label


def _check_image(image: Any, options: DecodeOptions, made_by: str) -> None:
    """Refuse what would be silently broadcast or wrapped around when written to a slot."""
    if np.shape(image) != options.shape:
        raise ValueError(
            f"{made_by} returned shape {np.shape(image)}, expected {options.shape}: "
            f"a {made_by} must keep the image size (resize with image_size instead)"
        )
    if getattr(image, "dtype", None) != np.uint8:
        raise TypeError(
            f"{made_by} returned dtype {getattr(image, 'dtype', type(image).__name__)}, "
            "expected uint8: clip and cast, e.g. np.clip(x, 0, 255).astype(np.uint8)"
        )
