"""Datasets in shard files: TFRecord and WebDataset tar, local or at URLs.

`TFRecordSource` and `TarSource` (both a `ShardSource`, a `FileList`) are file sources whose
samples are located by `Member` values, built once from each shard's offset index. Here too:
the TFRecord, `tf.train.Example` and tar formats, read and written without TensorFlow or
`tarfile` (bounded reads, errors naming the shard and byte offset); the offset index
(`index_shard`, `ShardIndex`: built by seeking header to header, kept beside the shard, valid
only for the bytes it indexed); a shard set's manifest; and which files a source reads.
Imports `prefetch.io`, `prefetch.sources` and the top level.
"""

from prefetch.sources.shards._files import parse_class_names
from prefetch.sources.shards._index import (
    INDEX_SUFFIX,
    index_folder,
    index_shard,
    load_or_build,
    open_shard,
)
from prefetch.sources.shards._index_file import (
    IndexRefused,
    IndexSpec,
    ShardIdentity,
    ShardIndex,
    decode_index,
    edge_digest,
    local_identity,
)
from prefetch.sources.shards._manifest import (
    MAX_MANIFEST_BYTES,
    Manifest,
    ShardEntry,
    is_manifest_name,
    manifest_name,
    manifests_of,
    read_manifest,
    reproducible,
    shard_prefix,
)
from prefetch.sources.shards._set import verify
from prefetch.sources.shards._sources import ShardSource, TarSource, TFRecordSource
from prefetch.sources.shards._tar import (
    MAX_HELD_NAME_BYTES,
    TAR_END,
    TarMember,
    iter_tar_members,
    sample_key,
    tar_header,
    tar_padding,
)
from prefetch.sources.shards._tfrecord import (
    encode_example,
    example_bytes_span,
    example_feature,
    iter_records,
    length_field,
)

__all__ = [
    "INDEX_SUFFIX",
    "MAX_HELD_NAME_BYTES",
    "MAX_MANIFEST_BYTES",
    "TAR_END",
    "IndexRefused",
    "IndexSpec",
    "Manifest",
    "ShardEntry",
    "ShardIdentity",
    "ShardIndex",
    "ShardSource",
    "TFRecordSource",
    "TarMember",
    "TarSource",
    "decode_index",
    "edge_digest",
    "encode_example",
    "example_bytes_span",
    "example_feature",
    "index_folder",
    "index_shard",
    "is_manifest_name",
    "iter_records",
    "iter_tar_members",
    "length_field",
    "load_or_build",
    "local_identity",
    "manifest_name",
    "manifests_of",
    "open_shard",
    "parse_class_names",
    "read_manifest",
    "reproducible",
    "sample_key",
    "shard_prefix",
    "tar_header",
    "tar_padding",
    "verify",
]
