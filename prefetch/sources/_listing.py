"""The one folder lister (ImageFolder's and the Keras drop-in's), and where its listings are kept.

`index_directory` lists with Keras's order, rules and path strings, one walk per class
folder and no per-file path arithmetic. `list_folder` is the same listing with a
`ListingReport`: a local folder's listing is kept as a file in a folder of the user's own
(`keep_listing`; `prefetch.sources._kept_listing` has the lock, when a kept listing serves
and the pruning of unused ones, `prefetch.sources._listing_file` the file and its checks), so
that the ranks of a host list the folder once and later runs start from the file while no
folder in it has changed. A listing is complete or an error: a local walk (`FolderWalk`)
reads every folder whole, retrying transient errors, stamps each before reading it (what a
kept listing is checked against) and raises naming a folder it cannot read, so no listing
with a folder left out is ever made or kept. A URL is listed with one bulk listing
(`RemoteTree`) and never kept. Pure functions apart from the kept files; thread-safe.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from prefetch._messages import counted
from prefetch.io import (
    PathArray,
    RemoteOptions,
    RemoteTree,
    is_url,
    local_path,
    open_private_folder,
    pack_chunks,
    user_cache_folder,
)
from prefetch.sources._kept_listing import load_or_list
from prefetch.sources._listing_file import LISTING_VERSION, Listing
from prefetch.sources._walk import FolderWalk

log = logging.getLogger("prefetch.loader")

# The extensions that Keras `image_dataset_from_directory` accepts (compared lower-cased).
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
# Set to "0" (or false, no, off) to keep no listing unless a folder is named (`keep_listing`).
KEEP_LISTING_ENV = "PREFETCH_KEEP_LISTING"
# Its values, in any case and with spaces around: those that turn keeping off, and those that
# keep it on (as unset or empty); any other is an error.
KEEP_LISTING_OFF = ("0", "false", "no", "off")
KEEP_LISTING_ON = ("1", "true", "yes", "on")

_warned: set[str] = set()  # the folders refused in this process (each said once)


@dataclass(frozen=True)
class ListingReport:
    """How a folder's files were found (`ImageFolder.listing`).

    - `read`: True when they were taken from a kept listing (written by an earlier run or by
      another rank of this host), False when the folder was listed now.
    - `file`: the kept listing read or written; None when none was (listing keeping is off, the
      root is a URL, or the file could not be written).
    - `seconds`: the time it took to list the folder, or to read and check the kept listing.
    - `waited_s`: the time spent waiting for another process listing the same folder.
    """

    read: bool
    file: str | None
    seconds: float
    waited_s: float


def index_directory(
    directory: str | os.PathLike[str],
    *,
    infer_labels: bool = True,
    class_names: Sequence[str] | None = None,
    follow_links: bool = False,
    remote: RemoteOptions | None = None,
    on_error: str = "raise",
    keep_listing: bool | str | os.PathLike[str] = True,
) -> tuple[PathArray, np.ndarray, list[str]]:
    """List image files exactly as Keras's `image_dataset_from_directory` does, unshuffled.

    Returns `(paths, labels, class_names)`. With `infer_labels`, the classes are the sorted
    non-hidden subfolders of `directory` (symlinks to folders count), or `class_names` in their
    order, which must all be such subfolders (else Keras's ValueError); `labels` (int32) index
    them. Otherwise every image under `directory` is listed with label 0 and `class_names` is
    empty. Each class folder is walked as `os.walk` walks it (into linked folders only with
    `follow_links`), folders in sorted path order, files sorted within each, hidden ones
    included, extensions compared lower-cased; but a folder that cannot be read raises an
    `OSError` of its kind naming it (errors transient by nature retried first: `FolderWalk`),
    where `os.walk` leaves it out. A path is `os.path.join(folder, name)` of the
    walk from `os.path.join(directory, class)` with `directory` as given (not normalised): the
    string Keras puts in `file_paths` for the same argument. A missing `directory` raises
    FileNotFoundError (its `filename` the directory) when labels are inferred, as in Keras,
    and lists nothing otherwise, as Keras does.

    A local `directory`'s listing is kept as a file and taken from it while no folder in it has
    changed (`keep_listing`, as `ImageFolder`'s; docs/scale.md). A URL `directory` (`is_url`) is
    listed once with the filesystem's bulk listing (`RemoteTree`, bounded by `remote`; with
    `on_error="skip"` a failing sub-folder page is left out) and then walked by the same code,
    giving URL paths; a missing one raises FileNotFoundError naming it. A `file://` directory is
    listed as the local path.
    """
    listing, _ = list_folder(
        directory,
        infer_labels=infer_labels,
        class_names=class_names,
        follow_links=follow_links,
        remote=remote,
        on_error=on_error,
        keep_listing=keep_listing,
    )
    return listing.paths, listing.labels, listing.class_names


def list_folder(
    directory: str | os.PathLike[str],
    *,
    infer_labels: bool = True,
    class_names: Sequence[str] | None = None,
    follow_links: bool = False,
    remote: RemoteOptions | None = None,
    on_error: str = "raise",
    keep_listing: bool | str | os.PathLike[str] = True,
) -> tuple[Listing, ListingReport]:
    """`index_directory`'s listing, and how it was found (read from a kept file or listed)."""
    started_ns, start = time.time_ns(), time.perf_counter()
    top = os.fspath(directory)
    named = listing_place(keep_listing)
    if is_url(top):
        tree = RemoteTree(top, options=remote, skip_errors=on_error == "skip")
        listing = _list(top, tree, infer_labels, class_names, follow_links)
        return listing, ListingReport(False, None, time.perf_counter() - start, 0.0)
    top = local_path(top)

    def list_now() -> Listing:
        return _list(top, FolderWalk(), infer_labels, class_names, follow_links)

    place = _open_place(*named) if named else None
    if named is None or place is None:
        listing = list_now()
        return listing, ListingReport(False, None, time.perf_counter() - start, 0.0)
    key = _key(top, infer_labels, class_names, follow_links)
    try:
        listing, outcome = load_or_list(key, place, named[0], started_ns, list_now)
    finally:
        os.close(place)
    seconds = time.perf_counter() - start - outcome.waited_s
    report = ListingReport(outcome.read, outcome.file, seconds, outcome.waited_s)
    _say(top, listing, report)
    return listing, report


def listing_place(keep_listing: bool | str | os.PathLike[str]) -> tuple[str, bool] | None:
    """Where listings are kept for `keep_listing`, and whether the caller named the folder:
    None for False (and for True when `keep_listing_default()` is False); for True
    `user_cache_folder("listings")` (`$PREFETCH_CACHE_DIR/listings`, else
    `$XDG_CACHE_HOME/prefetch/listings`, else `~/.cache/prefetch/listings`); a path is that
    folder. TypeError for anything else; ValueError for an environment value not understood."""
    if keep_listing is True:
        if not keep_listing_default():
            return None
        return user_cache_folder("listings"), False
    if keep_listing is False:
        return None
    if not isinstance(keep_listing, (str, os.PathLike)):
        raise TypeError(
            "keep_listing must be True (keep folder listings in your cache folder), False "
            f"(keep none) or a folder of your own, got {type(keep_listing).__name__}"
        )
    return os.path.abspath(os.fspath(keep_listing)), True


def keep_listing_default() -> bool:
    """Whether `keep_listing=True` keeps listings, by `PREFETCH_KEEP_LISTING`: unset, empty or
    one of `KEEP_LISTING_ON` keeps them, one of `KEEP_LISTING_OFF` does not (any case);
    anything else is a ValueError naming the variable and what it accepts."""
    value = os.environ.get(KEEP_LISTING_ENV, "")
    said = value.strip().lower()
    if said in KEEP_LISTING_OFF:
        return False
    if said in ("", *KEEP_LISTING_ON):
        return True
    raise ValueError(
        f"{KEEP_LISTING_ENV}={value!r} is not understood: set it to "
        f"{'/'.join(KEEP_LISTING_OFF)} (any case) to keep no folder listings, or to "
        f"{'/'.join(KEEP_LISTING_ON)} (or leave it unset) to keep them"
    )


def _open_place(place: str, named: bool) -> int | None:
    """A descriptor of the listings folder `place` (created 0700), checked as your own. A
    folder the caller named that fails the checks raises ValueError; the default one is said
    once (a warning) and the listing is not kept."""
    try:
        os.makedirs(place, mode=0o700, exist_ok=True)
        return open_private_folder(place, "keep_listing")
    except (OSError, ValueError) as error:
        if named:
            raise
        if place not in _warned:
            _warned.add(place)
            log.warning(
                "prefetch: folder listings are not kept (%s); pass keep_listing= a folder of "
                "your own, or keep_listing=False (or set %s=0) to keep none",
                error,
                KEEP_LISTING_ENV,
            )
        return None


def _key(top: str, infer_labels: bool, class_names: Sequence[str] | None, follow: bool) -> str:
    """What a kept listing was made for: the folder as given (with the working directory when
    relative), the host (a path may name another disk on another host), the options."""
    return json.dumps(
        {
            "version": LISTING_VERSION,
            "host": socket.gethostname(),
            "top": top,
            "cwd": "" if os.path.isabs(top) else os.getcwd(),
            "infer_labels": infer_labels,
            "class_names": None if class_names is None else list(class_names),
            "follow_links": follow,
            "extensions": IMAGE_EXTENSIONS,
        }
    )


def _say(top: str, listing: Listing, report: ListingReport) -> None:
    files = counted(len(listing.paths), "file")
    if report.read:
        waited = f" after waiting {report.waited_s:.2f} s for another process" * bool(
            report.waited_s > 0.1
        )
        log.info(
            "prefetch: took the listing of %r (%s) from %r in %.2f s%s",
            top,
            files,
            report.file,
            report.seconds,
            waited,
        )
    else:
        kept = f"; kept in {report.file!r}" if report.file else ""
        log.info("prefetch: listed %r (%s) in %.2f s%s", top, files, report.seconds, kept)


def _list(
    top: str,
    tree: FolderWalk | RemoteTree,
    infer_labels: bool,
    class_names: Sequence[str] | None,
    follow_links: bool,
) -> Listing:
    """Keras's listing of `top` on `tree`: a `FolderWalk` (a local folder: complete or an
    error, each folder stamped before it is read) or a `RemoteTree` (a URL, no stamps)."""
    listed_ns = time.time_ns()
    walk: Callable[..., Iterator[tuple[str, list[str], list[str]]]]
    subfolders: Callable[[str], list[str]]
    if isinstance(tree, FolderWalk):
        # As os.walk: a missing folder lists nothing when labels are not inferred.
        walk = functools.partial(tree.walk, missing_ok=not infer_labels)
        subfolders = tree.subfolders
    else:
        walk, subfolders = tree.walk, functools.partial(_remote_subfolders, tree)
    if infer_labels:
        subdirs = [name for name in sorted(subfolders(top)) if not name.startswith(".")]
        if class_names is not None:
            if not set(class_names).issubset(set(subdirs)):
                missing = [name for name in class_names if name not in subdirs]
                raise ValueError(
                    "The `class_names` passed did not match the names of the subdirectories "
                    f"of the target directory. Expected: {subdirs} (or a subset of it), but "
                    f"received: class_names={class_names}. {missing} are not subfolders of "
                    f"{top!r}; pass some of its subfolders, or class_names=None for all"
                )
            subdirs = list(class_names)
    else:
        subdirs = [""]
    # As Keras: a class given twice is listed twice, with the index of its last mention.
    class_indices = dict(zip(subdirs, range(len(subdirs)), strict=True))
    counts: list[int] = []

    def listed() -> Iterator[list[str]]:
        for subdir in subdirs:
            found = _walk_images(os.path.join(top, subdir), follow_links, walk)
            counts.append(len(found))
            yield found

    paths = pack_chunks(listed())
    labels = np.repeat(
        np.array([class_indices[name] for name in subdirs], dtype=np.int32),
        np.array(counts, dtype=np.int64),
    )
    names = subdirs if infer_labels else []
    folders, stamps = (tree.folders, tree.stamps) if isinstance(tree, FolderWalk) else ([], [])
    table = np.array(stamps, dtype=np.int64).reshape(-1, 4)
    return Listing(paths, labels, names, PathArray(folders), table, listed_ns)


def _remote_subfolders(tree: RemoteTree, top: str) -> list[str]:
    """The names in the URL folder `top` of `tree` that are folders."""
    return [name for name in tree.listdir(top) if tree.isdir(os.path.join(top, name))]


def _walk_images(
    folder: str, follow_links: bool, walk: Callable[..., Iterator[tuple[str, list[str], list[str]]]]
) -> list[str]:
    """Keras's iter_valid_files: the walk sorted by folder path, each folder's files sorted."""
    found: list[str] = []
    for root, _, filenames in sorted(
        walk(folder, followlinks=follow_links), key=lambda entry: entry[0]
    ):
        prefix = os.path.join(root, "")  # os.path.join(root, name) == prefix + name
        found.extend(
            [prefix + name for name in sorted(filenames) if name.lower().endswith(IMAGE_EXTENSIONS)]
        )
    return found
