"""Where a sample's bytes come from: local files, URLs and shard members, read within bounds.

The bottom layer of prefetch: it imports nothing above it (only `prefetch.errors` and
`prefetch._messages` of prefetch's own). It owns

- the location of a sample as data: a path or URL (`str`), or a `Member` of a shard (its
  file, format, byte offset and length), kept per source in a `MemberTable` of numpy columns;
- the one read of a location, `read_location`, and of an image `read_image` (the same bytes,
  checked for an empty file, an image of too many pixels by its header, and a JPEG of too
  many scans before any decoder sees them);
- the bounds of every read and listing (`RemoteOptions`: deadlines, size caps, listing caps,
  redirects), set per thread with `using` and read back with `active_options`;
- retries of transient failures and errors that name the path or URL;
- listing a remote folder once (`RemoteTree`), the local copies of remote objects
  (`ObjectCache`, bounded by `cache_limit` and shared by the processes of a host), and the
  checks of a folder of the user's own that such files are kept in (`open_private_folder`,
  `user_cache_folder`, and `flock_within` for the locks of its files).

Contract: a `str` location is always a path or URL (`is_url` tells them apart; `file://` is a
path), never parsed for more; nothing here blocks past a `RemoteOptions` deadline or reads
past its caps, whatever a store or a local file (a FIFO, /dev/zero) sends; a damaged
TFRecord record is a `CorruptShardError` naming the shard and the offset. Everything is
stateless (the cache's state is its folder) and thread-safe; fsspec, aiohttp and asyncio are
imported only when a URL is read, so `import prefetch` imports none of them.

Modules, lowest first: `_remote_options` (the bounds), `_local_files` (bounded local reads),
`_links` (URL resolution), `_retries` (retries, request errors), `_http` (one http(s)
request), `_storage` (paths and URLs: whole objects, ranges, downloads), `_tree` (listings),
`_records` (a TFRecord record's framing), `_locations` (locations and `read_location`),
`_headers` (the header walk: the size decoders allocate), `_images` (checked image bytes),
`_paths` (`PathArray`), `_private` (a folder of the user's own), `_cache_ledger` (a cache
folder's bytes and eviction, shared by processes), `_cache_files` (its files' names, object
locks and pins), `_cache_folder` (the folder held in each process), `_cache` (`ObjectCache`),
`_counts` (`Tally`: counters that add up, and the cache's `CacheCounts`).
See docs/remote.md and docs/shards.md.
"""

from __future__ import annotations

from prefetch.io._cache import ObjectCache
from prefetch.io._counts import CacheCounts, Tally
from prefetch.io._headers import MAX_HEADER_SEGMENTS, JpegHeader, PngHeader, walk_jpeg, walk_png
from prefetch.io._images import (
    DEFAULT_MAX_PIXELS,
    MAX_JPEG_SCAN_PIXELS,
    MAX_JPEG_SCANS,
    check_image_bytes,
    image_pixels,
    open_bytes,
    open_image,
    read_image,
)
from prefetch.io._local_files import open_regular, read_capped, read_local
from prefetch.io._locations import (
    Location,
    Member,
    MemberTable,
    place_of,
    read_location,
    spooled,
    spooled_name,
)
from prefetch.io._paths import PathArray, pack_chunks
from prefetch.io._private import flock_within, open_private_folder, user_cache_folder
from prefetch.io._records import (
    RECORD_OVERHEAD,
    corrupt_shard,
    frame_record,
    masked_crc32c,
    record_data,
    record_length,
)
from prefetch.io._remote_options import RemoteOptions, active_options, using
from prefetch.io._storage import (
    beside,
    download,
    filesystem_for,
    is_url,
    local_path,
    read_bytes,
    read_range,
    read_small,
    url_scheme,
)
from prefetch.io._tree import RemoteTree

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "MAX_HEADER_SEGMENTS",
    "MAX_JPEG_SCANS",
    "MAX_JPEG_SCAN_PIXELS",
    "RECORD_OVERHEAD",
    "CacheCounts",
    "JpegHeader",
    "Location",
    "Member",
    "MemberTable",
    "ObjectCache",
    "PathArray",
    "PngHeader",
    "RemoteOptions",
    "RemoteTree",
    "Tally",
    "active_options",
    "beside",
    "check_image_bytes",
    "corrupt_shard",
    "download",
    "filesystem_for",
    "flock_within",
    "frame_record",
    "image_pixels",
    "is_url",
    "local_path",
    "masked_crc32c",
    "open_bytes",
    "open_image",
    "open_private_folder",
    "open_regular",
    "pack_chunks",
    "place_of",
    "read_bytes",
    "read_capped",
    "read_image",
    "read_local",
    "read_location",
    "read_range",
    "read_small",
    "record_data",
    "record_length",
    "spooled",
    "spooled_name",
    "url_scheme",
    "user_cache_folder",
    "using",
    "walk_jpeg",
    "walk_png",
]
