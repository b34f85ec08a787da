"""What each executor actor asks of the Ray cluster, fitted to what its
nodes have (mixed into nothing: plain functions `RayExecutorPool` calls).

An actor asks for `num_gpus=1` (a GPU), `num_cpus=threads` (a CPU slice:
its ONNX Runtime threads) or nothing (an emulated device). The daemon
counts a CPU slice's threads from *its own* cores; on a cluster the actor
runs on a node that may have fewer. So, unless THREADS_PER_SLICE says how
many, a CPU slice's threads are fitted to the nodes it may run on: at most
the CPUs of the largest such node (the node RAY_NODES names, else any live
node). With THREADS_PER_SLICE set the actor asks for exactly that many.

A request no live node can meet would wait in Ray's queue forever (Ray
calls it infeasible and says so only in its own logs); start-up stops at
once instead, naming the executor, what it asked for and what each node
offers (`infeasible`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.errors import ExecutorFailed
from app.runtime.devices import ExecutorDevice

# The resources a request is checked for (Ray's names).
CPU, GPU = "CPU", "GPU"


class ActorInfeasible(ExecutorFailed):
    """No live node of the cluster has what an executor's actor asks for."""


@dataclass(frozen=True)
class NodeOffer:
    """One live node: its id, address, and total resources (`ray.nodes()`)."""

    node_id: str
    address: str
    resources: Mapping[str, float] = field(default_factory=dict)

    def has(self, request: Mapping[str, float]) -> bool:
        return all(self.resources.get(k, 0.0) >= v for k, v in request.items() if v > 0)

    def describe(self) -> str:
        cpu = _number(self.resources.get(CPU, 0.0))
        gpu = _number(self.resources.get(GPU, 0.0))
        return f"node {self.node_id[:12]}… at {self.address}: {cpu} CPU, {gpu} GPU"


def offers_of(nodes: Iterable[Mapping[str, Any]]) -> list[NodeOffer]:
    """The live nodes of `ray.nodes()`."""
    return [
        NodeOffer(
            str(n["NodeID"]),
            str(n.get("NodeManagerAddress", "?")),
            {str(k): float(v) for k, v in dict(n.get("Resources") or {}).items()},
        )
        for n in nodes
        if n.get("Alive")
    ]


def candidates(offers: Sequence[NodeOffer], node: str | None) -> list[NodeOffer]:
    """The nodes an actor may run on: its RAY_NODES node, else every one."""
    return list(offers) if node is None else [o for o in offers if o.node_id == node]


def fitted(device: ExecutorDevice, offers: Sequence[NodeOffer], node: str | None) -> ExecutorDevice:
    """`device` with a CPU slice's threads cut to the CPUs of the largest
    node it may run on (at least 1); other devices unchanged."""
    if device.kind != "cpu":
        return device
    most = max((int(o.resources.get(CPU, 0.0)) for o in candidates(offers, node)), default=0)
    if most < 1 or device.threads <= most:
        return device
    return replace(device, threads=most)


def request_of(device: ExecutorDevice) -> dict[str, float]:
    """The resources the device's actor asks Ray for."""
    if device.kind == "cuda":
        return {GPU: 1.0}
    if device.kind == "cpu":
        return {CPU: float(device.threads)}
    return {CPU: 0.0}


def describe(request: Mapping[str, float]) -> str:
    asked = [f"{_number(v)} {k}" for k, v in request.items() if v > 0]
    return ", ".join(asked) or "no CPU or GPU"


def infeasible(
    device: ExecutorDevice,
    request: Mapping[str, float],
    offers: Sequence[NodeOffer],
    node: str | None,
    *,
    fitted_threads: bool,
) -> str | None:
    """Why no live node can run the device's actor (None: some node can)."""
    places = candidates(offers, node)
    if any(o.has(request) for o in places):
        return None
    where = "its RAY_NODES node" if node is not None else "any live node"
    listing = "; ".join(o.describe() for o in offers) or "no live nodes"
    hint = ""
    if device.kind == "cpu" and not fitted_threads:
        hint = " (THREADS_PER_SLICE sets it; unset, the threads are fitted to the nodes)"
    elif device.kind == "cuda":
        hint = " (CPU_SLICES and EMULATED_DEVICES run without a GPU)"
    return (
        f"executor {device.name}: its Ray actor asks for {describe(request)}{hint}, "
        f"more than {where} has ({listing})"
    )


def _number(value: float) -> str:
    return f"{value:g}"
