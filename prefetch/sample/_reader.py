"""What a worker does with a batch: read each sample, convert, transform, write into the slot.

`SampleReader` is the whole per-batch task and is picklable, so every backend runs the same
code: in a worker thread, or in a worker process on a shared-memory slot. A file source is told
apart from any other source by `prefetch.sources._folders.is_file_source` (a type), never by its
attributes. An error raised while reading a sample gets a note that names the sample and the
worker, and what failed with its fix: an unreadable file (then `on_error="skip"` is the fix),
or user code (a decoder, a transform, a source's `__getitem__`, or what one returned: then the
note names that function).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefetch.decode import (
    DecodeOptions,
    Decoder,
    chunk_available,
    crop_image,
    decode_chunk,
    decode_image,
    decode_window,
    decoder_name,
    flip_left_right,
    to_target_size,
)
from prefetch.errors import add_note
from prefetch.io import (
    Location,
    Member,
    ObjectCache,
    RemoteOptions,
    filesystem_for,
    is_url,
    local_path,
    place_of,
    spooled,
    using,
)
from prefetch.plan import Augment
from prefetch.sample._task import BatchTask, ChunkOutcome, Skipped, Slot, thread_clocks
from prefetch.sources import check_label, is_file_source

# Rows per call of the compiled chunk decoder (`decode_chunk`, which holds at most
# `CHUNK_BYTES` of their files and windows at once, in bytes whatever the rows), and each call
# costs some Python under the GIL (measured under load: 57 us held a sample at 32 rows a call,
# 47 at a whole part of 128 a call, 75 at 16).
CHUNK_ROWS = 32

# What a sample's read is doing (`_Step.name`), so that an error's note names what failed.
FILE = "file"  # reading and decoding a file with prefetch's decoders: a bad file
DECODER = "decoder"  # a decoder of the user's own decoding a file
DECODER_RESULT = "decoder result"  # what that decoder returned
GETITEM = "getitem"  # a source's own __getitem__
GETITEM_RESULT = "getitem result"  # what __getitem__ returned (the image, the label)
TRANSFORM = "transform"  # the user's transform
TRANSFORM_RESULT = "transform result"  # what the transform returned


@dataclass
class _Step:
    """The step a worker is at in reading one sample (one per read_into call)."""

    name: str = FILE


@dataclass(frozen=True)
class SampleReader:
    """Reads samples of `source` into slots: decode, transform, write. Picklable.

    For file sources (`is_file_source`: a `FileList`) it decodes files with `decoder` (remote
    objects from their local copies in `cache`, when given); for any other source it calls
    `source[index] -> (image, label)` (or just `image` when `labelled` is False) and converts
    the image to the target size. With `augment` (a crop, a flip, a transform) the crop's window
    is drawn from the image's size and decoded alone (`prefetch.decode._window`, by
    `window_engine`), or cut from the source's image; the flip is a view; then the transform
    runs. Files are read
    within `remote` (`storage.using`: deadlines, size caps; None: the defaults); a cached copy
    is decoded through `ObjectCache.decoded`, which keeps only copies that decode. A task's
    crops of local files (no transform, no cache) are first decoded together in one call of the
    compiled window decoder (`prefetch.decode.decode_chunk`, the GIL released); the rows it
    leaves are read one by one, as above, with the same pixels either way. With
    `spool_folder` (where the runtime's spool keeps a streamed shard source's copies), samples
    of URL shards are read from the shards' local copies there.
    """

    source: Any
    decoder: Decoder
    options: DecodeOptions
    skip_errors: bool
    labelled: bool
    num_classes: int | None = None
    cache: ObjectCache | None = None
    augment: Augment = field(default_factory=Augment)
    window_engine: str = "turbo"
    remote: RemoteOptions | None = None
    spool_folder: str | None = None

    def prepare(self) -> None:
        """Import and set up what reading needs: the decoder's libraries (its `prepare()`, if
        it has one) and the filesystem of URL paths. A worker process calls this before its
        first task, so that task's samples (and `sample_timeout_s`) do not pay for it."""
        prepare = getattr(self.decoder, "prepare", None)
        if callable(prepare):
            prepare()
        if is_file_source(self.source) and len(self.source):
            where = place_of(self.source.location(0))
            if is_url(where):
                filesystem_for(where)

    def file_path(self, index: int) -> Location:
        """Where a file source's sample `index` is read from: its path, or its shard's
        `Member` (in the shard's spooled copy, when the source is streamed). Only the source
        makes a `Member`: a path string is never read as one."""
        location: Location = self.source.location(index)
        if self.spool_folder is not None and isinstance(location, Member):
            return spooled(self.spool_folder, location)
        return location

    def describe(self, index: int) -> str:
        """The file (or sample) behind `index`, for messages."""
        if is_file_source(self.source):
            return self.source.describe(index)
        return f"{type(self.source).__name__}[{index}]"

    def read_into(
        self, task: BatchTask, slot: Slot, start: int, stop: int, worker: str
    ) -> ChunkOutcome:
        """Fill rows [start, stop) of `slot` with the samples task.indices[start:stop], with
        `remote`'s bounds in effect for every read."""
        with using(self.remote):
            return self._read_rows(task, slot, start, stop, worker)

    def _read_rows(
        self, task: BatchTask, slot: Slot, start: int, stop: int, worker: str
    ) -> ChunkOutcome:
        began = time.perf_counter()
        began_cpu, began_runnable = thread_clocks()
        outcome = ChunkOutcome()
        started = slot.started
        step = _Step()
        done = self._read_chunk(task, slot, start, stop, outcome)
        for position in range(start, stop):
            if done is not None and done[position - start]:
                continue
            index = int(task.indices[position])
            if position in task.timed_out:
                error = TimeoutError(f"{self.describe(index)!r} never returned: skipped")
                outcome.skipped.append(Skipped(position, self.describe(index), error))
                continue
            began_sample = time.monotonic()
            try:
                if started is not None:
                    started[position] = began_sample
                out = slot.images[position]
                slot.labels[position] = self._read(index, task, outcome, step, out)
                outcome.read_s.append(time.monotonic() - began_sample)
            except Exception as error:
                what = self.describe(index)
                if not self.skip_errors:
                    add_note(error, self._note(step.name, index, task.epoch, worker))
                    raise
                outcome.skipped.append(Skipped(position, what, error))
            finally:
                if started is not None:
                    started[position] = 0.0
        work = outcome.work
        if self.cache is not None:
            work.cache = work.cache + self.cache.take_counts()
        work.busy_s = time.perf_counter() - began
        cpu, runnable = thread_clocks()
        work.cpu_s, work.runnable_s = cpu - began_cpu, runnable - began_runnable
        return outcome

    def _read_chunk(
        self, task: BatchTask, slot: Slot, start: int, stop: int, outcome: ChunkOutcome
    ) -> np.ndarray | None:
        """Rows [start, stop) of a file source's crops in one call of the compiled decoder
        (`prefetch.decode.decode_chunk`: files read, boxes drawn, windows decoded without the
        GIL; the same pixels as `_read`). Returns which rows it wrote (the others, and every
        row when it returns None, are read one by one by `_read`, which names what is wrong
        with a file)."""
        augment = self.augment
        crop = augment.crop
        if (
            crop is None
            or augment.transform is not None
            or self.cache is not None
            or not is_file_source(self.source)
            or not chunk_available(crop, self.options, self.window_engine)
            or not (0 <= task.seed < 1 << 64 and 0 <= task.epoch < 1 << 64)
        ):
            return None
        rows = np.zeros(stop - start, bool)
        wanted = [p for p in range(start, stop) if p not in task.timed_out]
        for first in range(0, len(wanted), CHUNK_ROWS):
            positions = wanted[first : first + CHUNK_ROWS]
            indices = task.indices[positions].tolist()
            locations = [self.file_path(index) for index in indices]
            paths = [local_path(p) for p in locations if isinstance(p, str) and not is_url(p)]
            if len(paths) != len(locations):  # a shard's members, or URLs: read one by one
                return rows
            done, seconds = decode_chunk(
                paths,
                indices,
                positions,
                int(task.seed),
                int(task.epoch),
                crop,
                bool(augment.flip),
                self.options,
                slot.images,
                slot.started,
            )
            written = np.asarray(positions, np.int64)[done]
            rows[written - start] = True
            slot.labels[written] = self.source.labels[task.indices[written]]
            outcome.read_s.extend(seconds[done].tolist())
        return rows

    def decode_file(
        self, path: Location, rng: np.random.Generator | None, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The image file at `path` at the target size: the crop's window when there is a
        crop (drawn from `rng`, the sample's `Augment.rng`), else the whole image. With `out`
        (a slot's row) a crop's window is resized straight into it (then `out` is returned)."""
        if self.augment.crop is not None and rng is not None:
            crop, options = self.augment.crop, self.options
            return decode_window(path, crop, rng, options, self.window_engine, out)
        return self.decoder(path, self.options)

    def _read(
        self, index: int, task: BatchTask, outcome: ChunkOutcome, step: _Step, out: np.ndarray
    ) -> int:
        """One sample at the target size, written into `out` (its row of the slot); returns
        its label. `step` tells what it is doing. Without a transform, a crop's window is
        resized and flipped in `out` itself: no copy of the sample is made."""
        step.name = FILE  # reading the file (or its copy) until a decoder of the user's runs
        augment = self.augment
        rng = augment.rng(task.seed, task.epoch, index) if augment else None
        transform = augment.transform
        target = out if transform is None else None  # where to resize and flip
        if is_file_source(self.source):
            path = self.file_path(index)
            own_decoder = augment.crop is None and not _is_builtin(self.decoder)
            # The cache may decode twice (a kept copy that fails is read again): both draw alike.
            again = rng.bit_generator.state if rng is not None and self.cache else None

            def decode(local: Location) -> np.ndarray:
                if rng is not None and again is not None:
                    rng.bit_generator.state = again
                step.name = DECODER if own_decoder else FILE
                return self.decode_file(local, rng, target)

            if self.cache is None or not isinstance(path, str):
                image = decode(path)
            else:
                image, kept = self.cache.decoded(path, decode, task.epoch)
                if kept:
                    outcome.work.cache.hits += 1
                else:
                    outcome.work.cache.misses += 1
            step.name = DECODER_RESULT if own_decoder else FILE
            _check_image(image, self.options, "decoder")
            label = int(self.source.labels[index])
        else:
            step.name = GETITEM
            item = self.source[index]
            step.name = GETITEM_RESULT
            image, label = item if self.labelled else (item, 0)
            label = check_label(label, self.num_classes)
            crop = augment.crop
            if crop is not None and rng is not None:
                image = crop_image(image, crop, rng, self.options)
            else:
                image = to_target_size(image, self.options)
            _check_image(image, self.options, "decoder")
        if rng is not None and augment.flipped(rng):
            image = flip_left_right(image, target)
        if transform is not None:
            transform_rng = np.random.default_rng([task.seed, task.epoch, index])
            step.name = TRANSFORM
            image = transform(image, transform_rng)
            step.name = TRANSFORM_RESULT
            _check_image(image, self.options, "transform")
        if image is not out:
            out[...] = image
        return label

    def _note(self, step: str, index: int, epoch: int, worker: str) -> str:
        """The note for an error raised at `step` of reading sample `index`: what failed (the
        file, or the user's function by name) and the fix for that."""
        where = f"{self.describe(index)!r} (sample {index}, epoch {epoch}) in {worker}"
        shape = self.options.shape
        if step == DECODER:
            name = decoder_name(self.decoder)
            return (
                f"prefetch: decoder {name} raised while reading {where}. If the file is "
                "unreadable, pass on_error='skip' to drop such samples; if not, the error is "
                f"in {name}: fix it there"
            )
        if step == DECODER_RESULT:
            name = decoder_name(self.decoder)
            return (
                f"prefetch: decoder {name} returned an image the loader cannot use, reading "
                f"{where}: fix {name}; it must return a uint8 array of shape {shape}"
            )
        if step in (GETITEM, GETITEM_RESULT):
            method = f"{type(self.source).__qualname__}.__getitem__"
            place = f"(sample {index}, epoch {epoch}) in {worker}"
            if step == GETITEM:
                return (
                    f"prefetch: {method}({index}) raised {place}: the error is in your "
                    f"Source's code; fix {method}"
                )
            image = "a uint8 numpy array (HxW, HxWx1, HxWx3 or HxWx4) or a Pillow image of any size"
            returns = (
                f"(image, label): the image {image}, the label an int class index"
                if self.labelled
                else f"the image alone (label_mode=None): {image}"
            )
            return (
                f"prefetch: {method}({index}) returned what the loader cannot use {place}: fix "
                f"{method}; it must return {returns}"
            )
        if step in (TRANSFORM, TRANSFORM_RESULT):
            name = _callable_name(self.augment.transform)
            if step == TRANSFORM:
                return (
                    f"prefetch: transform {name} raised while transforming {where}: the error "
                    f"is in the transform; fix {name}"
                )
            return (
                f"prefetch: transform {name} returned an image the loader cannot use, for "
                f"{where}: fix {name}; it must return a uint8 array of shape {shape}, the "
                "shape it was given"
            )
        location = self.source.location(index) if is_file_source(self.source) else None
        if isinstance(location, Member):
            return (
                f"prefetch: while reading {where}: the sample is damaged in its shard; "
                f"re-write or re-download {location.shard!r}, or pass on_error='skip' to drop "
                "unreadable samples"
            )
        return f"prefetch: while reading {where}; pass on_error='skip' to drop unreadable samples"


def _is_builtin(decoder: Decoder) -> bool:
    """Whether `decoder` is one of prefetch's own (`decode_image`, the `fast` extra's
    `decode_turbo`): its errors come from the file, not from code of the user's."""
    return decoder is decode_image or type(decoder).__module__ == "prefetch.decode._turbo"


def _callable_name(function: Any) -> str:
    """`function`'s qualified name (a callable object's type name), for notes."""
    return str(getattr(function, "__qualname__", None) or type(function).__qualname__)


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
