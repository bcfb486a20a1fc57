"""The Ray backend keeps the local backends' contract (issue 47): batches in order, every
sample once, the process backend's pixels, a bounded window with backpressure, errors named
with the sample and the node, sample_timeout_s, resume, shards whose ranks share the CPUs,
and stats that say where batches were decoded.

One real cluster for the module (tests/ray_cluster.py): this process's node (the head, no
CPUs: the loader's `workers` run there, reserving none) and two decode nodes of 2 CPUs each,
every node with its own raylet and worker processes. Nothing of Ray is mocked.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ray_cluster import RESOURCE, decode_node_ids, running_cluster, wait_ready

import prefetch
from prefetch.backends import RayOptions
from prefetch.backends._ray_cluster import Node, placement
from prefetch.testing import (
    HangingDecoder,
    RecordingDecoder,
    SlowDecoder,
    assert_same_batches,
    run_python,
    serve_folder,
    write_bad_files,
    write_image_folder,
)
from prefetch.tools.shards import write_shards

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
CROP = prefetch.Augment(crop=prefetch.RandomResizedCrop(), flip=True)
OPTIONS: dict[str, Any] = {"batch_size": 8, "image_size": 24, "seed": 7}
DECODE_NODES = 2
CPUS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from running_cluster(DECODE_NODES, CPUS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("ray"), per_class=20, size=(40, 32))


def ray_backend(**options: Any) -> RayOptions:
    return RayOptions(resource=RESOURCE, **options)


def epochs(
    loader: prefetch.Loader, count: int, ready: tuple[int, int] | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` epochs of `loader`, copied; with `ready` (local, remote), once that many of its
    actors are ready."""
    with loader:
        if ready is not None:
            wait_ready(loader, *ready)
        return [(b.images.copy(), b.labels.copy()) for _ in range(count) for b in loader]


def test_batches_equal_the_process_backends_in_order_pixel_for_pixel(
    cluster: Any, folder: Path
) -> None:
    expected = epochs(prefetch.Loader(folder, augment=CROP, backend="process", **OPTIONS), 2)
    loader = prefetch.Loader(folder, augment=CROP, backend=ray_backend(), workers=1, **OPTIONS)
    assert_same_batches(epochs(loader, 2, ready=(1, DECODE_NODES * CPUS)), expected)
    places = loader.stats().decoded_on
    assert places[0].local and places[0].actors == 1, "the loader's one worker, on this node"
    assert {p.node_id for p in places if not p.local} <= set(decode_node_ids())


def test_stats_say_where_batches_were_decoded_and_at_what_rate(cluster: Any, folder: Path) -> None:
    loader = prefetch.Loader(folder, backend=ray_backend(), workers=1, **OPTIONS)
    with loader:
        wait_ready(loader, 1, DECODE_NODES * CPUS)
        for _ in range(3):
            sum(1 for _ in loader)
        stats = loader.stats()
    assert stats.backend == "ray"
    local, *remote = stats.decoded_on
    assert local.local and local.actors == 1
    assert len(remote) == DECODE_NODES and all(p.actors == CPUS for p in remote)
    decoded = sum(p.images for p in stats.decoded_on)  # and the next epoch's first batches
    assert 3 * 60 <= decoded <= 3 * 60 + stats.in_flight * OPTIONS["batch_size"]
    assert all(p.images_per_s > 0 for p in stats.decoded_on if p.images)
    assert "decoded on this node (1 actor)" in str(stats)
    assert f"{CPUS * DECODE_NODES} decode actors on {DECODE_NODES} other nodes" in (
        loader.backend_reason
    )


def test_a_state_taken_mid_epoch_resumes_with_the_same_following_batches(
    cluster: Any, folder: Path
) -> None:
    expected = epochs(prefetch.Loader(folder, augment=CROP, backend="process", **OPTIONS), 2)
    first = prefetch.Loader(folder, augment=CROP, backend=ray_backend(), workers=1, **OPTIONS)
    with first:
        stream = iter(first)
        head = [(b.images.copy(), b.labels.copy()) for _, b in zip(range(3), stream, strict=False)]
        state = first.state_dict()
        stream.close()
    assert_same_batches(head, expected[:3])
    resumed = prefetch.Loader(folder, augment=CROP, backend=ray_backend(), workers=1, **OPTIONS)
    resumed.load_state_dict(state)
    with resumed:
        rest = [(b.images.copy(), b.labels.copy()) for _ in range(2) for b in resumed]
    assert_same_batches(rest, expected[3:])


