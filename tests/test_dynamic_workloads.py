"""Input-dependent latency: the workload `latency:` block, its SLO and
derived profile, the per-request draws, and the simulator's batch times and
profiler (app/workloads/dynamic.py, app/simulation/engine.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.scheduling.clockwork import ClockworkScheduler
from app.scheduling.model import InputDependence, ModelInfo
from app.scheduling.profile import LatencyProfile
from app.simulation.engine import run_simulation
from app.simulation.run import simulate
from app.workloads.arrivals import generate_arrivals
from app.workloads.dynamic import DEFAULT_FLOOR_MS, PRIOR_SAMPLES
from app.workloads.spec import Workload, load_workload, parse_workload
from tests.fakes import devices

WORKLOADS = Path(__file__).resolve().parent.parent / "bench" / "workloads"

BIMODAL = {
    "batch": {"c0_ms": 5.0, "c1": 0.1},
    "apps": [
        {"name": "short", "share": 0.25, "modes": [{"mean_ms": 20, "std_ms": 2}]},
        {
            "name": "long",
            "share": 0.75,
            "modes": [
                {"mean_ms": 80, "std_ms": 4, "weight": 0.6},
                {"mean_ms": 40, "std_ms": 4, "weight": 0.4},
            ],
        },
    ],
}


def workload(
    tmp_path: Path, latency: dict | None = None, *, model: dict | None = None, **top
) -> Workload:
    entry = {"name": "bart", "max_batch": 8, "rate": 50, "latency": latency or BIMODAL}
    entry.update(model or {})
    entry = {k: v for k, v in entry.items() if v is not None}  # None: leave the key out
    doc = {"duration_s": 20, "seed": 7, "devices": 1, "slo_p99_multiple": 3, **top}
    doc["models"] = [entry]
    return parse_workload(doc, tmp_path, source="wl.yaml")


def draws(latency: dict, n: int = 400_000) -> tuple[np.ndarray, np.ndarray]:
    """(application index, clipped ℓ_r ms) by Monte Carlo from the parsed spec."""
    parsed = parse_workload(
        {"duration_s": 1, "devices": 1, "slo_ms": 10, "models": [_entry(latency)]},
        Path("."),
    ).models[0]
    return parsed.latency.draw(np.random.default_rng(123), n)


def _entry(latency: dict) -> dict:
    return {"name": "m", "max_batch": 8, "rate": 1, "latency": latency}


# --------------------------------------------------------------------------- parsing


def test_slo_is_the_multiple_of_the_alone_time_p99_and_matches_monte_carlo(tmp_path):
    m = workload(tmp_path).models[0]
    _, lengths = draws(BIMODAL)
    mc_p99 = float(np.quantile(5.0 + 0.1 * lengths, 0.99))
    assert m.alone_p99_ms == pytest.approx(mc_p99, rel=2e-3)
    # The long app's upper mode (80, σ 4) holds the top 1 %: P99 of the
    # mixture sits 2.0 σ above 80 (0.75·0.6 = 0.45 of the mass is there,
    # P(above) = 0.01/0.45 → z = 2.01).
    assert pytest.approx(m.alone_p99_ms, abs=0.01) == 5.0 + 0.1 * 88.0
    assert m.slo_ms == pytest.approx(3 * m.alone_p99_ms)


def test_table_applications_use_the_empirical_quantile(tmp_path):
    (tmp_path / "lengths.csv").write_text("# ms\n" + "\n".join(str(v) for v in range(1, 101)))
    spec = {"batch": {"c0_ms": 1.0, "c1": 1.0}, "apps": [{"name": "a", "table": "lengths.csv"}]}
    m = workload(tmp_path, spec).models[0]
    # Smallest y with F(y) ≥ 0.99 over 1..100 is 99; alone = c0 + c1·99.
    assert m.alone_p99_ms == pytest.approx(100.0, abs=1e-6)
    assert m.latency.mean_length_ms() == pytest.approx(50.5)


def test_derived_profile_is_the_model_at_the_mean_length(tmp_path):
    m = workload(tmp_path).models[0]
    mean = 0.25 * 20 + 0.75 * (0.6 * 80 + 0.4 * 40)  # 53 ms; clipping is negligible
    for b in (1, 4, 8):
        assert m.profile.latency(b) == pytest.approx((5.0 + 0.1 * b * mean) / 1000.0, rel=1e-9)
    _, lengths = draws(BIMODAL)
    assert lengths.mean() == pytest.approx(mean, rel=2e-3)


def test_floor_clips_short_lengths_and_enters_the_p99_and_mean(tmp_path):
    spec = {
        "batch": {"c0_ms": 0.0, "c1": 1.0},
        "floor_ms": 5.0,
        "apps": [{"name": "a", "modes": [{"mean_ms": 1.0, "std_ms": 1.0}]}],
    }
    m = workload(tmp_path, spec).models[0]
    assert m.alone_p99_ms == 5.0  # all of the mass is below the floor (mean + 4σ = 5)
    assert m.latency.mean_length_ms() == pytest.approx(5.0, abs=1e-3)
    _, lengths = draws(spec, 10_000)
    assert lengths.min() == 5.0
    assert workload(tmp_path, {**spec, "floor_ms": None}).models[0].latency.floor_ms == (
        DEFAULT_FLOOR_MS
    )


def test_static_models_take_a_p99_multiple_of_their_alone_time(tmp_path):
    doc = {
        "duration_s": 1,
        "devices": 1,
        "slo_p99_multiple": 2,
        "models": [
            {"name": "r", "max_batch": 8, "rate": 1, "profile": {"alpha_ms": 1, "beta_ms": 5}},
            {"name": "s", "max_batch": 8, "rate": 1, "profile": {"alpha_ms": 1, "beta_ms": 5}}
            | {"slo_ms": 40},
        ],
    }
    r, s = parse_workload(doc, tmp_path).models
    assert r.slo_ms == pytest.approx(12.0) and r.latency is None  # 2 × ℓ(1) = 2 × 6 ms
    assert s.slo_ms == 40.0


def test_model_info_carries_c0_and_a_deterministic_prior(tmp_path):
    wl = workload(tmp_path)
    info = wl.model_infos()[0]
    assert info.dynamic is not None and info.dynamic.c0 == pytest.approx(0.005)
    prior = dict(info.dynamic.prior)
    assert sorted(prior) == ["long", "short"]
    assert all(len(v) == PRIOR_SAMPLES for v in prior.values())
    assert np.mean(prior["short"]) == pytest.approx(0.005 + 0.1 * 0.020, rel=0.01)
    assert np.mean(prior["long"]) == pytest.approx(0.005 + 0.1 * 0.064, rel=0.01)
    assert workload(tmp_path).model_infos()[0].dynamic.prior == info.dynamic.prior
    other = workload(tmp_path, seed=8).model_infos()[0].dynamic.prior
    assert other != info.dynamic.prior


@pytest.mark.parametrize(
    ("latency", "model", "message"),
    [
        (BIMODAL, {"profile": {"alpha_ms": 1, "beta_ms": 1}}, r"models\[0\] \(bart\): give either"),
        (
            {**BIMODAL, "batch": {"c0_ms": 5.0}},
            {},
            r"latency\.batch: missing required key 'c1'",
        ),
        (
            {**BIMODAL, "batch": {"c0_ms": 5.0, "c1": 0}},
            {},
            r"latency\.batch\.c1: must be > 0",
        ),
        (
            {**BIMODAL, "apps": [{**BIMODAL["apps"][0], "share": 0.5}, BIMODAL["apps"][1]]},
            {},
            r"latency\.apps: shares must sum to 1, they sum to 1\.25",
        ),
        (
            {
                **BIMODAL,
                "apps": [
                    BIMODAL["apps"][0],
                    {**BIMODAL["apps"][1], "modes": [{"mean_ms": 1, "std_ms": 1, "weight": 0.5}]},
                ],
            },
            {},
            r"latency\.apps\[1\]\.modes: weights must sum to 1",
        ),
        (
            {
                **BIMODAL,
                "apps": [{"name": n, "modes": [{"mean_ms": 1, "std_ms": 1}]} for n in ("a", "b")],
            },
            {},
            r"apps\[0\]\.share: missing",
        ),
        (
            {"batch": {"c0_ms": 1, "c1": 1}, "apps": [{"name": "a"}]},
            {},
            r"latency\.apps\[0\]: give either 'modes'",
        ),
        (
            {"batch": {"c0_ms": 1, "c1": 1}, "apps": [{"name": "a", "table": "nope.csv"}]},
            {},
            r"latency\.apps\[0\]\.table: length table not found",
        ),
        (BIMODAL, {"slo_ms": 30, "slo_p99_multiple": 2}, r"give slo_ms or slo_p99_multiple"),
        (
            {**BIMODAL, "apps": [{"name": "a", "modes": [{"mean_ms": 1, "std_ms": -1}]}]},
            {},
            r"modes\[0\]\.std_ms: must be ≥ 0",
        ),
    ],
)
def test_bad_latency_blocks_name_file_and_field(tmp_path, latency, model, message):
    with pytest.raises(ValueError, match=r"^wl\.yaml: .*" + message):
        workload(tmp_path, latency, model=model)


def test_bad_table_values_and_top_level_slo_clash(tmp_path):
    (tmp_path / "bad.csv").write_text("3\n-1\n")
    spec = {"batch": {"c0_ms": 1, "c1": 1}, "apps": [{"name": "a", "table": "bad.csv"}]}
    with pytest.raises(ValueError, match=r"bad\.csv: lengths must be finite and ≥ 0 ms, value 2"):
        workload(tmp_path, spec)
    with pytest.raises(ValueError, match=r"^wl\.yaml: slo_p99_multiple: give a top-level"):
        workload(tmp_path, slo_ms=30)
    with pytest.raises(ValueError, match=r"^wl\.yaml: profile_sample_rate: must be a fraction"):
        workload(tmp_path, profile_sample_rate=1.5)


# --------------------------------------------------------------------------- draws


def test_draws_are_deterministic_with_the_right_shares_and_means(tmp_path):
    wl = workload(tmp_path, duration_s=200)
    a, b = generate_arrivals(wl), generate_arrivals(wl)
    assert np.array_equal(a.apps, b.apps) and np.array_equal(a.work, b.work)
    assert len(a) > 9_000
    long = a.apps == "long"
    assert long.mean() == pytest.approx(0.75, abs=0.015)
    assert set(a.apps) == {"short", "long"}
    # work x_r = c1·ℓ_r in seconds
    assert a.work[~long].mean() == pytest.approx(0.1 * 0.020, rel=0.01)
    assert a.work[long].mean() == pytest.approx(0.1 * 0.064, rel=0.01)
    c = generate_arrivals(workload(tmp_path, duration_s=200, seed=8))
    assert not np.array_equal(c.work[:100], a.work[:100])


def test_the_latency_block_changes_no_arrival_time(tmp_path):
    dynamic = workload(tmp_path)
    static = workload(tmp_path, model={"latency": None, "profile": {"alpha_ms": 1, "beta_ms": 5}})
    a, s = generate_arrivals(dynamic), generate_arrivals(static)
    assert np.array_equal(a.times, s.times) and np.array_equal(a.items, s.items)
    assert set(s.apps) == {""} and not s.work.any()


def test_static_workloads_simulate_as_before():
    """An existing workload: same arrivals and the same trace through the
    plain path (apps and work not passed) as with them passed explicitly."""
    wl = load_workload(WORKLOADS / "trace-synthetic.yaml")
    wl = dataclasses.replace(wl, duration_s=2.0)
    arrivals = generate_arrivals(wl)
    assert set(arrivals.apps) == {""}
    result = simulate(wl, "symphony", arrivals=arrivals)
    plain = simulate(wl, "symphony", arrivals=dataclasses.replace(arrivals, apps=None, work=None))
    assert np.array_equal(result.trace.finish, plain.trace.finish, equal_nan=True)
    assert np.array_equal(result.trace.status, plain.trace.status)


# --------------------------------------------------------------------------- engine


class Recording(ClockworkScheduler):
    """Clockwork that records the alone-times the profiler feeds it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.alone: list[tuple[str, str, float, float]] = []

    def _on_alone_time(self, model: ModelInfo, app: str, seconds: float, now: float) -> None:
        self.alone.append((model.name, app, seconds, now))


