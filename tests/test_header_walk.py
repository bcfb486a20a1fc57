"""One header walk for every decoder and both paths, with no count after which it stops looking
(issue 40.3): comment segments or fill bytes before a JPEG's frame, a second frame, a second
PNG IHDR and a scan bomb behind padding are all refused under `max_pixels`, by the per-sample
path, by the compiled chunk path and by the shard writer; the walk's C twin reports what the
Python walk reports for every trick and a mutated corpus; and the walk is one search per
segment, never a step per byte.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from prefetch.cli import main
from prefetch.decode import _window as window_decode
from prefetch.decode._decoders import DecodeOptions
from prefetch.io import MAX_HEADER_SEGMENTS, check_image_bytes, image_pixels, walk_jpeg
from prefetch.io import _headers as headers_module
from prefetch.plan import RandomResizedCrop
from prefetch.testing import write_image_folder
from prefetch.testing.bombs import (
    add_frame,
    claim_size,
    hide_frame,
    write_scan_bomb,
    write_two_header_png,
)
from prefetch.testing.shards import run_limited

MAX_PIXELS = 1_000_000


def jpeg(size: tuple[int, int] = (48, 40), **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def write_tricks(folder: Path) -> dict[str, str]:
    """Issue 40.3's files in `folder`, by name, with what each must be refused for."""
    folder.mkdir(parents=True, exist_ok=True)
    big = claim_size(jpeg(), (9000, 9000))
    scans = claim_size(write_scan_bomb(folder / "scans.tmp", scans=498).read_bytes(), (8000, 8000))
    (folder / "scans.tmp").unlink()
    files = {
        "comments.jpg": (hide_frame(big, 300), "9000 x 9000"),
        "fill.jpg": (hide_frame(big, 300, "fill"), "9000 x 9000"),
        "comments-and-fill.jpg": (hide_frame(hide_frame(big, 300, "fill"), 300), "9000 x 9000"),
        "two-frames.jpg": (add_frame(jpeg(), (13_000, 13_000)), "2 frame headers"),
        "two-frames-big-first.jpg": (add_frame(jpeg(), (13_000, 13_000), True), "2 frame"),
        "hidden-scans.jpg": (hide_frame(scans, 300), "8000 x 8000"),
        "long-header.jpg": (hide_frame(jpeg(), MAX_HEADER_SEGMENTS + 1), "MAX_HEADER_SEGMENTS"),
    }
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    write_two_header_png(folder / "two-headers.png")
    return {**{name: why for name, (_, why) in files.items()}, "two-headers.png": "2 IHDR"}


@pytest.fixture(scope="module")
def tricks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("tricks")
    return folder, write_tricks(folder)


def test_every_trick_is_refused_by_the_check_naming_the_file(
    tricks: tuple[Path, dict[str, str]],
) -> None:
    folder, expected = tricks
    for name, why in expected.items():
        with pytest.raises(Image.DecompressionBombError, match=re.escape(why)) as raised:
            check_image_bytes((folder / name).read_bytes(), name, MAX_PIXELS)
        assert repr(name) in str(raised.value), raised.value


def test_the_size_reported_is_the_largest_any_decoder_allocates(
    tricks: tuple[Path, dict[str, str]],
) -> None:
    folder, _ = tricks
    assert image_pixels((folder / "comments.jpg").read_bytes()) == (9000, 9000)
    assert image_pixels((folder / "two-frames.jpg").read_bytes()) == (13_000, 13_000)
    assert image_pixels((folder / "two-headers.png").read_bytes()) == (13_000, 13_000)
    with (
        pytest.warns(Image.DecompressionBombWarning),
        Image.open(folder / "two-headers.png") as image,  # what Pillow would allocate
    ):
        assert image.size == (13_000, 13_000)


