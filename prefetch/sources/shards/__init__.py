"""Datasets in shard files: TFRecord and WebDataset tar, local or at URLs.

`TFRecordSource` and `TarSource` (both a `ShardSource`, a `FileList`) are file sources whose
samples are located by `Member` values, built once from each shard's offset index. Here too:
the TFRecord, `tf.train.Example` and tar formats, read and written without TensorFlow or
`tarfile` (bounded reads, errors naming the shard and byte offset); the offset index
(`index_shard`, `ShardIndex`: built by seeking header to header, kept beside the shard, valid
only for the bytes it indexed); a shard set's manifest; and which files a source reads.
Imports `prefetch.io`, `prefetch.sources` and the top level.
"""