def dynamic_model(c0: float = 0.005, slo_ms: float = 500.0) -> ModelInfo:
    # The profile is what clockwork plans with; the engine runs c0 + k·max x.
    profile = LatencyProfile.linear(1.0, 5.0, 8)
    return ModelInfo("d", profile, slo_ms / 1000.0, 8, dynamic=InputDependence(c0))


def test_a_batch_runs_c0_plus_its_size_times_the_largest_work():
    info, devs = dynamic_model(), devices(1)
    scheduler = Recording([info], devs)
    work = np.array([0.002, 0.010, 0.004])
    trace = run_simulation(
        scheduler,
        [info],
        devs,
        np.zeros(3),
        np.zeros(3, dtype=int),
        apps=np.array(["a", "b", "a"], dtype=object),
        work=work,
        profile_sample_rate=1.0,
    )
    # Clockwork runs the first request at once, then the two that waited:
    # c0 + 1·2 ms, then c0 + 2·max(10, 4) ms.
    assert trace.batches == 2 and list(trace.batch_size) == [1, 2, 2]
    assert trace.finish - trace.start == pytest.approx([0.007, 0.025, 0.025])
    for start in set(trace.start):
        batch = trace.start == start
        expected = 0.005 + batch.sum() * work[batch].max()
        assert trace.finish[batch] - start == pytest.approx(np.full(batch.sum(), expected))
    # Every request profiled once, alone-time c0 + x_r, at its batch's end.
    assert sorted(scheduler.alone) == [
        ("d", "a", pytest.approx(0.007), pytest.approx(0.007)),
        ("d", "a", pytest.approx(0.009), pytest.approx(0.032)),
        ("d", "b", pytest.approx(0.015), pytest.approx(0.032)),
    ]


