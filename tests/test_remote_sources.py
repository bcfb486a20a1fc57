"""Image folders and file lists on fsspec URLs: memory:// and a loopback HTTP server.

No mocks of fsspec: real JPEG and PNG bytes are written into fsspec's memory filesystem (one per
test, under a unique bucket) or served by `prefetch.testing.serve_folder`. Each remote folder is
compared with the same folder on local disk: Keras's file order and class names, and the pixels
of a Loader epoch. memory:// lives in one process only (a spawned worker sees an empty
filesystem), so the process backend is tested over HTTP.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import prefetch
from prefetch import Augment, ErrorPolicy, FileList, ImageFolder, Loader
from prefetch.decode._decoders import DecodeOptions, decode_image
from prefetch.io import _storage as storage
from prefetch.runtime._autoscale import usable_cores
from prefetch.runtime._options import REMOTE_PROCESSES_PER_CORE, REMOTE_READER_THREADS
from prefetch.sources._folders import index_directory
from prefetch.testing import serve_folder, write_image_folder

pytestmark = pytest.mark.usefixtures("fsspec_io_thread")

fsspec = pytest.importorskip("fsspec", reason="the remote extra is not installed")

SIZE = (16, 16)
CLASSES = ("square", "circle", "triangle")


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    """A local image folder with JPEGs, PNGs, a nested folder and a hidden class folder."""
    root = write_image_folder(tmp_path / "train", class_names=CLASSES, per_class=4)
    write_image_folder(tmp_path / "train", class_names=("circle",), per_class=2, image_format="PNG")
    nested = root / "square" / "more"
    nested.mkdir()
    (nested / "Upper.JPG").write_bytes((root / "square" / "square_0000.jpg").read_bytes())
    (root / "square" / "notes.txt").write_text("not an image")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.jpg").write_bytes((root / "square" / "square_0001.jpg").read_bytes())
    return root


@pytest.fixture
def memory_root(local_root: Path) -> Iterator[str]:
    """`local_root` copied into fsspec's memory filesystem; removed after the test."""
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}/train"
    fs = fsspec.filesystem("memory")
    for folder, _, files in os.walk(local_root):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), local_root)
            fs.pipe_file(f"{url}/{relative}", Path(folder, name).read_bytes())
    yield url
    fs.rm(url, recursive=True)


def relative(paths: list[str], root: str) -> list[str]:
    return [path[len(root) :].lstrip("/") for path in paths]


def epoch(loader: Loader) -> tuple[np.ndarray, np.ndarray]:
    with loader:
        batches = [(images.copy(), labels.copy()) for images, labels in loader]
    return np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])


# --- what is a URL ------------------------------------------------------------------------------


def test_only_scheme_urls_other_than_file_are_urls() -> None:
    assert storage.is_url("memory://bucket/x.jpg")
    assert storage.is_url("gs://bucket/x.jpg")
    assert storage.is_url("http://127.0.0.1:8000/x.jpg")
    assert not storage.is_url("file:///tmp/x.jpg")
    assert not storage.is_url("/tmp/x.jpg")
    assert not storage.is_url("relative/dir")
    assert not storage.is_url(Path("/tmp/x.jpg"))


def test_importing_prefetch_does_not_import_fsspec() -> None:
    code = "import sys, prefetch, prefetch.sources._folders; print('fsspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- listing ------------------------------------------------------------------------------------


def test_a_memory_folder_lists_in_keras_order_with_the_local_folders_classes(
    local_root: Path, memory_root: str
) -> None:
    remote, local = ImageFolder(memory_root), ImageFolder(local_root)
    assert remote.class_names == local.class_names == sorted(CLASSES)
    assert relative(remote.paths.tolist(), memory_root) == relative(
        local.paths.tolist(), str(local_root)
    )
    assert np.array_equal(remote.labels, local.labels)
    assert all(path.startswith(memory_root + "/") for path in remote.paths)
    assert "circle/circle_0000.png" in relative(remote.paths.tolist(), memory_root)
    assert "square/more/Upper.JPG" in relative(remote.paths.tolist(), memory_root)


