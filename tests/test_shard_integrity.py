"""Shards that cannot mislabel, bloat or be subverted (issue 29, the reading side): exact
indexes, indexes checked before they are trusted, bounded parsing, member locations as data.

Real shards are written into tmp dirs; hostile ones come from `prefetch.testing.shards`. A test
whose failure could take much memory runs that part in a subprocess under an address-space
limit (`run_limited`, 1.5 GiB) and checks its peak (ru_maxrss) there.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import os
import shutil
import tracemalloc
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import prefetch
from prefetch.io import _storage as storage
from prefetch.io import read_location
from prefetch.io._paths import PathArray
from prefetch.io._records import frame_record
from prefetch.plan._stream_order import StreamingPlan
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.sources.shards._index_file import IndexRefused, decode_index
from prefetch.sources.shards._tar import TAR_END, tar_header, tar_padding
from prefetch.sources.shards._tfrecord import encode_example
from prefetch.testing import FailingDecoder, serve_folder
from prefetch.testing.shards import (
    bomb_index,
    empty_values_record,
    long_name_tar,
    run_limited,
    write_tar,
    write_tfrecord,
)

pytestmark = pytest.mark.usefixtures("fsspec_io_thread", "private_cache")

SIZE = 8


def jpeg(value: int, size: int = 16) -> bytes:
    """A real JPEG of one grey level."""
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (value, value, value)).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def samples(labels: list[int]) -> list[tuple[str, bytes, int | None]]:
    return [(f"{n:06d}", jpeg(10 * n), label) for n, label in enumerate(labels)]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------- 1. exact indexes


def replace_keeping_size_and_mtime(path: Path, write: object, in_place: bool) -> None:
    """Write the shard again through `write(path)` (new labels, same size), in place (the same
    inode) or by a rename (a new one), and give it back its modification time."""
    before = os.stat(path)
    if in_place:
        fresh = path.with_name("fresh")
        write(fresh)  # type: ignore[operator]
        with open(path, "r+b") as file:
            file.write(fresh.read_bytes())
        fresh.unlink()
    else:
        write(path.with_name("fresh"))  # type: ignore[operator]
        os.replace(path.with_name("fresh"), path)
    assert os.stat(path).st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("format", ["tar", "tfrecord"])
@pytest.mark.parametrize("in_place", [True, False])
def test_a_shard_replaced_with_the_same_size_and_mtime_is_read_with_its_new_labels(
    tmp_path: Path, format: str, in_place: bool
) -> None:
    path = tmp_path / f"shard.{format}"

    def write(labels: list[int]) -> object:
        if format == "tar":
            return lambda p: write_tar(p, samples(labels))
        return lambda p: write_tfrecord(p, [(jpeg(n), label) for n, label in enumerate(labels)])

    write([1, 2, 3, 4])(path)  # type: ignore[operator]
    source = prefetch.TarSource if format == "tar" else prefetch.TFRecordSource
    assert source(str(path)).labels.tolist() == [1, 2, 3, 4]
    assert os.path.exists(str(path) + INDEX_SUFFIX)
    replace_keeping_size_and_mtime(path, write([5, 6, 7, 8]), in_place)
    assert source(str(path)).labels.tolist() == [5, 6, 7, 8]


def in_memory(path: Path) -> str:
    """The bytes of `path` put at a fresh memory:// URL (a store that serves byte ranges)."""
    import fsspec

    url = f"memory://shards-{uuid.uuid4().hex[:8]}/{path.name}"
    fsspec.filesystem("memory").pipe(url, path.read_bytes())
    return url


def test_a_url_shard_read_where_it_lies_is_checked_against_its_kept_index(tmp_path: Path) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    path = tmp_path / "shard.tar"
    write_tar(path, samples([1, 2, 3]))
    url = in_memory(path)
    first = prefetch.TarSource(url, streaming=False)
    assert first.labels.tolist() == [1, 2, 3]
    write_tar(path, samples([4, 5, 6]))
    import fsspec

    fsspec.filesystem("memory").pipe(url, path.read_bytes())  # the same size, other labels
    again = prefetch.TarSource(url, streaming=False)
    assert again.labels.tolist() == [4, 5, 6]
    assert read_location(again.location(2)) == jpeg(20)


def test_a_streamed_copy_that_is_not_the_bytes_indexed_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    path = tmp_path / "shard.tar"
    write_tar(path, samples([1, 2, 3]))
    with serve_folder(tmp_path) as url:
        source = prefetch.TarSource(f"{url}shard.tar", streaming=True)
        replace_keeping_size_and_mtime(path, lambda p: write_tar(p, samples([4, 5, 6])), False)
        made = prefetch.Loader(source, batch_size=3, image_size=(SIZE, SIZE), seed=1)
        with pytest.raises(OSError, match="has changed since it was indexed"), made:
            list(made)