def test_the_profiler_samples_at_the_configured_rate():
    info, devs = dynamic_model(slo_ms=5_000.0), devices(1)
    n = 4_000
    times = np.arange(n) * 0.02  # one at a time, 20 ms apart: the device keeps up
    work = np.full(n, 0.001)
    counts = []
    for rate in (0.0, 0.25):
        scheduler = Recording([info], devs)
        run_simulation(
            scheduler,
            [info],
            devs,
            times,
            np.zeros(n, dtype=int),
            work=work,
            profile_sample_rate=rate,
        )
        counts.append(len(scheduler.alone))
        assert all(app == "" and s == pytest.approx(0.006) for _, app, s, _ in scheduler.alone)
    assert counts[0] == 0
    assert counts[1] == pytest.approx(0.25 * n, abs=3 * (n * 0.25 * 0.75) ** 0.5)


def test_an_input_dependent_model_needs_work():
    info, devs = dynamic_model(), devices(1)
    with pytest.raises(ValueError, match=r"models \['d'\] are input-dependent"):
        run_simulation(Recording([info], devs), [info], devs, np.zeros(1), np.zeros(1, int))


def test_simulate_runs_a_dynamic_workload_and_feeds_the_profiler(tmp_path):
    wl = workload(tmp_path, duration_s=5, profile_sample_rate=0.5)
    result = simulate(wl, "clockwork")
    trace = result.trace
    n = len(trace.arrival)
    assert n > 200 and 0.0 < result.attainment <= 1.0
    done = ~np.isnan(trace.start)
    # Every batch took c0 + size·max x ≥ c0 + x_r of each of its requests.
    arrivals = generate_arrivals(wl)
    assert np.all(trace.finish[done] - trace.start[done] >= 0.005 + arrivals.work[done] - 1e-12)


