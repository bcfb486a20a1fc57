"""TFRecord, tf.train.Example and tar shards read and written without TensorFlow.

Checked against the real implementations: tf.io.TFRecordWriter, tf.data.TFRecordDataset,
tf.io.parse_single_example and the protobuf runtime for records; Python's tarfile for tar.
"""

from __future__ import annotations

import io
import pickle
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from prefetch.errors import CorruptShardError
from prefetch.io._records import (
    RECORD_OVERHEAD,
    frame_record,
    masked_crc32c,
    record_data,
    record_length,
)
from prefetch.sources.shards._tar import (
    TAR_END,
    TarMember,
    iter_tar_members,
    sample_key,
    tar_header,
    tar_padding,
)
from prefetch.sources.shards._tfrecord import (
    encode_example,
    example_bytes_span,
    example_feature,
    example_keys,
    iter_records,
)

pytestmark = pytest.mark.timeout(60)


def jpeg_bytes(seed: int, size: int = 64) -> bytes:
    """A real JPEG of random noise (noise compresses badly: about 5 KB per 64x64)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=95)
    return out.getvalue()


def read_records(path: Path) -> list[tuple[int, memoryview]]:
    """(offset, data) of every record of a TFRecord file, both CRCs checked."""
    with open(path, "rb") as file:
        found = list(iter_records(file, str(path)))
        content = Path(path).read_bytes()
    return [
        (offset, record_data(content[offset : offset + RECORD_OVERHEAD + n], str(path), offset))
        for offset, n in found
    ]


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


# ---------------------------------------------------------------- TFRecord framing


def test_masked_crc32c_matches_the_tfrecord_reference_values() -> None:
    # The header of a TFRecord of 0 bytes and of 3 bytes, as TensorFlow writes them.
    assert masked_crc32c(b"") == 0xA282EAD8
    assert frame_record(b"abc")[:12] == struct.pack("<QI", 3, masked_crc32c(struct.pack("<Q", 3)))
    assert masked_crc32c(memoryview(b"xabc")[1:]) == masked_crc32c(b"abc")


@pytest.mark.tf
def test_records_written_by_tensorflow_are_read_with_identical_values(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "shard.tfrecord"
    samples = []
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(5):
            sample = {
                "jpeg": jpeg_bytes(i),
                "label": i * 7 - 10,
                "score": 0.1 * i - 3.3,
                "boxes": [i, -1, 2**62, -(2**63), 0],
            }
            feature = {
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[sample["jpeg"]])
                ),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[sample["label"]])
                ),
                "image/score": tf.train.Feature(
                    float_list=tf.train.FloatList(value=[sample["score"]])
                ),
                "image/boxes": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=sample["boxes"])
                ),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
            samples.append(sample)
    content = path.read_bytes()
    records = read_records(path)
    assert len(records) == len(samples)
    for (offset, data), sample in zip(records, samples, strict=True):
        kind, values = example_feature(data, "image/encoded")  # type: ignore[misc]
        assert kind == "bytes" and [bytes(v) for v in values] == [sample["jpeg"]]
        assert example_feature(data, "image/class/label") == ("int64", [sample["label"]])
        assert example_feature(data, "image/boxes") == ("int64", sample["boxes"])
        kind, values = example_feature(data, "image/score")  # type: ignore[misc]
        assert kind == "float" and values == [float(np.float32(sample["score"]))]
        assert example_feature(data, "image/missing") is None
        assert sorted(example_keys(data)) == sorted(
            ["image/encoded", "image/class/label", "image/score", "image/boxes"]
        )
        # The span points at the JPEG inside the file: an index needs no copy of the record.
        start, length = example_bytes_span(data, "image/encoded")  # type: ignore[misc]
        at = offset + 12 + start
        assert content[at : at + length] == sample["jpeg"]
        assert Image.open(io.BytesIO(content[at : at + length])).size == (64, 64)
        assert example_bytes_span(data, "image/class/label") is None


@pytest.mark.tf
def test_records_written_here_are_read_by_tensorflow_with_identical_values(
    tmp_path: Path,
) -> None:
    tf = pytest.importorskip("tensorflow")
    samples: list[dict[str, Any]] = [
        {
            "image/encoded": jpeg_bytes(i),
            "image/class/label": -i - 1 if i % 2 else i * 1000,
            "image/score": 1.5 * i - 2.25,
            "image/boxes": [i, -(2**63), 2**63 - 1, -1],
            "image/weights": [0.5, -1e-3, 3.0e30],
            "image/texts": [b"a", b"", "ü".encode(), bytes(range(256))],
        }
        for i in range(4)
    ]
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(b"".join(frame_record(encode_example(sample)) for sample in samples))
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/score": tf.io.FixedLenFeature([], tf.float32),
        "image/boxes": tf.io.FixedLenFeature([4], tf.int64),
        "image/weights": tf.io.FixedLenFeature([3], tf.float32),
        "image/texts": tf.io.FixedLenFeature([4], tf.string),
    }
    parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert len(parsed) == len(samples)
    for got, sample in zip(parsed, samples, strict=True):
        assert got["image/encoded"].numpy() == sample["image/encoded"]
        assert got["image/class/label"].numpy() == sample["image/class/label"]
        assert got["image/score"].numpy() == np.float32(sample["image/score"])
        assert got["image/boxes"].numpy().tolist() == sample["image/boxes"]
        np.testing.assert_array_equal(
            got["image/weights"].numpy(), np.float32(sample["image/weights"])
        )
        assert got["image/texts"].numpy().tolist() == sample["image/texts"]
        decoded = tf.io.decode_jpeg(got["image/encoded"])
        assert tuple(decoded.shape) == (64, 64, 3)


# ---------------------------------------------------------------- tf.train.Example encoding


@pytest.mark.tf
def test_encode_example_is_byte_identical_to_the_protobuf_runtime() -> None:
    pytest.importorskip("tensorflow")
    from tensorflow.core.example import example_pb2, feature_pb2

    # No key is a prefix of another: the upb runtime orders those longest first, C++ shortest.
    features: dict[str, Any] = {
        "one_bytes": b"\xff\x00jpeg",
        "one_int": -5,
        "one_float": 2.5,
        "ints": [1, -1, 300, 2**63 - 1],
        "floats": (1.0, -0.0, 1e-40),
        "bytes": [b"x", b"yz"],
        "array": np.arange(-3, 3, dtype=np.int16),
        "farray": np.linspace(0, 1, 5, dtype=np.float64),
        "empty": np.zeros(0, np.int64),
        "ünïcode": 1,
    }
    expected = example_pb2.Example()
    for key, value in features.items():
        feature = expected.features.feature[key]
        values = value.tolist() if isinstance(value, np.ndarray) else value
        values = values if isinstance(values, (list, tuple)) else [values]
        if key == "empty":
            feature.int64_list.SetInParent()
        elif isinstance(values[0], bytes):
            feature.bytes_list.value.extend(values)
        elif isinstance(values[0], float):
            feature.float_list.value.extend(values)
        else:
            feature.int64_list.value.extend(values)
    encoded = encode_example(features)
    assert encoded == expected.SerializeToString(deterministic=True)
    assert example_pb2.Example.FromString(encoded) == expected
    assert isinstance(feature_pb2.Feature(), feature_pb2.Feature)


@pytest.mark.parametrize(
    "value", ["text", [], [1, b"x"], [1, 2.5], 2**63, [-(2**63) - 1], object(), np.array(["u"])]
)
def test_encode_example_refuses_values_it_cannot_type(value: Any) -> None:
    with pytest.raises(ValueError, match="feature 'k'"):
        encode_example({"k": value})


def hand_built_example() -> bytes:
    """An Example as other writers may emit it: unpacked lists, unknown fields of every wire
    type at every level, value before key in a map entry, a list merged from two fields."""
    unknown = varint(15 << 3 | 0) + varint(2**40)  # varint
    unknown += varint(16 << 3 | 1) + b"8bytes!!"  # fixed64
    unknown += delimited(17, b"skipped")  # length-delimited
    unknown += varint(18 << 3 | 5) + b"4byt"  # fixed32
    ints = b"".join(varint(1 << 3 | 0) + varint(v) for v in [5, -7, 2**63 - 1])
    ints += delimited(1, varint(8) + varint(-(2**62)))  # a packed run after unpacked values
    floats = b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in [0.5, -2.0])
    feature_ints = delimited(3, ints + unknown)
    feature_floats = unknown + delimited(2, floats)
    feature_bytes = delimited(1, delimited(1, b"first") + unknown + delimited(1, b"second"))
    entries = [
        delimited(2, feature_ints) + delimited(1, b"ints"),  # value before key
        delimited(1, b"floats") + delimited(2, feature_floats),
        delimited(1, b"image/encoded") + delimited(2, feature_bytes),
    ]
    features = b"".join(delimited(1, entry) for entry in entries) + unknown
    return unknown + delimited(1, features) + unknown


def test_example_feature_reads_unpacked_lists_and_skips_unknown_fields() -> None:
    data = hand_built_example()
    assert example_feature(data, "ints") == ("int64", [5, -7, 2**63 - 1, 8, -(2**62)])
    assert example_feature(data, "floats") == ("float", [0.5, -2.0])
    kind, values = example_feature(data, "image/encoded")  # type: ignore[misc]
    assert kind == "bytes" and [bytes(v) for v in values] == [b"first", b"second"]
    start, length = example_bytes_span(data, "image/encoded")  # type: ignore[misc]
    assert data[start : start + length] == b"first"
    assert example_keys(data) == ["ints", "floats", "image/encoded"]


@pytest.mark.tf
def test_the_protobuf_runtime_reads_the_hand_built_example_the_same_way() -> None:
    pytest.importorskip("tensorflow")
    from tensorflow.core.example import example_pb2

    parsed = example_pb2.Example.FromString(hand_built_example()).features.feature
    assert list(parsed["ints"].int64_list.value) == [5, -7, 2**63 - 1, 8, -(2**62)]
    assert list(parsed["floats"].float_list.value) == [0.5, -2.0]
    assert list(parsed["image/encoded"].bytes_list.value) == [b"first", b"second"]


def test_unknown_fields_inside_a_map_entry_are_skipped() -> None:
    # upb moves such an entry to the unknown fields (the feature disappears) and TensorFlow's
    # parser rejects the record; reading the feature is the lenient choice and loses nothing.
    entry = delimited(1, b"k") + varint(9 << 3 | 5) + b"abcd" + delimited(2, delimited(1, b""))
    assert example_feature(delimited(1, delimited(1, entry)), "k") == ("bytes", [])


def test_the_last_map_entry_and_the_last_kind_win_as_in_protobuf() -> None:
    first = delimited(1, delimited(1, b"k") + delimited(2, delimited(3, delimited(1, varint(1)))))
    second = delimited(1, delimited(1, b"k") + delimited(2, delimited(3, delimited(1, varint(2)))))
    kinds = delimited(3, delimited(1, varint(3))) + delimited(2, delimited(1, b"\0\0\x80?"))
    third = delimited(1, delimited(1, b"j") + delimited(2, kinds))
    data = delimited(1, first + second + third)
    assert example_feature(data, "k") == ("int64", [2])
    assert example_feature(data, "j") == ("float", [1.0])
    assert example_keys(data) == ["k", "j"]


def test_example_feature_accepts_bytes_and_memoryviews_without_copying_the_image() -> None:
    image = jpeg_bytes(1, size=256)
    data = bytearray(encode_example({"image/encoded": image, "image/class/label": 3}))
    view = memoryview(data)
    kind, values = example_feature(view, "image/encoded")  # type: ignore[misc]
    assert kind == "bytes" and values[0].obj is data  # a view into the caller's buffer
    assert bytes(values[0]) == image
    assert example_feature(view[:], "image/class/label") == ("int64", [3])


# Feature "k" with a FloatList whose packed values are 2 bytes long (not a multiple of 4).
ODD_PACKED_FLOATS = delimited(
    1, delimited(1, delimited(1, b"k") + delimited(2, delimited(2, delimited(1, b"\1\2"))))
)


@pytest.mark.parametrize(
    "data, what",
    [
        (b"\x0a\x05\x0a\x03", "runs past"),  # a length beyond the message
        (b"\x0a\x02\x0a", "runs past"),
        (b"\x0a\x01\xff", "varint"),  # a varint cut short
        (b"\x0b", "wire type"),  # a group, not valid in an Example
        (b"\x02\x00", "field 0"),  # field number 0
        (ODD_PACKED_FLOATS, "packed floats"),
    ],
)
def test_a_malformed_example_is_a_corrupt_shard_naming_the_record(data: bytes, what: str) -> None:
    with pytest.raises(CorruptShardError, match=rf"shard\.tfrecord at offset 1234.*{what}"):
        example_feature(data, "k", path="shard.tfrecord", offset=1234)
    with pytest.raises(CorruptShardError, match="offset 1234"):
        example_bytes_span(data, "k", path="shard.tfrecord", offset=1234)
    if what != "packed floats":
        with pytest.raises(CorruptShardError, match="offset 1234"):
            example_keys(data, path="shard.tfrecord", offset=1234)


def random_features(rng: np.random.Generator) -> dict[str, Any]:
    """Features of every type, with random keys, lengths and values (int64 extremes included)."""
    features: dict[str, Any] = {}
    for _ in range(int(rng.integers(0, 6))):
        key = "".join(rng.choice(list("abcü/_"), int(rng.integers(1, 12))))
        count = int(rng.integers(1, 5))
        kind = int(rng.integers(3))
        if kind == 0:
            features[key] = [rng.bytes(int(rng.integers(0, 300))) for _ in range(count)]
        elif kind == 1:
            features[key] = [float(np.float32(v)) for v in rng.normal(0, 1e6, count)]
        else:
            extremes = [-(2**63), 2**63 - 1, -1, 0, 127, 128]
            features[key] = [int(v) for v in rng.integers(-(2**63), 2**63 - 1, count)]
            features[key][0] = extremes[int(rng.integers(len(extremes)))]
    return features


@pytest.mark.tf
def test_random_examples_read_the_same_here_and_in_the_protobuf_runtime() -> None:
    pytest.importorskip("tensorflow")
    from tensorflow.core.example import example_pb2

    rng = np.random.default_rng(7)
    for _ in range(300):
        features = random_features(rng)
        data = encode_example(features)
        parsed = example_pb2.Example.FromString(data).features.feature
        assert sorted(example_keys(data)) == sorted(parsed) == sorted(features)
        for key, values in features.items():
            kind, got = example_feature(data, key)  # type: ignore[misc]
            if kind == "bytes":
                got = [bytes(v) for v in got]
            expected = getattr(parsed[key], f"{kind}_list").value
            assert got == list(expected) == values


def test_damaged_examples_raise_only_corrupt_shard_errors() -> None:
    rng = np.random.default_rng(3)
    data = encode_example({"image/encoded": bytes(300), "label": [1, -2], "f": [0.5], "b": [b"x"]})
    for _ in range(3000):
        damaged = bytearray(data)
        position = int(rng.integers(len(damaged)))
        if rng.random() < 0.7:
            damaged[position] = int(rng.integers(256))
        else:
            del damaged[position:]
        for key in ("image/encoded", "label", "f", "b"):
            try:
                example_feature(bytes(damaged), key)
                example_bytes_span(bytes(damaged), key)
                example_keys(bytes(damaged))
            except CorruptShardError:
                pass


# ---------------------------------------------------------------- corrupt TFRecord files


def write_shard(path: Path, count: int = 4) -> list[int]:
    """A TFRecord file of `count` Examples; returns the record offsets."""
    offsets, content = [], b""
    for i in range(count):
        offsets.append(len(content))
        content += frame_record(encode_example({"image/encoded": jpeg_bytes(i), "label": i}))
    path.write_bytes(content)
    return offsets


def test_a_flipped_data_byte_names_the_file_and_the_record_offset(tmp_path: Path) -> None:
    path = tmp_path / "shard.tfrecord"
    offsets = write_shard(path)
    content = bytearray(path.read_bytes())
    content[offsets[2] + 12 + 100] ^= 0x01
    path.write_bytes(content)
    with open(path, "rb") as file:  # framing is intact: iteration does not read data
        found = list(iter_records(file, str(path)))
    assert [offset for offset, _ in found] == offsets
    assert [bytes(data) for _, data in read_records_until(path, 2)]
    record = bytes(content[offsets[2] : offsets[3]])
    with pytest.raises(CorruptShardError, match="data CRC mismatch") as error:
        record_data(record, str(path), offsets[2])
    assert f"{path} at offset {offsets[2]}" in str(error.value)
    assert "on_error" not in str(error.value) and "re-download" in str(error.value)
    assert (error.value.path, error.value.offset) == (str(path), offsets[2])


def read_records_until(path: Path, count: int) -> list[tuple[int, memoryview]]:
    content = path.read_bytes()
    with open(path, "rb") as file:
        found = list(iter_records(file, str(path)))[:count]
    return [(o, record_data(content[o : o + 16 + n], str(path), o)) for o, n in found]


@pytest.mark.parametrize("byte", [8, 11, 0])  # in the length CRC, or in the length itself
def test_a_flipped_length_crc_byte_names_the_record_offset(tmp_path: Path, byte: int) -> None:
    path = tmp_path / "shard.tfrecord"
    offsets = write_shard(path)
    content = bytearray(path.read_bytes())
    content[offsets[1] + byte] ^= 0x40
    path.write_bytes(content)
    with open(path, "rb") as file, pytest.raises(CorruptShardError, match="length CRC") as error:
        list(iter_records(file, str(path)))
    assert f"{path} at offset {offsets[1]}" in str(error.value)
    with pytest.raises(CorruptShardError, match=f"offset {offsets[1]}"):
        record_length(bytes(content[offsets[1] : offsets[1] + 12]), str(path), offsets[1])


@pytest.mark.parametrize("cut", [1, 11, 12, 500, -1])
def test_a_file_truncated_mid_record_names_the_record_offset(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "shard.tfrecord"
    offsets = write_shard(path)
    content = path.read_bytes()
    end = offsets[3] + cut if cut > 0 else len(content) + cut
    path.write_bytes(content[:end])
    with open(path, "rb") as file:
        records = iter_records(file, str(path))
        assert [next(records)[0] for _ in range(3)] == offsets[:3]
        with pytest.raises(CorruptShardError, match=f"at offset {offsets[3]}: truncated"):
            next(records)
    with pytest.raises(CorruptShardError, match=f"at offset {offsets[3]}: truncated"):
        record_data(content[offsets[3] : end], str(path), offsets[3])


@pytest.mark.parametrize("garbage", [b"\0", b"garbage", b"x" * 40])
def test_garbage_after_the_last_record_is_reported_at_its_offset(
    tmp_path: Path, garbage: bytes
) -> None:
    path = tmp_path / "shard.tfrecord"
    write_shard(path)
    size = path.stat().st_size
    with open(path, "ab") as file:
        file.write(garbage)
    with open(path, "rb") as file, pytest.raises(CorruptShardError, match=f"offset {size}"):
        list(iter_records(file, str(path)))


def test_records_are_iterated_from_any_binary_file_object() -> None:
    content = b"".join(frame_record(bytes([i]) * i) for i in range(5))
    found = list(iter_records(io.BytesIO(content), "memory"))
    assert [n for _, n in found] == [0, 1, 2, 3, 4]
    assert bytes(record_data(content[found[3][0] :], "memory", found[3][0])) == b"\3\3\3"


def test_corrupt_shard_error_is_a_value_error_and_pickles_with_its_location() -> None:
    try:
        record_length(b"short", "s.tfrecord", 42)
    except CorruptShardError as error:
        assert isinstance(error, ValueError) and "truncated" in str(error)
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.path, copy.offset) == (
            CorruptShardError,
            str(error),
            "s.tfrecord",
            42,
        )


def test_the_module_imports_no_tensorflow() -> None:
    code = "import sys, prefetch.sources.shards._tfrecord; assert 'tensorflow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)


# ---------------------------------------------------------------- tar


LONG_NAME = "/".join(["d" * 40, "e" * 40, "f" * 40, "sample_000001_long_name.jpg"])
assert len(LONG_NAME) == 150  # over ustar's 100-byte name field: split into the prefix
LONG_FLAT = "g" * 150 + ".cls"  # no slash: only GNU and pax can hold it


def write_tar(path: Path, tar_format: int) -> dict[str, bytes]:
    """An archive with files, a directory, a symlink, an empty and long and non-ASCII names."""
    files = {
        "000001.jpg": jpeg_bytes(1),
        "000001.cls": b"3",
        "dir/000002.jpg": jpeg_bytes(2),
        "dir/empty.txt": b"",
        LONG_NAME: b"x" * 513,
        "ünïcödé/0003.jpg": jpeg_bytes(3),
    }
    if tar_format != tarfile.USTAR_FORMAT:
        files[LONG_FLAT] = b"7"
    with tarfile.open(path, "w", format=tar_format, pax_headers={"comment": "global"}) as tar:
        directory = tarfile.TarInfo("dir")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
            if name == "000001.cls":
                link = tarfile.TarInfo("link.jpg")
                link.type, link.linkname = tarfile.SYMTYPE, "000001.jpg"
                tar.addfile(link)
    return files


@pytest.mark.parametrize(
    "tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]
)
def test_tar_members_written_by_tarfile_are_listed_with_names_offsets_sizes(
    tmp_path: Path, tar_format: int
) -> None:
    path = tmp_path / "shard.tar"
    files = write_tar(path, tar_format)
    with open(path, "rb") as file:
        members = list(iter_tar_members(file, str(path)))
    with tarfile.open(path) as tar:
        expected = [TarMember(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    assert members == expected
    assert [m.name for m in members] == list(files)
    content = path.read_bytes()
    for member in members:
        assert content[member.offset : member.offset + member.size] == files[member.name]


def test_tar_members_with_a_base_256_size_are_read() -> None:
    header = bytearray(tar_header("a.bin", 5))
    header[124:136] = b"\x80" + (5).to_bytes(11, "big")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    archive = bytes(header) + b"hello" + tar_padding(5) + TAR_END
    assert list(iter_tar_members(io.BytesIO(archive), "big.tar")) == [TarMember("a.bin", 512, 5)]
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert tar.extractfile("a.bin").read() == b"hello"  # type: ignore[union-attr]


def test_an_archive_of_tar_header_padding_and_end_is_read_by_tarfile() -> None:
    files = {"000001.jpg": jpeg_bytes(1), "a/000001.cls": b"12", "empty": b"", LONG_NAME: b"z"}
    archive = b"".join(
        tar_header(name, len(data), mtime=1_700_000_000) + data + tar_padding(len(data))
        for name, data in files.items()
    )
    archive += TAR_END
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        infos = tar.getmembers()
        assert [info.name for info in infos] == list(files)
        for info in infos:
            assert info.isreg() and info.mode == 0o644 and info.mtime == 1_700_000_000
            assert tar.extractfile(info).read() == files[info.name]  # type: ignore[union-attr]
    members = list(iter_tar_members(io.BytesIO(archive), "ours.tar"))
    assert {m.name: archive[m.offset : m.offset + m.size] for m in members} == files
    assert len(archive) % 512 == 0 and tar_padding(512) == b"" and len(tar_padding(1)) == 511


def test_tar_header_refuses_what_ustar_cannot_hold() -> None:
    with pytest.raises(ValueError, match=LONG_FLAT):
        tar_header(LONG_FLAT, 1)
    with pytest.raises(ValueError, match="member size"):
        tar_header("big", 8**11)
    with pytest.raises(ValueError, match="non-empty"):
        tar_header("", 1)


def test_a_bad_tar_checksum_names_the_header_offset(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, tarfile.USTAR_FORMAT)
    with open(path, "rb") as file:
        members = list(iter_tar_members(file, str(path)))
    header_offset = members[2].offset - 512
    content = bytearray(path.read_bytes())
    content[header_offset + 3] ^= 0x01  # one bit of the name
    path.write_bytes(content)
    with open(path, "rb") as file:
        listed = iter_tar_members(file, str(path))
        assert [next(listed) for _ in range(2)] == members[:2]
        with pytest.raises(CorruptShardError, match=f"offset {header_offset}: tar header check"):
            next(listed)


@pytest.mark.parametrize("cut", [100, 511, 600])
def test_a_truncated_tar_names_the_header_offset(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "shard.tar"
    write_tar(path, tarfile.GNU_FORMAT)
    with open(path, "rb") as file:
        member = list(iter_tar_members(file, str(path)))[2]
    path.write_bytes(path.read_bytes()[: member.offset - 512 + cut])
    with open(path, "rb") as file, pytest.raises(CorruptShardError) as error:
        list(iter_tar_members(file, str(path)))
    assert f"at offset {member.offset - 512}: truncated" in str(error.value)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("dir/000123.jpg", ("dir/000123", "jpg")),
        ("a/b.c.png", ("a/b", "c.png")),
        ("000123.JPG", ("000123", "JPG")),
        ("x.y/z.cls", ("x.y/z", "cls")),
        ("a/b/c.d/e.f.g", ("a/b/c.d/e", "f.g")),
        ("noext", ("noext", "")),
        (".hidden", (".hidden", "")),
        ("dir/.hidden", ("dir/", "hidden")),  # WebDataset's pattern: the key may end in a slash
    ],
)
def test_sample_key_splits_at_the_first_dot_of_the_basename(
    name: str, expected: tuple[str, str]
) -> None:
    assert sample_key(name) == expected