# ---------------------------------------------------------------- 2. indexes checked first


def test_an_index_claiming_millions_of_samples_for_a_small_shard_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, samples([0, 1, 2, 3, 4, 5]))
    index = prefetch.TarSource(str(path)).indexes[0]
    count = 5_000_000
    zeros = np.zeros(count, np.int64)
    claimed = type(index)(zeros, zeros, zeros, zeros, np.zeros(count, np.int32), index.identity)
    spec = prefetch.TarSource(str(path)).spec
    Path(str(path) + INDEX_SUFFIX).write_bytes(claimed.to_bytes(spec))
    assert len(prefetch.TarSource(str(path))) == 6


def test_an_index_whose_member_names_are_damaged_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, samples([0, 1, 2]))
    source = prefetch.TarSource(str(path))
    index = source.indexes[0]
    assert index.keys is not None
    names, starts = index.keys.parts()
    unended = PathArray._from_parts(np.full_like(names, ord("x")), starts)  # no NUL ends a name
    damaged = dataclasses.replace(index, keys=unended)
    Path(str(path) + INDEX_SUFFIX).write_bytes(damaged.to_bytes(source.spec))
    again = prefetch.TarSource(str(path))
    assert [again.member(n).key for n in range(3)] == ["000000.jpg", "000001.jpg", "000002.jpg"]


def test_an_index_whose_array_header_claims_more_than_its_bytes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, samples([0, 1]))
    spec = prefetch.TarSource(str(path)).spec
    good = Path(str(path) + INDEX_SUFFIX).read_bytes()
    assert decode_index(good, spec).labels.tolist() == [0, 1]  # type: ignore[union-attr]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<i4", "fortran_order": False, "shape": (10**9,)}
    )
    lying = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(good)) as archive, zipfile.ZipFile(lying, "w") as out:
        for info in archive.infolist():
            data = archive.read(info)
            if info.filename == "labels.npy":
                data = header.getvalue() + data[-8:]  # 4 GB claimed, 8 bytes held
            out.writestr(info.filename, data)
    with pytest.raises(IndexRefused, match="not a flat array of the size its header says"):
        decode_index(lying.getvalue(), spec)


BOMB_CHECK = """
import resource, sys
from pathlib import Path
import prefetch
from prefetch.sources.shards._index import INDEX_SUFFIX
from prefetch.sources.shards._index_file import IndexRefused, decode_index
path = sys.argv[1] if len(sys.argv) > 1 else {path!r}
Path(path + INDEX_SUFFIX).write_bytes(Path({bomb!r}).read_bytes())
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
source = prefetch.TarSource(path)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(len(source), grown)
"""


def test_a_deflate_bomb_index_beside_a_shard_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, samples([0, 1, 2]))
    good = Path(str(path) + INDEX_SUFFIX)
    prefetch.TarSource(str(path))
    bomb = tmp_path / "bomb.npz"
    bomb.write_bytes(bomb_index(good.read_bytes(), gib=1))  # 2 GiB would fail at the limit
    assert bomb.stat().st_size < 2 << 20  # 1 GiB inflated
    count, grown_kib = run_limited(BOMB_CHECK.format(path=str(path), bomb=str(bomb))).split()
    assert int(count) == 3
    assert int(grown_kib) < 200 << 10  # not the 1 GiB the bomb inflates to


def test_a_bomb_index_beside_a_url_shard_is_logged_and_the_shard_indexed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    local = tmp_path / "local.tar"
    write_tar(local, samples([0, 1, 2]))
    prefetch.TarSource(str(local))
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(local, served / "shard.tar")
    index = Path(str(local) + INDEX_SUFFIX).read_bytes()
    (served / f"shard.tar{INDEX_SUFFIX}").write_bytes(bomb_index(index, gib=1))
    with caplog.at_level(logging.WARNING, "prefetch.loader"), serve_folder(served) as url:
        source = prefetch.TarSource(f"{url}shard.tar")
    assert source.labels.tolist() == [0, 1, 2]
    assert f"shard.tar{INDEX_SUFFIX}" in caplog.text and "declares" in caplog.text


# ---------------------------------------------------------------- 3. planted index paths


