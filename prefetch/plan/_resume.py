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
is taken as one of the loader's own layout, as it was saved. `LoaderState.of` checks every field
at the door.

`Handoff`: what an adapter that reads ahead of its user (`prefetch.torch`, `.tf`, `.keras`)
saves instead of the loader's state, which counts the batches read ahead as delivered.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from prefetch.plan._epochs import EpochPlan

STATE_VERSION = 2
_LAYOUT = ("size", "num_shards", "batch_size")
# The fields of each version of a state ("version" besides), and those that count at least 1.
_FIELDS = {1: ("seed", "epoch", "position"), 2: ("seed", "epoch", "position", "samples", *_LAYOUT)}
_AT_LEAST_ONE = frozenset(_LAYOUT)
_UNCHANGED = "pass the dict state_dict() gave, unchanged (JSON and torch.save keep it)"


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
        """Parse `state` (a dict from `state_dict`, maybe through JSON). Every field is checked
        at the door: TypeError if it is no mapping, ValueError naming the field, its value and
        the fix for an unknown version, a missing or unknown key, a value that is no int (a
        bool, a float, a string), one below its least (0; 1 for the layout's `size`,
        `num_shards`, `batch_size`), and a `samples` or `position` past the epoch."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a loader state is the dict state_dict() gave, got {state!r}")
        version = state.get("version", 1)
        if not _is_int(version) or version not in _FIELDS:
            raise ValueError(
                f"this loader state has version {version!r}; this prefetch reads versions 1 "
                f"and {STATE_VERSION}: was it saved by a newer prefetch?"
            )
        keys = _FIELDS[int(version)]
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"the loader state lacks {missing}: {dict(state)!r}; {_UNCHANGED}")
        unknown = sorted(str(key) for key in state if key not in (*keys, "version"))
        if unknown:
            raise ValueError(
                f"the loader state has keys a version-{version} state has not, {unknown}: "
                f"{dict(state)!r}; {_UNCHANGED}"
            )
        values = {key: _count(key, state[key], 1 if key in _AT_LEAST_ONE else 0) for key in keys}
        parsed = cls(**values)
        if parsed.samples is not None:
            parsed._check_within_epoch()
        return parsed

    def _check_within_epoch(self) -> None:
        """ValueError if `samples` or `position` is past the epoch of the state's layout."""
        assert self.samples is not None
        if self.samples > self.size:
            raise ValueError(
                f"the loader state's 'samples' is {self.samples}, past the epoch of its "
                f"'size' {self.size} samples; {_UNCHANGED}"
            )
        layout = EpochPlan(
            size=self.size, batch_size=self.batch_size, seed=0, num_shards=self.num_shards
        )
        batches = len(layout)  # with drop_remainder, which a state does not record, fewer
        if self.position > batches:
            raise ValueError(
                f"the loader state's 'position' is {self.position}, past the epoch of "
                f"{batches} batches that its layout has ({self.size} samples on "
                f"{self.num_shards} ranks, batch_size {self.batch_size}); {_UNCHANGED}"
            )


def _is_int(value: Any) -> bool:
    """Whether `value` is an int (numpy's too), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _count(key: str, value: Any, least: int) -> int:
    """The state's field `key` as an int, or ValueError naming it, its value and the fix."""
    if not _is_int(value) or value < least:
        raise ValueError(
            f"the loader state's {key!r} must be an int >= {least}, got {value!r}; {_UNCHANGED}"
        )
    return int(value)


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


class Handoff:
    """What an adapter's `state_dict` names: the first batch its user has not been handed.

    An adapter that reads its loader ahead of its user (a batch copied or converted ahead, a
    tf.data prefetch buffer) holds batches the loader counts as delivered, so the loader's own
    state is that far ahead. The adapter calls `asking(run)` just before each `next()` on the
    loader's stream (the loader's state then names the batch that call will take: it is kept,
    in order) and `handed()` as its user gets a batch (the oldest kept state is let go), so the
    oldest state kept names the first batch not handed, whatever the loop does next: `break`,
    an exception, `close()`, a collected generator, or a thread that reads ahead concurrently
    (nothing waits for a batch being read). `begin()` starts a run (an epoch's stream) and
    forgets the last; `end(run)` marks it over, after which a loader state changed by other
    means (`load_state_dict`, another iteration) is the loader's own again.

    `lag=1` is for a consumer that holds one batch out of the adapter's sight (tf.data's
    `prefetch_to_device`): a hand-out is counted as the batch leaves for that buffer, so the
    state names the batch before the oldest kept one; then it names the first batch not handed
    or the one before it, never a later one.

    - `state_dict`: the loader's `state_dict` (called with no arguments). Thread-safe.
    """

    def __init__(self, state_dict: Callable[[], dict[str, int]], lag: int = 0) -> None:
        if lag not in (0, 1):
            raise ValueError(f"lag must be 0 or 1, got {lag!r}")
        self._state_dict = state_dict
        self._lag = lag
        self._lock = threading.Lock()
        self._run = 0
        self._named: deque[dict[str, int]] = deque()  # the states of batches not handed
        self._last: dict[str, int] | None = None  # the state of the latest batch handed
        self._left: dict[str, int] | None = None  # the loader's state when the run ended

    def begin(self) -> int:
        """A new run: forget the last one's batches; returns the run's number."""
        with self._lock:
            self._run += 1
            self._named.clear()
            self._last = self._left = None
            return self._run

    def asking(self, run: int) -> None:
        """The adapter is about to take the next batch of `run` from the loader."""
        named = self._state_dict()
        with self._lock:
            if run == self._run:
                self._named.append(named)

    def handed(self) -> None:
        """The user got the oldest batch not yet handed."""
        with self._lock:
            if self._named:
                self._last = self._named.popleft()

    def given_back(self) -> None:
        """The batch handed last is to be handed again (Keras dropped it unused)."""
        with self._lock:
            if self._last is not None:
                self._named.appendleft(self._last)
                self._last = None

    def end(self, run: int) -> None:
        """`run` is over (its stream ended or was closed)."""
        left = self._state_dict()
        with self._lock:
            if run == self._run:
                self._left = left

    def state(self) -> dict[str, int]:
        """The loader's state, naming the first batch the adapter's user has not been handed."""
        with self._lock:
            named = self._last if self._lag and self._last is not None else None
            if named is None and self._named:
                named = self._named[0]
            left = self._left
        now = self._state_dict()
        if named is None or (left is not None and now != left):
            return now
        return dict(named)
