"""The Ray backend's faults (issue 47): a decode node removed mid-epoch costs only time (its
parts run again elsewhere: every sample once, in order, the process backend's pixels); with
every decode node gone, local workers carry on, or the batches fail within lost_timeout_s; a
killed training process leaves no actor (Ray frees their CPUs); an unreachable cluster is an
error naming its address within connect_timeout_s; another cluster than the one joined is
refused.

One real cluster for the module (tests/ray_cluster.py); the nodes a test removes are its own,
added for it. Nodes are removed the hard way: their raylet and workers killed (SIGKILL).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from ray_cluster import RESOURCE, add_decode_node, running_cluster, wait_ready

import prefetch
from prefetch import testing
from prefetch.testing import SlowDecoder, assert_same_batches, run_python, write_image_folder

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
OPTIONS: dict[str, Any] = {"batch_size": 8, "image_size": 24, "seed": 11}
# A decode long enough that every actor holds parts when its node goes.
SLOW = SlowDecoder(0.03)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from running_cluster(decode_nodes=2, cpus=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("faults"), per_class=40, size=(40, 32))


def collected(stream: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(b.images.copy(), b.labels.copy()) for b in stream]


def place_of(loader: prefetch.Loader, node_id: str) -> prefetch.DecodePlace:
    return next(p for p in loader.stats().decoded_on if p.node_id == node_id)


def test_a_decode_node_removed_mid_epoch_costs_only_time(
    cluster: Any, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected = collected(
        prefetch.Loader(folder, backend="process", workers=2, decoder=SLOW, **OPTIONS)
    )
    doomed = add_decode_node(cluster)
    ray_options = prefetch.RayOptions(resource=RESOURCE)
    loader = prefetch.Loader(folder, backend=ray_options, workers=0, decoder=SLOW, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="prefetch"), loader:
        wait_ready(loader, 0, 3)
        stream = iter(loader)
        got = [(b.images.copy(), b.labels.copy()) for b in [next(stream)]]
        while place_of(loader, doomed.node_id).images == 0:  # it is decoding its parts
            got += [(b.images.copy(), b.labels.copy()) for b in [next(stream)]]
        cluster.remove_node(doomed, allow_graceful=False)
        got += collected(stream)
        lost = place_of(loader, doomed.node_id)
    assert_same_batches(got, expected)  # every sample once, in order, the same pixels
    assert lost.lost_actors == 1 and lost.actors == 0
    again = [r.getMessage() for r in caplog.records if "run again elsewhere" in r.getMessage()]
    assert again and " 0 parts " not in again[0], again


def test_with_every_decode_node_gone_the_local_workers_carry_on(cluster: Any, folder: Path) -> None:
    expected = collected(
        prefetch.Loader(folder, backend="process", workers=2, decoder=SLOW, **OPTIONS)
    )
    only = add_decode_node(cluster, resource="only")
    loader = prefetch.Loader(
        folder, backend=prefetch.RayOptions(resource="only"), workers=1, decoder=SLOW, **OPTIONS
    )
    with loader:
        wait_ready(loader, 1, 1)
        stream = iter(loader)
        got = collected([next(stream), next(stream)])
        cluster.remove_node(only, allow_graceful=False)
        got += collected(stream)
        places = loader.stats().decoded_on
    assert_same_batches(got, expected)
    assert [(p.local, p.lost_actors) for p in places] == [(True, 0), (False, 1)]


def test_with_every_decode_node_gone_and_no_local_worker_the_batches_fail_in_time(
    cluster: Any, folder: Path
) -> None:
    only = add_decode_node(cluster, resource="only")
    ray_options = prefetch.RayOptions(resource="only", lost_timeout_s=3.0)
    loader = prefetch.Loader(folder, backend=ray_options, workers=0, decoder=SLOW, **OPTIONS)
    with loader:
        wait_ready(loader, 0, 1)
        stream = iter(loader)
        next(stream)
        cluster.remove_node(only, allow_graceful=False)
        with pytest.raises(prefetch.WorkerCrashedError, match="lost_timeout_s=3 s") as raised:
            collected(stream)
    assert "no decode actor" in str(raised.value) and "workers >= 1" in str(raised.value)


def test_a_node_that_joins_gets_actors_that_take_parts(cluster: Any, folder: Path) -> None:
    loader = prefetch.Loader(
        folder, backend=prefetch.RayOptions(resource="joins"), workers=1, decoder=SLOW, **OPTIONS
    )
    with loader:
        wait_ready(loader, 1, 0)  # no node with the resource yet: its worker decodes alone
        batches = iter(loader)
        next(batches)
        joined = add_decode_node(cluster, resource="joins")
        deadline = time.monotonic() + 60  # listed within 2 s, then the actor starts
        while time.monotonic() < deadline:
            places = {p.node_id: p for p in loader.stats().decoded_on}
            if places.get(joined.node_id) and places[joined.node_id].images > 0:
                break
            if next(batches, None) is None:
                batches = iter(loader)
        cluster.remove_node(joined)
    assert places[joined.node_id].images > 0, places


DRIVER = """
import sys
import time
import ray
import prefetch
from prefetch.testing import SlowDecoder

