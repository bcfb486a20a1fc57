"""The Ray backend's view of the cluster: joining it, its decode nodes, and each one's actors.

`import_ray` imports Ray or says which extra installs it. `connect` joins the cluster that
`RayOptions.address` names (or keeps the one `ray.init` already joined): an address that does
not answer within `connect_timeout_s` is an error that names it. `decode_nodes` lists the
live nodes other than this process's own that may run decode actors (those with CPUs and, with
`RayOptions.resource`, that resource), and `placement` how many actors this loader runs on
each: as asked (`RayOptions.cpus`, spread by the nodes' CPUs), or this rank's share of every
node's CPUs among the job's ranks (`rank_share`), so the ranks together take each node's CPUs
once. Pure functions of what Ray reports, besides `connect`; nothing here holds a lock.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prefetch._extras import require
from prefetch.backends._options import RayOptions


def import_ray() -> ModuleType:
    """Ray, or ModuleNotFoundError naming the extra that installs it."""
    return require(
        "ray",
        adapter="backend=RayOptions(...)",
        framework="Ray",
        extra="ray",
        alternative='pip install "ray>=2.60"; the thread and process backends need no Ray',
    )


def connect(ray: Any, options: RayOptions) -> bool:
    """Join the cluster at `options.address` unless this process has joined one (`ray.init`);
    returns whether this call joined it (then the backend leaves it when it closes).

    Raises ConnectionError naming the address when nothing answers there within
    `connect_timeout_s`, and ValueError when this process already joined another cluster.
    """
    if ray.is_initialized():
        joined = str(ray.get_runtime_context().gcs_address)
        if options.address is not None and not _same_address(options.address, joined):
            raise ValueError(
                f"RayOptions(address={options.address!r}) names another cluster than the one "
                f"this process joined with ray.init ({joined}): a process joins one Ray "
                "cluster; pass address=None to decode there, or ray.init that address"
            )
        return False
    address = options.address or os.environ.get("RAY_ADDRESS") or "auto"
    if address != "auto" and "://" not in address:
        _probe(address, options.connect_timeout_s)
    try:
        ray.init(address=address, log_to_driver=True)
    except ConnectionError as error:
        where = "no address given, RAY_ADDRESS unset" if address == "auto" else address
        raise ConnectionError(
            f"backend=RayOptions(...) could not join a Ray cluster ({where}): {error}. Start "
            "one (ray start --head) and pass RayOptions(address=...), or call ray.init first"
        ) from error
    return True


def _probe(address: str, timeout_s: float) -> None:
    """ConnectionError naming `address` ("host:port") unless a TCP connection to it opens
    within `timeout_s`."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"RayOptions(address={address!r}) is not a Ray cluster's address: pass "
            "'host:port' as `ray start --head` prints it (e.g. '10.0.0.1:6379')"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except OSError as error:
        raise ConnectionError(
            f"the Ray cluster at {address} did not answer within connect_timeout_s="
            f"{timeout_s:g} ({error}): is its head node running (ray start --head), and is "
            "the address and port the one it printed?"
        ) from error


def _same_address(given: str, joined: str) -> bool:
    """Whether two "host:port" addresses name the same endpoint (hosts resolved)."""

    def resolved(address: str) -> tuple[str, str]:
        host, _, port = address.rpartition(":")
        try:
            return socket.gethostbyname(host.strip("[]")), port
        except OSError:
            return host, port

    return given == joined or resolved(given) == resolved(joined)


@dataclass(frozen=True)
class Node:
    """A live node of the cluster that may run decode actors: its id, address and CPUs."""

    node_id: str
    ip: str
    cpus: int


def decode_nodes(ray: Any, options: RayOptions, own_node: str) -> list[Node]:
    """The live nodes other than `own_node` with CPUs and, with `options.resource`, that
    resource, in a fixed order (by node id)."""
    found = []
    for node in ray.nodes():
        resources = node.get("Resources", {})
        if not node.get("Alive") or node["NodeID"] == own_node:
            continue
        if options.resource is not None and resources.get(options.resource, 0) <= 0:
            continue
        cpus = int(resources.get("CPU", 0))
        if cpus > 0:
            found.append(Node(node["NodeID"], str(node.get("NodeManagerAddress", "?")), cpus))
    return sorted(found, key=lambda node: node.node_id)


def rank_share(cpus: int, ranks: int, rank: int) -> int:
    """Rank `rank`'s part of `cpus` among `ranks`: an equal part, and one more for `cpus %
    ranks` of them, so the parts add up to `cpus`."""
    return cpus // ranks + (1 if rank % ranks < cpus % ranks else 0)


def placement(nodes: list[Node], asked: int | None, ranks: int, rank: int) -> dict[str, int]:
    """How many decode actors this loader runs on each of `nodes` (by node id).

    With `asked`, that many, spread over the nodes in proportion to their CPUs (largest
    remainders first); else (None) this rank's share of each node's CPUs among `ranks`
    (`rank_share`), the extra CPUs of each node going to the ranks after those that took the
    previous node's, so that the ranks' totals differ by at most one.
    """
    if asked is None:
        shares, offset = {}, 0
        for node in nodes:
            shares[node.node_id] = rank_share(node.cpus, ranks, rank - offset)
            offset += node.cpus % ranks
        return shares
    total = sum(node.cpus for node in nodes)
    if not nodes or total == 0:
        return {}
    exact = [asked * node.cpus / total for node in nodes]
    counts = [int(share) for share in exact]
    by_remainder = sorted(range(len(nodes)), key=lambda k: (counts[k] - exact[k], k))
    for k in by_remainder[: asked - sum(counts)]:
        counts[k] += 1
    return {node.node_id: count for node, count in zip(nodes, counts, strict=True)}
