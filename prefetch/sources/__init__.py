"""What a sample is: the samples of a dataset, their locations and their labels.

`ImageFolder` and `FileList` (file sources: `paths` in a `PathArray` and int32 `labels`, both
numpy, so workers do not copy them on read), `Source` (any object with `__len__` and
`__getitem__`), `is_file_source` (a type test, never an attribute's name), `index_directory`
(the one Keras-order folder lister) and `keras_split` (the one train/validation split), and the
label modes. Datasets in shard files are in `prefetch.sources.shards`. Sources are immutable
after construction and safe to share between threads. Imports `prefetch.io` and the top level.
"""

from prefetch.sources._folders import (
    IMAGE_EXTENSIONS,
    SUBSETS,
    FileList,
    ImageFolder,
    ListingReport,
    Source,
    as_source,
    index_directory,
    is_file_source,
    keras_split,
    split_files,
)
from prefetch.sources._labels import (
    LABEL_MODES,
    check_label,
    check_label_mode,
    encode_labels,
    label_bytes,
    label_spec,
)
from prefetch.sources._remote import cache_for, reads_over_network, source_scheme

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_MODES",
    "SUBSETS",
    "FileList",
    "ImageFolder",
    "ListingReport",
    "Source",
    "as_source",
    "cache_for",
    "check_label",
    "check_label_mode",
    "encode_labels",
    "index_directory",
    "is_file_source",
    "keras_split",
    "label_bytes",
    "label_spec",
    "reads_over_network",
    "source_scheme",
    "split_files",
]
