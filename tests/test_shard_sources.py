"""TFRecordSource and TarSource: shards written by `write_shards` from real JPEG/PNG files, read
back by a real Loader (threads and processes), locally and streamed from a loopback server.

Every image of the class folder has content of its own (noise around a base colour given by its
number), so a decoded sample tells which file it came from (`Identify`). The reference is
`Loader(ImageFolder(folder))` over the same files: the writer keeps the folder's listing order
with `shuffle=False`, so sample `i` of the shards is file `i` of the folder.
"""

from __future__ import annotations

import gc
import glob
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.cli import main
from prefetch.io._records import frame_record
from prefetch.sources._folders import ImageFolder
from prefetch.sources.shards import _index as shard_index
from prefetch.sources.shards import _remote_index as remote_index
from prefetch.sources.shards._index import INDEX_SUFFIX, index_folder
from prefetch.sources.shards._tar import tar_header, tar_padding
from prefetch.sources.shards._tfrecord import encode_example
from prefetch.testing import serve_folder
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.usefixtures("fsspec_io_thread", "private_cache")

CLASSES = ("cat", "dog", "emu")
PER_CLASS = 8  # 24 images: shards of 5 are 5, 5, 5, 5 and 4 samples
COUNT = len(CLASSES) * PER_CLASS
SHARD_SIZE = 5
SIZE = 8  # the loaders' image_size
FORMATS = ("tar", "tfrecord")
SOURCES = {"tar": prefetch.TarSource, "tfrecord": prefetch.TFRecordSource}
PATTERNS = {"tar": "shard-*.tar", "tfrecord": "shard-*-of-*.tfrecord"}
Batches = list[tuple[np.ndarray, np.ndarray]]


# ---------------------------------------------------------------- fixtures and helpers


