"""`python -m bench.simulate` end to end, its JSON schema, and the capacity search."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import pytest

import bench.simulate as cli
from app.simulation.capacity_search import (
    ABOVE_MAX,
    BELOW_MIN,
    CONVERGED,
    MAX_RUNS,
    find_capacity,
)
from app.simulation.run import SimResult
from app.workloads.spec import load_workload
from bench.simulate_report import TABLE_WIDTH, print_table

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "bench" / "simulate_schema.json").read_text())

TINY = """\
name: tiny
duration_s: {duration}
seed: 7
devices: 2
models:
  - name: resnet
    profile: {{alpha_ms: 1.0, beta_ms: 5.0}}
    slo_ms: 25
    max_batch: 32
    rate: {rate}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(duration=1.5, rate=600))
    return path


@pytest.fixture
def run_cli(run_module):
    """`python -m bench.simulate --quiet ARGS` (conftest's `run_module`)."""
    return functools.partial(run_module, "bench.simulate", "--quiet")


def check_metrics(m: dict) -> None:
    assert 0.0 <= m["slo_attainment"] <= 1.0
    total = m["slo_attainment"] + m["drop_fraction"] + m["late_fraction"]
    assert total == pytest.approx(1.0, abs=1e-9)
    assert m["goodput_rps"] <= m["offered_rps"] + 1e-9
    assert m["offered_rps"] > 0


# --------------------------------------------------------------------------- CLI