# --------------------------------------------------------------------------- Orloj tables


def _generator():
    import importlib.util

    path = WORKLOADS / "orloj" / "make_workloads.py"
    spec = importlib.util.spec_from_file_location("orloj_make_workloads", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_orloj_workloads_are_current_and_load():
    gen = _generator()
    cases = gen.read("cases.yaml")
    assert len(cases["cases"]) == 15 and set(cases["arrivals"]) == {"trace", "poisson"}
    for case in cases["cases"]:
        for arrivals in cases["arrivals"]:
            path = WORKLOADS / "orloj" / f"{gen.file_stem(case['name'], arrivals)}.yaml"
            assert path.read_text() == gen.render(case, arrivals, cases), (
                f"{path.name} is stale: run python bench/workloads/orloj/make_workloads.py"
            )
    wl = load_workload(WORKLOADS / "orloj" / "std-2_0.5.poisson.yaml")
    (m,) = wl.models
    assert [a.modes[0].std_ms for a in m.latency.apps] == [8.0, 2.0]  # σ 2 and 0.5 × 4 ms
    # load 0.6 × 8 / ℓ(8) at the mean length (50 ms): 0.6 × 8 / 45 ms
    assert m.rate == pytest.approx(0.6 * 8 / 0.045, rel=1e-3)
    trace = load_workload(WORKLOADS / "orloj" / "std-2_0.5.trace.yaml")
    assert trace.offered_rate() == pytest.approx(m.rate, rel=1e-3)


def test_orloj_tables_quick_run_writes_the_paper_layout(tmp_path, capsys):
    import json

    from bench import orloj_tables

    code = orloj_tables.main(
        [
            "--quick",
            "--cases",
            "std-1",
            "--policies",
            "clockwork,no-such-policy",
            "--slo-multiples",
            "2,3",
            "--out-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    doc = json.loads((tmp_path / "tables-trace-quick.json").read_text())
    assert doc["policies"] == ["clockwork", "no-such-policy"]
    assert "unknown policy 'no-such-policy'" in doc["skipped"]["no-such-policy"]
    (case,) = doc["cases"]
    assert case["case"] == "std-1" and case["table"] == 2
    assert set(case["finish_rate"]) == {"2", "3"}
    rates = [case["finish_rate"][m]["clockwork"] for m in ("2", "3")]
    assert all(0.0 < r <= 1.0 for r in rates) and rates[0] <= rates[1]
    assert "no-such-policy" not in case["finish_rate"]["3"]
    assert case["requests"] > 500  # 10 s at ~107 r/s
    md = (tmp_path / "tables-trace-quick.md").read_text()
    assert "## Table 2" in md and f"| std-1 | 3 | {rates[1]:.2f} | — |" in md
    captured = capsys.readouterr()
    assert "note: policy 'no-such-policy' skipped" in captured.err
    assert "Table 2: finish rate" in captured.out