def test_the_walk_is_a_search_per_segment_never_a_step_per_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Megabytes of fill bytes, stuffed zeros, restart markers and junk before the frame are
    passed by C-speed searches: the Python loop turns once per segment with a length."""
    searches = 0
    pattern = headers_module._NEXT_MARKER

    class Counting:
        def search(self, data: bytes, position: int) -> re.Match[bytes] | None:
            nonlocal searches
            searches += 1
            return pattern.search(data, position)

    monkeypatch.setattr(headers_module, "_NEXT_MARKER", Counting())
    noise = b"\xff" * 4_000_000 + b"\xff\x00" * 1_000_000 + b"\xff\xd0" * 500_000 + b"junk" * 10**5
    data = hide_frame(claim_size(jpeg(), (9000, 9000)), 0)
    data = data[:2] + noise + data[2:]
    header = walk_jpeg(data)
    assert (header.width, header.height, header.frames) == (9000, 9000, 1)
    assert searches <= header.segments + 1  # a well-formed segment's next needs no search
    searches = 0
    header = walk_jpeg(hide_frame(jpeg(), 10 * MAX_HEADER_SEGMENTS))
    assert header.segments == MAX_HEADER_SEGMENTS + 1 and searches <= header.segments


# ---------------------------------------------------------------- the C twin


def mutated_corpus(seed: int, count: int) -> list[bytes]:
    """JPEGs as encoders write them (baseline, progressive, gray, optimized, with restart
    intervals and an EXIF thumbnail), then cut, bit-flipped, padded with markers and junk, or
    with segments repeated or removed."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    exif = Image.Exif()
    exif[0x010E] = "a description"
    bases = [
        jpeg(),
        jpeg(progressive=True),
        jpeg((7, 300), optimize=True),
        _encoded(image.convert("L")),
        _encoded(image, restart_marker_blocks=1),
        _encoded(image, exif=exif.tobytes()),
        add_frame(jpeg(), (300, 200)),
        hide_frame(jpeg(), 40, "fill"),
    ]
    pieces = [b"\xff", b"\xff\x00", b"\xff\xd8", b"\xff\xd0", b"\xff\xc0", b"\xff\xda", b"\xff\xfe"]
    corpus = list(bases)
    for _ in range(count):
        data = bytearray(bases[int(rng.integers(len(bases)))])
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(5))
            at = int(rng.integers(2, len(data)))
            if kind == 0:  # cut
                del data[at:]
            elif kind == 1:  # flip a bit in the header, where it matters
                at = int(rng.integers(2, min(len(data), 700)))
                data[at] ^= 1 << int(rng.integers(8))
            elif kind == 2:  # a marker, fill bytes or junk
                piece = pieces[int(rng.integers(len(pieces)))] * int(rng.integers(1, 30))
                data[at:at] = piece + rng.bytes(int(rng.integers(0, 5)))
            elif kind == 3:  # a stretch repeated
                end = min(len(data), at + int(rng.integers(1, 200)))
                data[at:at] = data[at:end]
            else:  # a stretch removed
                del data[at : at + int(rng.integers(1, 50))]
            if len(data) < 3:
                data = bytearray(b"\xff\xd8\xff")
        corpus.append(bytes(data))
    return corpus


