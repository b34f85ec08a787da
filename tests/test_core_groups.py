"""Scheduling cores from a plan (CORE_GROUPS): HERD's serving groups by
device index, Symphony's sub-clusters dealt the devices in order, the
refusals, and a live service forming one core per group."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from app.planning.herd.plan import HerdPlan, ServingGroup
from app.planning.herd.plan import write_plan as write_herd
from app.planning.partition.plan import (
    PartitionPlan,
    SolverResult,
    SubCluster,
)
from app.planning.partition.plan import (
    write_plan as write_partition,
)
from app.repository.config import ModelConfig
from app.runtime.devices import ExecutorDevice
from app.server.core_groups import CoreGroupsError, apply_core_groups, plan_groups
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from tests.fakes import emulated_config
from tests.test_statistics import emulated_repository

DEVICES = [ExecutorDevice(i, "emulated", f"emulated:{i}") for i in range(5)]


def herd_plan(path: Path, groups: list[tuple[tuple[int, ...], tuple[str, ...]]]) -> Path:
    plan = HerdPlan(
        "ilp",
        "paper",
        tuple(
            ServingGroup(devices, models, (i,), 2.0) for i, (devices, models) in enumerate(groups)
        ),
    )
    write_herd(plan, path)
    return path


def partition_plan(path: Path, clusters: list[tuple[str, ...]]) -> Path:
    plan = PartitionPlan(
        tuple(SubCluster(j, models, 100.0, 1e8, 1e7) for j, models in enumerate(clusters)),
        r_max=1000.0,
        s_max_bytes=1e9,
        w=1.0,
        c_max=None,
        objective=0.0,
        load_imbalance=0.0,
        memory_imbalance=0.0,
        moves=(),
        change_cost=0.0,
        removed=(),
        result=SolverResult("milp", "optimal", 0.1, 10.0),
    )
    write_partition(plan, path)
    return path


def configs(*names: str) -> dict[str, ModelConfig]:
    return {n: emulated_config(name=n) for n in names}


def test_a_herd_plan_puts_each_group_on_its_devices_by_index(tmp_path: Path) -> None:
    path = herd_plan(tmp_path / "h.json", [((0, 1, 2), ("a", "b")), ((3,), ("c",))])
    assert plan_groups(path, DEVICES) == [
        (("a", "b"), ["emulated:0", "emulated:1", "emulated:2"]),
        (("c",), ["emulated:3"]),
    ]
    placed = apply_core_groups(path, configs("a", "b", "c"), DEVICES)
    assert {n: c.devices for n, c in placed.items()} == {
        "a": ("emulated:0", "emulated:1", "emulated:2"),
        "b": ("emulated:0", "emulated:1", "emulated:2"),
        "c": ("emulated:3",),
    }


def test_a_partition_plan_deals_the_devices_out_in_order(tmp_path: Path) -> None:
    path = partition_plan(tmp_path / "p.json", [("a",), ("b", "c")])
    # 5 devices over 2 sub-clusters: 3 and 2.
    assert plan_groups(path, DEVICES) == [
        (("a",), ["emulated:0", "emulated:1", "emulated:2"]),
        (("b", "c"), ["emulated:3", "emulated:4"]),
    ]
    with pytest.raises(CoreGroupsError, match="3 sub-clusters need at least as many devices"):
        plan_groups(partition_plan(tmp_path / "q.json", [("a",), ("b",), ("c",)]), DEVICES[:2])


def test_plans_that_do_not_fit_the_server_are_refused_naming_why(tmp_path: Path) -> None:
    path = herd_plan(tmp_path / "h.json", [((0, 1), ("a", "b")), ((7,), ("c",))])
    with pytest.raises(
        CoreGroupsError, match=r"group 1 names devices \[7\], but this server has 5"
    ):
        plan_groups(path, DEVICES)
    path = herd_plan(tmp_path / "h2.json", [((0,), ("a", "zzz"))])
    with pytest.raises(CoreGroupsError, match=r"models \['zzz'\] are not in the repository"):
        apply_core_groups(path, configs("a"), DEVICES)
    # A model in no group runs on the devices no group names; a partition plan names all.
    placed = apply_core_groups(
        herd_plan(tmp_path / "h3.json", [((0, 1, 2), ("a",))]), configs("a", "b"), DEVICES
    )
    assert placed["a"].devices == ("emulated:0", "emulated:1", "emulated:2")
    assert placed["b"].devices == ("emulated:3", "emulated:4")
    with pytest.raises(CoreGroupsError, match=r"model 'b' of the repository is in no group"):
        apply_core_groups(
            partition_plan(tmp_path / "p3.json", [("a",)]), configs("a", "b"), DEVICES
        )
    other = tmp_path / "other.json"
    other.write_text('{"kind": "inss-plan", "version": 1}')
    with pytest.raises(CoreGroupsError, match="kind 'inss-plan' is not a plan of groups"):
        plan_groups(other, DEVICES)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(CoreGroupsError, match="CORE_GROUPS="):
        plan_groups(broken, DEVICES)


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_segments")
def test_the_daemon_forms_one_flex_core_per_serving_group(tmp_path: Path) -> None:
    repository = emulated_repository(tmp_path / "models", {"a": 1.0, "b": 2.0, "c": 1.0})
    path = herd_plan(tmp_path / "h.json", [((0, 1), ("a", "b")), ((2, 3), ("c",))])
    settings = Settings(
        repository=repository, cpu_slices=0, emulated_devices=4, policy="flex", core_groups=path
    )

    async def scenario() -> tuple[list[tuple[list[str], tuple[int, ...], str]], list[str]]:
        service = LiveService(settings, Metrics())
        await service.start()
        try:
            assert service.dispatcher is not None
            groups = [
                (sorted(g.models), g.devices, g.scheduler.name) for g in service.dispatcher.groups
            ]
            x = np.ones((1, 4), dtype=np.float32)
            answers = await asyncio.gather(
                *(service.infer(m, {"x": x}) for m in ("a", "b", "c") for _ in range(5))
            )
            return groups, [r.device for r in answers]
        finally:
            await service.stop()

    groups, served_on = asyncio.run(scenario())
    assert sorted(groups) == [(["a", "b"], (0, 1), "flex"), (["c"], (2, 3), "flex")]
    assert set(served_on[:10]) <= {"emulated:0", "emulated:1"}
    assert set(served_on[10:]) <= {"emulated:2", "emulated:3"}
