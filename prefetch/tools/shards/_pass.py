"""One write's passage through its shards: the counts it reports, and a shard's bytes.

`Writing` holds a write's state across its shards (the `Progress` it reports after each chunk
of samples, the skips, `strict`); `write_remaining` writes the shards left to write, whole
shards by the worker processes (`Preparer.write`) when there are at least `SHARDS_PER_WORKER`
per worker, else one at a time by this process from the answers the workers give for their
samples (`Preparer.map`); `ShardInProgress` is such a shard, chunk by chunk, as its bytes
are asked for; `shard_chunks` lays those bytes out (`_layout`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from prefetch.tools.shards._layout import Sample, relative_to, sample_bytes, shard_end
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._resume import Done
from prefetch.tools.shards._samples import Answer, Skip
from prefetch.tools.shards._shard_worker import ShardTask, ShardWritten, strict_refusal
from prefetch.tools.shards._work import CHUNK_SAMPLES, Preparer

# What `write_shards` calls after each shard is written, `(path, samples, size in bytes)`, and
# for each file it skips, `(path, reason)`.
ShardCallback = Callable[[str, int, int], None]
SkipCallback = Callable[[str, str], None]
# What `write_shards` calls with a `Progress` after each chunk of samples, and with a line for a
# person (resuming, starting over).
ProgressCallback = Callable[["Progress"], None]
NoteCallback = Callable[[str], None]


# Whole shards are given to the workers (each writes, and hashes, its own) when at least this
# many per worker are left to write; fewer, and the samples of each shard are shared among the
# workers instead (one shard written at a time, in order, by this process). With whole shards
# the last round leaves workers idle as the last shards finish: at 4 rounds or more that is a
# small share of the run, and sharing samples (whose writer costs about 1 ms an image) keeps up
# with dozens of workers re-encoding.
SHARDS_PER_WORKER = 4


def write_remaining(
    preparer: Preparer,
    out: OutFolder,
    writing: Writing,
    shards: dict[int, tuple[str, range]],
    record: Callable[[Done], None],
) -> None:
    """Write `shards` (index: its name and sample numbers) into `out` under temporary names,
    calling `record` with each as it is finished (module docstring: by whom)."""
    workers = preparer.workers
    if workers > 1 and len(shards) >= SHARDS_PER_WORKER * workers:
        tasks = (
            ShardTask(
                index,
                name,
                [writing.sample(number) for number in numbers],
                writing.format,
                writing.top,
                writing.strict,
            )
            for index, (name, numbers) in shards.items()
        )
        for by_worker in preparer.write(tasks, out, writing.advance):
            record(writing.finished(by_worker, shards[by_worker.shard][0]))
        return
    chunks = (
        [writing.sample(number) for number in part]
        for _, numbers in shards.values()
        for part in chunked(numbers)
    )
    answers = preparer.map(chunks)
    for index, (name, numbers) in shards.items():
        shard = writing.shard(index, name, numbers, answers)
        written = out.write_temporary(name, shard.chunks(), "shard")
        record(shard.done(written.temporary, written.size, written.sha256))


def chunked(numbers: range) -> Iterator[range]:
    """`numbers` (one shard's samples) in chunks of `CHUNK_SAMPLES`, the work sent at once."""
    for start in range(numbers.start, numbers.stop, CHUNK_SAMPLES):
        yield range(start, min(start + CHUNK_SAMPLES, numbers.stop))


class Progress(NamedTuple):
    """How far a write is: `done` of `total` samples handled (written or skipped; `resumed`
    of them by the interrupted run this one continues), `skipped` of them skipped, `bytes` of
    images written by this run, `elapsed_s` seconds since the write began (its listing and
    planning included), `writing_s` of them since it began writing images (the rates are
    per second of those; None: the same as `elapsed_s`)."""

    done: int
    total: int
    resumed: int
    skipped: int
    bytes: int
    elapsed_s: float
    writing_s: float | None = None


class Writing:
    """The state of a write across its shards: counts for `Progress`, skips, the clock."""

    def __init__(
        self,
        *,
        format: str,
        top: str,
        total: int,
        sample: Callable[[int], Sample],
        strict: bool,
        done: list[Done],
        began: float,
        on_skip: SkipCallback | None,
        on_progress: ProgressCallback | None,
    ) -> None:
        self.format = format
        self.top = top
        self.sample = sample
        self.strict = strict
        self.on_skip = on_skip
        self.on_progress = on_progress
        resumed = sum(shard.samples + len(shard.skipped) for shard in done)
        skipped = sum(len(shard.skipped) for shard in done)
        self.began = began  # the write's start (time.monotonic), its planning included
        self.start = time.monotonic()  # the writing's start
        self.progress = Progress(resumed, total, resumed, skipped, 0, self.start - began, 0.0)

    def shard(
        self, index: int, name: str, numbers: range, answers: Iterator[list[Answer]]
    ) -> ShardInProgress:
        return ShardInProgress(self, index, name, numbers, answers)

    def skip(self, path: str, reason: str) -> tuple[str, str]:
        if self.strict:
            raise strict_refusal(path, reason)
        if self.on_skip is not None:
            self.on_skip(path, reason)
        return relative_to(path, self.top), reason

    def finished(self, written: ShardWritten, name: str) -> Done:
        """The record of a shard a worker wrote (`Preparer.write`); its skips are reported."""
        skipped = tuple(self.skip(path, reason) for path, reason in written.skipped)
        return Done(
            written.shard,
            name,
            written.temporary,
            written.size,
            written.samples,
            written.sha256,
            skipped,
            written.resized,
        )

    def advance(self, samples: int, skipped: int, size: int) -> None:
        last = self.progress
        now = time.monotonic()
        self.progress = Progress(
            last.done + samples,
            last.total,
            last.resumed,
            last.skipped + skipped,
            last.bytes + size,
            now - self.began,
            now - self.start,
        )
        if self.on_progress is not None:
            self.on_progress(self.progress)


class ShardInProgress:
    """One shard being written: its samples' answers taken from `answers`, chunk by chunk
    (`_chunked`), as its bytes are asked for (`chunks`)."""

    def __init__(
        self,
        writing: Writing,
        index: int,
        name: str,
        numbers: range,
        answers: Iterator[list[Answer]],
    ) -> None:
        self.writing = writing
        self.index = index
        self.name = name
        self.numbers = numbers
        self.answers = answers
        self.samples = 0
        self.resized = 0
        self.skipped: list[tuple[str, str]] = []

    def kept(self) -> Iterator[tuple[Sample, bytes]]:
        """The samples written and their bytes; skips are reported on the way."""
        for part in chunked(self.numbers):
            answers = next(self.answers)
            size = skipped = 0
            for number, answer in zip(part, answers, strict=True):
                sample = self.writing.sample(number)
                if isinstance(answer, Skip):
                    self.skipped.append(self.writing.skip(sample.path, answer.reason))
                    skipped += 1
                    continue
                self.samples += 1
                self.resized += answer.resized
                size += len(answer.data)
                yield sample, answer.data
            self.writing.advance(len(part), skipped, size)

    def chunks(self) -> Iterable[bytes]:
        return shard_chunks(self.writing.format, self.kept(), self.writing.top)

    def done(self, temporary: str, size: int, sha256: str) -> Done:
        return Done(
            self.index,
            self.name,
            temporary,
            size,
            self.samples,
            sha256,
            tuple(self.skipped),
            self.resized,
        )


def shard_chunks(format: str, samples: Iterable[tuple[Sample, bytes]], top: str) -> Iterable[bytes]:
    """The bytes of one shard of `samples`, in pieces (a sample's image is read when reached)."""
    for sample, image in samples:
        yield from sample_bytes(format, sample, image, top)
    yield shard_end(format)
