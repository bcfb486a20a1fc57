"""Sources of samples: ImageFolder (Keras directory rules), FileList, and the epoch order.

A source is anything with `__len__` and `__getitem__(index) -> (image, label)`. File sources
(`ImageFolder`, `FileList`) also expose `paths` and `labels` as numpy arrays, never Python lists,
so that worker processes do not copy them on read; the Loader then decodes the files itself, at
the target size. Sources are immutable after construction and safe to share between threads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from PIL import Image

# The extensions that Keras `image_dataset_from_directory` accepts (compared lower-cased).
IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


@runtime_checkable
class Source(Protocol):
    """Any indexable dataset: `len(source)` samples, `source[i] -> (image, label)`."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class FileList:
    """Image files with integer labels given by the caller.

    `paths` is a sequence of file paths; `labels` a sequence of ints in [0, number of classes),
    or None for unlabelled data. `class_names` names the classes (defaults to "0", "1", ...).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        labels: Sequence[int] | np.ndarray | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        self.paths = np.array([os.fspath(p) for p in paths], dtype=np.str_)
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
        with Image.open(str(self.paths[index])) as image:
            return np.asarray(image), int(self.labels[index])

    def subset(self, indices: Sequence[int] | np.ndarray) -> FileList:
        """A FileList of the samples at `indices` (for train/validation splits)."""
        indices = np.asarray(indices, dtype=np.int64)
        return FileList(
            self.paths[indices],
            self.labels[indices] if self.has_labels else None,
            self.class_names,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} files, {len(self.class_names)} classes)"


class ImageFolder(FileList):
    """The images under `root/<class_name>/...`, listed with Keras's directory rules.

    Classes are the sorted names of the subdirectories of `root` (hidden ones, starting with
    ".", are skipped), or the given `class_names` in the given order. Files are found
    recursively, directories walked in sorted path order and files sorted within each, keeping
    the extensions .jpg .jpeg .png .bmp .gif in any case. Label i is `class_names[i]`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        class_names: Sequence[str] | None = None,
        follow_links: bool = False,
    ) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"image folder {str(self.root)!r} does not exist or is not a directory; "
                "pass the folder that holds one subfolder per class"
            )
        found = sorted(
            entry.name
            for entry in os.scandir(self.root)
            if entry.is_dir() and not entry.name.startswith(".")
        )
        if class_names is None:
            class_names = found
        else:
            missing = [name for name in class_names if name not in found]
            if missing:
                raise ValueError(
                    f"class_names {missing} have no subfolder in {str(self.root)!r}; "
                    f"the subfolders are {found}"
                )
        if not class_names:
            raise ValueError(
                f"no class folders in {str(self.root)!r}: put the images of each class in "
                f"its own subfolder, as in {self.root / 'cats' / 'cat_001.jpg'}"
            )
        paths: list[str] = []
        labels: list[int] = []
        for label, name in enumerate(class_names):
            for path in _list_images(self.root / name, follow_links):
                paths.append(path)
                labels.append(label)
        if not paths:
            raise ValueError(
                f"no images found in {str(self.root)!r} (classes {list(class_names)}); "
                f"allowed extensions are {', '.join(IMAGE_EXTENSIONS)}"
            )
        super().__init__(paths, labels, class_names)

    def __repr__(self) -> str:
        return (
            f"ImageFolder({str(self.root)!r}: {len(self)} files, {len(self.class_names)} classes)"
        )


def _list_images(folder: Path, follow_links: bool) -> list[str]:
    """Image files under `folder`, in Keras's order: walk sorted by directory, files sorted."""
    found = []
    for dirpath, _, filenames in sorted(os.walk(folder, followlinks=follow_links)):
        for filename in sorted(filenames):
            if filename.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.join(dirpath, filename))
    return found


def index_directory(
    directory: str | os.PathLike[str],
    *,
    infer_labels: bool = True,
    class_names: Sequence[str] | None = None,
    follow_links: bool = False,
) -> tuple[list[str], np.ndarray, list[str]]:
    """List image files exactly as Keras's `image_dataset_from_directory` does, unshuffled.

    Returns `(paths, labels, class_names)`. With `infer_labels`, the classes are the sorted
    non-hidden subfolders of `directory` (or `class_names`, in their order, which must all be
    subfolders) and `labels` (int32) index them; otherwise every image under `directory` is
    listed with label 0 and `class_names` is empty. Within a class, folders are walked in
    sorted path order and files sorted within each; paths are joined from `directory` as given
    (not normalised), so they equal the `file_paths` Keras reports for the same argument.
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"directory {os.fspath(directory)!r} does not exist or is not a directory; pass the "
            "folder that holds one subfolder per class"
        )
    if infer_labels:
        subdirs = [
            name.rstrip("/")
            for name in sorted(os.listdir(directory))
            if os.path.isdir(os.path.join(directory, name)) and not name.startswith(".")
        ]
        if class_names is not None:
            missing = [name for name in class_names if name not in subdirs]
            if missing:
                raise ValueError(
                    f"class_names {missing} are not subfolders of {os.fspath(directory)!r}: "
                    f"class_names must name some of its subfolders {subdirs}, or be None to "
                    "use them all"
                )
            subdirs = list(class_names)
    else:
        subdirs = [""]
    class_indices = {name: index for index, name in enumerate(subdirs)}
    paths: list[str] = []
    labels: list[int] = []
    for subdir in subdirs:
        folder = os.path.join(directory, subdir)
        name = os.path.basename(folder)
        walk = sorted(os.walk(folder, followlinks=follow_links), key=lambda entry: entry[0])
        for root, _, filenames in walk:
            for filename in sorted(filenames):
                if filename.lower().endswith(IMAGE_EXTENSIONS):
                    relative = os.path.relpath(os.path.join(root, filename), folder)
                    paths.append(os.path.join(directory, os.path.join(name, relative)))
                    labels.append(class_indices[name])
    return paths, np.array(labels, dtype=np.int32), subdirs if infer_labels else []


def epoch_order(size: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The sample indices of an epoch: a permutation derived from (seed, epoch) only."""
    if not shuffle:
        return np.arange(size, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(size).astype(np.int64)
