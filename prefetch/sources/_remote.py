"""What a source's files ask of the network: their URL scheme, whether reads wait on it, a cache.

`source_scheme` names the store a file source's files are on ("" when they are local), judged
by its first sample's location; `reads_over_network` tells the loader to start more workers
than cores for it (their reads mostly wait), except for a streamed shard source, whose workers
read local copies (`prefetch.runtime._spool`); `cache_for` opens the `ObjectCache` a
loader of a remote source keeps. Pure functions of a source; thread-safe.
"""

from __future__ import annotations

from prefetch.io import ObjectCache, RemoteOptions, place_of, url_scheme
from prefetch.sources._folders import is_file_source
from prefetch.sources.shards import ShardSource


def source_scheme(source: object) -> str:
    """The URL scheme of a file source's files ("memory", "http", ...), "" when they are local
    (plain paths or `file://`) or the source has no files (it is not a file source,
    `is_file_source`). Judged by its first sample's location (a shard's, for a shard source)."""
    if not is_file_source(source) or len(source) == 0:
        return ""
    return url_scheme(place_of(source.location(0)))


def reads_over_network(source: object) -> bool:
    """Whether a file source's reads wait on a network: URLs other than `memory://`. Such a
    loader's `workers=None` is tuned like "auto", starting above one worker per core
    (`prefetch.runtime._choice.remote_start`). A streamed shard source's workers read local
    copies (`prefetch.runtime._spool`): not over a network."""
    if isinstance(source, ShardSource) and source.streaming:
        return False
    return source_scheme(source) not in ("", "memory")


def cache_for(source: object, remote: RemoteOptions) -> ObjectCache | None:
    """The `ObjectCache` a loader of `source` keeps in `remote.cache_dir`, with at most
    `remote.cache_limit` bytes of copies evicted by `remote.cache_policy` (None without a
    folder).

    Raises ValueError when `source` holds no URLs: its files are local already, or it is not
    a file source (it reads its samples itself).
    """
    if remote.cache_dir is None:
        return None
    if not source_scheme(source):
        raise ValueError(
            f"cache_dir keeps local copies of remote objects, but {type(source).__name__} "
            "reads no URLs (local files, or samples it makes itself): leave cache_dir out"
        )
    return ObjectCache.open(remote.cache_dir, remote.cache_limit, remote.cache_policy)