def test_unlabelled_listing_and_class_names_match_the_local_folder(
    local_root: Path, memory_root: str
) -> None:
    for root in (memory_root, memory_root + "/"):
        paths, labels, names = index_directory(root, infer_labels=False)
        local_paths, _, _ = index_directory(str(local_root) + "/", infer_labels=False)
        assert names == [] and not labels.any()
        assert relative(paths.tolist(), root) == relative(local_paths.tolist(), str(local_root))
    assert index_directory(memory_root, infer_labels=False)[0].tolist() == paths.tolist()
    picked = ImageFolder(memory_root, class_names=["triangle", "circle"])
    assert picked.class_names == ["triangle", "circle"]
    triangles = picked.paths[picked.labels == 0].tolist()
    assert triangles and all("/triangle/" in path for path in triangles)
    with pytest.raises(ValueError, match="did not match"):
        ImageFolder(memory_root, class_names=["dog"])


def test_a_missing_remote_folder_is_an_error_naming_it() -> None:
    with pytest.raises(FileNotFoundError, match="memory://no-such-bucket/train"):
        ImageFolder("memory://no-such-bucket/train")


def test_a_file_url_folder_is_listed_as_the_local_folder(local_root: Path) -> None:
    by_url = ImageFolder(f"file://{local_root}")
    assert by_url.paths.tolist() == ImageFolder(local_root).paths.tolist()


# --- reading ------------------------------------------------------------------------------------


def test_a_thread_loader_epoch_over_memory_equals_the_local_one_pixel_for_pixel(
    local_root: Path, memory_root: str
) -> None:
    def load(root: str | Path, decoder: str) -> tuple[np.ndarray, np.ndarray]:
        return epoch(
            Loader(
                root,
                batch_size=5,
                image_size=SIZE,
                workers=2,
                seed=3,
                backend="thread",
                decoder=decoder,
            )
        )

    for decoder in ("pillow", "auto"):
        remote_images, remote_labels = load(memory_root, decoder)
        local_images, local_labels = load(local_root, decoder)
        assert np.array_equal(remote_labels, local_labels)
        assert np.array_equal(remote_images, local_images)


def test_decoders_read_urls_and_file_urls(local_root: Path, memory_root: str) -> None:
    options = DecodeOptions(image_size=SIZE)
    local = str(local_root / "circle" / "circle_0000.png")
    expected = decode_image(local, options)
    assert np.array_equal(decode_image(f"{memory_root}/circle/circle_0000.png", options), expected)
    assert np.array_equal(decode_image(f"file://{local}", options), expected)
    remote = FileList([f"{memory_root}/circle/circle_0000.png"], [0])
    assert np.array_equal(remote[0][0], FileList([local], [0])[0][0])


def test_a_missing_object_raises_naming_its_url_or_is_a_counted_skip(memory_root: str) -> None:
    good = f"{memory_root}/square/square_0000.jpg"
    missing = f"{memory_root}/square/gone.jpg"
    files = FileList([good, missing, good, good], [0, 0, 0, 0])
    with pytest.raises(FileNotFoundError, match=missing):
        epoch(Loader(files, batch_size=2, image_size=SIZE, workers=2, backend="thread"))
    loader = Loader(
        files, batch_size=2, image_size=SIZE, workers=2, backend="thread", on_error="skip"
    )
    images, _ = epoch(loader)
    assert len(images) == 3
    assert loader.stats().skipped == 1
    assert loader.stats().skipped_paths == (missing,)


def test_a_protocol_without_its_package_names_the_package_to_install() -> None:
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed")
    with pytest.raises(ImportError, match="pip install gcsfs"):
        storage.read_bytes("gs://bucket/train/cat/a.jpg")
    with pytest.raises(ImportError, match="gcsfs"):
        ImageFolder("gs://bucket/train")


# --- HTTP (prefetch.testing.serve_folder) --------------------------------------------------------


def test_an_http_folder_lists_like_the_local_one_and_loads_the_same_pixels(
    local_root: Path,
) -> None:
    with serve_folder(local_root.parent) as base:
        url = base + "train/"
        remote = ImageFolder(url)
        local = ImageFolder(local_root)
        assert remote.class_names == local.class_names
        assert relative(remote.paths.tolist(), url) == relative(
            local.paths.tolist(), str(local_root)
        )
        for backend in ("thread", "process"):
            remote_epoch = epoch(
                Loader(remote, batch_size=5, image_size=SIZE, workers=2, seed=1, backend=backend)
            )
            local_epoch = epoch(
                Loader(local, batch_size=5, image_size=SIZE, workers=2, seed=1, backend=backend)
            )
            assert np.array_equal(remote_epoch[0], local_epoch[0]), backend
            assert np.array_equal(remote_epoch[1], local_epoch[1]), backend