def _encoded(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


@pytest.mark.compiled
def test_the_c_walk_reports_what_the_python_walk_reports(
    tricks: tuple[Path, dict[str, str]],
) -> None:
    """walk_jpeg_header (prefetch/decode/_c/header_walk.c) against walk_jpeg
    (prefetch/io/_headers.py), for every trick and 3,000 mutated JPEGs, at the default cap and
    at caps small enough to be reached."""
    compiled = window_decode._jpegwindow
    assert compiled is not None
    folder, expected = tricks
    corpus = [(folder / name).read_bytes() for name in expected if name.endswith(".jpg")]
    corpus += mutated_corpus(40, 3000)
    for number, data in enumerate(corpus):
        for cap in (MAX_HEADER_SEGMENTS, 3, 0):
            want = tuple(walk_jpeg(data, cap))
            got = compiled.walk_header(data, cap)
            assert got == want, (number, cap, data[:80])


@pytest.mark.compiled
def test_the_chunk_path_leaves_every_trick_to_the_per_sample_path(
    tricks: tuple[Path, dict[str, str]],
) -> None:
    """It decodes none of them (the per-sample path then refuses each, naming it), and still
    decodes the same file without the trick."""
    folder, expected = tricks
    paths = [str(folder / name) for name in expected]
    plain = folder.parent / "plain.jpg"
    plain.write_bytes(jpeg((300, 200)))
    options = DecodeOptions(32, max_pixels=MAX_PIXELS)
    images = np.zeros((len(paths) + 1, *options.shape), np.uint8)
    done, _ = window_decode.decode_chunk(
        [*paths, str(plain)],
        list(range(len(paths) + 1)),
        list(range(len(paths) + 1)),
        0,
        0,
        RandomResizedCrop(),
        False,
        options,
        images,
    )
    assert done.tolist() == [False] * len(paths) + [True]


@pytest.mark.compiled
def test_both_paths_pass_a_header_at_the_cap_and_refuse_one_past_it(tmp_path: Path) -> None:
    """MAX_HEADER_SEGMENTS segments before the first scan pass the check and the chunk path;
    one more is refused by the check, and the chunk path leaves it (fail closed, both alike)."""
    data = jpeg()
    own = walk_jpeg(data).segments
    paths = []
    for extra, refused in ((0, False), (1, True)):
        padded = hide_frame(data, MAX_HEADER_SEGMENTS - own + extra)
        assert walk_jpeg(padded).segments == MAX_HEADER_SEGMENTS + extra
        if refused:
            with pytest.raises(Image.DecompressionBombError, match="MAX_HEADER_SEGMENTS"):
                check_image_bytes(padded, "past.jpg")
        else:
            check_image_bytes(padded, "at.jpg")
        paths.append(tmp_path / f"{extra}.jpg")
        paths[-1].write_bytes(padded)
    options = DecodeOptions(32)
    images = np.zeros((2, *options.shape), np.uint8)
    done, _ = window_decode.decode_chunk(
        [str(p) for p in paths], [0, 1], [0, 1], 0, 0, RandomResizedCrop(), False, options, images
    )
    assert done.tolist() == [True, False]


# ---------------------------------------------------------------- the loader and the writer

# Runs in a child under an address-space limit: read ROOT with max_pixels=1,000,000, skipping;
# print how many samples were skipped and the peak RSS over the steady state (a first read of
# the good images), of this process and of its worker processes.
CHILD = """
import resource, sys
import prefetch

def run(root):
    augment = prefetch.Augment(crop=prefetch.RandomResizedCrop()) if CROP else None
    policy = prefetch.ErrorPolicy("skip", max_pixels=1_000_000, max_skipped=None)
    with prefetch.Loader(root, batch_size=4, image_size=32, workers=WORKERS, backend=BACKEND,
                         augment=augment, on_error=policy, seed=0) as loader:
        delivered = sum(len(batch.labels) for batch in loader)
        return delivered, loader.stats().skipped

run(GOOD)
steady = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT", *run(BAD))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("PEAK_MB", round((peak - steady) / 1024, 1), "CHILDREN_MB", round(children / 1024, 1))
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("backend", "workers", "crop"),
    [("thread", 2, True), ("thread", 1, False), ("process", 2, True)],
    ids=["thread-chunk", "thread-pillow", "process-chunk"],
)
def test_the_loader_skips_every_trick_and_stays_small(
    tmp_path: Path, backend: str, workers: int, crop: bool
) -> None:
    good = write_image_folder(tmp_path / "good", per_class=4)
    bad = write_image_folder(tmp_path / "bad", per_class=4)
    expected = write_tricks(bad / "circle")
    code = (
        f"GOOD, BAD = {str(good)!r}, {str(bad)!r}\n"
        f"BACKEND, WORKERS, CROP = {backend!r}, {workers}, {crop}\n" + CHILD
    )
    output = run_limited(code, 3 << 30, timeout_s=200)
    print(output)
    found = re.search(r"RESULT (\d+) (\d+)\nPEAK_MB (\S+) CHILDREN_MB (\S+)", output)
    assert found, output
    delivered, skipped, peak, children = (float(v) for v in found.groups())
    assert (delivered, skipped) == (12, len(expected)), output
    assert peak < 300, output
    if backend == "process":  # a worker: the interpreter, numpy, Pillow, and what it decodes
        assert children < 600, output


@pytest.mark.timeout(120)
def test_the_shard_writer_skips_every_trick_and_names_it(
    tricks: tuple[Path, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, expected = tricks
    source = write_image_folder(tmp_path / "images", per_class=2)
    for name in expected:
        (source / "circle" / name).write_bytes((folder / name).read_bytes())
    assert main(["shards", "write", str(source), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    manifests = [p for p in (tmp_path / "out").iterdir() if p.suffix == ".json"]
    assert len(manifests) == 1, list((tmp_path / "out").iterdir())
    listed = json.dumps(json.loads(manifests[0].read_text()))
    for name in expected:
        assert f"circle/{name}" in printed and f"circle/{name}" in listed, (name, printed)
    assert listed.count("over the readers' limits") == len(expected), listed
