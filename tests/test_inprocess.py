"""bench.inprocess: the daemon's service under open-loop load without HTTP.

What is checked: every scheduled request is sent once and answered once with
the outcome the HTTP API would give it (a result, or a drop with its reason);
the document has bench.loadgen's schema; the command line refuses bad input
before starting anything, and its capacity search runs probes on the one
service. Timing claims (capacity, latency tails) belong in BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from app.repository.config import ModelConfig, TensorSpec
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload
from bench import inprocess as ip
from bench import loadgen as lg

ROOT = Path(__file__).resolve().parent.parent
LIVE = ROOT / "bench" / "repositories" / "live"
# The in-process service leaves no shared memory behind.
pytestmark = pytest.mark.usefixtures("no_leftover_segments")
LOADGEN_SCHEMA = json.loads((ROOT / "bench" / "loadgen_schema.json").read_text())
ALPHA_MS, BETA_MS = 1.053, 5.072  # resnet50-t4 in bench/repositories/live

WORKLOAD = """\
name: {name}
duration_s: {duration}
seed: 3
devices: 1
arrival: {{process: poisson}}
models:
  - name: {model}
    profile: {{alpha_ms: 1.053, beta_ms: 5.072}}
    slo_ms: {slo}
    max_batch: 32
    rate: {rate}
"""


def make_workload(
    tmp_path: Path, *, name="ip", model="resnet50-t4", slo=25, rate=100, duration=1.0
):
    path = tmp_path / f"{name}.yaml"
    path.write_text(WORKLOAD.format(name=name, model=model, slo=slo, rate=rate, duration=duration))
    return load_workload(path), path


def test_request_inputs_follow_the_model_config():
    specs = (
        TensorSpec("x", "FP32", (-1, 4, 2)),
        TensorSpec("ids", "INT64", (-1, 3)),
        TensorSpec("mask", "BOOL", (-1, 5)),
    )
    config = ModelConfig("m", "emulated", Path("."), specs, (), 8, 25.0)
    inputs = ip.request_inputs(config)
    assert {k: (v.shape, v.dtype) for k, v in inputs.items()} == {
        "x": ((1, 4, 2), np.dtype(np.float32)),
        "ids": ((1, 3), np.dtype(np.int64)),
        "mask": ((1, 5), np.dtype(bool)),
    }
    assert inputs["x"].min() >= -1.0 and inputs["x"].max() < 1.0
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 10


@pytest.mark.slow
def test_runs_against_the_live_service(tmp_path):
    """One service, three runs: served, all dropped, and a model it lacks."""
    served_wl, served_path = make_workload(tmp_path, name="served", rate=150, duration=1.0)
    # 4 ms is less than a batch of one takes (β + α ≈ 6.1 ms): every request
    # must come back dropped, none lost and none served.
    dropped_wl, _ = make_workload(tmp_path, name="dropped", slo=4, rate=100, duration=0.5)
    missing_wl, _ = make_workload(tmp_path, name="missing", model="no-such-model")
    settings = ip.service_settings(LIVE, 1, policy="symphony")

    async def scenario():
        async with ip.running_service(settings) as service:
            served = await ip.run_inprocess(service, served_wl)
            dropped = await ip.run_inprocess(service, dropped_wl)
            with pytest.raises(lg.LoadGenError, match="no-such-model"):
                await ip.run_inprocess(service, missing_wl)
            return served, dropped, ip.server_block(service)

    served, dropped, server = ip.run_on_daemon_loop(scenario)

    doc = lg.build_document(served_wl, served_path, served, server=server)
    jsonschema.validate(doc, LOADGEN_SCHEMA)
    assert doc["url"] == "in-process" and doc["generator"]["client"] == "in-process"
    assert server["mode"] == "in-process" and server["policy"] == "symphony"
    o = doc["overall"]
    assert o["requests"] == len(generate_arrivals(served_wl)) > 100
    assert o["error_fraction"] == 0.0
    assert o["slo_attainment"] + o["late_fraction"] + o["drop_fraction"] == pytest.approx(1.0)
    assert o["goodput_rps"] > 0
    assert o["mean_batch_size"] >= 1.0
    assert o["latency_p50_ms"] > ALPHA_MS + BETA_MS  # at least one emulated batch
    parts = doc["timing_breakdown"]["served"]
    assert parts["exec"]["p50_ms"] >= ALPHA_MS + BETA_MS - 0.1
    assert not np.isnan(served.records.sent).any()  # every request was sent

    d = dropped.summary["overall"]
    assert d["requests"] == len(generate_arrivals(dropped_wl)) > 20
    assert d["drop_fraction"] == 1.0
    assert d["error_fraction"] == 0.0
    assert d["drop_reasons"] == {"deadline": d["requests"]}


@pytest.fixture
def cli(run_module):
    """`python -m bench.inprocess ARGS` (conftest's `run_module`)."""
    return functools.partial(run_module, "bench.inprocess", timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "fifo"], "--policy must be one of"),
        (["--repository", "/no/such/dir"], "no such directory"),
        (["--deadline-margin-ms", "-1"], "--deadline-margin-ms must be ≥ 0"),
        (["--emulated-devices", "0"], "--emulated-devices must be ≥ 1"),
        (["--rate-scale", "0"], "--rate-scale must be a positive number"),
        (["--realtime-priority", "100"], "--realtime-priority must be 0 (off) to 99, got 100"),
    ],
)
def test_cli_refuses_bad_input_before_starting(tmp_path, cli, args, message):
    _, path = make_workload(tmp_path)
    proc = cli("--workload", str(path), "-q", *args)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.slow
def test_cli_refuses_a_bad_daemon_setting_in_the_environment(tmp_path, cli):
    _, path = make_workload(tmp_path)
    proc = cli("--workload", str(path), "-q", env={"TIMER_LEAD_MS": "soon"})
    assert proc.returncode == 2
    assert "TIMER_LEAD_MS='soon' is not a number" in proc.stderr


@pytest.mark.slow
def test_cli_capacity_search_probes_the_one_service(tmp_path, cli):
    _, path = make_workload(tmp_path, rate=100, duration=0.5)
    proc = cli(
        "--workload",
        str(path),
        "--json",
        "-q",
        "--capacity",
        "--max-probes",
        "2",
        "--probe-duration",
        "0.5",
        "--timer-lead-ms",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, LOADGEN_SCHEMA)
    assert doc["server"]["timer_lead_ms"] == 1.0
    emulated = [d for d in doc["server"]["devices"] if d.startswith("emulated")]
    assert emulated == ["emulated:0"]  # the workload's one device
    probes = doc["capacity_probes"]
    assert 1 <= len(probes) <= 2
    assert all(p["duration_s"] == 0.5 for p in probes)
    assert doc["capacity_status"] in ("converged", "max_runs", "above_max_scale", "below_min_scale")
    best = [p for p in probes if p["scale"] == doc["capacity_rate_scale"]]
    if best:  # the capacity is a probe that passed
        assert best[0]["passed"] and best[0]["offered_rps"] == doc["capacity_rps"]
    else:
        assert doc["capacity_rps"] == 0.0 and not any(p["passed"] for p in probes)
