"""HERD's measured single-device goodput (app/simulation/herd_goodput.py):
T from a simulated capacity search, cached per (profile, SLO, max batch),
and `python -m app plan herd --goodput`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from app.planning.cli import main as plan_main
from app.planning.herd.ilp import SolveOptions, solve
from app.planning.herd.problem import Problem, Stream, model_streams, single_device_goodput
from app.planning.herd.random_groups import random_plan
from app.scheduling.profile import LatencyProfile
from app.simulation.herd_goodput import MeasuredGoodput
from tests.test_herd import problem

EXAMPLE = Path(__file__).resolve().parents[1] / "bench/workloads/herd/example.yaml"
# α = 1 ms, β = 0, SLO 20 ms: analytic T = 1000 r/s, and U (a device always
# busy, every batch within the SLO) is 1000 r/s too.
LINEAR = LatencyProfile.linear(1.0, 0.0, 64)
# ResNet50 of Table 5: analytic b = 3 (2·ℓ(3) = 23.1 ms ≤ 27), T = 260.2 r/s.
RESNET50 = LatencyProfile.linear(2.050, 5.378, 64)


@pytest.mark.parametrize(
    ("profile", "slo", "analytic", "measured"),
    [(LINEAR, 0.020, 1000.0, 868.0), (RESNET50, 0.027, 260.2, 182.4)],
)
def test_measured_is_below_the_analytic_bound_under_poisson(profile, slo, analytic, measured):
    # The analytic T assumes steady arrivals; with Poisson arrivals one device
    # meets 99 % within SLO at 0.70–0.87 of it on these profiles.
    t = MeasuredGoodput()(profile, slo, 64)
    assert single_device_goodput(profile, slo, 64) == pytest.approx(analytic, abs=0.1)
    assert t == pytest.approx(measured, rel=0.02)
    assert 0.6 * analytic < t < 0.9 * analytic


def test_measurement_is_deterministic_and_within_the_ceiling():
    a, b = MeasuredGoodput(), MeasuredGoodput()
    assert a(RESNET50, 0.027, 64) == b(RESNET50, 0.027, 64)
    m = a.measurements[(RESNET50, 0.027, 64)]
    # U = max b/ℓ(b) with ℓ(b) ≤ 27 ms: b = 10, 10 / 25.878 ms.
    assert m.ceiling == pytest.approx(386.43, abs=0.01)
    assert m.status == "converged" and 5 <= m.probes <= 12
    assert m.goodput <= m.ceiling


def test_max_batch_caps_the_measurement():
    # Batches of one only: ℓ(1) = 7.4 ms, U = 135 r/s; one request at a time
    # with Poisson arrivals meets 99 % within 27 ms at about half of that.
    t = MeasuredGoodput()(RESNET50, 0.027, 1)
    assert t == pytest.approx(66.0, rel=0.02)
    assert t < single_device_goodput(RESNET50, 0.027, 64)


def test_unservable_slo_measures_zero_and_the_plan_says_so():
    measured = MeasuredGoodput()
    assert measured(LINEAR, 0.0005, 64) == 0.0  # ℓ(1) = 1 ms > 0.5 ms
    assert measured.measurements[(LINEAR, 0.0005, 64)].status == "unservable"
    p = problem([("a", 10, "x")], [("a", 1)], 1, 1)
    hard = Problem(p.models, (Stream("a", 1.0, slo=0.0005),), p.cluster)
    with pytest.raises(ValueError, match="no rate passes the single-device measurement"):
        model_streams(hard, measured)


def test_one_search_per_model_and_slo(monkeypatch):
    calls: list[float] = []
    real = MeasuredGoodput.measure

    def counted(self, profile, slo, max_batch):
        calls.append(slo)
        return real(self, profile, slo, max_batch)

    monkeypatch.setattr(MeasuredGoodput, "measure", counted)
    streams = [("a", 10.0)] * 40 + [("b", 10.0)] * 20
    p = problem([("a", 10, "x"), ("b", 10, "x")], streams, devices=4, group=4)
    # Two more streams of a with their own SLO: one more search.
    p = Problem(p.models, p.streams + (Stream("a", 5.0, 0.040),) * 2, p.cluster)
    measured = MeasuredGoodput()
    ms = model_streams(p, measured)
    # a and b share profile and SLO (tests/test_herd.py's PROFILE, 20 ms).
    assert sorted(calls) == [0.020, 0.040] and measured.searches == 2
    t20, t40 = (measured(LINEAR, slo, 64) for slo in (0.020, 0.040))
    assert ms[0].devices_needed == pytest.approx(400.0 / t20 + 10.0 / t40)
    assert ms[1].devices_needed == pytest.approx(200.0 / t20)


def test_ilp_and_random_baseline_solve_with_measured_goodput():
    p = problem([("a", 10, "x"), ("b", 10, "y")], [("a", 500), ("b", 300)], devices=4, group=2)
    measured = MeasuredGoodput()
    plan = solve(p, SolveOptions("paper", 10), measured)
    t = measured(LINEAR, 0.020, 64)  # cached: no new search
    assert measured.searches == 1
    # Two groups of 2 (one affinity set each): bt = 2 / n, the least for a.
    assert sorted(len(g.devices) for g in plan.groups) == [2, 2]
    assert plan.min_burst_tolerance == pytest.approx(2.0 * t / 500.0)
    assert plan.min_burst_tolerance < solve(p).min_burst_tolerance
    baseline = random_plan(p, 0, goodput=measured)
    assert baseline.min_burst_tolerance == pytest.approx(plan.min_burst_tolerance)


def test_cli_measured_names_it_and_lists_both_goodputs():
    out, err = io.StringIO(), io.StringIO()
    code = plan_main(
        ["herd", str(EXAMPLE), "--goodput", "measured"], out, err, herd_measurer=MeasuredGoodput
    )
    assert code == 0, err.getvalue()
    text = out.getvalue()
    assert text.splitlines()[1].startswith(
        "single-device goodput T_i: measured (flex on one simulated device"
    )
    assert "7 capacity searches in" in text  # six models, ResNet50 with two SLOs
    rows = [line for line in text.splitlines() if line.startswith("ResNet50 ")]
    row = next(line for line in rows if line.split()[1] == "27")
    analytic, measured, ratio = (float(v) for v in row.split()[2:])
    assert analytic == pytest.approx(260.2) and measured == pytest.approx(182.4, rel=0.02)
    assert ratio == pytest.approx(measured / analytic, abs=0.01)


def test_cli_default_is_analytic_and_bad_value_is_an_argparse_error(capsys):
    out, err = io.StringIO(), io.StringIO()
    assert plan_main(["herd", str(EXAMPLE)], out, err) == 0
    assert out.getvalue().splitlines()[1].startswith("single-device goodput T_i: analytic")
    assert "capacity searches" not in out.getvalue()
    # Without a measurer (planning alone does not run the simulator): a clear error.
    err = io.StringIO()
    assert plan_main(["herd", str(EXAMPLE), "--goodput", "measured"], io.StringIO(), err) == 2
    assert "--goodput measured runs the simulator: use `python -m app plan herd`" in err.getvalue()
    with pytest.raises(SystemExit) as exit_:
        plan_main(["herd", str(EXAMPLE), "--goodput", "simulated"], io.StringIO(), io.StringIO())
    assert exit_.value.code == 2
    assert "--goodput: invalid choice: 'simulated'" in capsys.readouterr().err


def test_too_few_requests_per_probe_is_refused():
    with pytest.raises(ValueError, match="requests must be ≥ 100"):
        MeasuredGoodput(requests=50)


def test_bench_goodput_problem_loads_by_the_given_goodput():
    from bench.herd import build_parser, goodput_problem

    assert build_parser().parse_args(["--goodput", "measured"]).goodput == "measured"

    def flat(profile: LatencyProfile, slo: float, max_batch: int) -> float:
        return 100.0

    p = goodput_problem(32, 1, flat)
    # Σ n_i = Σ rate_i / 100 = 0.7 · 32 devices.
    assert sum(s.rate for s in p.streams) == pytest.approx(0.7 * 32 * 100.0)
    analytic = goodput_problem(32, 1)
    assert sum(ms.devices_needed for ms in model_streams(analytic)) == pytest.approx(0.7 * 32)
