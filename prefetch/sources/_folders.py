"""Sources of samples: ImageFolder and FileList on one Keras-order lister, and Keras's split.

A source is anything with `__len__` and `__getitem__(index) -> (image, label)`. A file source is
a `FileList` (`ImageFolder` is one), decided by `is_file_source` (a type, never an attribute's
name); it holds `paths` (a `PathArray`: one UTF-8 buffer plus offsets) and `labels` (int32),
both in numpy arrays, never Python lists, so that worker processes do not copy them on read;
the Loader then decodes the files itself, at the target size. `keras_split` is the one
train/validation split (the Loader's and the Keras drop-in's): Keras's files on each side.
`ImageFolder` lists with the one folder lister (`prefetch.sources._listing`), whose listings
are kept for the other ranks of a host and later runs. Sources and PathArrays are immutable
after construction and safe to share between threads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeGuard, runtime_checkable

import numpy as np

from prefetch._messages import counted, suggest_keywords
from prefetch.io import Location, RemoteOptions, is_url, local_path, open_image
from prefetch.io import PathArray as PathArray
from prefetch.sources._listing import IMAGE_EXTENSIONS as IMAGE_EXTENSIONS
from prefetch.sources._listing import ListingReport as ListingReport
from prefetch.sources._listing import index_directory as index_directory
from prefetch.sources._listing import list_folder


@runtime_checkable
class Source(Protocol):
    """Any indexable dataset: `len(source)` samples, `source[i] -> (image, label)`.

    `runtime_checkable`: `isinstance(obj, prefetch.Source)` tells whether an object qualifies.
    How a `Loader` reads a source depends on its type alone:

    - A `FileList` (an `ImageFolder` is one, and so is an instance of your own subclass of
      either) is a *file source*: the loader decodes `paths[i]` itself, with its `decoder`, at
      the target size, takes the label from `labels[i]`, and never calls `__getitem__`.
    - Any other object is read through `source[i]`, whatever attributes it has (a `paths` of
      its own included), which returns `(image, label)`, or the image alone with
      `label_mode=None`. The image is a uint8 numpy array (H×W, H×W×1, H×W×3 or H×W×4) or a
      Pillow image; it is converted to `color_mode` and resized to `image_size`. Another dtype
      raises `TypeError` (convert in `__getitem__`). The label is an int class index.
    - Optional attributes: `class_names` (needed for `label_mode="categorical"`), and
      `has_labels = False` for a source without labels.

    `__getitem__` is called from the worker threads (or processes) concurrently. An error it
    raises reaches the consumer with a note naming `YourClass.__getitem__` and the index.
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@suggest_keywords
class FileList:
    """Image files with integer labels given by the caller: a file source.

    Parameters:

    - `paths`: the image files, one per sample: paths (`str` or `os.PathLike`) or fsspec URLs
      (a `PathArray` is taken as is).
    - `labels`: one int class index per path, in `[0, len(class_names))`; `None` for
      unlabelled data (then `has_labels` is False and a Loader needs `label_mode=None`).
    - `class_names`: the names of the classes, label `i` being `class_names[i]`; by default
      `"0"`, `"1"`, ... up to the largest label.

    The attributes `paths` (a `PathArray`) and `labels` (an int32 array) hold one entry per
    file. A `Loader` decodes a FileList's files itself (and an `ImageFolder`'s, or those of a
    subclass of yours; `is_file_source`) and never calls its `__getitem__`.
    """

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]],
        labels: Sequence[int] | np.ndarray | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.paths = paths if isinstance(paths, PathArray) else PathArray(paths)
        if labels is None:
            self.labels = np.zeros(len(self.paths), dtype=np.int32)
            self.has_labels = False
        else:
            self.labels = np.asarray(labels, dtype=np.int32).reshape(-1)
            self.has_labels = True
            if len(self.labels) != len(self.paths):
                raise ValueError(
                    f"labels must have one entry per path: got {len(self.labels)} labels "
                    f"for {len(self.paths)} paths"
                )
            if len(self.labels) and self.labels.min() < 0:
                raise ValueError(f"labels must be >= 0, got {int(self.labels.min())}")
        if class_names is None:
            count = int(self.labels.max()) + 1 if len(self.labels) and self.has_labels else 0
            class_names = [str(i) for i in range(count)]
        self.class_names = list(class_names)
        if self.has_labels and len(self.labels) and self.labels.max() >= len(self.class_names):
            raise ValueError(
                f"label {int(self.labels.max())} is out of range for "
                f"{len(self.class_names)} class names"
            )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """The full-size decoded image (uint8 HxWxC, as stored) and its label."""
        with open_image(self.location(index)) as image:
            return np.asarray(image), int(self.labels[index])

    def location(self, index: int) -> Location:
        """Where sample `index` is read from: its path (a shard source: its `Member`)."""
        return str(self.paths[index])

    def describe(self, index: int) -> str:
        """Sample `index` named for messages: its path (a shard source's `paths` name the
        shard, the member's key and its byte offset)."""
        return str(self.paths[index])

    def subset(self, indices: Sequence[int] | np.ndarray) -> FileList:
        """A FileList of the samples at `indices` (for train/validation splits)."""
        indices = np.asarray(indices, dtype=np.int64)
        return FileList(
            self.paths[indices],
            self.labels[indices] if self.has_labels else None,
            self.class_names,
        )

    def __repr__(self) -> str:
        files, classes = counted(len(self), "file"), counted(len(self.class_names), "class")
        return f"{type(self).__name__}({files}, {classes})"