ray.init(address=sys.argv[1], log_to_driver=False)
backend = prefetch.RayOptions(resource={resource!r})
loader = prefetch.Loader(
    sys.argv[2], backend=backend, workers=1, decoder=SlowDecoder(0.05), batch_size=4,
    image_size=16,
)
with loader:
    stream = iter(loader)
    next(stream)
    while sum(place.actors for place in loader.stats().decoded_on) < 3:
        time.sleep(0.05)
    print("decoding", flush=True)  # on all 3 actors, until killed
    while True:
        sum(1 for _ in stream)
        stream = iter(loader)
"""


def decode_actors() -> list[psutil.Process]:
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "DecodeActor" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def test_a_killed_training_process_leaves_no_actor_and_frees_their_cpus(
    cluster: Any, folder: Path
) -> None:
    import ray

    free = ray.cluster_resources()["CPU"]
    wait_for(lambda: ray.available_resources().get("CPU", 0) == free)  # earlier tests' gone
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(resource=RESOURCE), cluster.address, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == "decoding\n"
        assert len(decode_actors()) == 3  # its worker here and one actor on each decode node
        assert ray.available_resources().get("CPU", 0) == free - 2
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    # Ray ends a dead driver's actors within seconds.
    wait_for(lambda: not decode_actors() and ray.available_resources().get("CPU", 0) == free)
    assert not decode_actors()
    assert ray.available_resources().get("CPU", 0) == free


def wait_for(condition: Any, limit_s: float = 60.0) -> None:
    """Return once `condition()` holds, or after `limit_s` (the caller asserts it then)."""
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


UNREACHABLE = """
import time
import prefetch
backend = prefetch.RayOptions(address={address!r}, connect_timeout_s=2)
loader = prefetch.Loader({folder!r}, backend=backend)
began = time.monotonic()
try:
    next(iter(loader))
except ConnectionError as error:
    print(f"{{time.monotonic() - began:.1f}} {{error}}")
"""


def test_an_unreachable_cluster_is_an_error_naming_its_address_in_time(folder: Path) -> None:
    address = f"127.0.0.1:{testing.free_ports(1)[0]}"  # nothing listens there
    code = UNREACHABLE.format(address=address, folder=str(folder))
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    seconds, message = result.stdout.split(" ", 1)
    assert address in message and "connect_timeout_s=2" in message
    assert float(seconds) < 2 + 10  # the deadline, and a generous margin on a busy machine


def test_another_cluster_than_the_one_joined_is_refused_naming_both(
    cluster: Any, folder: Path
) -> None:
    address = f"127.0.0.1:{testing.free_ports(1)[0]}"
    loader = prefetch.Loader(folder, backend=prefetch.RayOptions(address=address), **OPTIONS)
    with pytest.raises(ValueError, match="names another cluster") as raised:
        next(iter(loader))
    assert address in str(raised.value) and cluster.address in str(raised.value)