@pytest.mark.parametrize("planted", ["directory", "fifo", "symlink"])
def test_a_planted_entry_at_the_index_path_is_passed_over_without_leaking(
    tmp_path: Path, private_cache: Path, planted: str
) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, samples([3, 1]))
    beside = Path(str(path) + INDEX_SUFFIX)
    if planted == "directory":
        beside.mkdir()
    elif planted == "fifo":
        os.mkfifo(beside)
    else:
        (tmp_path / "elsewhere").write_bytes(b"not an index")
        beside.symlink_to(tmp_path / "elsewhere")
    before = open_fds()
    for _ in range(3):
        assert prefetch.TarSource(str(path)).labels.tolist() == [3, 1]
    assert open_fds() == before
    if planted == "directory":
        assert beside.is_dir() and any((private_cache / "shard-index").iterdir())
    assert (
        (tmp_path / "elsewhere").read_bytes() == b"not an index" if planted == "symlink" else True
    )


# ---------------------------------------------------------------- 4. max_object_bytes


def test_a_sample_larger_than_max_object_bytes_is_refused_whatever_the_index_says(
    tmp_path: Path,
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    path = tmp_path / "shard.tar"
    write_tar(path, [("000000", b"\xff" * (2 << 20), 0)])
    capped = prefetch.RemoteOptions(max_object_bytes=1 << 20)
    for shard in (str(path), in_memory(path)):
        member = prefetch.TarSource(shard, streaming=False).location(0)
        with storage.using(capped), pytest.raises(OSError) as raised:
            read_location(member)
        told = str(raised.value)
        assert "max_object_bytes=1048576" in told and "'000000.jpg'" in told
        assert f"{shard} (member '000000.jpg' at byte 512)" in told


# ---------------------------------------------------------------- 5. 6. bounded parsing

RECORD_CHECK = """
import resource
import prefetch
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
source = prefetch.TFRecordSource({path!r})
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(len(source), source.labels.tolist()[0], grown)
"""


def test_a_record_of_millions_of_empty_values_indexes_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "junk.tfrecord"
    empty_values_record(path, values=10_000_000)
    assert path.stat().st_size > 20_000_000
    count, label, grown_kib = run_limited(RECORD_CHECK.format(path=str(path))).split()
    assert (int(count), int(label)) == (1, 1)
    assert int(grown_kib) < 100 << 10  # the record's 20 MB mapped, not 75 times that


LONG_NAME_CHECK = """
import prefetch
try:
    prefetch.TarSource({path!r})
except prefetch.CorruptShardError as error:
    print(error.offset, error)
"""


def test_a_tar_declaring_a_two_gigabyte_long_name_fails_fast_naming_shard_and_offset(
    tmp_path: Path,
) -> None:
    path = tmp_path / "long.tar"
    long_name_tar(path, declared=2 << 30)
    assert path.stat().st_blocks * 512 < 1 << 20  # sparse: a few KB on disk
    told = run_limited(LONG_NAME_CHECK.format(path=str(path)))
    assert told.startswith("0 ") and str(path) in told and "GNU long name" in told


# ---------------------------------------------------------------- 7. duplicate keys


def write_members(path: Path, members: list[tuple[str, bytes]]) -> None:
    with open(path, "wb") as file:
        for name, data in members:
            file.write(tar_header(name, len(data)) + data + tar_padding(len(data)))
        file.write(TAR_END)


@pytest.mark.parametrize(
    "names",
    [
        ["000001.jpg", "000001.cls", "000001.jpg"],
        ["000001.jpg", "000001.cls", "000001.cls"],
        ["000001.cls", "000001.cls", "000001.jpg"],  # labels before their image
        ["000001.jpg", "000002.jpg", "000002.cls", "000001.cls", "000001.jpg"],
    ],
)
def test_a_tar_with_a_key_twice_is_refused_naming_shard_key_and_offset(
    tmp_path: Path, names: list[str]
) -> None:
    path = tmp_path / "dup.tar"
    write_members(path, [(name, jpeg(1) if name.endswith("jpg") else b"1") for name in names])
    with pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TarSource(str(path))
    told = str(raised.value)
    second = next(name for n, name in enumerate(names) if name in names[:n])
    key = second.split(".")[0]
    assert str(path) in told and f"{key!r}" in told and f"{second!r}" in told
    assert raised.value.offset > 0 and f"at offset {raised.value.offset}" in told


def test_a_label_before_its_image_and_a_second_image_kind_are_read_as_one_sample(
    tmp_path: Path,
) -> None:
    path = tmp_path / "order.tar"
    members = [
        ("000001.cls", b"4"),
        ("000001.jpg", jpeg(1)),
        ("000001.png", b"png"),
        ("x.cls", b"9"),
    ]
    write_members(path, [*members, ("000002.jpg", jpeg(2)), ("000002.cls", b"5")])
    source = prefetch.TarSource(str(path))
    assert source.labels.tolist() == [4, 5]
    assert [source.member(n).key for n in range(2)] == ["000001.jpg", "000002.jpg"]


# ---------------------------------------------------------------- 8. streamed order memory


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_streamed_epoch_order_of_twenty_million_samples_takes_eight_bytes_per_sample(
    shuffle: bool,
) -> None:
    count = 20_000_000
    starts = np.linspace(0, count, 2001).astype(np.int64)  # 2,000 shards of 10,000
    plan = StreamingPlan(
        size=count, batch_size=256, seed=3, shuffle=shuffle, shard_starts=starts, buffer=4096
    )
    tracemalloc.start()
    try:
        order = plan.order(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(order) == count and order.dtype == np.int64
    assert peak < 8 * count + (32 << 20)  # the order, and a fixed amount per step
    assert np.array_equal(np.sort(order[: 1 << 16]), np.unique(order[: 1 << 16]))


# ---------------------------------------------------------------- 9. a path is a path


@pytest.mark.parametrize("name", ["x.jpg#tar@0+10", "x.jpg#tfrecord@0+10/0+5"])
def test_a_file_whose_name_looks_like_a_member_decodes_as_itself(tmp_path: Path, name: str) -> None:
    path = tmp_path / "a" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(jpeg(200))
    made = prefetch.Loader(
        prefetch.FileList([str(path)], [0]), batch_size=1, image_size=(SIZE, SIZE), shuffle=False
    )
    with made:
        (batch,) = list(made)
    assert abs(int(batch.images.mean()) - 200) <= 3


def test_a_member_suffix_on_a_missing_path_is_file_not_found_and_never_reads_the_file(
    tmp_path: Path,
) -> None:
    photo = tmp_path / "photo"
    photo.write_bytes(jpeg(100, size=64))
    missing = f"{photo}#tar@0+654"
    made = prefetch.Loader(
        prefetch.FileList([missing], [0]), batch_size=1, image_size=(SIZE, SIZE), shuffle=False
    )
    with pytest.raises(FileNotFoundError) as raised, made:
        list(made)
    told = "\n".join([str(raised.value), *getattr(raised.value, "__notes__", [])])
    assert missing in told


def test_errors_inside_a_shard_name_the_members_key_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, [("000000", jpeg(1), 0), ("000017", b"not an image", 0)])
    source = prefetch.TarSource(str(path))
    made = prefetch.Loader(source, batch_size=2, image_size=(SIZE, SIZE), shuffle=False)
    with pytest.raises(Exception) as raised, made:
        list(made)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert f"{path} (member '000017.jpg' at byte" in notes
    assert f"re-write or re-download {str(path)!r}" in notes


@pytest.mark.parametrize("marker", ["000002.jpg", "shard.tar"])
def test_the_testing_fakes_match_a_shard_sample_by_its_description(
    tmp_path: Path, marker: str
) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, [(f"{n:06d}", jpeg(10 * n), 0) for n in range(4)])
    source = prefetch.TarSource(str(path))
    made = prefetch.Loader(
        source, batch_size=2, image_size=(SIZE, SIZE), decoder=FailingDecoder(marker)
    )
    with pytest.raises(ValueError, match=r"injected failure for .*shard\.tar") as raised, made:
        list(made)
    if marker == "000002.jpg":
        assert "member '000002.jpg'" in str(raised.value)


