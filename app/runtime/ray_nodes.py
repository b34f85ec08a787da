"""Which Ray node each executor actor runs on (RAY_NODES).

A user names a node the way `ray status` and their own inventory show it:
by its node ID or by its IP address; `local` is the daemon's own node
(where an executor's batches take the batch channel, app.runtime.ray_channel).
Actors are placed with node affinity (hard), so a name that matches no
live node, or an IP address that several raylets share (several raylets on
one machine), is an error at start-up rather than an actor waiting forever
for a node that is not there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The RAY_NODES name of the daemon's own node.
LOCAL = "local"


class NodeNotFound(ValueError):
    """A RAY_NODES entry names no single live node."""


def resolve_nodes(
    wanted: Mapping[int, str],
    nodes: Iterable[Mapping[str, Any]],
    devices: Iterable[int],
    local: str | None = None,
) -> dict[int, str]:
    """Executor index → node ID. `nodes` is `ray.nodes()` (dicts with
    "NodeID", "NodeManagerAddress", "Alive"); `devices` the pool's indices;
    `local` the daemon's node ID (what `local` names)."""
    alive = [n for n in nodes if n.get("Alive")]
    ids = {str(n["NodeID"]) for n in alive}
    by_ip: dict[str, list[str]] = {}
    for n in alive:
        by_ip.setdefault(str(n.get("NodeManagerAddress", "")), []).append(str(n["NodeID"]))
    known = sorted(set(devices))
    resolved: dict[int, str] = {}
    for device, name in sorted(wanted.items()):
        if device not in known:
            raise NodeNotFound(f"RAY_NODES names executor {device}; the executors are {known}")
        if name == LOCAL and local is not None:
            name = local
        if name in ids:
            resolved[device] = name
            continue
        matches = by_ip.get(name, [])
        if len(matches) == 1:
            resolved[device] = matches[0]
            continue
        listing = ", ".join(
            f"{n['NodeID'][:12]}… at {n.get('NodeManagerAddress', '?')}" for n in alive
        )
        if matches:
            raise NodeNotFound(
                f"RAY_NODES: {len(matches)} live nodes are at {name} (several raylets on one "
                f"machine); name executor {device}'s node by its ID: {listing}"
            )
        raise NodeNotFound(
            f"RAY_NODES: executor {device}'s node {name!r} is not a live node of the "
            f"cluster ({listing or 'no live nodes'})"
        )
    return resolved
