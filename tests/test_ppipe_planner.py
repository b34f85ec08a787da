"""PPipe's planner (app/planning/ppipe/milp.py and friends): hand-made
problems whose optimum is worked out below, and reference plans of the
PPipe artifact re-solved to their published objective."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.planning.ppipe.cli import main as plan_main
from app.planning.ppipe.options import ModelDemand
from app.planning.ppipe.plan import Cluster, read_plan
from app.planning.ppipe.planner import PlannerOptions, plan
from app.planning.ppipe.profiles import BUNDLED_DIR, BlockProfile
from app.planning.ppipe.reference import reference_problem, resolve_reference

REFERENCES = BUNDLED_DIR / "plans-maf19"
MS = 1e-3


def two_block_model(name: str = "m", cut_bytes: float = 0.0) -> BlockProfile:
    """Two blocks at batch 1 only: 2 + 2 ms on H, 6 + 6 ms on L."""
    return BlockProfile(
        name,
        {("H", 1): np.array([[2 * MS], [2 * MS]]), ("L", 1): np.array([[6 * MS], [6 * MS]])},
        np.array([cut_bytes]),
    )


def demand(profile: BlockProfile, budget_ms: float = 10.0, weight: float = 1.0) -> ModelDemand:
    return ModelDemand(profile.model, weight, 2 * budget_ms * MS, profile, budget_ms * MS)


#: no batch-building wait, so that the numbers below are plain
PLAIN = PlannerOptions(batch_build_factor=0.0, time_limit_s=10.0)
H1_L2 = Cluster({"H": 1, "L": 2}, bandwidth_gbps=1.0)


# ------------------------------------------------------------ hand-made problems


def test_cutting_lets_slow_devices_serve_and_the_optimum_is_the_hand_computed_one():
    # Whole model: 4 ms on H (250 req/s), 12 ms on L (> the 10 ms budget).
    # Cut after block 0, L→H or H→L: 6 + 2 = 8 ms ≤ 10; per instance L does
    # 1000/6 = 166.7 req/s of its half, H 500. One H and two L: a pipeline
    # H ×1 → L ×2 (or L ×2 → H ×1) serves min(500, 2 × 166.7) = 333.3 req/s,
    # more than 250 from the H alone; the L devices alone can serve nothing.
    result = plan(H1_L2, [demand(two_block_model())], PLAIN)
    assert result.objective == pytest.approx(1000 / 3, rel=1e-6)
    assert result.details["status"] == "optimal" and result.gap <= 1e-4
    (pipeline,) = result.pipelines  # the other slots stay inactive
    assert [(s.start, s.end) for s in pipeline.stages] == [(0, 1), (1, 2)]
    assert sorted((s.device_class, s.devices) for s in pipeline.stages) == [("H", 1), ("L", 2)]
    assert pipeline.latency_s == pytest.approx(8 * MS)
    assert result.devices_used() == {"H": 1.0, "L": 2.0}


def test_np_never_cuts_and_uses_only_what_meets_the_slo_whole():
    result = plan(H1_L2, [demand(two_block_model())], replace(PLAIN, variant="np"))
    assert result.objective == pytest.approx(250.0)
    assert all(len(p.stages) == 1 for p in result.pipelines)
    assert [(s.start, s.end, s.device_class, s.share) for s in result.pipelines[0].stages] == [
        (0, 2, "H", 1)
    ]


def test_the_slo_excludes_a_cut_whose_transfer_does_not_fit():
    # 375 kB at 1 Gbit/s = 3 ms: 6 + 3 + 2 = 11 ms > 10, so no cut fits and
    # only H running the whole model remains: 250 req/s.
    result = plan(H1_L2, [demand(two_block_model(cut_bytes=375_000))], PLAIN)
    assert result.objective == pytest.approx(250.0)
    assert all(len(p.stages) == 1 for p in result.pipelines)
    # with a budget of 11.5 ms it fits again; now the link caps each instance
    # at 1 / 3 ms = 333.3 req/s of what crosses the cut: L ×2 → H ×1 serves
    # min(333.3, 500 and its link 333.3) = 333.3.
    result = plan(H1_L2, [demand(two_block_model(cut_bytes=375_000), budget_ms=11.5)], PLAIN)
    assert result.objective == pytest.approx(1000 / 3, rel=1e-6)


def test_device_counts_bound_the_plan():
    # With one L, a cut pipeline serves min(500, 166.7): less than H alone.
    one_l = Cluster({"H": 1, "L": 1}, bandwidth_gbps=1.0)
    result = plan(one_l, [demand(two_block_model())], PLAIN)
    assert result.objective == pytest.approx(250.0)
    # Four H: whole-model pipelines on all four, 1000 req/s, never a fifth.
    four_h = Cluster({"H": 4, "L": 0}, bandwidth_gbps=1.0)
    result = plan(four_h, [demand(two_block_model())], PLAIN)
    assert result.objective == pytest.approx(1000.0)
    assert result.devices_used()["H"] == pytest.approx(4.0)


def test_weights_share_the_devices_max_min():
    # Two copies of the model, weights 1 and 3, on 4 H (250 req/s each as
    # whole models): the worst throughput ÷ weight is best with 1 H and 3 H,
    # 250 / 1 = 750 / 3 = 250.
    four_h = Cluster({"H": 4}, bandwidth_gbps=1.0)
    models = [
        demand(two_block_model("a"), weight=1.0),
        demand(two_block_model("b"), weight=3.0),
    ]
    result = plan(four_h, models, PLAIN)
    assert result.objective == pytest.approx(250.0)
    assert [m.throughput for m in result.models] == pytest.approx([250.0, 750.0])


def one_block_on_halves(name: str) -> BlockProfile:
    """One block: 2 ms on a whole H, 4 ms on half an H."""
    return BlockProfile(
        name, {("H", 1): np.array([[2 * MS]]), ("H", 2): np.array([[4 * MS]])}, np.array([])
    )


def test_each_models_stage_rounds_up_to_whole_devices_as_the_artifact_does():
    # Two models on one H. Sharing the H as two halves would give each
    # 250 req/s; but a model's stages on a class round up to whole devices
    # (the artifact's force_sum_gpu_integer_per_partition), so one model
    # gets nothing and the objective is 0 — unless that rule is off.
    cluster = Cluster({"H": 1}, bandwidth_gbps=1.0)
    models = [demand(one_block_on_halves("a")), demand(one_block_on_halves("b"))]
    assert plan(cluster, models, PLAIN).objective == pytest.approx(0.0)
    relaxed = plan(cluster, models, replace(PLAIN, integer_devices_per_stage=False))
    assert relaxed.objective == pytest.approx(250.0)
    assert {(p.model, p.stages[0].share, p.stages[0].devices) for p in relaxed.pipelines} == {
        ("a", 2, 1),
        ("b", 2, 1),
    }


def test_a_model_nothing_can_serve_leaves_every_slot_inactive():
    # Budget 3 ms: no option (4 ms whole on H, 8 ms cut) fits; the program
    # stays feasible with every slot inactive and plans nothing.
    result = plan(H1_L2, [demand(two_block_model(), budget_ms=3)], PLAIN)
    assert result.details["status"] == "optimal"
    assert result.pipelines == () and result.objective == 0.0


def test_the_batch_building_wait_counts_against_the_slo():
    # Batch 2 takes 5 ms on H (400 req/s); at an estimated 100 req/s the
    # artifact's wait is 1.3 × (2 − 1) / 100 = 13 ms: 18 ms > a 10 ms budget,
    # so batch 1 (4 ms, 250 req/s) is planned; without the wait, batch 2.
    profile = BlockProfile(
        "m", {("H", 1): np.array([[2 * MS, 2.5 * MS], [2 * MS, 2.5 * MS]])}, np.array([0.0])
    )
    cluster = Cluster({"H": 1}, bandwidth_gbps=1.0)
    waiting = replace(demand(profile), est_throughput=100.0)
    result = plan(cluster, [waiting], replace(PLAIN, batch_build_factor=1.3))
    assert result.objective == pytest.approx(250.0) and result.pipelines[0].batch == 1
    result = plan(cluster, [demand(profile)], PLAIN)
    assert result.objective == pytest.approx(400.0) and result.pipelines[0].batch == 2


def test_bad_options_and_demands_are_refused():
    with pytest.raises(ValueError, match="variant"):
        PlannerOptions(variant="fast")
    with pytest.raises(ValueError, match="max_partitions"):
        PlannerOptions(max_partitions=4)
    with pytest.raises(ValueError, match="weight"):
        demand(two_block_model(), weight=0.0)
    with pytest.raises(ValueError, match="none of the cluster's classes"):
        plan(Cluster({"X": 3}, 1.0), [demand(two_block_model())], PLAIN)
    with pytest.raises(ValueError, match="exactly two"):
        plan(Cluster({"H": 3}, 1.0), [demand(two_block_model())], replace(PLAIN, variant="dart-r"))


# ------------------------------------------------------------ reference plans

V4 = "colorization-v2-googlenet-v3-pytorch-repvgg-b3_0.3-0.33-0.37_L4-T4_25-75_bw-gbps-10_sla-multiplier-5_v4.json"  # noqa: E501
BL = "fsaf_r101_fpn_1x_coco-nonlocal_r101-d8_4xb2-40k_cityscapes-512x1024-tf_efficientdet_d1_0.3-0.33-0.37_V100-P4_25-75_bw-gbps-6_sla-multiplier-5_bl.json"  # noqa: E501
DART = "colorization-v2-googlenet-v3-pytorch-repvgg-b3_0.3-0.33-0.37_L4-T4_25-75_bw-gbps-10_sla-multiplier-5_dart-r.json"  # noqa: E501
HARD = "efficientnet-b8_3rdparty_8xb32-aa-advprop_in1k-encnet_r101-d8_4xb2-40k_cityscapes-512x1024-rtmdet_x_8xb32-300e_coco_0.3-0.33-0.37_V100-T4_25-75_bw-gbps-10_sla-multiplier-5_v4.json"  # noqa: E501


@pytest.mark.parametrize("name", [V4, BL, DART])
def test_reference_plans_are_re_solved_to_their_objective(name):
    report = resolve_reference(REFERENCES / name, BUNDLED_DIR, time_limit_s=20.0)
    assert report["gap"] == pytest.approx(0.0, abs=0.01), report
    assert report["objective"] > 0
    kinds = {"_v4": "ppipe", "_bl": "np", "_dart-r": "dart-r"}
    assert report["variant"] == next(v for k, v in kinds.items() if name.endswith(k + ".json"))


def test_a_reference_problem_takes_its_inputs_from_the_file():
    problem = reference_problem(REFERENCES / V4, BUNDLED_DIR)
    assert problem.cluster.classes == {"L4": 25, "T4": 75}
    assert problem.options.shares == {"L4": (1, 2, 3, 4), "T4": (1, 2, 3, 4)}
    assert problem.options.devices_per_node == {"L4": 4, "T4": 2}
    first = problem.demands[0]
    # sla 71752.36 µs less hist_adjustment 28701 µs
    assert first.budget_s == pytest.approx((71752.36 - 28701) * 1e-6, rel=1e-6)
    assert first.est_throughput == pytest.approx(837.359, rel=1e-5)


def test_a_time_limit_returns_the_incumbent_with_its_gap_and_a_warm_start_keeps_it():
    problem = reference_problem(REFERENCES / HARD, BUNDLED_DIR)
    demands = list(problem.demands)
    rushed = plan(problem.cluster, demands, replace(problem.options, time_limit_s=0.01))
    assert rushed.details["status"] == "time-limit"
    assert rushed.details["warm_start"] == "np plan"
    # the incumbent is at least the NP plan it started from, and the bound
    # is above it by the reported gap
    assert rushed.objective > 0 and rushed.gap > 0
    assert rushed.details["bound"] >= rushed.objective
    # started from an optimal plan, the same limit keeps its objective
    best = problem.reference
    restarted = plan(problem.cluster, demands, replace(problem.options, time_limit_s=0.01), best)
    assert restarted.details["warm_start"] == "given plan"
    assert restarted.objective == pytest.approx(best.objective, rel=1e-6)


# ------------------------------------------------------------ the command


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return plan_main(argv, out, err), out.getvalue(), err.getvalue()


def test_reference_mode_prints_one_json_object():
    timings = str(BUNDLED_DIR / "block-timing")  # its parent is meant; both are accepted
    code, out, _ = run(
        ["ppipe", "--reference", str(REFERENCES / V4), "--timings", timings, "--time-limit", "20"]
    )
    assert code == 0
    report = json.loads(out)
    assert report["objective"] == pytest.approx(report["reference_objective"], rel=0.01)
    for key in ("gap", "mip_gap", "runtime_s", "reference_runtime_s", "pipelines"):
        assert key in report
    assert sum(p["throughput"] for p in report["pipelines"]) > 0


def test_plan_mode_reads_yaml_prints_and_writes_a_plan(tmp_path: Path):
    config = tmp_path / "cluster.yaml"
    config.write_text(
        f"""
