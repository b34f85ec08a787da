"""probe(): the path of a batch through a pooled pipeline that ends earliest
under the current reservations (ppipe.txt §5.4, Algorithm 2).

Stage by stage, greedily: for every instance of the stage's pool, the
transfer into it starts at the earliest slot free on both the previous
instance's node uplink and this instance's node downlink, the stage at the
earliest slot of its own table after the transfer; the instance whose stage
ends first is taken, and the next stage starts from its end.

A pipeline's hand-over (`PoolPipeline.handoff_s`, 0 on a cluster) is a
fixed delay between a stage's input being there and the stage being able
to start: it is work, not waiting, in step 1's ranking.

Two refinements of the pseudo-code, each for a reason:

* Before the last stage an instance is ranked by when its node's uplink can
  send its output (the end of the stage, or later if that uplink is spoken
  for), not by the end of the stage alone — the artifact's simulator does
  the same (ReservationOffer.reserve): an instance behind a congested
  uplink finishes early but delivers late.
* The scan of a pool stops at the first instance that meets the bound no
  instance can beat (no waiting at all). At low load that is the first idle
  instance, so a probe costs a few table look-ups instead of one per
  instance; the choice is the same as the full scan's (the first instance
  with the least end, as the pseudo-code's strict `<` picks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.scheduling.ppipe.batches import StageRun
from app.scheduling.ppipe.layout import PoolPipeline
from app.scheduling.ppipe.reservations import EPS, ReservationTable, earliest_common_slot

_INF = float("inf")


@dataclass(slots=True)
class Probe:
    """A batch of `batch` on `pipeline` along `steps`: it ends at `finish`,
    having waited `wait` for busy resources in total."""

    pipeline: PoolPipeline
    batch: int
    steps: list[StageRun]
    finish: float
    wait: float


def probe(
    pipeline: PoolPipeline,
    batch: int,
    now: float,
    device_tables: Sequence[ReservationTable],
    uplinks: Sequence[ReservationTable],
    downlinks: Sequence[ReservationTable],
    node_of: Sequence[int],
    alive: Sequence[bool],
    *,
    first_stage: int = 0,
    source_node: int | None = None,
) -> Probe | None:
    """The earliest-ending path of a batch of `batch` through `pipeline`'s
    stages from `first_stage` on, starting at `now` with its input on
    `source_node` (None: at the front end, no transfer). None when a stage
    has no instance up."""
    stages = pipeline.stages
    last = len(stages) - 1
    t_g = now
    work = 0.0
    prev_node = source_node
    steps: list[StageRun] = []
    for k in range(first_stage, last + 1):
        stage = stages[k]
        li = stage.latency[batch - 1]
        ln = stage.transfer_in[batch - 1] if prev_node is not None else 0.0
        ln_next = stages[k + 1].transfer_in[batch - 1] if k < last else 0.0
        up = uplinks[prev_node] if prev_node is not None else None
        best_key = _INF
        best: StageRun | None = None
        best_finish = _INF
        best_work = 0.0
        # No instance can end before the stage runs right after its input
        # arrives (at once on the sender's node, after one transfer elsewhere).
        local = prev_node is not None and prev_node in stage.nodes
        handoff = pipeline.handoff_s if k > 0 else 0.0
        bound = t_g + li + (0.0 if local else ln) + handoff + EPS
        for device in stage.devices:
            if not alive[device]:
                continue
            node = node_of[device]
            t = t_g
            xs: float | None = None
            if up is not None and node != prev_node:
                t = earliest_common_slot((up, downlinks[node]), t, ln)
                xs = t
                t += ln
            s = device_tables[device].earliest_slot(t + handoff, li)
            f = s + li
            key = f
            if ln_next > 0.0:
                key = uplinks[node].earliest_slot(f, ln_next)
            if key < best_key:
                best_key = key
                best_finish = f
                best_work = li + handoff + (ln if xs is not None else 0.0)
                best = StageRun(
                    k,
                    device,
                    node,
                    s,
                    f,
                    xs,
                    None if xs is None else xs + ln,
                    prev_node if xs is not None else None,
                )
                if key <= bound:
                    break
        if best is None:
            return None
        steps.append(best)
        work += best_work
        t_g = best_finish
        prev_node = best.node
    return Probe(pipeline, batch, steps, t_g, t_g - now - work)