@pytest.mark.slow
def test_json_validates_and_is_sane(tiny: Path, run_cli) -> None:
    proc = run_cli(
        "--workload",
        str(tiny),
        "--policy",
        "symphony",
        "--policy",
        "symphony:pruning=prefix",
        "--policy",
        "flex",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the whole of stdout is one JSON document
    jsonschema.validate(doc, SCHEMA)
    assert doc["workload"]["name"] == "tiny"
    assert doc["workload"]["devices"] == 2
    assert doc["workload"]["offered_rps"] == pytest.approx(600.0)
    assert doc["rate_scale"] == 1.0
    assert set(doc["policies"]) == {"symphony", "symphony:pruning=prefix", "flex"}
    assert doc["policies"]["symphony:pruning=prefix"]["params"] == {"pruning": "prefix"}
    offered = {p["overall"]["offered_rps"] for p in doc["policies"].values()}
    assert len(offered) == 1  # the same arrival sequence for every policy
    for entry in doc["policies"].values():
        assert "trace" not in entry
        assert "capacity_rps" not in entry
        check_metrics(entry["overall"])
        for m in entry["models"].values():
            check_metrics(m)


@pytest.mark.slow
def test_serving_path_options_model_the_daemon(tiny: Path, run_cli) -> None:
    args = ("--workload", str(tiny), "--policy", "symphony", "--rate-scale", "1.6", "--json")
    direct = json.loads(run_cli(*args).stdout)
    proc = run_cli(
        *args, "--deadline-margin-ms", "3", "--timer-lead-ms", "1", "--intake-delay-ms", "0.5"
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert "serving_path" not in direct
    assert doc["serving_path"] == {
        "deadline_margin_ms": 3.0,
        "timer_lead_ms": 1.0,
        "intake_delay_ms": 0.5,
    }
    assert doc["policies"]["symphony"]["params"] == {"deadline_margin": 0.003, "timer_lead": 0.001}
    # Planned 3 ms before the 25-ms SLO: the slow tail comes in earlier,
    # though the intake delay moves every answer later.
    p99 = [d["policies"]["symphony"]["overall"]["latency_p99_ms"] for d in (direct, doc)]
    assert p99[0] > 23.0 and p99[1] <= 22.0 + 1e-6
    bad = run_cli(*args, "--deadline-margin-ms", "-1")
    assert bad.returncode == 2 and "--deadline-margin-ms must be" in bad.stderr


@pytest.mark.slow
def test_capacity(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "cap.yaml"
    path.write_text(TINY.format(duration=1.0, rate=400))
    proc = run_cli(
        "--workload", str(path), "--policy", "symphony", "--capacity", "--capacity-tol", "0.05"
    )
    assert proc.returncode == 0, proc.stderr
    assert "capacity" in proc.stdout  # the table, not JSON
    proc = run_cli(
        "--workload",
        str(path),
        "--policy",
        "symphony",
        "--capacity",
        "--capacity-tol",
        "0.05",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    entry = doc["policies"]["symphony"]
    assert entry["capacity_rps"] > 0
    assert entry["capacity_status"] == CONVERGED
    best = [p for p in entry["capacity_probes"] if p["scale"] == entry["capacity_rate_scale"]]
    assert len(best) == 1
    assert best[0]["attainment"] >= 0.99
    assert best[0]["offered_rps"] == entry["capacity_rps"]
    # The bracket is tight: some probe within 5 % above it fails.
    failing = [p["scale"] for p in entry["capacity_probes"] if not p["passed"]]
    assert failing and min(failing) <= entry["capacity_rate_scale"] * 1.05 + 1e-12


@pytest.mark.slow
def test_plot_and_curves(tiny: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "figs" / "goodput.png"
    proc = run_cli(
        "--workload",
        str(tiny),
        "--policy",
        "symphony",
        "--policy",
        "flex-np",
        "--plot",
        str(out),
        "--scales",
        "0.5,1,3",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert set(doc["curves"]) == {"symphony", "flex-np"}
    for points in doc["curves"].values():
        assert [p["rate_scale"] for p in points] == [0.5, 1.0, 3.0]
        offered = [p["offered_rps"] for p in points]
        assert offered == sorted(offered)
        assert all(p["goodput_rps"] <= p["offered_rps"] for p in points)
        # 900 requests at most per point, fewer than --sweep-requests: in full.
        assert [p["duration_s"] for p in points] == [1.5, 1.5, 1.5]


@pytest.mark.slow
def test_missing_workload_exits_2(tmp_path: Path, run_cli) -> None:
    proc = run_cli("--workload", str(tmp_path / "nope.yaml"), "--json")
    assert proc.returncode == 2
    assert "not found" in proc.stderr and "nope.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("content", "extra", "needle"),
    [
        ("models: [unclosed", [], "YAML"),
        ("duration_s: 1\ndevices: 1\nmodels: []\nbogus: 1\n", [], "bogus"),
        (TINY.format(duration=1, rate=10), ["--policy", "nosuch"], "unknown policy"),
        (TINY.format(duration=1, rate=10), ["--policy", "symphony:pruning=zzz"], "pruning"),
        (TINY.format(duration=1, rate=10), ["--policy", "symphony:oops"], "key=value"),
        (TINY.format(duration=1, rate=10), ["--rate-scale", "-1"], "rate-scale"),
        (TINY.format(duration=1, rate=10), ["--scales", "1,x"], "scales"),
    ],
)
def test_usage_errors_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    extra: list[str],
    needle: str,
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(content)
    rc = cli.main(["--workload", str(path), "--json", "-q", *extra])
    captured = capsys.readouterr()
    assert rc == 2
    assert needle in captured.err
    assert captured.out == ""


def test_failing_policy_is_reported_not_fatal(
    tiny: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = cli.simulate

    def flaky(workload, policy, params=None, **kw):
        if policy == "flex":
            raise RuntimeError("boom")
        return real(workload, policy, params, **kw)

    monkeypatch.setattr(cli, "simulate", flaky)
    rc = cli.main(
        ["--workload", str(tiny), "--policy", "symphony", "--policy", "flex", "--json", "-q"]
    )
    captured = capsys.readouterr()
    assert rc == 0
    doc = json.loads(captured.out)
    jsonschema.validate(doc, SCHEMA)
    assert list(doc["policies"]) == ["symphony"]
    assert "boom" in doc["errors"]["flex"]
    assert "boom" in captured.err


def test_parse_policy_options() -> None:
    known = ["symphony", "triton"]
    spec = cli.parse_policy("triton:max_queue_delay_ms=2,queue_timeout_ms=none", known)
    assert spec.name == "triton"
    assert spec.params == {"max_queue_delay_ms": 2, "queue_timeout_ms": None}
    assert spec.label == "triton:max_queue_delay_ms=2,queue_timeout_ms=none"
    assert cli.parse_policy("symphony", known).params == {}
    assert [cli.parse_value(v) for v in ("1", "1.5", "true", "False", "prefix")] == [
        1,
        1.5,
        True,
        False,
        "prefix",
    ]
    with pytest.raises(cli.UsageError):
        cli.parse_policy("clockwerk", known)
    assert cli.parse_scales("1,0.5,1") == [0.5, 1.0]
    with pytest.raises(cli.UsageError):
        cli.parse_scales("1,-2")


# --------------------------------------------------------------------------- find_capacity


def fake_run(threshold: float, calls: list[float] | None = None, base_rps: float = 100.0):
    """Attainment 1.0 up to `threshold`, 0.5 above it."""

    def run(scale: float) -> SimResult:
        if calls is not None:
            calls.append(scale)
        attainment = 1.0 if scale <= threshold else 0.5
        overall = {
            "offered_rps": base_rps * scale,
            "goodput_rps": base_rps * scale * attainment,
            "slo_attainment": attainment,
        }
        return SimResult("fake", {}, scale, {"overall": overall, "models": {}}, {}, 0.0, None)

    return run


@pytest.mark.parametrize("threshold", [0.013, 0.3, 0.77, 1.0, 3.7, 41.0])
@pytest.mark.parametrize("rel_tol", [0.01, 0.001])
def test_find_capacity_step(threshold: float, rel_tol: float) -> None:
    calls: list[float] = []
    res = find_capacity(fake_run(threshold, calls), rel_tol=rel_tol, max_runs=100)
    assert res.status == CONVERGED
    assert res.rate_scale is not None
    assert res.rate_scale <= threshold  # a passing scale ...
    assert res.rate_scale >= threshold / (1 + rel_tol)  # ... within rel_tol of the step
    assert res.capacity_rps == pytest.approx(100.0 * res.rate_scale)
    assert len(calls) == len(set(calls)) == len(res.probes)  # no scale simulated twice
    assert [p.scale for p in res.probes] == calls
    assert all(p.passed == (p.scale <= threshold) for p in res.probes)
    # Deterministic.
    again = find_capacity(fake_run(threshold), rel_tol=rel_tol, max_runs=100)
    assert again.probes == res.probes


def test_find_capacity_target_and_bounds() -> None:
    def run(scale: float) -> SimResult:  # attainment falls linearly from 1 at scale 1
        att = max(0.0, min(1.0, 2.0 - scale))
        overall = {"offered_rps": 10.0 * scale, "goodput_rps": 0.0, "slo_attainment": att}
        return SimResult("fake", {}, scale, {"overall": overall, "models": {}}, {}, 0.0, None)

    res = find_capacity(run, target=0.9, lo=1.0, hi=1.0, rel_tol=1e-4)
    assert res.status == CONVERGED
    assert res.rate_scale == pytest.approx(1.1, rel=1e-4)

    res = find_capacity(fake_run(1e9), max_scale=8.0)
    assert res.status == ABOVE_MAX
    assert res.rate_scale == 8.0 and res.capacity_rps == 800.0

    res = find_capacity(fake_run(1e-9), min_scale=0.01)
    assert res.status == BELOW_MIN
    assert res.rate_scale is None and res.capacity_rps == 0.0
    assert min(p.scale for p in res.probes) == 0.01

    res = find_capacity(fake_run(0.77), max_runs=4)
    assert res.status == MAX_RUNS
    assert len(res.probes) == 4
    assert res.rate_scale is not None and res.rate_scale <= 0.77

    with pytest.raises(ValueError):
        find_capacity(fake_run(1.0), lo=2.0, hi=1.0)
    with pytest.raises(ValueError):
        find_capacity(fake_run(1.0), target=1.5)


# --------------------------------------------------------------------------- the sweep


def test_sweep_points_simulate_about_sweep_requests_each(tiny: Path, capsys) -> None:
    """Each point other than the main run's simulates the workload's first
    seconds, as many as --sweep-requests take at its rate; the main scale's
    point is the main run, in full."""
    args = ["--workload", str(tiny), "--policy", "symphony", "--scales", "0.5,1,2"]
    assert cli.main([*args, "--sweep-requests", "300", "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["sweep_requests"] == 300
    points = doc["curves"]["symphony"]
    # 600 req/s: 300 requests take 1 s at ×0.5, 0.25 s at ×2; ×1 is the main run.
    assert [p["duration_s"] for p in points] == [1.0, 1.5, 0.25]
    assert points[1]["offered_rps"] == doc["policies"]["symphony"]["overall"]["offered_rps"]
    for p in (points[0], points[2]):
        requests = p["offered_rps"] * p["duration_s"]
        assert 300 * 0.75 < requests < 300 * 1.25  # Poisson: ~300 ± 3 sigma


def test_sweep_workload_shortens_only_what_needs_it(tiny: Path, capsys) -> None:
    workload = load_workload(tiny)  # 1.5 s at 600 req/s
    assert cli.sweep_workload(workload, 1.0, 2.0, 600).duration_s == pytest.approx(0.5)
    assert cli.sweep_workload(workload, 1.0, 2.0, 0) is workload  # 0: in full
    assert cli.sweep_workload(workload, 2.0, 2.0, 600) is workload  # the main run
    assert cli.sweep_workload(workload, 1.0, 0.5, 600) is workload  # needs > 1.5 s
    assert cli.main(["--workload", str(tiny), "--sweep-requests", "-1", "--quiet"]) == 2
    assert "--sweep-requests must be ≥ 0, got -1" in capsys.readouterr().err


# --------------------------------------------------------------------------- the table


def _metrics(goodput: float, p99_ms: float) -> dict:
    return {
        "offered_rps": 99_999.9,
        "goodput_rps": goodput,
        "slo_attainment": 0.99991,
        "drop_fraction": 0.00004,
        "late_fraction": 0.00005,
        "latency_p50_ms": 1_234.56,
        "latency_p99_ms": p99_ms,
        "mean_batch_size": 64.0,
        "device_busy_fraction": 1.0,
    }


def test_the_table_fits_100_columns_with_nothing_cut() -> None:
    """The widest figures the table can show (five-digit rates and latencies,
    a capacity that did not converge, a policy with options, per-model rows)
    at a 100-column console: no line is longer, no cell is cut (rich's
    ellipsis), every figure is there whole."""
    from rich.console import Console

    workload = load_workload(ROOT / "bench" / "workloads" / "live-c-bursty-mix.yaml")
    assert 1 < len(workload.models) <= 8  # per-model rows
    models = {m.name: _metrics(12_345.6, 23_456.78) for m in workload.models}
    policies = {}
    for label in ("symphony", "symphony-wc", "triton:max_queue_delay_ms=2"):
        policies[label] = {
            "overall": _metrics(98_765.4, 12_345.67),
            "models": models,
            "autoscale": {"bad_rate": 0.25, "idle_fraction": 0.5, "advised_device_change": -12},
            "wall_s": 123.45,
            "simulated_requests_per_wall_s": 1_234_567,
            "capacity_rps": 99_999.9,
            "capacity_rate_scale": 2.05,
            "capacity_status": "max_runs",
        }
    doc = {
        "workload": {"name": workload.name, "devices": 8, "models": [], "duration_s": 20.0},
        "rate_scale": 1.0,
        "policies": policies,
        "serving_path": {"deadline_margin_ms": 3, "timer_lead_ms": 2, "intake_delay_ms": 0.5},
    }
    doc["workload"]["models"] = [m.name for m in workload.models]
    doc["workload"]["offered_rps"] = 99_999.9
    console = Console(width=TABLE_WIDTH, record=True)
    print_table(doc, workload, capacity=True, console=console)
    text = console.export_text()
    assert TABLE_WIDTH == 100
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "…" not in text
    figures = [
        "98,765.4",
        "99.99%",
        "0.00%",
        "1,234.56",
        "12,345.67",
        "23,456.78",
        "64.00",
        "99,999.9 ×2.05*",
        "100.00%",
        "25.00%",
        "50.00%",
        "-12",
        "123.45",
        "1,234,567",
        "symphony-wc",
    ]
    for figure in figures:
        assert figure in text, figure
    for model in workload.models:
        assert f"└─{model.name}" in text, model.name
    assert "capacity search did not converge" in text