def test_the_ranks_of_a_job_share_the_decode_cpus_and_their_shards_cover_the_epoch(
    cluster: Any, folder: Path
) -> None:
    loaders = []
    for rank in range(2):
        loader = prefetch.Loader(folder, backend=ray_backend(), workers=1, **OPTIONS)
        loader.shard(2, rank)
        loaders.append(loader)
    with loaders[0], loaders[1]:
        for loader in loaders:  # each rank: half of each 2-CPU node, so every actor starts
            wait_ready(loader, 1, DECODE_NODES * CPUS // 2)
        places = [loader.stats().decoded_on for loader in loaders]
        seen = [sum(len(b.labels) for b in loader) for loader in loaders]
    for got in places:
        assert sorted(p.actors for p in got if not p.local) == [1] * DECODE_NODES, got
    assert seen == [30, 30]


def test_placement_gives_eight_ranks_each_node_once_between_them() -> None:
    nodes = [Node("a", "10.0.0.1", 64), Node("b", "10.0.0.2", 3), Node("c", "10.0.0.3", 2)]
    shares = [placement(nodes, None, 8, rank) for rank in range(8)]
    for node in nodes:
        assert sum(share[node.node_id] for share in shares) == node.cpus
    totals = [sum(share.values()) for share in shares]
    assert max(totals) - min(totals) <= 1, totals
    asked = placement(nodes, 10, 1, 0)
    assert sum(asked.values()) == 10 and asked["a"] >= 8


def test_a_slow_consumer_holds_the_decoding_to_the_window(cluster: Any, folder: Path) -> None:
    recorder = RecordingDecoder(folder.parent / "starts.log")
    loader = prefetch.Loader(
        folder, backend=ray_backend(cpus=1), workers=0, decoder=recorder, shuffle=False, **OPTIONS
    )
    with loader:
        stream = iter(loader)
        next(stream)
        time.sleep(3.0)  # the consumer trains on its first batch
        window = loader.stats().in_flight
        started = len(recorder.starts())
        stream.close()
    # The delivered batch, and the window of batches in flight: nothing decoded beyond.
    assert started <= (1 + window) * OPTIONS["batch_size"], (started, window)
    assert window < 60 // OPTIONS["batch_size"], "a window smaller than the epoch"


def test_a_bad_file_raises_at_its_batch_naming_it_and_the_node_or_is_skipped(
    cluster: Any, tmp_path: Path
) -> None:
    root = write_image_folder(tmp_path / "tree", per_class=4, size=(40, 32))
    bad = list(write_bad_files(root / "circle", kinds=("truncated",)).values())
    loader = prefetch.Loader(root, backend=ray_backend(), workers=0, shuffle=False, **OPTIONS)
    with pytest.raises(Exception) as raised, loader:
        sum(1 for _ in loader)
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert str(bad[0]) in notes and "ray actor prefetch-ray-" in notes and " on node " in notes
    skipping = prefetch.Loader(
        root, backend=ray_backend(), workers=0, shuffle=False, on_error="skip", **OPTIONS
    )
    with skipping:
        count = sum(len(b.labels) for b in skipping)
    assert count == 12 and skipping.stats().skipped_paths == (str(bad[0]),)


def test_a_sample_that_never_returns_times_out_naming_it(cluster: Any, tmp_path: Path) -> None:
    root = write_image_folder(tmp_path / "tree", per_class=4, size=(40, 32))
    (tmp_path / "arrivals").mkdir()
    hanging = HangingDecoder(tmp_path / "arrivals")
    policy = prefetch.ErrorPolicy(sample_timeout_s=2.0)
    loader = prefetch.Loader(
        root, backend=ray_backend(), workers=0, decoder=hanging, on_error=policy, **OPTIONS
    )
    with (
        pytest.raises(prefetch.SampleTimeoutError, match=r"sample_timeout_s=2\.0") as raised,
        loader,
    ):
        next(iter(loader))
    assert str(root) in str(raised.value)
    assert any("prefetch: stopped ray actor" in note for note in raised.value.__notes__)


@pytest.mark.usefixtures("fsspec_io_thread", "private_cache")
def test_urls_and_shards_are_read_by_the_nodes_themselves_with_the_same_pixels(
    cluster: Any, folder: Path, tmp_path: Path
) -> None:
    shards = tmp_path / "shards"
    write_shards(folder, shards, format="tar", shard_size=16, shuffle=False)
    with serve_folder(folder) as files, serve_folder(shards) as served:
        # Files over HTTP, and shard members by byte range: each actor reads them itself,
        # given only sample indices. (The loopback server answers no range request: URL
        # shards by byte range are the same reads, of another kind of Location.)
        cached = {"remote": prefetch.RemoteOptions(cache_dir=tmp_path / "copies")}
        for source, more in ((files, {}), (files, cached), (prefetch.TarSource(shards), {})):
            expected = epochs(
                prefetch.Loader(source, augment=CROP, backend="process", **OPTIONS), 1
            )
            loader = prefetch.Loader(
                source, augment=CROP, backend=ray_backend(), workers=0, **OPTIONS, **more
            )
            assert_same_batches(epochs(loader, 1), expected)
            if more:  # the actors read every object through cache_dir
                stats = loader.stats()
                assert stats.cache_misses + stats.cache_hits == 60, (
                    stats.cache_hits,
                    stats.cache_misses,
                )
        # Streamed (the default for URL shards): whole shards are fetched into a spool here.
        streamed = prefetch.Loader(prefetch.TarSource(served), backend=ray_backend(), **OPTIONS)
        with pytest.raises(ValueError, match="streaming=False") as raised, streamed:
            pass  # refused as the workers start
    assert "spool on this host" in str(raised.value)


@pytest.mark.timeout(180)  # 20 s beside two busy loops; then its actors' processes end
def test_a_sample_that_never_returns_is_skipped_with_on_error_skip(
    cluster: Any, tmp_path: Path
) -> None:
    root = write_image_folder(tmp_path / "tree", per_class=4, size=(40, 32))
    stuck = sorted((root / "square").iterdir())[2]
    hanging = SlowDecoder(3600.0, marker=stuck.name)  # a read that never returns
    policy = prefetch.ErrorPolicy("skip", sample_timeout_s=2.0)
    loader = prefetch.Loader(
        root, backend=ray_backend(), workers=1, decoder=hanging, on_error=policy, **OPTIONS
    )
    with loader:
        count = sum(len(b.labels) for b in loader)
        stats = loader.stats()
    assert count == 11 and stats.skipped_paths == (str(stuck),)
    assert sum(p.lost_actors for p in stats.decoded_on) == 1  # stopped, and replaced


def test_a_path_no_decode_node_can_read_is_an_error_naming_the_node_and_the_path(
    cluster: Any, tmp_path: Path
) -> None:
    root = write_image_folder(tmp_path / "tree", per_class=4, size=(40, 32))
    loader = prefetch.Loader(root, backend=ray_backend(), workers=0, shuffle=False, **OPTIONS)
    gone = sorted((root / "circle").iterdir())[1]
    gone.unlink()  # listed, then unreadable where the actors read it
    with pytest.raises(FileNotFoundError) as raised, loader:
        sum(1 for _ in loader)
    note = " ".join(raised.value.__notes__)
    assert str(gone) in note and " on node " in note and "(id " in note


def test_ray_missing_is_an_error_that_names_the_extra(folder: Path) -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import prefetch\n"
        f"loader = prefetch.Loader({str(folder)!r}, backend=prefetch.RayOptions())\n"
        "try:\n"
        "    next(iter(loader))\n"
        "except ModuleNotFoundError as error:\n"
        "    print(error)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert 'pip install "prefetch[ray]"' in result.stdout, result.stdout


@pytest.mark.parametrize(
    "options, named",
    [
        ({"cpus": -1}, "cpus must be an int >= 0"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"connect_timeout_s": 0}, "connect_timeout_s must be a number of seconds > 0"),
        ({"resource": ""}, "resource must be the name of a custom resource"),
        ({"address": ""}, "address must be a Ray cluster's address"),
    ],
)
def test_a_bad_ray_option_is_refused_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        prefetch.RayOptions(**options)


def test_the_loader_takes_ray_options_and_refuses_what_does_not_go_with_them(folder: Path) -> None:
    with pytest.raises(TypeError, match="did you mean address"):
        prefetch.RayOptions(adress="10.0.0.1:6379")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="workers='auto' tunes"):
        prefetch.Loader(folder, backend=prefetch.RayOptions(), workers="auto")
    with pytest.raises(ValueError, match="workers must be an int >= 1"):
        prefetch.Loader(folder, backend="process", workers=0)  # none here: only with Ray
    assert prefetch.Loader(folder, backend="ray", workers=0).options.ray == prefetch.RayOptions()
