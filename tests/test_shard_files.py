"""Which files a shard source reads: WebDataset's brace notation (locally and over HTTP) and
folder URLs listed like image folders, against real shards served over loopback HTTP."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import prefetch
from prefetch.sources.shards._files import MAX_BRACE_NAMES, expand_braces
from prefetch.testing import serve_folder, write_image_folder
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.usefixtures("fsspec_io_thread", "private_cache")

COUNT = 24
CLASSES = ["circle", "square", "triangle"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tar shards of 5 samples (5, 5, 5, 5, 4) and TFRecord shards of 10, in one folder."""
    images = write_image_folder(tmp_path_factory.mktemp("images"), per_class=8)
    out = tmp_path_factory.mktemp("shards")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFETCH_CACHE_DIR", str(out.parent / "module-cache"))
        write_shards(images, out, format="tar", shard_size=5)
        write_shards(images, out, format="tfrecord", shard_size=10)
    return out


@pytest.fixture
def served(shards: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A private copy of the shard folder, served over loopback HTTP: (the copy, its URL)."""
    pytest.importorskip("fsspec", reason="the remote extra is not installed")
    copy = tmp_path / "served" / "shards"
    shutil.copytree(shards, copy)
    with serve_folder(copy.parent) as url:
        yield copy, url + "shards/"


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("s-{0000..0002}.tar", ["s-0000.tar", "s-0001.tar", "s-0002.tar"]),
        ("s-{8..11}.tar", ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]),
        ("s-{08..10}", ["s-08", "s-09", "s-10"]),
        ("{3..1}", ["3", "2", "1"]),
        ("x{0..6..3}", ["x0", "x3", "x6"]),
        ("{a,b}-{1,2}", ["a-1", "a-2", "b-1", "b-2"]),
        ("{a,{b,c}d}", ["a", "bd", "cd"]),
        ("train-{x}.tar", ["train-{x}.tar"]),
        ("half-{open.tar", ["half-{open.tar"]),
        ("plain.tar", ["plain.tar"]),
    ],
)
def test_braces_expand_as_webdatasets_braceexpand_does(expression: str, names: list[str]) -> None:
    assert expand_braces(expression) == names


def test_a_brace_range_too_large_is_refused_before_it_is_built() -> None:
    with pytest.raises(ValueError, match=f"more than {MAX_BRACE_NAMES}"):
        expand_braces("s-{0..999999999}.tar")
    with pytest.raises(ValueError, match=f"more than {MAX_BRACE_NAMES}"):
        expand_braces("s-{0..9999}-{0..9999}.tar")


def test_local_braces_name_the_shards_in_order(shards: Path) -> None:
    source = prefetch.TarSource(str(shards / "shard-{000000..000002}.tar"))
    assert [Path(shard).name for shard in source.shards] == [
        "shard-000000.tar",
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    assert len(source) == 15 and source.class_names == CLASSES
    picked = prefetch.TarSource(str(shards / "shard-{000004,000000}.tar"))
    assert [Path(shard).name for shard in picked.shards] == ["shard-000004.tar", "shard-000000.tar"]
    with pytest.raises(FileNotFoundError, match=r"shard-000007\.tar"):
        prefetch.TarSource(str(shards / "shard-{000003..000007}.tar"))


def test_a_path_that_exists_is_a_path_braces_and_all(shards: Path, tmp_path: Path) -> None:
    literal = tmp_path / "set-{a,b}"
    shutil.copytree(shards, literal)
    assert len(prefetch.TarSource(literal)) == COUNT


def test_braces_in_a_url_expand_to_shard_urls(served: tuple[Path, str]) -> None:
    _, url = served
    source = prefetch.TarSource(url + "shard-{000000..000001}.tar")
    assert source.shards == [url + "shard-000000.tar", url + "shard-000001.tar"]
    assert len(source) == 10 and source.streaming
    with prefetch.Loader(source, batch_size=5, image_size=8, workers=1, backend="thread") as made:
        assert sum(len(batch.labels) for batch in made) == 10


def test_a_folder_url_lists_the_folder_and_takes_its_shards_of_the_format(
    served: tuple[Path, str],
) -> None:
    _, url = served
    tar = prefetch.TarSource(url)
    assert tar.shards == [f"{url}shard-{n:06d}.tar" for n in range(5)]
    assert len(tar) == COUNT and tar.class_names == CLASSES
    tfrecord = prefetch.TFRecordSource(url)
    assert tfrecord.shards == [f"{url}shard-{n:05d}-of-00003.tfrecord" for n in range(3)]
    with prefetch.Loader(tar, batch_size=8, image_size=8, workers=2, backend="thread") as made:
        assert sum(len(batch.labels) for batch in made) == COUNT


def test_a_folder_url_missing_a_shard_of_its_manifest_is_refused_naming_it(
    served: tuple[Path, str],
) -> None:
    copy, url = served
    (copy / "shard-000003.tar").unlink()
    with pytest.raises(ValueError, match=r"is missing 'shard-000003\.tar'") as raised:
        prefetch.TarSource(url)
    assert url + "shard-tar.manifest.json" in str(raised.value)
