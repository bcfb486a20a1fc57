"""The state `Loader.state_dict` saves, and where a loader of any layout continues it.

A state names the epoch's global position: `samples`, how many samples of the epoch's order
(`EpochPlan.sequence`) the ranks together have read, with the layout it was taken on
(`num_shards` ranks, `batch_size`) and the dataset's `size`. Every rank advances in lockstep
(each has the same number of batches, `EpochPlan`), so batch `position` of any rank gives the
same global position: each rank's own state is the whole state, and saving rank 0's is
enough. `resume` continues it on a plan of any number of shards and batch size: the plan
yields the rest of that epoch's order from there, split among its shards (the same batches as
an uninterrupted run when the layout is the same), so across before and after every sample
of the epoch is read once, besides the padding of each layout (`EpochPlan`).

Format (version 2): `{"version", "seed", "epoch", "position", "samples", "size",
"num_shards", "batch_size"}`, all ints, JSON-safe. `position` is this rank's batches of the
epoch delivered so far in this layout (`len(loader) - position` are left); at the epoch's end
(`position` is `len(loader)`) `samples` is `size`, and any layout resumes it with nothing of
that epoch left. A version-1 state, `{"seed", "epoch", "position"}`, still loads: its position
is taken as one of the loader's own layout, as it was saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefetch.plan._epochs import EpochPlan

STATE_VERSION = 2
_LAYOUT = ("size", "num_shards", "batch_size")


@dataclass(frozen=True)
class LoaderState:
    """A parsed, checked state (see the module docstring); `samples` is None for version 1."""

    seed: int
    epoch: int
    position: int
    samples: int | None = None
    size: int = 0
    num_shards: int = 1
    batch_size: int = 1

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> LoaderState:
        """Parse `state` (a dict from `state_dict`, maybe through JSON); ValueError if it is
        not one."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a loader state is the dict state_dict() gave, got {state!r}")
        version = state.get("version", 1)
        if version not in (1, STATE_VERSION):
            raise ValueError(
                f"this loader state has version {version!r}; this prefetch reads versions 1 "
                f"and {STATE_VERSION}: was it saved by a newer prefetch?"
            )
        keys = ("seed", "epoch", "position") + (("samples", *_LAYOUT) if version == 2 else ())
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"the loader state lacks {missing}: {dict(state)!r}")
        values = {key: state[key] for key in keys}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the loader state's {key!r} must be an int >= 0, got {value!r}")
        return cls(**values)


def loader_state(plan: EpochPlan, epoch: int, position: int) -> dict[str, int]:
    """The state of a loader with `plan` whose next batch is batch `position` of `epoch`."""
    return {
        "version": STATE_VERSION,
        "seed": plan.seed,
        "epoch": epoch,
        "position": position,
        "samples": plan.consumed(epoch, position),
        "size": plan.size,
        "num_shards": plan.num_shards,
        "batch_size": plan.batch_size,
    }


def resume(plan: EpochPlan, state: LoaderState) -> tuple[EpochPlan, int]:
    """`plan` (with the state's seed) made to continue `state`, and the batch position its
    next iteration begins at, in `state.epoch`. ValueError where it cannot continue exactly."""
    plan = plan.replace(seed=state.seed, resume_at=None)
    if state.samples is None:  # version 1: a position of this layout
        if not 0 <= state.position <= len(plan):
            raise ValueError(
                f"position {state.position} is outside this loader's epoch of {len(plan)} "
                "batches; was the state saved with another batch_size or dataset?"
            )
        return plan, state.position
    if state.size != plan.size or state.samples > plan.size:
        raise ValueError(
            f"the loader state was taken on a dataset of {state.size} samples, at sample "
            f"{state.samples} of its epoch; this loader has {plan.size}: the same dataset "
            "(and validation_split) is needed to resume"
        )
    if state.samples == 0:
        return plan, 0
    if state.samples == plan.size:  # taken at the epoch's end: nothing of it is left
        return plan, len(plan)
    found = plan.position_of(state.epoch, state.samples)
    taken = (state.num_shards, state.batch_size)
    same_layout = taken == (plan.num_shards, plan.batch_size)
    if found is not None and (same_layout or plan.elastic):
        return plan, found
    if plan.elastic:
        resumed = plan.replace(resume_at=(state.epoch, state.samples))
        return resumed, resumed.run_offset(state.epoch)
    if same_layout:
        raise ValueError(
            f"this state's place (epoch {state.epoch}, sample {state.samples}) is at no batch "
            "boundary of this loader: was it saved with other options (drop_remainder, "
            "shuffle)?"
        )
    what = (
        "shuffle='batches' fixes each batch's samples for one batch size and rank count"
        if plan.shuffle == "batches"
        else "a streamed shard source gives each rank whole shard files"
    )
    raise ValueError(
        f"this state was taken mid-epoch (epoch {state.epoch}, sample {state.samples}) on "
        f"{state.num_shards} ranks with batch_size {state.batch_size}, and this loader has "
        f"{plan.num_shards} with batch_size {plan.batch_size}: {what}, so it resumes "
        "mid-epoch only on the same (call loader.shard(...) before load_state_dict); a "
        "state taken at an epoch's end resumes on any"
    )