def write_images(root: Path) -> Path:
    """`root/<class>/img_NN.<ext>`: 24 real images, JPEG and PNG, of a few sizes; image n is
    noise around a base colour of its own."""
    rng = np.random.default_rng(3)
    number = 0
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for _ in range(PER_CLASS):
            width, height = 24 + 3 * (number % 4), 20 + 2 * (number % 3)
            base = np.array([number * 10, 250 - number * 10, (number * 67) % 256], np.int16)
            noise = rng.integers(-20, 21, (height, width, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            extension, kind = (".png", "PNG") if number % 3 == 0 else (".jpg", "JPEG")
            Image.fromarray(pixels).save(root / name / f"img_{number:02d}{extension}", kind)
            number += 1
    return root


def write(folder: Path, out: Path, format: str, **options: object) -> list[str]:
    """The shards of `folder` in `out`, in the folder's order unless `options` say otherwise."""
    options = {"shard_size": SHARD_SIZE, "shuffle": False, **options}
    return write_shards(folder, out, format=format, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def written(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Shard folders of both formats, written once, in the folder's order (not to be changed:
    tests that change shards write their own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFETCH_CACHE_DIR", str(tmp_path_factory.mktemp("module-cache")))
        found = {}
        for format in FORMATS:
            out = tmp_path_factory.mktemp(f"shards-{format}")
            write(folder, out, format)
            found[format] = out
    return found


def loader(source: object, **options: object) -> prefetch.Loader:
    """A small Loader: 8x8 images, batches of 4, two thread workers; `num_shards` and
    `shard_index` are given to `Loader.shard`, `crop`, `flip` to its `Augment`, `cache_dir` to
    its `RemoteOptions`."""
    hosts = options.pop("num_shards", 1), options.pop("shard_index", 0)
    augment = {key: options.pop(key) for key in ("crop", "flip") if key in options}
    if augment:
        options["augment"] = prefetch.Augment(**augment)  # type: ignore[arg-type]
    if "cache_dir" in options:
        options["remote"] = prefetch.RemoteOptions(cache_dir=options.pop("cache_dir"))  # type: ignore[arg-type]
    settings: dict[str, object] = {
        "batch_size": 4,
        "image_size": SIZE,
        "workers": 2,
        "backend": "thread",
        **options,
    }
    made = prefetch.Loader(source, **settings)  # type: ignore[arg-type]
    made.shard(*hosts)  # type: ignore[arg-type]
    return made


def epochs(made: prefetch.Loader, count: int = 1) -> list[Batches]:
    """`count` epochs of `made` (which they close), each a list of (images, labels)."""
    with made:
        return [[(batch.images, batch.labels) for batch in made] for _ in range(count)]


@pytest.fixture(scope="module")
def reference(folder: Path) -> Batches:
    """The folder read in order, one sample per batch: sample i is file i."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFETCH_CACHE_DIR", str(folder.parent / "reference-cache"))
        return epochs(loader(ImageFolder(folder), batch_size=1, shuffle=False))[0]


class Identify:
    """Which file of the folder a decoded 8x8 sample is (its pixels are unique)."""

    def __init__(self, reference: Batches) -> None:
        self.numbers = {images[0].tobytes(): n for n, (images, _) in enumerate(reference)}
        assert len(self.numbers) == COUNT, "the test images must decode to distinct pixels"

    def __call__(self, batches: Batches) -> list[int]:
        return [self.numbers[image.tobytes()] for images, _ in batches for image in images]


@pytest.fixture(scope="module")
def identify(reference: Batches) -> Identify:
    return Identify(reference)


def assert_same(got: Batches, expected: Batches) -> None:
    assert len(got) == len(expected), f"{len(got)} batches, expected {len(expected)}"
    for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def sidecars(out: Path) -> list[Path]:
    return sorted(out.glob("*" + INDEX_SUFFIX))


def kept(cache: Path) -> list[str]:
    """The index files kept in the index folder."""
    folder = cache / "shard-index"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


@pytest.fixture
def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The shards `build_index` indexes from now on (it is the only place an index is built)."""
    built: list[str] = []
    real = shard_index.build_index

    def counting(path: str, spec: shard_index.IndexSpec) -> shard_index.ShardIndex:
        built.append(path)
        return real(path, spec)

    monkeypatch.setattr(shard_index, "build_index", counting)
    return built


@pytest.fixture
def served(written: dict[str, Path], tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A private copy of both shard folders (`tar/`, `tfrecord/`), indexes removed, served
    over loopback HTTP with 20 ms per request: (the local root, its base URL)."""
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    root = tmp_path / "served"
    for format, out in written.items():
        shutil.copytree(out, root / format)
        for index in sidecars(root / format):
            index.unlink()
    with serve_folder(root, latency_s=0.02) as url:
        yield root, url


# ---------------------------------------------------------------- 1. round trip


@pytest.mark.parametrize("backend", ["thread", "process"])
@pytest.mark.parametrize("format", FORMATS)
def test_shards_read_back_the_same_images_and_labels_as_the_folder(
    folder: Path, written: dict[str, Path], reference: Batches, format: str, backend: str
) -> None:
    source = SOURCES[format](written[format])
    assert len(source) == COUNT and len(source.shards) == 5 and not source.streaming
    assert source.class_names == list(CLASSES)
    shards = epochs(loader(source, shuffle=False, backend=backend, batch_size=5))[0]
    folder_batches = epochs(loader(ImageFolder(folder), shuffle=False, batch_size=5))[0]
    assert_same(shards, folder_batches)
    # and sample by sample, as the reference read them
    flat = [(images[i : i + 1], labels[i : i + 1]) for images, labels in shards for i in range(5)]
    assert_same(flat[:COUNT], reference)


@pytest.mark.parametrize("format", FORMATS)
def test_a_shuffled_write_stores_the_files_in_the_writers_permutation(
    folder: Path, tmp_path: Path, reference: Batches, identify: Identify, format: str
) -> None:
    write(folder, tmp_path / "out", format, shuffle=True, seed=4, shard_size=7)
    source = SOURCES[format](str(tmp_path / "out" / PATTERNS[format]))
    assert len(source.shards) == 4
    got = epochs(loader(source, shuffle=False, batch_size=1))[0]
    order = np.random.default_rng(4).permutation(COUNT).tolist()
    assert identify(got) == order
    assert [int(labels[0]) for _, labels in got] == [int(reference[n][1][0]) for n in order]


def test_class_names_come_from_the_manifest_else_classes_txt_beside_the_shards(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    write(folder, out, "tar")
    assert prefetch.TarSource(out).class_names == list(CLASSES)
    (out / "classes.txt").write_text("lion\ntiger\nbear\n")
    with pytest.raises(ValueError, match="one of them was edited") as raised:
        prefetch.TarSource(out)  # the two disagree: refused, naming both
    assert "classes.txt" in str(raised.value) and "shard-tar.manifest.json" in str(raised.value)
    (out / "shard-tar.manifest.json").unlink()
    assert prefetch.TarSource(out).class_names == ["lion", "tiger", "bear"]
    with loader(prefetch.TarSource(out), shuffle=False) as made:
        assert made.class_names == ["lion", "tiger", "bear"]
    (out / "classes.txt").unlink()
    assert prefetch.TarSource(out).class_names == ["0", "1", "2"]
    assert prefetch.TarSource(out, class_names=list("abc")).class_names == ["a", "b", "c"]


# ---------------------------------------------------------------- 2. shuffled epochs


@pytest.mark.parametrize("format", FORMATS)
def test_shuffled_epochs_of_local_shards_are_exact_permutations(
    written: dict[str, Path], identify: Identify, format: str
) -> None:
    source = SOURCES[format](written[format])
    first, second = (identify(batches) for batches in epochs(loader(source, seed=9), 2))
    assert sorted(first) == list(range(COUNT)) and sorted(second) == list(range(COUNT))
    assert first != second and first != list(range(COUNT))
    for workers, backend in ((1, "thread"), (3, "thread"), (2, "process")):
        again = epochs(loader(source, seed=9, workers=workers, backend=backend), 2)
        assert [identify(batches) for batches in again] == [first, second], (workers, backend)
    assert identify(epochs(loader(source, seed=10))[0]) != first


# ---------------------------------------------------------------- 3. crops and flips


CROPPED = {"crop": prefetch.RandomResizedCrop(), "flip": True, "seed": 5, "batch_size": 6}


def by_index(made: prefetch.Loader, batches: list[Batches]) -> list[dict[int, np.ndarray]]:
    """Each epoch's images by source index (`made`'s batch_indices say which is which)."""
    return [
        {
            int(index): image
            for indices, (images, _) in zip(made.batch_indices(epoch), found, strict=True)
            for index, image in zip(indices, images, strict=True)
        }
        for epoch, found in enumerate(batches)
    ]


@pytest.fixture(scope="module")
def cropped_folder(folder: Path) -> list[dict[int, np.ndarray]]:
    """Two epochs of the folder with random crops and flips, by source index."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFETCH_CACHE_DIR", str(folder.parent / "cropped-cache"))
        made = loader(ImageFolder(folder), **CROPPED)
        return by_index(made, epochs(made, 2))


@pytest.mark.parametrize("format", FORMATS)
def test_random_crops_and_flips_of_shards_equal_those_of_the_folder(
    folder: Path, written: dict[str, Path], format: str
) -> None:
    want = epochs(loader(ImageFolder(folder), **CROPPED), 2)
    got = epochs(loader(SOURCES[format](written[format]), **CROPPED), 2)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


def test_the_crops_are_real_and_new_every_epoch(
    reference: Batches, cropped_folder: list[dict[int, np.ndarray]]
) -> None:
    first, second = cropped_folder
    whole = [images[0] for images, _ in reference]
    assert sum(not np.array_equal(first[n], whole[n]) for n in range(COUNT)) > COUNT // 2
    assert sum(not np.array_equal(first[n], second[n]) for n in range(COUNT)) > COUNT // 2


def test_a_streamed_epoch_crops_each_sample_as_the_folder_does(
    written: dict[str, Path], cropped_folder: list[dict[int, np.ndarray]]
) -> None:
    source = prefetch.TarSource(written["tar"], streaming=True, shuffle_buffer=6)
    streamed = loader(source, **CROPPED)
    got = by_index(streamed, epochs(streamed, 2))
    for epoch in range(2):
        assert sorted(got[epoch]) == list(range(COUNT))
        for index, image in got[epoch].items():
            np.testing.assert_array_equal(image, cropped_folder[epoch][index])


# ---------------------------------------------------------------- 4. resume


def resume_matches(
    source: object, identify: Identify, resumed_backend: str = "thread", **options: object
) -> None:
    """Two batches into epoch 1, a state; a new Loader (on `resumed_backend`) from it gives
    the rest of that epoch and the next one, as an uninterrupted run does."""
    options = {"seed": 21, **options}
    uninterrupted = epochs(loader(source, **options), 3)
    first = loader(source, **options)
    with first:
        list(first)
        stream = iter(first)
        taken = [next(stream), next(stream)]
        state = first.state_dict()
        del stream
    assert state.items() >= {"seed": 21, "epoch": 1, "position": 2}.items()
    assert_same([(b.images, b.labels) for b in taken], uninterrupted[1][:2])
    resumed = loader(source, **{**options, "seed": 0, "backend": resumed_backend})
    resumed.load_state_dict(state)
    rest, following = epochs(resumed, 2)
    assert_same(rest, uninterrupted[1][2:])
    assert_same(following, uninterrupted[2])
    assert sorted(identify(uninterrupted[1])) == list(range(COUNT))


@pytest.mark.parametrize("format", FORMATS)
def test_resuming_local_shards_mid_epoch_gives_the_remaining_batches(
    written: dict[str, Path], identify: Identify, format: str
) -> None:
    resume_matches(SOURCES[format](written[format]), identify)


@pytest.mark.parametrize("format", FORMATS)
def test_resuming_streamed_remote_shards_mid_epoch_gives_the_remaining_batches(
    served: tuple[Path, str], identify: Identify, format: str
) -> None:
    _, url = served
    source = SOURCES[format](f"{url}{format}/{PATTERNS[format]}", shuffle_buffer=8)
    assert source.streaming
    resume_matches(source, identify)


def test_resuming_streamed_remote_shards_in_worker_processes_continues_a_thread_run(
    served: tuple[Path, str], identify: Identify
) -> None:
    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=8)
    resume_matches(source, identify, resumed_backend="process")


# ---------------------------------------------------------------- 5. num_shards


@pytest.mark.parametrize("format", FORMATS)
def test_two_hosts_of_local_shards_are_disjoint_and_cover_every_epoch(
    written: dict[str, Path], identify: Identify, format: str
) -> None:
    source = SOURCES[format](written[format])
    hosts = [
        [identify(b) for b in epochs(loader(source, seed=2, num_shards=2, shard_index=h), 2)]
        for h in range(2)
    ]
    for epoch in range(2):
        zero, one = hosts[0][epoch], hosts[1][epoch]
        assert len(zero) == len(one) == COUNT // 2
        assert not set(zero) & set(one)
        assert sorted(zero + one) == list(range(COUNT))
    assert hosts[0][0] != hosts[0][1]


def assert_streamed_hosts(source: prefetch.TarSource, identify: Identify) -> None:
    """Each of two hosts reads whole shard files (file f on host f % 2), the same number of
    batches, no sample twice; together a subset of the dataset."""
    starts = source.shard_starts
    hosts = []
    for host in range(2):
        made = loader(source, seed=2, num_shards=2, shard_index=host)
        assert made._epochs.spool is not None
        batches = epochs(made)[0]
        assert len(batches) == len(made)
        numbers = identify(batches)
        assert np.concatenate(made.batch_indices(0)).tolist() == numbers
        shards = {int(np.searchsorted(starts, n, side="right") - 1) for n in numbers}
        assert shards <= set(range(host, len(source.shards), 2)), (host, shards)
        hosts.append((len(batches), numbers))
    (count_zero, zero), (count_one, one) = hosts
    assert count_zero == count_one
    # host 0 has files 0, 2, 4 (14 samples), host 1 files 1, 3 (10): both read 10
    assert len(zero) == len(one) == 10
    assert len(set(zero)) == len(zero) and len(set(one)) == len(one)
    assert not set(zero) & set(one)
    assert set(zero) | set(one) <= set(range(COUNT))


def test_two_hosts_of_streamed_remote_shards_take_whole_files(
    served: tuple[Path, str], identify: Identify
) -> None:
    _, url = served
    assert_streamed_hosts(prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=8), identify)


def test_two_hosts_of_local_shards_streamed_take_whole_files(
    written: dict[str, Path], identify: Identify
) -> None:
    source = prefetch.TarSource(written["tar"], streaming=True, shuffle_buffer=8)
    assert_streamed_hosts(source, identify)


def test_streaming_local_shards_gives_exact_once_epochs_through_the_buffer(
    written: dict[str, Path], identify: Identify
) -> None:
    source = prefetch.TFRecordSource(written["tfrecord"], streaming=True, shuffle_buffer=6)
    made = loader(source, seed=8)
    first, second = (identify(b) for b in epochs(made, 2))
    assert sorted(first) == sorted(second) == list(range(COUNT))
    assert first != second


def test_streaming_local_shards_reads_them_where_they_lie(written: dict[str, Path]) -> None:
    """A local shard is not copied into the spool: the workers read the original."""
    source = prefetch.TarSource(written["tar"], streaming=True, shuffle_buffer=6)
    made = loader(source, seed=8)
    with made:
        assert len(list(made)) == len(made)
        fetched = made._epochs.spool.fetched if made._epochs.spool is not None else 0
        copies = os.listdir(made._epochs.spool.folder) if made._epochs.spool is not None else []
    assert fetched == 0 and copies == []


# ---------------------------------------------------------------- 6. corrupt data


@pytest.fixture
def damaged_tfrecord(folder: Path, tmp_path: Path) -> tuple[prefetch.TFRecordSource, str, int]:
    """TFRecord shards with one byte of sample 7's image flipped: (source, shard, offset of
    the record)."""
    out = tmp_path / "out"
    write(folder, out, "tfrecord")
    source = prefetch.TFRecordSource(out)
    member = source.member(7)
    with open(member.shard, "r+b") as file:
        where = member.offset + 12 + member.start + member.size // 2
        file.seek(where)
        byte = file.read(1)
        file.seek(where)
        file.write(bytes([byte[0] ^ 0xFF]))
    return prefetch.TFRecordSource(out), member.shard, member.offset


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_flipped_byte_in_a_tfrecord_raises_corrupt_shard_naming_shard_and_offset(
    damaged_tfrecord: tuple[prefetch.TFRecordSource, str, int], backend: str
) -> None:
    source, shard, offset = damaged_tfrecord
    assert source.member(7).offset == offset  # indexing does not read the image bytes
    with pytest.raises(Exception) as raised, loader(source, shuffle=False, backend=backend) as made:
        list(made)
    error = raised.value
    corrupt = error if isinstance(error, prefetch.CorruptShardError) else error.__cause__
    assert isinstance(corrupt, prefetch.CorruptShardError), repr(error)
    assert shard in str(corrupt) and f"offset {offset}" in str(corrupt)
    assert (corrupt.path, corrupt.offset) == (shard, offset)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_corrupt_record_is_skipped_and_counted_with_on_error_skip(
    damaged_tfrecord: tuple[prefetch.TFRecordSource, str, int],
    identify: Identify,
    backend: str,
) -> None:
    source, shard, offset = damaged_tfrecord
    made = loader(source, shuffle=False, backend=backend, on_error="skip")
    with made:
        got = [(b.images, b.labels) for b in made]
        stats = made.stats()
    assert identify(got) == [n for n in range(COUNT) if n != 7]
    assert stats.skipped == 1
    assert stats.skipped_paths == (source.paths[7],)
    assert f"{shard} (record at byte {offset})" == stats.skipped_paths[0]


def test_a_corrupt_record_of_a_streamed_remote_shard_is_skipped_or_raised(
    damaged_tfrecord: tuple[prefetch.TFRecordSource, str, int], identify: Identify
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    _, shard, offset = damaged_tfrecord
    with serve_folder(os.path.dirname(shard), latency_s=0.02) as url:
        source = prefetch.TFRecordSource(f"{url}{PATTERNS['tfrecord']}", shuffle_buffer=8)
        url_shard = f"{url}{os.path.basename(shard)}"
        skipping = loader(source, seed=4, on_error="skip")
        with skipping:
            got = identify([(b.images, b.labels) for b in skipping])
            stats = skipping.stats()
        assert sorted(got) == [n for n in range(COUNT) if n != 7]
        assert stats.skipped == 1 and stats.skipped_paths[0].startswith(
            f"{url_shard} (record at byte"
        )
        with pytest.raises(prefetch.CorruptShardError) as raised, loader(source, seed=4) as made:
            list(made)
    error = raised.value
    assert error.offset == offset
    told = "\n".join([str(error), *getattr(error, "__notes__", [])])
    assert url_shard in told and f"offset {offset}" in told


def test_a_corrupt_record_of_a_streamed_remote_shard_names_its_url(
    damaged_tfrecord: tuple[prefetch.TFRecordSource, str, int],
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    _, shard, offset = damaged_tfrecord
    with serve_folder(os.path.dirname(shard)) as url:
        source = prefetch.TFRecordSource(f"{url}{PATTERNS['tfrecord']}", shuffle_buffer=8)
        with pytest.raises(prefetch.CorruptShardError) as raised, loader(source, seed=4) as made:
            list(made)
    url_shard = f"{url}{os.path.basename(shard)}"
    assert raised.value.path == url_shard
    assert f"corrupt shard {url_shard} at offset {offset}" in str(raised.value)


def write_tar(path: Path, samples: int, size: int = 700) -> None:
    """A tar shard of `samples` samples, each a `size`-byte .jpg member and a .cls member."""
    with open(path, "wb") as file:
        for key in range(samples):
            for name, data in ((f"{key:03d}.jpg", b"x" * size), (f"{key:03d}.cls", b"1")):
                file.write(tar_header(name, len(data)) + data + tar_padding(len(data)))
        file.write(b"\0" * 1024)


@pytest.mark.parametrize(
    "cut, at",
    [
        (2560 + 512 + 300, 2560),  # inside sample 1's image data: its header is at 2560
        (2560 + 300, 2560),  # inside sample 1's image header
    ],
    ids=["in-member-data", "in-header"],
)
def test_a_truncated_tar_shard_is_refused_naming_the_file_and_offset(
    tmp_path: Path, cut: int, at: int
) -> None:
    write_tar(tmp_path / "good.tar", 3)
    write_tar(tmp_path / "cut.tar", 3)
    os.truncate(tmp_path / "cut.tar", cut)
    with pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TarSource(str(tmp_path / "*.tar"))
    message = str(raised.value)
    assert str(tmp_path / "cut.tar") in message and f"offset {at}" in message, message
    assert raised.value.offset == at


def test_a_truncated_tfrecord_shard_is_refused_naming_the_file_and_offset(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shard = write(folder, out, "tfrecord", shard_size=COUNT)[0]
    for index in sidecars(out):
        index.unlink()
    last = prefetch.TFRecordSource(out).member(COUNT - 1).offset
    for index in sidecars(out):
        index.unlink()
    os.truncate(shard, last + 20)
    with pytest.raises(ValueError, match=f"is {last + 20} bytes but .* says"):
        prefetch.TFRecordSource(out)  # the manifest's size is compared before it is read
    (out / "shard-tfrecord.manifest.json").unlink()
    with pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TFRecordSource(out)
    assert shard in str(raised.value) and f"offset {last}" in str(raised.value)


def write_examples(path: Path, features: dict[str, object], count: int = 2) -> None:
    with open(path, "wb") as file:
        for _ in range(count):
            file.write(frame_record(encode_example(features)))  # type: ignore[arg-type]


def test_a_record_read_with_its_own_keys_loads(folder: Path, tmp_path: Path) -> None:
    image = next((folder / "cat").glob("*.png")).read_bytes()
    write_examples(tmp_path / "a.tfrecord", {"img": image, "lbl": 1})
    source = prefetch.TFRecordSource(tmp_path, image_key="img", label_key="lbl")
    assert len(source) == 2 and source.labels.tolist() == [1, 1]
    with loader(source, label_mode=None, shuffle=False, batch_size=2) as made:
        assert next(iter(made)).images.shape == (2, SIZE, SIZE, 3)
    assert not prefetch.TFRecordSource(tmp_path, image_key="img").has_labels


@pytest.mark.parametrize(
    "options, features, named",
    [
        ({}, {"img": b"\x89PNG", "lbl": 1}, "'image/encoded'"),
        ({"image_key": "photo"}, {"img": b"\x89PNG", "lbl": 1}, "'photo'"),
        ({"image_key": "img", "label_key": "label"}, {"img": b"\x89PNG", "lbl": 1}, "'label'"),
    ],
    ids=["default-image-key", "named-image-key", "named-label-key"],
)
def test_a_record_without_the_key_is_refused_naming_it_and_the_keys_present(
    tmp_path: Path, options: dict[str, str], features: dict[str, object], named: str
) -> None:
    write_examples(tmp_path / "a.tfrecord", features)
    with pytest.raises(ValueError) as raised:
        prefetch.TFRecordSource(tmp_path, **options)
    message = str(raised.value)
    assert named in message and "['img', 'lbl']" in message, message
    assert str(tmp_path / "a.tfrecord") in message and "byte 0" in message


def test_a_record_that_is_not_an_example_is_refused_naming_shard_and_offset(
    folder: Path, tmp_path: Path
) -> None:
    image = next((folder / "cat").glob("*.png")).read_bytes()
    good = frame_record(encode_example({"image/encoded": image, "image/class/label": 0}))
    with open(tmp_path / "a.tfrecord", "wb") as file:
        file.write(good + frame_record(b"\xff\xff\xff\xff"))
    with pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TFRecordSource(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / "a.tfrecord") in message and f"offset {len(good)}" in message, message
    assert raised.value.offset == len(good)


# ---------------------------------------------------------------- 7. the index


@pytest.fixture
def fresh(folder: Path, tmp_path: Path) -> Path:
    """Tar shards of the folder without index files, nor a manifest (these tests are of the
    index's own checks, which must hold for sets written by other tools)."""
    out = tmp_path / "fresh"
    write(folder, out, "tar")
    (out / "shard-tar.manifest.json").unlink()
    for index in sidecars(out):
        index.unlink()
    return out


def test_the_index_is_built_once_beside_the_shard_and_reused(
    fresh: Path, count_builds: list[str], private_cache: Path
) -> None:
    first = prefetch.TarSource(fresh)
    assert sorted(count_builds) == first.shards
    made = sidecars(fresh)
    assert [p.name for p in made] == [os.path.basename(s) + INDEX_SUFFIX for s in first.shards]
    mtimes = [p.stat().st_mtime_ns for p in made]
    count_builds.clear()
    second = prefetch.TarSource(fresh)
    assert count_builds == []
    assert [p.stat().st_mtime_ns for p in sidecars(fresh)] == mtimes
    assert second.paths.tolist() == first.paths.tolist()
    assert kept(private_cache) == []


def test_a_rewritten_shard_is_indexed_again(
    folder: Path, fresh: Path, count_builds: list[str], identify: Identify
) -> None:
    prefetch.TarSource(fresh)
    count_builds.clear()
    # shard 0 becomes a copy of the 4-sample shard 4: another size, other samples
    shutil.copy(fresh / "shard-000004.tar", fresh / "shard-000000.tar")
    source = prefetch.TarSource(fresh)
    assert count_builds == [str(fresh / "shard-000000.tar")]
    assert len(source) == COUNT - 1
    got = epochs(loader(source, shuffle=False))[0]
    assert identify(got) == [20, 21, 22, 23, *range(5, COUNT)]


def test_a_read_only_shard_folder_keeps_its_index_in_the_cache_dir(
    fresh: Path,
    count_builds: list[str],
    private_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    identify: Identify,
) -> None:
    if os.geteuid() == 0:
        # root writes into a 0o555 folder anyway; the library asks os.access, so tell it no
        real_access = os.access

        def access(path: object, mode: int, **kwargs: object) -> bool:
            if mode & os.W_OK and os.path.abspath(os.fspath(path)) == str(fresh):  # type: ignore[arg-type]
                return False
            return real_access(path, mode, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "access", access)
    fresh.chmod(0o555)
    try:
        source = prefetch.TarSource(fresh)
        assert sidecars(fresh) == []
        assert len(kept(private_cache)) == len(source.shards) == 5
        assert stat.S_IMODE(os.stat(index_folder()).st_mode) == 0o700
        count_builds.clear()
        again = prefetch.TarSource(fresh)
        assert count_builds == []
        assert identify(epochs(loader(again, shuffle=False))[0]) == list(range(COUNT))
    finally:
        fresh.chmod(0o755)


def test_an_index_file_that_is_a_symlink_is_not_followed(
    fresh: Path, tmp_path: Path, count_builds: list[str]
) -> None:
    prefetch.TarSource(fresh)  # the real indexes
    sidecar = fresh / ("shard-000000.tar" + INDEX_SUFFIX)
    # a link to a valid index of another shard (same format and spec): followed, it would lie
    target = tmp_path / "elsewhere.npz"
    shutil.copy(fresh / ("shard-000004.tar" + INDEX_SUFFIX), target)
    before = target.read_bytes()
    sidecar.unlink()
    sidecar.symlink_to(target)
    count_builds.clear()
    source = prefetch.TarSource(fresh)
    assert count_builds == [str(fresh / "shard-000000.tar")]
    assert len(source) == COUNT
    assert not sidecar.is_symlink() and sidecar.is_file()  # replaced, not written through
    assert target.read_bytes() == before


def test_a_garbage_index_file_is_ignored_and_rebuilt(
    fresh: Path, count_builds: list[str], identify: Identify
) -> None:
    prefetch.TarSource(fresh)
    sidecar = fresh / ("shard-000002.tar" + INDEX_SUFFIX)
    sidecar.write_bytes(b"not an index at all")
    count_builds.clear()
    source = prefetch.TarSource(fresh)
    assert count_builds == [str(fresh / "shard-000002.tar")]
    assert np.load(sidecar)["offsets"].shape == (5,)
    assert identify(epochs(loader(source, shuffle=False))[0]) == list(range(COUNT))


@pytest.mark.parametrize("damage", ["empty", "truncated", "zip-magic"])
def test_a_damaged_index_file_is_ignored_and_rebuilt(
    fresh: Path, count_builds: list[str], damage: str
) -> None:
    prefetch.TarSource(fresh)
    sidecar = fresh / ("shard-000002.tar" + INDEX_SUFFIX)
    good = sidecar.read_bytes()
    damaged = {"empty": b"", "truncated": good[: len(good) // 2], "zip-magic": b"PK\x03\x04"}
    sidecar.write_bytes(damaged[damage])
    count_builds.clear()
    source = prefetch.TarSource(fresh)
    assert count_builds == [str(fresh / "shard-000002.tar")]
    assert len(source) == COUNT


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_an_index_file_owned_by_a_stranger_is_ignored(
    fresh: Path, tmp_path: Path, count_builds: list[str]
) -> None:
    prefetch.TarSource(fresh)
    sidecar = fresh / ("shard-000000.tar" + INDEX_SUFFIX)
    shutil.copy(fresh / ("shard-000004.tar" + INDEX_SUFFIX), sidecar)  # a lying index
    os.chown(sidecar, 4321, 4321)
    count_builds.clear()
    source = prefetch.TarSource(fresh)
    assert count_builds == [str(fresh / "shard-000000.tar")]
    assert len(source) == COUNT


# ---------------------------------------------------------------- 8. remote shards


@pytest.mark.parametrize("format", FORMATS)
def test_remote_shards_stream_every_sample_once_per_epoch(
    served: tuple[Path, str], identify: Identify, format: str
) -> None:
    _, url = served
    source = SOURCES[format](f"{url}{format}/{PATTERNS[format]}", shuffle_buffer=16)
    assert source.streaming and len(source.shards) == 5 and len(source) == COUNT
    assert all(shard.startswith(f"{url}{format}/shard-") for shard in source.shards)
    assert source.class_names == list(CLASSES)
    made = loader(source, seed=6)
    assert made._epochs.spool is not None
    first, second = (identify(b) for b in epochs(made, 2))
    assert sorted(first) == sorted(second) == list(range(COUNT))
    assert first != second


def test_remote_shards_without_an_index_are_indexed_by_downloading_them_once(
    served: tuple[Path, str], identify: Identify, private_cache: Path, downloads: list[str]
) -> None:
    root, url = served
    assert sidecars(root / "tfrecord") == []
    pattern = f"{url}tfrecord/{PATTERNS['tfrecord']}"
    source = prefetch.TFRecordSource(pattern, shuffle_buffer=16)
    assert sorted(downloads) == source.shards
    assert len(kept(private_cache)) == 5
    downloads.clear()
    again = prefetch.TFRecordSource(pattern, shuffle_buffer=16)
    assert downloads == []
    assert again.paths.tolist() == source.paths.tolist()
    assert sorted(identify(epochs(loader(again, seed=1))[0])) == list(range(COUNT))


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs the shard layer downloads whole (to index them) from now on: `download` where
    `prefetch.sources.shards._remote_index` calls it."""
    fetched: list[str] = []
    real = remote_index.download

    def counting(address: str, *args: object, **kwargs: object) -> int:
        fetched.append(address)
        return real(address, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(remote_index, "download", counting)
    return fetched


def test_remote_shards_with_index_files_beside_them_are_not_downloaded_to_index(
    written: dict[str, Path], downloads: list[str], private_cache: Path
) -> None:
    with serve_folder(written["tar"], latency_s=0.02) as url:
        source = prefetch.TarSource(f"{url}shard-*.tar")
        assert downloads == []
        assert len(kept(private_cache)) == 5
        assert source.paths.tolist() == [
            path.replace(str(written["tar"]) + "/", url)
            for path in prefetch.TarSource(written["tar"]).paths.tolist()
        ]


def test_streamed_shards_without_shuffle_come_in_order(
    served: tuple[Path, str], identify: Identify
) -> None:
    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=4)
    assert identify(epochs(loader(source, shuffle=False))[0]) == list(range(COUNT))


def test_more_hosts_than_streamed_shard_files_are_refused(served: tuple[Path, str]) -> None:
    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar")
    with pytest.raises(ValueError, match="whole files"):
        loader(source, seed=1, num_shards=6, shard_index=0)


def test_a_cache_dir_keeps_the_remote_shards_for_later_epochs_and_loaders(
    served: tuple[Path, str], tmp_path: Path, identify: Identify
) -> None:
    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=16)
    cache = tmp_path / "shard-cache"
    made = loader(source, seed=6, cache_dir=cache)
    with made:
        first = identify(list((b.images, b.labels) for b in made))
        assert made._epochs.spool.fetched == 5
        second = identify(list((b.images, b.labels) for b in made))
        assert made._epochs.spool.fetched == 5
    assert sorted(first) == sorted(second) == list(range(COUNT))
    copies = sorted(
        os.path.getsize(path) for path in glob.glob(str(cache / "**" / "*.shard"), recursive=True)
    )
    assert copies == sorted(index.size for index in source.indexes)
    later = loader(source, seed=7, cache_dir=cache)
    with later:
        assert sorted(identify(list((b.images, b.labels) for b in later))) == list(range(COUNT))
        assert later._epochs.spool.fetched == 0


def test_without_a_cache_dir_no_shard_copy_outlives_the_epoch(
    served: tuple[Path, str], identify: Identify
) -> None:
    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=16)
    made = loader(source, seed=6)
    with made:
        spool = made._epochs.spool.folder
        stream = iter(made)
        taken = [next(stream)]
        assert glob.glob(os.path.join(spool, "*.shard")), "a shard is copied while in use"
        taken += list(stream)
        del stream
        assert made._epochs.spool.fetched == 5
        assert os.listdir(spool) == []
        assert sorted(identify([(b.images, b.labels) for b in taken])) == list(range(COUNT))
    del made
    gc.collect()
    assert not os.path.exists(spool)


def test_a_remote_shard_changed_since_indexing_is_refused_naming_it(
    served: tuple[Path, str],
) -> None:
    root, url = served
    prefetch.TarSource(f"{url}tar/shard-*.tar")  # indexes kept for these URLs
    shutil.copy(root / "tar" / "shard-000004.tar", root / "tar" / "shard-000001.tar")
    source = prefetch.TarSource(f"{url}tar/shard-*.tar")
    with pytest.raises(OSError, match="has changed") as raised:
        list(loader(source, seed=1, shuffle=False))  # the stream closes the loader
    assert f"{url}tar/shard-000001.tar" in str(raised.value)


def test_a_failed_fetch_in_enter_leaves_no_fetch_thread_running(
    served: tuple[Path, str],
) -> None:
    root, url = served
    prefetch.TarSource(f"{url}tar/shard-*.tar")
    shutil.copy(root / "tar" / "shard-000004.tar", root / "tar" / "shard-000000.tar")
    source = prefetch.TarSource(f"{url}tar/shard-*.tar")
    before = set(threading.enumerate())
    made = loader(source, seed=1, shuffle=False)
    try:
        with pytest.raises(OSError, match="has changed"), made:
            list(made)
        left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
        assert left == []
    finally:
        made.close()  # what the caller cannot do from a `with` statement


# ---------------------------------------------------------------- 9. tf.data and Keras


def tiny_model() -> object:
    keras = pytest.importorskip("keras")
    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(len(CLASSES)),
        ]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def dummy_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """`_DummyThread` entries (threads Python did not start, e.g. tf.data's, that asked for
    `threading.current_thread()`) registered since `before`."""
    return [
        thread
        for thread in threading.enumerate()
        if isinstance(thread, threading._DummyThread) and thread not in before
    ]


def forget_threads(threads: list[threading.Thread]) -> None:
    """Drop stale `_DummyThread` entries (Python 3.11 keeps them forever)."""
    with threading._active_limbo_lock:  # type: ignore[attr-defined]
        for thread in threads:
            threading._active.pop(thread.ident, None)  # type: ignore[attr-defined]


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tar_source_as_a_tf_dataset_yields_every_batch(
    written: dict[str, Path], reference: Batches
) -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    made = loader(prefetch.TarSource(written["tar"]), shuffle=False, batch_size=5)
    with made:
        ds = prefetch.tf.dataset(made)
        assert ds.class_names == list(CLASSES)
        assert int(ds.cardinality()) == len(made) == 5
        elements = [(images.numpy(), labels.numpy()) for images, labels in ds]
    assert len(elements) == 5
    images = np.concatenate([images for images, _ in elements])
    labels = np.concatenate([labels for _, labels in elements])
    np.testing.assert_array_equal(images, np.concatenate([i for i, _ in reference]))
    np.testing.assert_array_equal(labels, np.concatenate([lab for _, lab in reference]))


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_keras_fits_an_epoch_on_local_tar_shards(written: dict[str, Path]) -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    model = tiny_model()
    made = loader(prefetch.TarSource(written["tar"]), seed=3, batch_size=6)
    with made:
        history = model.fit(prefetch.tf.dataset(made), epochs=1, shuffle=False, verbose=0)  # type: ignore[attr-defined]
        assert made.stats().images == COUNT
    assert len(history.history["loss"]) == 1 and np.isfinite(history.history["loss"][0])


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_keras_fits_streamed_remote_tar_shards_and_leaves_no_stale_thread(
    served: tuple[Path, str],
) -> None:
    pytest.importorskip("tensorflow")
    import prefetch.tf

    _, url = served
    source = prefetch.TarSource(f"{url}tar/shard-*.tar", shuffle_buffer=8)
    model = tiny_model()
    before = set(threading.enumerate())
    made = loader(source, seed=3, batch_size=6)
    try:
        with made:
            history = model.fit(prefetch.tf.dataset(made), epochs=2, shuffle=False, verbose=0)  # type: ignore[attr-defined]
            assert made.stats().images == 2 * COUNT
        assert len(history.history["loss"]) == 2
        assert [thread.name for thread in dummy_threads(before)] == []
    finally:
        forget_threads(dummy_threads(before))


# ---------------------------------------------------------------- 10. the command line


@pytest.mark.parametrize("format", FORMATS)
def test_prefetch_shards_write_then_read_back(
    folder: Path,
    tmp_path: Path,
    reference: Batches,
    capsys: pytest.CaptureFixture[str],
    format: str,
) -> None:
    out = tmp_path / "cli"
    argv = ["shards", "write", str(folder), str(out), "--format", format, "--shard-size", "10"]
    assert main([*argv, "--no-shuffle"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {COUNT} samples in 3 {format} shards" in printed
    pattern = str(out / PATTERNS[format])
    assert pattern in printed
    source = SOURCES[format](pattern)
    assert len(source.shards) == 3 and source.class_names == list(CLASSES)
    assert_same(epochs(loader(source, shuffle=False, batch_size=1))[0], reference)