@suggest_keywords
class ImageFolder(FileList):
    """The images under `root/<class_name>/...`, listed with Keras's directory rules.

    Parameters:

    - `root`: the folder that holds one subfolder per class: a path, or an fsspec URL.
    - `class_names`: the classes to list, in this order (each a subfolder of `root`); `None`
      for every subfolder, sorted.
    - `follow_links`: also walk into folders that are symbolic links, as Keras's
      `follow_links`.
    - `remote`: for a URL `root`, the `RemoteOptions` that bound its listing (deadlines, the
      caps on pages, page bytes and depth, redirects); `None` for the defaults. Kept as
      `self.remote` (a `Loader` of this folder reads with them unless given its own).
    - `on_error`: for a URL `root` listed page by page (http(s)), what a sub-folder whose page
      fails does: `"raise"` an `OSError` naming that page, or `"skip"`: leave it out, with a
      warning on the `prefetch.runtime._loader` logger.
    - `keep_listing`: where the listing of a local `root` is kept, so that the other ranks of
      the host and later runs read it instead of listing the folder again: `True` (default)
      for your cache folder (`$PREFETCH_CACHE_DIR/listings`, else
      `$XDG_CACHE_HOME/prefetch/listings`, else `~/.cache/prefetch/listings`; off when the
      environment sets `PREFETCH_KEEP_LISTING` to 0, false, no or off), a folder of your own
      (ValueError when another user owns it or may write to it), or `False` to list every
      time. A kept listing is used only while every folder it walked is unchanged, and one
      nobody used for 30 days is removed (docs/scale.md); `self.listing` (a `ListingReport`)
      says whether the files were read from it or listed now, and the `prefetch.loader`
      logger says so at INFO.

    Classes are the sorted names of the subdirectories of `root` (hidden ones, starting with
    ".", are skipped), or the given `class_names` in the given order. Files are found
    recursively, directories walked in sorted path order and files sorted within each, keeping
    the extensions .jpg .jpeg .png .bmp .gif in any case. Label i is `class_names[i]`. The
    paths are `index_directory`'s: those Keras reports in `file_paths` for the same `root`
    (unshuffled), joined from `root` as given. The listing is complete or an error: a folder
    under `root` that cannot be read (after retries of errors such as EIO or EMFILE) raises
    an `OSError` naming it, where Keras leaves it out, and nothing is kept.

    `root` may be an fsspec URL (`"gs://bucket/train"`, `"memory://..."`, an `http(s)://`
    folder whose index page links its files; the `remote` extra, docs/remote.md): it is listed
    with one bulk listing, with the same rules, and the paths are URLs. `root` stays a `str`
    for a URL (a `Path` otherwise).
    """

    listing: ListingReport

    def __init__(
        self,
        root: str | os.PathLike[str],
        class_names: Sequence[str] | None = None,
        follow_links: bool = False,
        *,
        remote: RemoteOptions | None = None,
        on_error: str = "raise",
        keep_listing: bool | str | os.PathLike[str] = True,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be one of ('raise', 'skip'), got {on_error!r}")
        self.remote = remote
        at_url = is_url(root)
        self.root: str | Path = str(root) if at_url else Path(local_path(os.fspath(root)))
        missing = (
            f"image folder {str(self.root)!r} does not exist or is not a directory; "
            "pass the folder that holds one subfolder per class"
        )
        if not at_url and not Path(self.root).is_dir():
            raise FileNotFoundError(missing)
        try:
            listing, self.listing = list_folder(
                root,
                class_names=class_names,
                follow_links=follow_links,
                remote=remote,
                on_error=on_error,
                keep_listing=keep_listing,
            )
        except FileNotFoundError as error:
            if not at_url:
                raise
            raise FileNotFoundError(f"{missing} ({error})") from error
        paths, labels, class_names = listing.paths, listing.labels, listing.class_names
        if not class_names:
            raise ValueError(
                f"no class folders in {str(self.root)!r}: put the images of each class in "
                f"its own subfolder, as in {os.path.join(self.root, 'cats', 'cat_001.jpg')}"
            )
        if not len(paths):
            raise ValueError(
                f"no images found in {str(self.root)!r} (classes {list(class_names)}); "
                f"allowed extensions are {', '.join(IMAGE_EXTENSIONS)}"
            )
        super().__init__(paths, labels, class_names)

    def __repr__(self) -> str:
        return (
            f"ImageFolder({str(self.root)!r}: {counted(len(self), 'file')}, "
            f"{counted(len(self.class_names), 'class')})"
        )


def is_file_source(source: object) -> TypeGuard[FileList]:
    """Whether a Loader reads `source` as files: whether it is a `FileList` (an `ImageFolder`,
    or a subclass of yours). The one test of it, used everywhere (reading, the backend choice,
    remote storage): never an attribute's name, so your own class with a `paths` attribute is
    still read through `source[i]`.

    Parameters:

    - `source`: any object a `Loader` may be given as its source.
    """
    return isinstance(source, FileList)


# The two sides of a split, in Keras's order.
SUBSETS = ("training", "validation")


def keras_split(
    count: int, *, validation_split: float | None, subset: str | None, seed: int | None
) -> np.ndarray:
    """Indices (into a listing of `count` files) of the files Keras's
    `image_dataset_from_directory` keeps for `subset`, in Keras's order.

    Keras shuffles its listing once with `np.random.RandomState(seed).shuffle` (when it
    shuffles; pass `seed=None` for Keras's `shuffle=False`, which keeps the listing's order),
    then, with `validation_split`, takes the last `int(validation_split * count)` files for
    `"validation"` and the rest for `"training"` (Keras's slices, `[:-k]` and `[-k:]`, so a
    `k` of 0 leaves training empty and gives validation everything: callers that want a clear
    error check `k` first). Without `validation_split` every file is kept.

    Parameters:

    - `count`: the number of files listed (`index_directory`'s order).
    - `validation_split`: the fraction held out for validation, in (0, 1), or None for no split.
    - `subset`: `"training"` or `"validation"` (ignored without `validation_split`).
    - `seed`: the seed of Keras's shuffle of the listing; None for no shuffle.
    """
    order = np.arange(count)
    if seed is not None:
        np.random.RandomState(seed).shuffle(order)
    if not validation_split:
        return order
    held_out = int(validation_split * count)
    return order[:-held_out] if subset == "training" else order[-held_out:]


def split_files(
    source: FileList, validation_split: float, subset: str, seed: int | None
) -> FileList:
    """The `subset` ("training" or "validation") of `source`'s files: Keras's for the same
    `validation_split` and `seed` (`keras_split`, with Keras's default `shuffle=True`).
    ValueError when a side would hold no file."""
    held_out = int(validation_split * len(source))
    if held_out == 0 or held_out == len(source):
        raise ValueError(
            f"validation_split={validation_split} of {counted(len(source), 'file')} holds out "
            f"{counted(held_out, 'file')}, leaving a side empty: use a validation_split between "
            f"{1 / len(source):.3g} and {1 - 1 / len(source):.3g}, or more files"
        )
    return source.subset(
        keras_split(len(source), validation_split=validation_split, subset=subset, seed=seed)
    )


def as_source(source: Any, remote: RemoteOptions | None = None, on_error: str = "raise") -> Source:
    """`source` as a Source: a folder path becomes an ImageFolder (listed with `remote` and
    `on_error`); TypeError or ValueError for what has no samples to load."""
    if isinstance(source, (str, os.PathLike)):
        source = ImageFolder(source, remote=remote, on_error=on_error)
    if not isinstance(source, Source):
        raise TypeError(
            f"source must have __len__ and __getitem__ (or be a folder path), "
            f"got {type(source).__name__}"
        )
    if len(source) == 0:
        raise ValueError(f"source {source!r} is empty: there is nothing to load")
    return source
