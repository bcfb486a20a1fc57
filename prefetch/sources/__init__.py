"""What a sample is: the samples of a dataset, their locations and their labels.

`ImageFolder` and `FileList` (file sources: `paths` in a `PathArray` and int32 `labels`, both
numpy, so workers do not copy them on read), `Source` (any object with `__len__` and
`__getitem__`), `is_file_source` (a type test, never an attribute's name), `index_directory`
(the one Keras-order folder lister) and `keras_split` (the one train/validation split), and the
label modes. Datasets in shard files are in `prefetch.sources.shards`. Sources are immutable
after construction and safe to share between threads. Imports `prefetch.io` and the top level.
"""
