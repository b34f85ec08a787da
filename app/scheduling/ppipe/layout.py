"""The pools a plan's pipelines run on: device instances, their nodes, and
each stage's latencies per batch size — what the data plane works on.

A plan (app/planning/ppipe/plan.py) says, per pipeline stage, "`devices`
instances of 1/`share` of a `device_class` device".
`app.planning.ppipe.layout.build_layout` makes that concrete (the core
imports nothing outside app/scheduling, so the builder lives beside the
plan):

* physical devices of each class are numbered and laid onto nodes of
  `devices_per_node` devices (per class: the reference plans' clusters put 4
  L4 but 2 T4 on a server), a node per group, classes after one another;
* stages take their instances in plan order: a physical device is cut into
  `share` equal instances, and a stage continues on the leftover instances
  of the previous device of its class when that one was cut into the same
  share (a device is never cut into two different sizes);
* every node has one uplink and one downlink (their reservation tables live
  in the policy); a transfer between instances on the same node uses no link.

Latencies come from the block profiles, not from the plan's figures, because
the data plane probes smaller batch sizes than the planned one (step 2):
`PoolStage.latency[b − 1]` runs blocks [start, end) at batch b on one
instance, `PoolStage.transfer_in[b − 1]` sends the previous stage's output of
a batch of b over one link (0 for the first stage).

These are plain values; nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceInstance:
    """A whole device (share 1) or 1/share of physical device `physical`."""

    id: int
    device_class: str
    share: int
    physical: int
    node: int


@dataclass(frozen=True, slots=True)
class PoolStage:
    """Blocks [start, end) on a pool of same-class, same-share instances."""

    start: int
    end: int
    device_class: str
    share: int
    devices: tuple[int, ...]
    latency: tuple[float, ...]  # [b − 1]: one batch of b on one instance
    transfer_in: tuple[float, ...]  # [b − 1]: the previous stage's output of b
    nodes: frozenset[int] = frozenset()  # the nodes its instances sit on


@dataclass(frozen=True, slots=True)
class PoolPipeline:
    """A pooled pipeline of `model` at planned batch size `batch`."""

    id: int
    model: str
    batch: int
    stages: tuple[PoolStage, ...]
    throughput: float
    # From a stage's end (or its output's arrival) until the next stage can
    # start: nothing across a cluster's links (the transfer is the cost);
    # on one machine, the report through the daemon to the next executor.
    handoff_s: float = 0.0

    def work(self, batch: int) -> float:
        """Compute, transfers and hand-overs of a batch of `batch` with no waiting."""
        handoffs = self.handoff_s * (len(self.stages) - 1)
        return handoffs + sum(s.latency[batch - 1] + s.transfer_in[batch - 1] for s in self.stages)


@dataclass(frozen=True)
class Layout:
    """Instances, nodes and pipelines of a plan, and each model's SLO."""

    devices: tuple[DeviceInstance, ...]
    nodes: int
    pipelines: tuple[PoolPipeline, ...]
    slo_s: Mapping[str, float]
    physical: Mapping[str, int]  # whole devices per class in the cluster

    def pipelines_of(self, model: str) -> list[PoolPipeline]:
        return [p for p in self.pipelines if p.model == model]
