"""The twins held together: every file of a mutated JPEG corpus (`prefetch.testing.corpus`) gets
the same pixels, or the same refusal naming it, from the compiled chunk path
(`prefetch.decode.decode_chunk`, as the worker's `SampleReader` calls it) and from the
per-sample path (`decode_window`, one file at a time), in any chunk order and split, on any
backend; and the per-sample path gives each file what its bytes deserve (`CorpusFile.expect`).

`PREFETCH_CORPUS_COUNT` sets the corpus's size (default `DEFAULT_CORPUS_COUNT`); `make
sanitize` runs this file with several thousand files against the extension built with
AddressSanitizer and UBSan. A failure lists every file that differs: its seed, its mutation,
and both outcomes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefetch
import prefetch.sample._reader as reader_module
from prefetch.decode import DecodeOptions, decode_image
from prefetch.decode import _window as window_decode
from prefetch.plan import Augment, CenterCrop, Crop, RandomResizedCrop
from prefetch.sample import BatchTask, SampleReader, Slot
from prefetch.testing.corpus import (
    CORPUS_MAX_PIXELS,
    DECODED,
    DEFAULT_CORPUS_COUNT,
    REFUSED,
    SAME,
    TOO_LARGE,
    CorpusFile,
    write_jpeg_corpus,
)

COUNT = int(os.environ.get("PREFETCH_CORPUS_COUNT", DEFAULT_CORPUS_COUNT))
TARGET = (16, 16)  # small: DCT scales 1/2 and 1/4 are used for the larger windows
SEED, EPOCH = 40, 0  # the loaders' seed and first epoch
CROPS: dict[str, Crop] = {"random": RandomResizedCrop(), "center": CenterCrop(0.8)}
ORDERS = ("written", "reversed", "shuffled-1", "shuffled-2")
# Rows per read_into call (the reader calls decode_chunk for up to CHUNK_ROWS of them at once:
# 32); "all": the whole corpus in one read_into and one decode_chunk call.
SPLITS = (1, 3, 32, "all")

pytestmark = [
    # Scaled with the corpus: about 10 s for 300 files on 2 busy cores, several times that
    # under the sanitizers.
    pytest.mark.timeout(120 + COUNT // 5),
    pytest.mark.compiled,
]


@dataclass(frozen=True)
class Outcome:
    """What a path gave one file: its row's pixels (a digest), or the refusal's type."""

    pixels: str | None
    refusal: str | None = None

    def __str__(self) -> str:
        return f"pixels {self.pixels}" if self.pixels is not None else f"refused {self.refusal}"


def pixels_of(row: np.ndarray) -> Outcome:
    return Outcome(hashlib.sha1(row.tobytes()).hexdigest()[:12])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[CorpusFile]:
    return write_jpeg_corpus(tmp_path_factory.mktemp("corpus"), COUNT)


def keep(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A transform that changes nothing: with it the reader takes the per-sample path."""
    return image


def file_list(paths: list[Path]) -> prefetch.FileList:
    """`paths` as a source whose label is each file's number in the corpus."""
    return prefetch.FileList(paths, list(range(len(paths))), [str(i) for i in range(len(paths))])


def make_reader(paths: list[Path], crop: Crop, chunked: bool) -> SampleReader:
    """The worker's reader of `paths` with `crop` (flipped), skipping what fails: the chunk
    path first (`chunked`), or one sample at a time (a transform: `keep`)."""
    return SampleReader(
        source=file_list(paths),
        decoder=decode_image,
        options=DecodeOptions(TARGET, max_pixels=CORPUS_MAX_PIXELS),
        skip_errors=True,
        labelled=True,
        num_classes=len(paths),
        augment=Augment(crop, flip=True, transform=None if chunked else keep),
    )


