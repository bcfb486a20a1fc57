"""Where bytes come from: a sample's location -> its bytes, within the RemoteOptions bounds.

A location is a path or URL (a `str`, never parsed for anything else) or a member of a shard
(a `Member` value); `Location` is their union. The one read function, `read_whole(location)`,
reads any of them: a local regular file (never past a cap, never blocking on a FIFO), an fsspec
URL (retried on transient failures, within the deadlines and caps of the `RemoteOptions` in
effect, `using`), or a shard member (one `pread`, or one ranged read). Also here: bounded
folder listings of URLs (`RemoteTree`), the object cache of `cache_dir` (`ObjectCache`) and
`PathArray`, many paths in one buffer. The lowest layer: it imports only prefetch's top-level
helpers (errors, _messages).
"""
