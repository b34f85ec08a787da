"""bench.compare: its setups name files and models that exist, its table and
plots from measured results, and a short end-to-end run against the daemon."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.repository import BUNDLED_REPOSITORY
from app.repository.loader import load_repository
from app.workloads.spec import load_workload
from bench import compare
from bench.compare import SETUPS, SystemResult, markdown_table, write_outputs


@pytest.mark.parametrize("key", sorted(SETUPS))
def test_every_setup_serves_every_model_its_workload_names(key):
    setup = SETUPS[key]
    workload = load_workload(setup.workload)
    if setup.repository == BUNDLED_REPOSITORY:
        names = {"mlp", "cnn"}  # bundled ONNX models are built on first start
    else:
        index = load_repository(setup.repository)
        assert index.errors == {}
        names = set(index.models)
    assert {m.name for m in workload.models} <= names
    devices = setup.emulated_devices or setup.cpu_slices
    assert devices == len(workload.devices)


def _result(system: str, capacity: float, p50: float = 5.0) -> SystemResult:
    probes = [
        {"offered_rps": capacity * f, "goodput_rps": capacity * min(f, 1.0), "slo_attainment": a}
        for f, a in ((0.5, 1.0), (1.0, 0.99), (1.5, 0.7))
    ]
    overall = {
        "offered_rps": 100.0,
        "slo_attainment": 0.995,
        "latency_p50_ms": p50,
        "latency_p99_ms": 4 * p50,
    }
    return SystemResult(
        system=system,
        label=f"label {system}",
        startup_s=2.0,
        capacity_rps=capacity,
        capacity_status="CONVERGED",
        probes=probes,
        cdf_run={"rate_scale": 1.0, "overall": overall},
        latencies_ms=np.sort(np.random.default_rng(0).exponential(p50, 200)),
    )


def test_table_gives_each_system_its_ratio_to_ray_serve():
    table = markdown_table([_result("symphony", 900.0), _result("ray", 300.0)])
    lines = table.splitlines()
    assert lines[2].startswith("| label symphony | 900 (CONVERGED) | 3.00× | 100 | 5.0 / 20.0 |")
    assert lines[3].startswith("| label ray | 300 (CONVERGED) | — |")
    # Without Ray there is no ratio.
    assert "| — |" in markdown_table([_result("symphony", 900.0)]).splitlines()[2]


def test_outputs_are_written(tmp_path):
    setup = SETUPS["a"]
    workload = load_workload(setup.workload)
    results = [_result("symphony", 800.0), _result("ray", 400.0)]
    write_outputs(setup, workload, results, tmp_path)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [s["system"] for s in doc["systems"]] == ["symphony", "ray"]
    assert doc["systems"][0]["capacity_rps"] == 800.0
    assert doc["nominal_rps"] == pytest.approx(workload.offered_rate())
    assert "2.00×" in (tmp_path / "summary.md").read_text()
    for name in ("goodput.png", "cdf.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_unknown_system_is_a_usage_error(capsys):
    assert compare.main(["--systems", "symphony,tensorflow-serving"]) == 2
    assert "tensorflow-serving" in capsys.readouterr().err


@pytest.mark.slow
def test_short_run_against_the_daemon(tmp_path, capsys):
    # Real daemon, real load: ~2 probes of 1 s plus start-up.
    code = compare.main(
        [
            "--workload",
            "ceiling",
            "--systems",
            "symphony",
            "--probe-duration",
            "1",
            "--max-probes",
            "2",
            "--cdf-fraction",
            "0.5",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    doc = json.loads((tmp_path / "live-ceiling" / "results.json").read_text())
    (system,) = doc["systems"]
    assert system["system"] == "symphony"
    assert len(system["probes"]) == 2
    # How much it serves on this machine is the benchmark's figure; here: the
    # capacity is the best probe with ≥ 99 % within SLO (0 if none), and the
    # CDF run went at half its rate scale.
    passed = [p for p in system["probes"] if p["slo_attainment"] >= 0.99]
    if passed:
        best = max(passed, key=lambda p: p["rate_scale"])
        assert system["capacity_rps"] == best["offered_rps"] > 0
        assert system["cdf_run"]["rate_scale"] == pytest.approx(0.5 * best["rate_scale"])
    else:
        assert system["capacity_rps"] == 0.0
    run = system["cdf_run"]["overall"]
    assert run["requests"] > 0 and 0.0 <= run["slo_attainment"] <= 1.0
    assert "| daemon, policy symphony |" in capsys.readouterr().out