def read(reader: SampleReader, order: list[int], split: int) -> dict[int, Outcome]:
    """Each file's outcome, reading the files in `order`, `split` rows per read_into call.
    A refused file must be named by its skip record."""
    count = len(order)
    images, labels = np.zeros((count, *TARGET, 3), np.uint8), np.full(count, -1, np.int32)
    slot = Slot(images, labels, started=np.zeros(count))
    task = BatchTask(np.asarray(order, np.int64), EPOCH, SEED)
    refused: dict[int, Outcome] = {}
    for start in range(0, count, split):
        outcome = reader.read_into(task, slot, start, min(count, start + split), "differential")
        for skipped in outcome.skipped:
            index = order[skipped.position]
            assert skipped.path == reader.describe(index), (skipped.path, index)
            refused[index] = Outcome(None, type(skipped.error).__name__)
    found = {}
    for position, index in enumerate(order):
        if index not in refused:
            assert slot.labels[position] == index, (position, index)
        found[index] = refused.get(index) or pixels_of(slot.images[position])
    return found


def ordered(name: str, count: int) -> list[int]:
    if name == "written":
        return list(range(count))
    if name == "reversed":
        return list(range(count))[::-1]
    return np.random.default_rng(int(name[-1])).permutation(count).tolist()


@pytest.fixture(scope="module")
def per_sample(corpus: list[CorpusFile]) -> dict[str, dict[int, Outcome]]:
    """Every file's outcome on the per-sample path, for each crop (read in the corpus's order,
    and checked against a shuffled read: the path is stateless)."""
    paths = [each.path for each in corpus]
    outcomes = {}
    for name, crop in CROPS.items():
        reader = make_reader(paths, crop, chunked=False)
        outcomes[name] = read(reader, ordered("written", len(paths)), len(paths))
        again = read(reader, ordered("shuffled-1", len(paths)), 3)
        assert again == outcomes[name], report(corpus, outcomes[name], {"shuffled": again})
    return outcomes


def report(
    corpus: list[CorpusFile], want: dict[int, Outcome], runs: dict[str, dict[int, Outcome]]
) -> str:
    """Every file whose outcome in some run differs from `want` (the per-sample path's): the
    file, its seed and mutation, both outcomes, and in how many runs it differed; then the
    counts by mutation."""
    lines, kinds = [], Counter()
    for index, each in enumerate(corpus):
        differing = {run: got[index] for run, got in runs.items() if got[index] != want[index]}
        if differing:
            run, got = next(iter(differing.items()))
            lines.append(
                f"  {each.describe()}: per-sample path {want[index]}; {run}: {got} "
                f"(differs in {len(differing)} of {len(runs)} runs)"
            )
            kinds[each.mutation.split("@")[0]] += 1
    summary = ", ".join(f"{kind}: {n}" for kind, n in kinds.most_common())
    return f"{len(lines)} of {len(corpus)} files differ ({summary}):\n" + "\n".join(lines)