def test_http_reads_retry_500s_and_name_the_url_of_a_dropped_or_missing_object(
    local_root: Path,
) -> None:
    name = "train/square/square_0000.jpg"
    expected = (local_root / "square" / "square_0000.jpg").read_bytes()
    with serve_folder(local_root.parent, fail_first=2, drop_paths=[name]) as base:
        other = base + "train/circle/circle_0000.png"
        assert storage.read_bytes(other) == (local_root / "circle" / "circle_0000.png").read_bytes()
        with pytest.raises(OSError, match="after 2 attempts"):
            storage.read_bytes(base + "train/circle/circle_0001.png", retries=1)
        with pytest.raises(OSError, match=f"cannot read '{base + name}' after 4 attempts"):
            storage.read_bytes(base + name)
        with pytest.raises(FileNotFoundError, match=base + "train/square/gone.jpg"):
            storage.read_bytes(base + "train/square/gone.jpg")
    with serve_folder(local_root.parent, fail_first=1) as base:
        assert storage.read_bytes(base + name) == expected


def test_an_http_read_slower_than_its_timeout_is_a_timeout_error_naming_the_url(
    local_root: Path,
) -> None:
    with serve_folder(local_root.parent, latency_s=5.0) as base:
        url = base + "train/square/square_0000.jpg"
        with pytest.raises(TimeoutError, match=f"reading '{url}' timed out after 2 attempts"):
            storage.read_bytes(url, timeout_s=0.2, retries=1)


def test_the_keras_drop_in_reads_a_memory_folder_like_the_local_one(
    local_root: Path, memory_root: str
) -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    def load(root: str) -> tuple[list[str], list[np.ndarray], list[np.ndarray]]:
        dataset = prefetch.tf.image_dataset_from_directory(
            root, image_size=SIZE, batch_size=4, seed=2, verbose=False, backend="thread"
        )
        with dataset.loader:
            batches = [(x.numpy(), y.numpy()) for x, y in dataset]
        return dataset.file_paths, [b[0] for b in batches], [b[1] for b in batches]

    remote_paths, remote_images, remote_labels = load(memory_root)
    local_paths, local_images, local_labels = load(str(local_root))
    assert relative(remote_paths, memory_root) == relative(local_paths, str(local_root))
    assert np.array_equal(np.concatenate(remote_labels), np.concatenate(local_labels))
    assert np.array_equal(np.concatenate(remote_images), np.concatenate(local_images))


def test_auto_keeps_threads_for_memory_files_that_workers_could_not_see(memory_root: str) -> None:
    """A Python transform would pick processes, but memory:// exists in this process only."""
    loader = Loader(
        memory_root,
        batch_size=5,
        image_size=SIZE,
        workers=2,
        augment=Augment(transform=slow_python_transform),
    )
    with loader:
        assert len(list(loader)) == len(loader)
    assert loader.backend_name == "thread"
    assert "memory://" in loader.backend_reason


