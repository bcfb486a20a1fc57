"""What goes where, decided before any byte is read: pure functions of (seed, epoch, sample).

`EpochPlan`: which samples go in which batch of an epoch (a permutation of `(seed, epoch)`) and
which of them this host takes (`num_shards`, tf.data's name for the host split); `Cursor`:
where an iteration stands (what `state_dict` saves). `StreamingPlan`: a streamed shard
source's epoch order (this host's shards, then a shuffle buffer). `RandomResizedCrop`,
`CenterCrop`: a sample's crop box, drawn from the image's size and its own generator
(`AUGMENT_STREAM`), so the decoder can decode the box alone. Reads no file, holds no thread;
the same seed gives the same plan for any worker count and backend. Imports `prefetch.sources`,
`prefetch.io` and the top level.
"""

from prefetch.plan._crops import AUGMENT_STREAM, Augment, Box, CenterCrop, Crop, RandomResizedCrop
from prefetch.plan._epochs import Cursor, EpochPlan, epoch_order, fixed_grouping
from prefetch.plan._stream_order import StreamingPlan

__all__ = [
    "AUGMENT_STREAM",
    "Augment",
    "Box",
    "CenterCrop",
    "Crop",
    "Cursor",
    "EpochPlan",
    "RandomResizedCrop",
    "StreamingPlan",
    "epoch_order",
    "fixed_grouping",
]