@pytest.mark.parametrize("crop", list(CROPS))
def test_every_file_gets_the_per_sample_outcome_in_any_chunk_order_and_split(
    corpus: list[CorpusFile],
    per_sample: dict[str, dict[int, Outcome]],
    crop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunk path (decode_chunk with the per-sample path for what it leaves) gives each
    file the per-sample path's pixels or refusal, whatever files share its chunk."""
    paths = [each.path for each in corpus]
    reader = make_reader(paths, CROPS[crop], chunked=True)
    runs = {}
    for order_name in ORDERS:
        order = ordered(order_name, len(paths))
        for split in SPLITS:
            with monkeypatch.context() as patch:
                if split == "all":  # one decode_chunk call for the whole corpus
                    patch.setattr(reader_module, "CHUNK_ROWS", len(paths))
                rows = len(paths) if split == "all" else int(split)
                runs[f"chunk path, {order_name} order, {split} a call"] = read(reader, order, rows)
    want = per_sample[crop]
    assert all(got == want for got in runs.values()), report(corpus, want, runs)


@pytest.mark.parametrize("crop", list(CROPS))
def test_every_file_gets_what_its_bytes_deserve(
    corpus: list[CorpusFile], per_sample: dict[str, dict[int, Outcome]], crop: str
) -> None:
    """Seeds decode; a file without DHT, or with runs of markers or fill bytes, decodes to its
    seed's pixels (the standard tables; no run hides a frame); a file without DQT, a 12-bit
    frame or a truncated header is refused; a frame over the pixel bound is refused as one,
    however many markers precede it."""
    got = per_sample[crop]
    twins = [each.origin or each.path for each in corpus]  # a SAME file's seed, at its index
    seeds = read(make_reader(twins, CROPS[crop], chunked=False), list(range(len(twins))), 64)
    unmet, kinds = [], Counter()
    for index, each in enumerate(corpus):
        outcome, expect = got[index], each.expect
        wrong = (
            (expect == DECODED and outcome.pixels is None)
            or (expect == SAME and (outcome.pixels is None or outcome != seeds[index]))
            or (expect == REFUSED and outcome.refusal is None)
            or (expect == TOO_LARGE and outcome.refusal != "DecompressionBombError")
        )
        if wrong:
            seed = f", its seed {seeds[index]}" if expect == SAME else ""
            unmet.append(f"  {each.describe()}: {outcome}{seed}")
            kinds[each.mutation.split("@")[0]] += 1
    summary = ", ".join(f"{kind}: {n}" for kind, n in kinds.most_common())
    assert not unmet, f"{len(unmet)} files not as expected ({summary}):\n" + "\n".join(unmet)


@pytest.mark.parametrize(
    ("backend", "crop"), [("thread", "random"), ("thread", "center"), ("process", "random")]
)
def test_a_loader_gives_every_file_the_per_sample_outcome(
    corpus: list[CorpusFile],
    per_sample: dict[str, dict[int, Outcome]],
    backend: str,
    crop: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real Loader (shuffled, two workers sharing each batch's rows, files skipped and
    logged by name) delivers each file's per-sample pixels, and skips exactly the files the
    per-sample path refuses, with the same error."""
    paths = [each.path for each in corpus]
    loader = prefetch.Loader(
        file_list(paths),
        batch_size=13,
        image_size=TARGET,
        seed=SEED,
        workers=2,
        backend=backend,
        augment=Augment(CROPS[crop], flip=True),
        on_error=prefetch.ErrorPolicy("skip", max_pixels=CORPUS_MAX_PIXELS),
    )
    got: dict[int, Outcome] = {}
    with caplog.at_level(logging.WARNING, logger="prefetch.loader"), loader:
        for images, labels in loader:
            for image, label in zip(images, labels.tolist(), strict=True):
                got[label] = pixels_of(image)
    named = {str(path): index for index, path in enumerate(paths)}
    for record in caplog.records:
        if record.name == "prefetch.loader" and record.msg.startswith("prefetch skipped"):
            path, error = record.args  # type: ignore[misc]
            got[named[path]] = Outcome(None, type(error).__name__)
    assert sorted(got) == list(range(len(paths)))
    want = per_sample[crop]
    assert got == want, report(corpus, want, {f"Loader({backend!r})": got})


def test_the_compiled_entry_points_take_every_file_or_refuse_it(
    corpus: list[CorpusFile],
) -> None:
    """header() and entropy_decode_rows() of every corpus file return or raise ValueError
    (under `make sanitize`: with no memory error)."""
    compiled: Any = window_decode._jpegwindow
    rng = np.random.default_rng(3)
    answered = 0
    for each in corpus:
        data = each.path.read_bytes()
        try:
            width, height, _, _ = compiled.header(data)
            if width * height > CORPUS_MAX_PIXELS:  # a benchmark's tool: no bound of its own
                continue
            rows = compiled.entropy_decode_rows(data, int(rng.integers(0, max(1, height))))
            assert 0 < rows <= height and width > 0
            answered += 1
        except ValueError:
            pass
    assert answered > len(corpus) // 3


def test_the_corpus_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    """Seeded and deterministic: the same files, bytes and expectations twice; every seed
    and every structured case is there."""
    first = write_jpeg_corpus(tmp_path / "a", 260)
    second = write_jpeg_corpus(tmp_path / "b", 260)
    assert [(f.path.name, f.expect) for f in first] == [(f.path.name, f.expect) for f in second]
    pairs = zip(first, second, strict=True)
    assert all(a.path.read_bytes() == b.path.read_bytes() for a, b in pairs)
    mutations = Counter(each.mutation for each in first)
    seeds = mutations["no-DQT"]
    assert seeds >= 20 and mutations["no-DHT"] == mutations["com-run-300"] == seeds
    assert sum(each.expect == SAME for each in first) >= seeds
