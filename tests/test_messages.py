"""How prefetch words what it prints: counted nouns, short floats (issue 28.14).

A repr or a message says "1 shard", never "1 shards", and shows a float as a person writes it
(`ratio=(0.75, 1.333)`), for the values a user meets first: sources, crops, statistics and the
`shards write` summary.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import prefetch
from prefetch._messages import counted, short
from prefetch.testing import write_image_folder
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("count", "noun", "words"),
    [(1, "shard", "1 shard"), (2, "shard", "2 shards"), (0, "file", "0 files"),
     (1, "class", "1 class"), (3, "class", "3 classes"), (2, "batch", "2 batches")],
)  # fmt: skip
def test_a_count_takes_the_singular_only_for_one(count: int, noun: str, words: str) -> None:
    assert counted(count, noun) == words


def test_floats_are_shown_in_four_significant_digits() -> None:
    assert [short(v) for v in (0.75, 4 / 3, 0.08, 1.0, 0.875)] == [
        "0.75", "1.333", "0.08", "1", "0.875"
    ]  # fmt: skip


def test_crops_show_their_ranges_as_written() -> None:
    assert (
        repr(prefetch.RandomResizedCrop())
        == "RandomResizedCrop(scale=(0.08, 1), ratio=(0.75, 1.333))"
    )
    assert repr(prefetch.CenterCrop()) == "CenterCrop(fraction=0.875)"


def test_sources_of_one_file_shard_and_class_say_so_in_the_singular(tmp_path: Path) -> None:
    folder = write_image_folder(tmp_path / "one", class_names=("a",), per_class=1)
    assert repr(prefetch.ImageFolder(folder)).endswith(": 1 file, 1 class)")
    assert repr(prefetch.FileList([folder / "a" / "a_0000.jpg"], [0], ["a"])) == (
        "FileList(1 file, 1 class)"
    )
    write_shards(folder, tmp_path / "shards", format="tar", shard_size=10)
    assert repr(prefetch.TarSource(str(tmp_path / "shards"))).startswith(
        "TarSource(1 shard, 1 sample, 1 class, "
    )


def test_statistics_of_one_image_one_batch_and_one_worker_read_in_the_singular() -> None:
    stats = prefetch.LoaderStats(
        backend="thread", workers=1, depth=2, epochs=1, batches=1, images=1, elapsed_s=0.5,
        images_per_s=2.0, consumer_wait_s=0.1, consumer_wait_fraction=0.2, producer_busy_s=0.05,
        mean_ready_batches=0.0, skipped=1, skipped_paths=("x.jpg",), reads_in_flight=1,
    )  # fmt: skip
    text = str(stats)
    assert text.startswith("1 image in 1 batch, 2 images/s")
    assert "1 worker busy 10% of the time" in text
    assert "1 sample being read now" in text and text.endswith("1 sample skipped")
    two = str(dataclasses.replace(stats, workers=2, producer_busy_s=0.1))
    assert "2 workers busy 10% of the time" in two
