"""A real Ray cluster on this machine for the Ray backend's tests: one per test module.

`ray.cluster_utils.Cluster` starts a head node and decode nodes, each with its own raylet and
worker processes (all children of the test process, so tests/conftest.py's leak check sees
every actor a test leaves). The head is the test process's own node; decode nodes declare
`RESOURCE`. `running_cluster` joins it (`ray.init`), waits until the processes Ray starts on
its own (idle workers) have settled, so that no test counts them as its leak, and at the end
leaves it, shuts every node down and asserts that no process of Ray's is left.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import psutil

# The custom resource the test clusters' decode nodes declare (RayOptions(resource=...)).
RESOURCE = "prefetch"
# How long Ray's processes get to end after the cluster is shut down.
SHUTDOWN_GRACE_S = 30.0
# Ray tells a node is gone within a second (health checks every 200 ms, 5 missed).
FAST_FAILURE = {"health_check_period_ms": 200, "health_check_failure_threshold": 5}


def of_ray(command: str) -> bool:
    """Whether a process's command line is one of Ray's (a daemon, a worker, an actor)."""
    return "/ray/" in command or "ray::" in command


def ray_processes() -> list[psutil.Process]:
    """The live processes of Ray's under this one (its nodes' daemons, workers, actors)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            if child.status() != psutil.STATUS_ZOMBIE and of_ray(command):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def wait_ready(loader: Any, local: int, remote: int, limit_s: float = 60.0) -> None:
    """Return once `loader` (started) has `local` actors ready on this node and `remote` on
    the others, as its stats say; AssertionError after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        places = loader.stats().decoded_on
        here = sum(p.actors for p in places if p.local)
        there = sum(p.actors for p in places if not p.local)
        if (here, there) == (local, remote):
            return
        time.sleep(0.1)
    raise AssertionError(f"actors not ready after {limit_s} s: {loader.stats().decoded_on}")


def settle(quiet_s: float = 2.0, limit_s: float = 30.0) -> None:
    """Return once this process's children stayed the same for `quiet_s` (or `limit_s`)."""
    deadline = time.monotonic() + limit_s
    seen: set[int] = set()
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        now = {p.pid for p in ray_processes()}
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.1)


def running_cluster(
    decode_nodes: int, cpus: int, head_cpus: int = 0, head_resources: dict[str, float] | None = None
) -> Iterator[Any]:
    """A joined cluster: a head (this process's node, `head_cpus` CPUs and `head_resources`)
    and `decode_nodes` nodes of `cpus` CPUs with `RESOURCE`; everything of it gone at the
    end."""
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": head_cpus,
            "resources": head_resources or {},
            "_system_config": FAST_FAILURE,
        },
    )
    try:
        for _ in range(decode_nodes):
            cluster.add_node(num_cpus=cpus, resources={RESOURCE: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        settle()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while ray_processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [" ".join(p.cmdline())[:80] for p in ray_processes()]
        assert not left, f"processes of Ray left after the cluster shut down: {left}"


def add_decode_node(cluster: Any, cpus: int = 1, resource: str = RESOURCE) -> Any:
    """One more decode node (declaring `resource`), joined and settled."""
    node = cluster.add_node(num_cpus=cpus, resources={resource: 1})
    cluster.wait_for_nodes()
    settle()
    return node


def decode_node_ids() -> list[str]:
    """The ids of the live nodes that declare `RESOURCE`."""
    import ray

    return sorted(
        node["NodeID"]
        for node in ray.nodes()
        if node["Alive"] and node["Resources"].get(RESOURCE, 0) > 0
    )