def slow_python_transform(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Holds the GIL for a while (pure Python), so backend="auto" would want processes."""
    total = 0
    for value in range(20_000):
        total += value
    return image


def test_process_workers_read_urls_with_several_threads_each_by_default(local_root: Path) -> None:
    with serve_folder(local_root.parent) as base:
        remote = ImageFolder(base + "train/")
        loader = Loader(remote, batch_size=5, image_size=SIZE, workers=1, backend="process")
        with loader:
            assert len(list(loader)) == len(loader)
            backend = loader._epochs.workers.backend
            assert backend is not None
            assert backend.threads_per_worker == 5  # type: ignore[attr-defined]  # one per row
    local = Loader(local_root, batch_size=5, image_size=SIZE, workers=1, backend="process")
    with local:
        backend = local._epochs.workers.backend
        assert backend is not None and backend.threads_per_worker == 1  # type: ignore[attr-defined]


def test_default_workers_on_remote_urls_are_tuned_and_start_above_one_per_core(
    local_root: Path, memory_root: str
) -> None:
    many = REMOTE_READER_THREADS * usable_cores()
    with serve_folder(local_root.parent) as base:
        loader = Loader(base + "train/", batch_size=2, image_size=SIZE, backend="thread", seed=2)
        assert loader.autotune  # workers=None on a remote store: tuned like "auto"
        with loader:
            stream = iter(loader)
            next(stream)  # no tuning window has closed yet: the starting count
            assert loader.workers == many
            assert loader._epochs.workers.in_flight() == many  # two rows per worker, 2 rows a batch
            stats = loader.stats()  # the ready batches are counted out of the whole window
            assert stats.in_flight == many and f"of the {many} in flight were ready" in str(stats)
            stream.close()
        fixed = Loader(base + "train/", batch_size=2, image_size=SIZE, workers=2, seed=2)
        assert not fixed.autotune
        processes = Loader(base + "train/", batch_size=2, image_size=SIZE, seed=2)
        with processes:
            stream = iter(processes)
            next(stream)
            assert processes.backend_name == "process"
            assert processes.workers == REMOTE_PROCESSES_PER_CORE * usable_cores()
            stream.close()
    for local in (local_root, memory_root):  # local disk, and memory:// which waits on nothing
        loader = Loader(local, batch_size=2, image_size=SIZE, backend="thread", seed=2)
        assert not loader.autotune
        with loader:
            next(iter(loader))
            assert loader.workers == usable_cores() and loader._epochs.workers.in_flight() == 2


@pytest.mark.timeout(120)  # one spawned worker, its replacement, and a 2 s sample limit
def test_a_stuck_remote_read_is_bounded_by_the_sample_timeout_and_skipped(local_root: Path) -> None:
    # the object answers after 60 s: longer than the read timeout's retries would take to give
    # up, so only the Loader's per-sample limit ends it; the worker is replaced, the rest read
    stuck = "train/circle/circle_0001.png"
    with serve_folder(local_root.parent, slow_paths={stuck: 60.0}) as base:
        loader = Loader(
            base + "train/",
            batch_size=4,
            image_size=SIZE,
            workers=1,
            backend="process",
            on_error=ErrorPolicy("skip", sample_timeout_s=2.0),
            seed=3,
        )
        labels = np.concatenate([b.labels for b in loader])
        stats = loader.stats()
    assert list(stats.skipped_paths) == [base + stuck]
    assert len(labels) == len(loader.source) - 1
    with serve_folder(local_root.parent, slow_paths={stuck: 60.0}) as base:
        loader = Loader(
            base + "train/",
            image_size=SIZE,
            backend="thread",
            on_error=ErrorPolicy(sample_timeout_s=2.0),
        )
        with pytest.raises(prefetch.SampleTimeoutError, match=stuck):
            list(loader)


def test_an_http_listing_retries_each_folder_page_on_its_own(local_root: Path) -> None:
    # every page (root, 3 classes, a nested folder) answers 500 twice: 3 retries per page pass,
    # where retrying the whole listing 3 times would not
    with serve_folder(local_root.parent, fail_first=2) as base:
        remote = ImageFolder(base + "train/")
        local = ImageFolder(local_root)
        assert remote.class_names == local.class_names
        assert relative(remote.paths.tolist(), base + "train/") == relative(
            local.paths.tolist(), str(local_root)
        )
    with serve_folder(local_root.parent, fail_first=9) as base, pytest.raises(OSError) as raised:
        ImageFolder(base + "train/")
    assert f"cannot read '{base}train" in str(raised.value) and "after 4 attempts" in str(
        raised.value
    )


def test_auto_reads_remote_urls_with_processes_unless_a_part_cannot_be_pickled(
    local_root: Path,
) -> None:
    with serve_folder(local_root.parent) as base:
        loader = Loader(base + "train/", batch_size=5, image_size=SIZE, seed=1)
        remote = epoch(loader)
        assert loader.backend_name == "process"
        assert "files are decoded in worker processes" in loader.stats().backend_reason
        local = epoch(Loader(local_root, batch_size=5, image_size=SIZE, seed=1))
        assert np.array_equal(remote[0], local[0]) and np.array_equal(remote[1], local[1])
        kept = Loader(
            base + "train/",
            batch_size=5,
            image_size=SIZE,
            augment=Augment(transform=lambda i, r: i),
        )
        epoch(kept)
        assert kept.backend_name == "thread"
        assert "cannot be pickled" in kept.stats().backend_reason
        fixed = Loader(base + "train/", batch_size=5, image_size=SIZE, workers=4)
        epoch(fixed)  # a count sized for threads: not 4 processes of a reader per row
        assert fixed.backend_name == "thread" and fixed.workers == 4


def test_the_keras_drop_in_splits_a_remote_folder_as_the_local_one(
    local_root: Path, memory_root: str
) -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    def split(root: str) -> list[list[str]]:
        train, validation = prefetch.tf.image_dataset_from_directory(
            root,
            image_size=SIZE,
            batch_size=4,
            seed=7,
            validation_split=0.3,
            subset="both",
            verbose=False,
            backend="thread",
        )
        return [relative(train.file_paths, root), relative(validation.file_paths, root)]

    remote, local = split(memory_root), split(str(local_root))
    assert remote == local and len(remote[1]) > 0
