"""One shard write under its output folder's lock, once the folder is listed (`_writer`).

`Job` is what `write_shards` was asked, with the listing; `write_into(place, job, preparer)`
finishes an earlier write of the set that was interrupted while it was put in place
(`_names.earlier_write`), says when the complete set in place is already the one asked for
(its progress journal says so: `ALREADY_COMPLETE`), refuses a folder that holds another set
(without `overwrite`), resumes from the shards an interrupted run finished (`_resume`), writes
the others (`_pass.write_remaining`), refuses a set whose every file was skipped (nothing is
left: a reader refuses a set of no samples), and commits the set (`_set.commit`), its journal
then marked complete and kept. The plan (`planner`) waits for the listing's digest
(`_listing_digest`) only where it must: before an earlier run's journal is compared, and before the
commit; the shards finished before it is ready are kept in memory and written to the journal
once it is; a Ctrl-C before then waits up to `JOURNAL_WAIT_S` for it to write them (after that,
it keeps none of them for a rerun). Called by one thread.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from prefetch._messages import counted
from prefetch.sources import ImageFolder
from prefetch.sources.shards import MAX_MANIFEST_BYTES, Manifest, ShardEntry, manifest_name
from prefetch.tools.shards import _fit_crop as fitting
from prefetch.tools.shards import _set as shard_set
from prefetch.tools.shards._layout import Sample, extension_of
from prefetch.tools.shards._listing_digest import ListingDigest
from prefetch.tools.shards._names import (
    already_written,
    earlier_write,
    matching_shards,
    refuse_existing,
    remove_strays,
)
from prefetch.tools.shards._out_folder import OutFolder
from prefetch.tools.shards._pass import (
    NoteCallback,
    ProgressCallback,
    ShardCallback,
    SkipCallback,
    Writing,
    write_remaining,
)
from prefetch.tools.shards._resume import Done, Journal, Plan, progress_name, resumable
from prefetch.tools.shards._work import Preparer

# How a note of `write_shards` that the set in place is already the one asked for begins.
ALREADY_COMPLETE = "already complete"
# The longest an interrupted write waits for the listing's digest to journal the shards it
# finished (a rerun then resumes from them): a Ctrl-C ends the command within it.
JOURNAL_WAIT_S = 2.0
# Skipped files named in the error of a write whose every file was skipped.
_SKIPS_NAMED = 3


@dataclasses.dataclass(frozen=True)
class Job:
    """What `write_shards` was asked, once the folder is listed: the `source`, the folder as
    given (`top`), the shuffled `order` (None: the listing's), the shard `names`, the plan's
    `options` and the `plan` (made when first asked: it waits for the listing's digest;
    `plan_ready(wait_s)` says whether it would, after waiting at most `wait_s`), `overwrite`,
    when the write `began`, and `write_shards`'s callbacks (`note` and `status` always
    callable)."""

    source: ImageFolder
    top: str
    order: np.ndarray | None
    names: list[str]
    options: dict[str, Any]
    plan: Callable[[], Plan]
    plan_ready: Callable[[float], bool]
    overwrite: bool
    began: float
    on_shard: ShardCallback | None
    on_skip: SkipCallback | None
    on_progress: ProgressCallback | None
    note: NoteCallback
    status: NoteCallback

    def sample(self, number: int) -> Sample:
        """Sample `number` of the written order."""
        index = number if self.order is None else int(self.order[number])
        return Sample(number, str(self.source.paths[index]), int(self.source.labels[index]))


def write_into(place: OutFolder, job: Job, preparer: Preparer) -> list[str]:
    """Under `place`'s lock: finish an earlier write, say that the set in place is already
    this one, or write it (`_write_set`); the shards' paths."""
    format, prefix = job.options["format"], job.options["prefix"]
    note, status = job.note, job.status
    abandoned = earlier_write(place, format, prefix, job.overwrite)
    journal = Journal(place, progress_name(format, prefix))
    known = None
    if journal.exists():
        status(f"checking the {len(job.source):,} files against the journal of the earlier run")
        known = already_written(place, job.plan(), journal)
    if known == "finished" or (known == "complete" and not job.overwrite):
        note(
            "the interrupted run had written every shard: its set is now in place"
            if known == "finished"
            else f"{ALREADY_COMPLETE}: {place.path!r} holds the set of these "
            f"{len(job.source):,} files with these options (unchanged since it was written); "
            "nothing to do (pass --overwrite to write it again)"
        )
        remove_strays(place, job.names, prefix, format, keep=set())
        return [place.where(name) for name in job.names]
    existing = matching_shards(place.names(), format, prefix)
    if not job.overwrite:
        refuse_existing(place, format, prefix, existing, tuple(job.source.class_names))
    done: list[Done] = []
    if journal.exists():
        done, why = resumable(place, journal.name, job.plan(), shard_set.is_temporary)
        if why is not None:
            note(f"starting over: {why} since the interrupted run")
        elif done:
            kept = sum(shard.samples + len(shard.skipped) for shard in done)
            note(
                f"resuming: the interrupted run wrote {counted(len(done), 'shard')} of "
                f"{len(job.names):,} ({kept:,} of {len(job.source):,} images), checked "
                "against the plan"
            )
    keep = {shard.temporary for shard in done} | set(abandoned)
    remove_strays(place, job.names, prefix, format, keep=keep)
    _write_set(place, job, preparer, journal, done)
    manifest = _manifest(job, done)
    for temporary in abandoned:
        place.remove(temporary)
    moves = [(shard.temporary, shard.name) for shard in done]
    shard_set.commit(place, manifest, moves, sorted(set(existing) - set(job.names)))
    written = place.read_small(manifest_name(format, prefix), MAX_MANIFEST_BYTES) or b""
    journal.settle(job.plan(), written)  # kept: the same write again knows it is complete
    place.sync()
    return [place.where(name) for name in job.names]