cluster: {{classes: {{L4: 2, T4: 6}}, bandwidth_gbps: 10, devices_per_node: {{L4: 4, T4: 2}}}}
timings: {BUNDLED_DIR}
models:
  - {{name: repvgg-b3, weight: 0.5, slo_multiple: 5}}
  - {{name: googlenet-v3-pytorch, weight: 0.5, slo_ms: 30}}
planner: {{time_limit_s: 20}}
"""
    )
    out_file = tmp_path / "plan.json"
    code, out, err = run(["ppipe", str(config), "--out", str(out_file)])
    assert code == 0, err
    assert "objective" in out and "repvgg-b3" in out
    written = read_plan(out_file)
    assert written.variant == "ppipe" and written.objective > 0
    assert {m.name for m in written.models} == {"repvgg-b3", "googlenet-v3-pytorch"}
    assert written.models[1].slo_s == pytest.approx(0.030)
    used = written.devices_used()
    assert used["L4"] <= 2 and used["T4"] <= 6
    code, _, err = run(["ppipe", str(config), "--variant", "np"])
    assert code == 0, err


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("cluster: {classes: {L4: 2}, bandwidth_gbps: 10}\nmodels: []\n", "non-empty list"),
        ("cluster: {classes: {L4: 2}}\nmodels: [{name: repvgg-b3, slo_ms: 5}]\n", "bandwidth"),
        (
            "cluster: {classes: {L4: 2}, bandwidth_gbps: 10}\nmodels: [{name: repvgg-b3}]\n",
            "exactly one of slo_ms",
        ),
        (
            "cluster: {classes: {L4: 2}, bandwidth_gbps: 10}\n"
            "models: [{name: nosuchmodel, slo_ms: 5}]\n",
            "no block timings",
        ),
        ("cluster: {classes: {L4: 2}, bandwidth_gbps: 10, colour: red}\n", "unknown keys"),
    ],
)
def test_bad_input_is_named_and_exits_2(tmp_path: Path, body: str, message: str):
    config = tmp_path / "bad.yaml"
    config.write_text(body)
    code, out, err = run(["ppipe", str(config)])
    assert code == 2 and out == ""
    assert message in err


def test_bad_reference_input_exits_2(tmp_path: Path):
    assert run(["ppipe", "--reference", str(tmp_path / "plan.json")])[0] == 2
    code, _, err = run(["ppipe", "--reference", str(REFERENCES / V4), "--timings", str(tmp_path)])
    assert code == 2 and "block-timing" in err
    assert run(["ppipe"])[0] == 2


def test_the_benchmark_writes_its_table_and_reports(tmp_path: Path, capsys):
    from bench.ppipe_planner import main as bench_main

    assert bench_main(["--variants", "bl", "--match", "fsaf_r101", "--match", "V100-P4",
                       "--out", str(tmp_path)]) == 0  # fmt: skip
    body = json.loads((tmp_path / "ppipe-planner.json").read_text())
    (report,) = body["reports"]
    assert report["file"] == BL and abs(report["gap"]) <= 0.01
    table = (tmp_path / "ppipe-planner.md").read_text()
    assert "| reference plan |" in table and "1/1 within 1 %" in table
    assert "V100-P4 bl" in capsys.readouterr().out
