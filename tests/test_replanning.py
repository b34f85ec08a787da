"""Re-planning while serving (REPLAN_S, app/server/replanning.py): the
partition made again from measured rates is taken up only when it is
better enough, and REPLAN_S without a partition plan says it is not acted on."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from app.planning.herd.plan import HerdPlan, ServingGroup
from app.server.herd_replanning import IDLE_RATE, herd_replan
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.replanning import Replanner
from app.server.settings import Settings
from tests.test_core_groups import partition_plan
from tests.test_statistics import emulated_repository


def _settings(repository: Path, **overrides) -> Settings:
    return Settings(repository=repository, cpu_slices=0, emulated_devices=2, **overrides)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_re_plan_is_taken_up_when_the_rates_unbalance_the_plan_and_kept_otherwise(
    tmp_path: Path,
):
    repository = emulated_repository(tmp_path / "models", dict.fromkeys("abcd", 1.0))
    plan = partition_plan(tmp_path / "partition.json", [("a", "b"), ("c", "d")])
    service = LiveService(_settings(repository, plan=plan), Metrics())
    await service.start()
    try:
        replanner = Replanner(service, service.apply_plan, 1.0, 0.2, service.profile_index)
        x = np.ones((1, 4), dtype=np.float32)
        for model in "abcd":
            await service.infer(model, {"x": x})
        assert replanner.counts() == dict.fromkeys("abcd", 1)
        # a and b busy, c and d idle: both busy models on one sub-cluster
        switched = await replanner.replan({"a": 100.0, "b": 90.0, "c": 1.0, "d": 2.0})
        assert switched is not None and switched["kind"] == "symphony-partition"
        groups = sorted(tuple(g["models"]) for g in switched["groups"])
        # the best balance: 100 r/s against 93 (a alone, the rest together)
        assert groups == [("a",), ("b", "c", "d")], groups
        in_force = service.plan_in_force()
        assert in_force is not None and in_force["setting"] == "POST /v2/plan"
        assert in_force["made_from"]["command"] == "REPLAN_S=1 REPLAN_GAIN=0.2"
        assert in_force["made_from"]["rates"] == {"a": 100.0, "b": 90.0, "c": 1.0, "d": 2.0}
        assert in_force["made_from"]["inputs"] == ["REPLAN_S"]
        assert in_force["made_from"]["made_at"].endswith("Z")  # as a planner's, UTC
        # the same rates again: the plan in force is as good, so it is kept
        assert await replanner.replan({"a": 100.0, "b": 90.0, "c": 1.0, "d": 2.0}) is None
        assert replanner.taken_up == 1
        answers = [await service.infer(model, {"x": x}) for model in "abcd"]
        assert all(a.device.startswith("emulated:") for a in answers)
    finally:
        await service.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_replan_s_without_a_partition_plan_is_said_not_acted_on(tmp_path: Path, caplog):
    repository = emulated_repository(tmp_path / "models", {"a": 1.0})
    service = LiveService(_settings(repository, replan_s=5.0), Metrics())
    with caplog.at_level(logging.WARNING, logger="app.server"):
        await service.start()
    try:
        assert service._replanning is None
        assert "REPLAN_S=5 is not acted on" in caplog.text
        assert "it re-plans the plan in force" in caplog.text
        assert "this server serves none" in caplog.text
    finally:
        await service.stop()


def _herd_plan(path: Path, groups: list[tuple[list[int], list[str]]]) -> Path:
    # `shared`: a group's burst tolerance counts its other members' load (the
    # `paper` reading does not, and so cannot tell these groupings apart).
    plan = HerdPlan(
        "ilp", "shared", tuple(ServingGroup(tuple(d), tuple(m), (), 1.0) for d, m in groups)
    )
    path.write_text(json.dumps(plan.to_dict()))
    return path


@pytest.mark.slow
@pytest.mark.anyio
async def test_herd_groups_are_made_again_when_the_rates_leave_one_group_short(tmp_path: Path):
    """a and b busy in one group of two devices, c and d idle in the other:
    HERD's groups on the measured rates raise the least burst tolerance, so
    they are taken up; the same rates again keep them."""
    repository = emulated_repository(tmp_path / "models", dict.fromkeys("abcd", 1.0), slo_ms=200)
    plan = _herd_plan(tmp_path / "herd.json", [([0, 1], ["a", "b"]), ([2, 3], ["c", "d"])])
    settings = dataclasses.replace(_settings(repository, plan=plan), emulated_devices=4)
    service = LiveService(settings, Metrics())
    await service.start()
    try:
        replanner = service.replanner(1.0, 0.2)
        rates = {"a": 300.0, "b": 250.0, "c": 1.0, "d": 0.0}
        found = herd_replan(
            plan, service.device_index(), service.profile_index(), rates, dict.fromkeys("abcd")
        )
        assert found.rates == {"a": 300.0, "b": 250.0, "c": 1.0, "d": IDLE_RATE}
        assert found.found >= found.kept + 0.2, (found.kept, found.found)
        switched = await replanner.replan(rates)
        assert switched is not None and switched["kind"] == "herd-plan"
        groups = {tuple(g["models"]): g["devices"] for g in switched["groups"]}
        assert set().union(*map(set, groups)) == set("abcd")
        assert len(groups) > 1 and not any({"a", "b"} <= set(m) for m in groups), groups
        in_force = service.plan_in_force()
        assert in_force is not None and in_force["setting"] == "POST /v2/plan"
        assert in_force["made_from"]["command"] == "REPLAN_S=1 REPLAN_GAIN=0.2"
        assert await replanner.replan(rates) is None  # as good as itself: kept
        assert replanner.taken_up == 1
        x = np.ones((1, 4), dtype=np.float32)
        answers = [await service.infer(model, {"x": x}) for model in "abcd"]
        assert all(a.device.startswith("emulated:") for a in answers)
    finally:
        await service.stop()


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.usefixtures("no_leftover_segments")
async def test_an_inss_placement_short_of_a_measured_rate_is_made_again_and_moves_models(
    tmp_path: Path,
):
    """a and b on halves of emulated:0, c alone on emulated:1; then a gets
    200 r/s, more than half a device serves (8 / 56 ms = 143 r/s at its
    largest batch) and less than a whole one (286 r/s). InSS's placement on
    the measured rates serves all three, so it is taken up — a model moved,
    share executors added and removed — and the same rates again keep it."""
    from app.server.inss_replanning import IDLE_RATE, inss_replan
    from tests.fakes import inss_plan

    repository = emulated_repository(tmp_path / "models", dict.fromkeys("abc", 1.0), slo_ms=200)
    plan = inss_plan(
        tmp_path / "inss.json",
        {"a": ("emulated:0", 0.5, 8), "b": ("emulated:0", 0.5, 1), "c": ("emulated:1", 1.0, 1)},
    )
    settings = dataclasses.replace(_settings(repository, plan=plan), policy="inss")
    service = LiveService(settings, Metrics())
    await service.start()
    try:
        replanner = service.replanner(1.0, 0.1)
        rates = {"a": 200.0, "b": 1.0, "c": 0.0}
        found = inss_replan(
            plan, service.device_index(), service.profile_index(), rates, dict.fromkeys("abc")
        )
        assert found.rates == {"a": 200.0, "b": 1.0, "c": IDLE_RATE}
        assert found.kept.served == 2 and found.found.served == 3, (found.kept, found.found)
        assert found.better_by(0.1)
        placed = {m.model: (m.device, m.share) for m in found.plan.models}
        assert placed["a"][1] == 1.0, placed  # a has a device of its own
        switched = await replanner.replan(rates)
        assert switched is not None and switched["kind"] == "inss-plan"
        assert switched["added"] or switched["removed"], switched
        in_force = service.plan_in_force()
        assert in_force is not None and in_force["setting"] == "POST /v2/plan"
        assert in_force["made_from"]["command"] == "REPLAN_S=1 REPLAN_GAIN=0.1"
        assert service.plan is not None and service.plan.inss is not None
        a_on = service.plan.inss.device_of["a"]
        assert "/" not in a_on, a_on  # a on a whole device
        assert await replanner.replan(rates) is None  # as good as itself: kept
        assert replanner.taken_up == 1
        x = np.ones((1, 4), dtype=np.float32)
        answers = {m: await service.infer(m, {"x": x}) for m in "abc"}
        assert answers["a"].device == a_on
        assert {answers["b"].device, answers["c"].device}.isdisjoint({a_on})
    finally:
        await service.stop()


def test_an_inss_re_plan_wins_by_models_served_first_then_by_its_gain_in_throughput():
    from app.server.inss_replanning import InssReplan, Score

    def replan(kept: Score, found: Score) -> InssReplan:
        return InssReplan(kept, found, {}, None)  # type: ignore[arg-type]

    assert replan(Score(2, 500.0), Score(3, 100.0)).better_by(0.1)  # one more at its rate
    assert not replan(Score(3, 100.0), Score(2, 500.0)).better_by(0.1)
    assert replan(Score(3, 100.0), Score(3, 110.0)).better_by(0.1)  # +10 %: taken up
    assert not replan(Score(3, 100.0), Score(3, 109.0)).better_by(0.1)  # within the noise


def test_the_live_benchs_herd_plans_pair_a_busy_model_with_a_quiet_one_in_each_phase():
    from bench.replanning_live import PHASE_RATES, groups_of, herd_plan

    first, second = (herd_plan(rates) for rates in PHASE_RATES)
    assert groups_of(first) == [["m0", "m1"], ["m2", "m3"]]
    assert groups_of(second) == [["m0", "m2"], ["m1", "m3"]]
    assert first["plan"]["objective"] == "shared"


def test_the_live_benchs_inss_plans_put_the_two_busy_models_apart_in_each_phase():
    from bench.replanning_live import PHASE_RATES, groups_of, inss_plan

    first, second = (inss_plan(rates) for rates in PHASE_RATES)
    # phase 1: m0 and m2 busy, each beside a quiet model, in turn on the
    # whole device; phase 2 (m1 busy, m2 quiet): m0 and m1 apart
    assert groups_of(first) == [["m0 1", "m1 1"], ["m2 1", "m3 1"]]
    assert groups_of(second) == [["m0 1", "m2 1"], ["m1 1", "m3 1"]]
    assert first["plan"]["feasible"] and second["plan"]["feasible"]


@pytest.mark.slow
def test_the_simulated_herd_replanning_bench_takes_up_a_better_plan_at_the_shift(tmp_path: Path):
    from bench.replanning import main

    out = tmp_path / "herd.json"
    assert (
        main(
            [
                *("--herd", "--phases", "2", "--phase-s", "2", "--epoch-s", "1"),
                *("--time-limit-s", "0.5"),  # HiGHS's incumbent at 0.5 s already gains ≫ 0.2
                *("--json", str(out)),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["planner"] == "herd" and report["sent"] > 10_000
    assert report["switches"] and all(s["gain"] >= 0.2 for s in report["switches"])
    goodput = report["goodput_rps"]
    assert goodput["re-planned"] > goodput["fixed"]


def test_the_simulated_inss_replanning_bench_takes_up_a_placement_serving_more_at_the_shift(
    tmp_path: Path,
):
    from bench.replanning import main

    out = tmp_path / "inss.json"
    argv = ["--inss", "--phases", "2", "--phase-s", "2", "--epoch-s", "1", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["planner"] == "inss" and report["sent"] > 5_000
    # phase 2's rates: the placement in force serves fewer models at them
    # than InSS's new one (a gain of +inf: models served come first)
    (switch,) = report["switches"]
    assert switch["after_epoch"] == 3 and switch["gain"] == float("inf") and switch["moves"] > 0
    goodput = report["goodput_rps"]
    assert goodput["fixed"] < goodput["re-planned"] <= goodput["hindsight"]


@pytest.mark.anyio
async def test_an_epoch_whose_rates_no_plan_fits_is_one_warning_and_the_loop_goes_on(caplog):
    class Statistics:
        def report(self) -> dict:
            return {"model_stats": []}

    class Service:
        statistics = Statistics()
        plan = None

    async def apply(body: bytes) -> dict:
        raise AssertionError("nothing is applied")

    replanner = Replanner(Service(), apply, 0.01, 0.2, list)  # type: ignore[arg-type]
    tries = []

    async def no_plan_fits(rates: dict[str, float]) -> None:
        tries.append(rates)
        raise ValueError("stream 'a' needs 3.2 devices; groups hold at most 2")

    replanner.replan = no_plan_fits  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="app.server"), pytest.raises(TimeoutError):
        await asyncio.wait_for(replanner.run(), 0.1)
    assert len(tries) >= 2  # it went on after the first
    assert "no re-plan on the rates measured: stream 'a' needs 3.2 devices" in caplog.text
    assert "Traceback" not in caplog.text
