"""What goes where, decided before any byte is read: pure functions of (seed, epoch, sample).

`EpochPlan`: which samples go in which batch of an epoch (a permutation of `(seed, epoch)`) and
which of them each rank takes (`num_shards`, tf.data's name for the host split), the same
number of batches on every rank; `Cursor`: where an iteration stands; `LoaderState`,
`loader_state`, `resume`: what `state_dict` saves (the epoch's global position, with the ranks
and batch size) and where a loader of any layout continues it; `Handoff`: the state an adapter
that reads ahead saves (the first batch its user has not been handed). `StreamingPlan`: a streamed
shard source's epoch order (this host's shards, then a shuffle buffer). `RandomResizedCrop`,
`CenterCrop`: a sample's crop box, drawn from the image's size and its own generator
(`AUGMENT_STREAM`), so the decoder can decode the box alone. Reads no file, holds no thread;
the same seed gives the same plan for any worker count and backend. Imports `prefetch.sources`,
`prefetch.io` and the top level.
"""

from prefetch.plan._crops import AUGMENT_STREAM, Augment, Box, CenterCrop, Crop, RandomResizedCrop
from prefetch.plan._epochs import Cursor, EpochPlan, epoch_order, fixed_grouping
from prefetch.plan._resume import STATE_VERSION, Handoff, LoaderState, loader_state, resume
from prefetch.plan._stream_order import StreamingPlan

__all__ = [
    "AUGMENT_STREAM",
    "STATE_VERSION",
    "Augment",
    "Box",
    "CenterCrop",
    "Crop",
    "Cursor",
    "EpochPlan",
    "Handoff",
    "LoaderState",
    "RandomResizedCrop",
    "StreamingPlan",
    "epoch_order",
    "fixed_grouping",
    "loader_state",
    "resume",
]
