"""The PPipe planner's entry: the plan of a variant — `ppipe` and `np`, the
MILP (milp.py), or `dart-r`, DART-r's chained pairs (dart.py)."""

from __future__ import annotations

from collections.abc import Sequence

from app.planning.ppipe.dart import plan_dart_r
from app.planning.ppipe.milp import PlannerOptions, check_demands, plan_pipelines
from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Cluster, Plan


def plan(
    cluster: Cluster,
    demands: Sequence[ModelDemand],
    options: PlannerOptions | None = None,
    start: Plan | None = None,
) -> Plan:
    """The plan for `demands` on `cluster` in `options.variant` (default
    options: `PlannerOptions()`). `start` (a previous plan of the same
    variant) warm-starts the MILP where its pipelines are options."""
    options = options or PlannerOptions()
    if options.variant == "dart-r":
        check_demands(cluster, demands)
        return plan_dart_r(cluster, demands, options)
    return plan_pipelines(cluster, demands, options, start)


__all__ = ["PlannerOptions", "plan"]