def _write_set(
    place: OutFolder, job: Job, preparer: Preparer, journal: Journal, done: list[Done]
) -> None:
    """Write the shards not in `done` under temporary names, recording each in `journal` (and
    `done`) as it is finished; refuse (leaving nothing) a set whose every file was skipped."""
    on_shard = job.on_shard
    size, shard_size = len(job.source), job.options["shard_size"]
    writing = Writing(
        format=job.options["format"],
        top=job.top,
        total=size,
        sample=job.sample,
        strict=job.options["strict"],
        done=done,
        began=job.began,
        on_skip=job.on_skip,
        on_progress=job.on_progress,
    )
    finished_already = {shard.index for shard in done}
    remaining = {
        index: (name, range(index * shard_size, min((index + 1) * shard_size, size)))
        for index, name in enumerate(job.names)
        if index not in finished_already
    }
    started = [False]  # the journal is written afresh once the plan is ready

    def record(finished: Done) -> None:
        done.append(finished)
        if started[0]:
            journal.append(finished)
        elif job.plan_ready(0.0):  # else kept until it is: the workers are not held up
            journal.start(job.plan(), done)
            started[0] = True
        if on_shard is not None:
            on_shard(place.where(finished.name), finished.samples, finished.size)

    try:
        write_remaining(preparer, place, writing, remaining, record)
        preparer.close()  # the workers are done: they need not wait for the commit
        if not any(shard.samples for shard in done):
            for shard in done:
                place.remove(shard.temporary)
            if started[0]:
                journal.remove()
            raise ValueError(_nothing_written(job.top, done))
        if not started[0]:  # the commit's crash recovery needs the journal (already_written)
            journal.start(job.plan(), done)
    except BaseException:
        if not done and not journal.settled():  # a set in place keeps its settled journal
            journal.remove()
        elif done and not started[0] and job.plan_ready(JOURNAL_WAIT_S):
            journal.start(job.plan(), done)  # the rerun resumes from the finished shards
        raise
    done.sort(key=lambda shard: shard.index)


def _manifest(job: Job, done: list[Done]) -> Manifest:
    """The manifest of the set of `done` shards (in order)."""
    options = job.options
    return Manifest(
        format=options["format"],
        prefix=options["prefix"],
        shards=tuple(
            ShardEntry(shard.name, shard.size, shard.samples, shard.sha256) for shard in done
        ),
        class_names=tuple(job.source.class_names),
        image_extensions=tuple(sorted({extension_of(p) for p in job.source.paths})),
        options={
            "shard_size": options["shard_size"],
            "seed": options["seed"],
            "shuffle": options["shuffle"],
            "strict": options["strict"],
            **fitting.recorded(
                options["fit_crop"],
                options["fit_crop_quality"] or fitting.DEFAULT_QUALITY,
                sum(shard.resized for shard in done),
            ),
        },
        skipped=tuple(pair for shard in done for pair in shard.skipped),
    )


def silent(line: str) -> None:
    """A note nobody asked for."""


def planner(
    options: dict[str, Any], files: int, digest: ListingDigest, shards: tuple[str, ...]
) -> Callable[[], Plan]:
    """The write's `Plan`, made when first asked for (it waits for the listing's digest)."""
    made: list[Plan] = []

    def plan() -> Plan:
        if not made:
            made.append(Plan(options, files, digest.result(), shards))
        return made[0]

    return plan


def _nothing_written(top: str, done: list[Done]) -> str:
    """The error of a write whose every file was skipped: no set is left behind."""
    skipped = [pair for shard in sorted(done, key=lambda s: s.index) for pair in shard.skipped]
    named = "; ".join(f"{path}: {reason}" for path, reason in skipped[:_SKIPS_NAMED])
    more = f"; and {len(skipped) - _SKIPS_NAMED:,} more" if len(skipped) > _SKIPS_NAMED else ""
    return (
        f"every one of the {len(skipped):,} files of {top!r} was skipped ({named}{more}): no "
        "shards written, nothing left in the output folder. A reader refuses a set of no "
        "samples: put images the readers can read in the folder (the reasons say what each "
        "file is), then write again"
    )
