"""The index of a shard at a URL: kept, fetched from beside it, or built from a whole copy;
and checked against the shard's bytes before it is used.

Thread-safe (each call reads and writes its own files). See `remote_index`.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile

from prefetch.io import download, read_range, read_small
from prefetch.sources.shards._index import (
    INDEX_SUFFIX,
    IndexSpec,
    ShardIdentity,
    ShardIndex,
    build_index,
    keep,
    kept_index,
)
from prefetch.sources.shards._index_file import IndexRefused, decode_index, edge_digest

log = logging.getLogger("prefetch.loader")

# The most bytes read of an index file beside a URL shard (its inflated size is bounded by
# `prefetch.sources.shards._index_file.decode_index`).
MAX_INDEX_BYTES = 256 << 20


def remote_index(url: str, spec: IndexSpec, check: bool = True) -> ShardIndex:
    """The index of the shard at `url`: the one kept for it in the index folder, else the
    index file beside it (`<url>.prefetch-index.npz`, as `prefetch shards write` leaves),
    else built from a whole copy fetched now into a private temporary file (then deleted),
    and kept. A kept or fetched index is used only when it passes `decode_index`'s checks
    (a refused one is logged, naming it) and, with `check`, when the shard's size and the
    digest of its first and last 64 KiB still match it (two ranged reads); a streamed
    source's copies are checked instead as they are fetched (`prefetch.runtime._spool`)."""
    found = kept_index(url, spec)
    if found is not None and (not check or _edges_match(url, found)):
        return found
    beside = url + INDEX_SUFFIX
    try:
        data = read_small(beside, MAX_INDEX_BYTES)
    except OSError:  # none beside it (or none readable): build one
        data = None
    found = None
    if data is not None:
        try:
            found = decode_index(data, spec)
        except IndexRefused as error:
            log.warning("prefetch: index %r not used (%s): indexing %r itself", beside, error, url)
        if found is not None and check and not _edges_match(url, found):
            found = None
    if found is None:
        found = _index_copy(url, spec)
    keep(url, found, spec)
    return found


def _edges_match(url: str, index: ShardIndex) -> bool:
    """Whether the shard at `url` has the size and the edges' digest `index` was built for."""
    try:
        digest = edge_digest(lambda offset, n: read_range(url, offset, n), index.size)
    except OSError:  # shorter than it was, or gone: index it again (or fail doing so)
        return False
    return digest == index.identity.digest


def _index_copy(url: str, spec: IndexSpec) -> ShardIndex:
    """The index of a whole copy of the shard at `url`, fetched now into a private temporary
    file (then deleted); errors name the URL, never the copy."""
    with tempfile.NamedTemporaryFile(prefix="prefetch-shard-") as copy:
        size = download(url, copy)  # type: ignore[arg-type]
        copy.flush()
        built = build_index(copy.name, spec, name=url)
    return dataclasses.replace(built, identity=ShardIdentity(size, built.identity.digest))