def test_a_url_shard_that_is_not_a_tar_is_refused_naming_its_url_not_a_temporary_copy(
    tmp_path: Path,
) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    (tmp_path / "shard.tar").write_bytes(b"<html><body>a listing, not a shard</body></html>" * 20)
    with serve_folder(tmp_path) as url, pytest.raises(prefetch.CorruptShardError) as raised:
        prefetch.TarSource(f"{url}shard.tar")
    assert raised.value.path == f"{url}shard.tar" and f"{url}shard.tar" in str(raised.value)
    assert "prefetch-shard-" not in str(raised.value)


def test_a_gzip_url_shard_is_refused_naming_its_url_not_a_temporary_copy(tmp_path: Path) -> None:
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    (tmp_path / "shard.tar").write_bytes(gzip.compress(tar_header("a.jpg", 3) + b"abc"))
    with serve_folder(tmp_path) as url, pytest.raises(ValueError) as raised:
        prefetch.TarSource(f"{url}shard.tar")
    assert f"{url}shard.tar" in str(raised.value) and "gzip-compressed tar" in str(raised.value)
    assert "prefetch-shard-" not in str(raised.value)


# ---------------------------------------------------------------- 10. gzip TFRecords


def test_a_gzip_tfrecord_is_refused_with_that_reason(tmp_path: Path) -> None:
    record = frame_record(encode_example({"image/encoded": jpeg(1), "image/class/label": 0}))
    path = tmp_path / "train.tfrecord.gz"
    path.write_bytes(gzip.compress(record * 3))
    with pytest.raises(ValueError, match="gzip-compressed TFRecord: random access needs"):
        prefetch.TFRecordSource(str(path))
