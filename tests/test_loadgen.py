"""The open-loop load generator (bench.loadgen): its send schedule against a
stub server, open-loop behaviour under a slow server, latency from the
intended send time, the JSON schema, the loopback-only rule, and a short run
against the real daemon."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest

import bench.loadgen as lg
from app.workloads.arrivals import generate_arrivals
from app.workloads.spec import load_workload

ROOT = Path(__file__).resolve().parents[1]
SIM_SCHEMA = json.loads((ROOT / "bench" / "simulate_schema.json").read_text())
LOADGEN_SCHEMA = json.loads((ROOT / "bench" / "loadgen_schema.json").read_text())

# A minimal HTTP/1.1 server (keep-alive, no framework, so it costs little CPU):
# POST /infer answers after DELAY_MS, or 503 "deadline" for a model whose name
# ends in "-drop"; POST /v2/models/{name}/infer answers KServe v2 JSON;
# GET /v2/models/{name} for the models named on the command line; GET /stats
# returns the monotonic time each /infer request arrived
# (CLOCK_MONOTONIC is shared by processes, so it compares with the
# generator's clock).
STUB = r"""
import asyncio, json, sys, time

DELAY = float(sys.argv[1]) / 1000.0
MODELS = set(sys.argv[2].split(","))
received = []

def reply(transport, status, body):
    data = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n")
    if not transport.is_closing():
        transport.write(head.encode() + data)

class Stub(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""
    def data_received(self, data):
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path, _ = head[0].split(" ", 2)
            self.handle(method, path, body)
    def handle(self, method, path, body):
        loop = asyncio.get_running_loop()
        if method == "POST" and path == "/infer":
            received.append(time.monotonic())
            model = json.loads(body)["model"]
            if model.endswith("-drop"):
                reply(self.t, 503, {"error": "dropped", "reason": "deadline"})
                return
            out = {"model": model, "outputs": {"output": {"shape": [1, 2], "data": [[0.0, 1.0]]}},
                   "timing": {"queue_ms": 0.25, "exec_ms": 1.5, "batch_size": 3, "device": "stub0"}}
            loop.call_later(DELAY, reply, self.t, 200, out)
        elif method == "POST" and path.startswith("/v2/models/") and path.endswith("/infer"):
            # A KServe v2 peer: no `timing` in its answer.
            received.append(time.monotonic())
            name = path.split("/")[3]
            out = {"model_name": name, "outputs": [
                {"name": "output", "datatype": "FP32", "shape": [1, 2], "data": [0.0, 1.0]}]}
            loop.call_later(DELAY, reply, self.t, 200 if name in MODELS else 404, out)
        elif path.startswith("/v2/models/") and path.count("/") == 3:
            name = path.rsplit("/", 1)[1]
            if name in MODELS:
                reply(self.t, 200, {"name": name, "inputs": [
                    {"name": "input", "datatype": "FP32", "shape": [-1, 4]}]})
            else:
                reply(self.t, 404, {"error": f"model '{name}' not found",
                                    "reason": "model_not_found"})
        elif path == "/stats":
            reply(self.t, 200, {"received": received})
        elif path == "/v2":
            reply(self.t, 200, {"name": "stub", "version": "0"})
        elif path.startswith("/v2/health"):
            reply(self.t, 200, {"live": True})
        else:
            reply(self.t, 404, {"error": "not found"})

async def main():
    server = await asyncio.get_running_loop().create_server(Stub, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""

WORKLOAD = """\
name: {name}
duration_s: {duration}
seed: 3
devices: 2
arrival: {arrival}
models:
  - name: {model}
    profile: {{alpha_ms: 1.0, beta_ms: 5.0}}
    slo_ms: {slo}
    max_batch: 32
    rate: {rate}
"""


class Stub:
    def __init__(self, delay_ms: float, models: str = "m,m-drop") -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", STUB, str(delay_ms), models],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        port = int(self.process.stdout.readline())
        self.url = f"http://127.0.0.1:{port}"

    def received(self) -> np.ndarray:
        return np.array(httpx.get(f"{self.url}/stats", trust_env=False).json()["received"])

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def fast_stub():
    stub = Stub(delay_ms=2.0)
    yield stub
    stub.close()


def make_workload(tmp_path: Path, **kw):
    params = {
        "name": "stub-load",
        "duration": 2.0,
        "arrival": "{process: poisson}",
        "model": "m",
        # The stub answers in milliseconds: with a 5 s SLO, "within SLO" does
        # not depend on how busy the machine is.
        "slo": 5000,
        "rate": 300,
    }
    params.update(kw)
    path = tmp_path / f"{params['name']}.yaml"
    path.write_text(WORKLOAD.format(**params))
    return load_workload(path), path


def run(url, workload, **kw) -> lg.LiveResult:
    return asyncio.run(lg.run_load(url, workload, **kw))


def assert_on_schedule(lag_ms: np.ndarray, duration_s: float) -> None:
    """The sends kept to the schedule, in terms a busy machine cannot break
    (it delays some sends by tens of ms) but a generator that ignores the
    schedule does: none early (not all at once), and no drift — the typical
    send, over the whole run and in its last tenth, less than a tenth of the
    run's length behind its time (a generator at a fraction f of the rate
    falls (1 − f)·t behind by time t; a closed loop waits for each answer).
    How closely it keeps to the schedule is measured by the benchmarks
    (docs/benchmark-history.md: p99 lag < 2 ms up to ~10,000 r/s per worker)."""
    assert not np.isnan(lag_ms).any()
    assert lag_ms.min() > -0.01, lag_ms.min()
    tenth_ms = 100.0 * duration_s
    tail = lag_ms[-max(1, len(lag_ms) // 10) :]
    assert np.median(lag_ms) < tenth_ms and np.median(tail) < tenth_ms, np.percentile(
        lag_ms, [50, 90, 100]
    )


def pace(received: np.ndarray, intended: np.ndarray) -> float:
    """How far the stub's receive times moved on from the first half of the
    run to the second, against the schedule (medians, so a few late sends do
    not count): 1 on schedule; all at once would give ~0, half rate ~2."""
    half = len(intended) // 2
    return float(
        (np.median(received[half:]) - np.median(received[:half]))
        / (np.median(intended[half:]) - np.median(intended[:half]))
    )


# --------------------------------------------------------------------------- schedule


@pytest.mark.slow
def test_schedule_follows_the_workload(fast_stub, tmp_path):
    workload, _ = make_workload(tmp_path, rate=400, duration=1.5)
    expected = generate_arrivals(workload, 1.0)
    result = run(fast_stub.url, workload)
    rec = result.records
    # Exactly the workload's arrival sequence, in order.
    assert len(rec) == len(expected)
    np.testing.assert_array_equal(rec.intended, expected.times)
    # Counts per second match the Poisson process within tolerance.
    assert abs(len(rec) - 600) < 5 * np.sqrt(600)
    lag = rec.send_lag_ms
    assert_on_schedule(lag, workload.duration_s)
    g = result.generator
    assert g["sent"] == len(rec) and g["not_sent"] == 0
    # Its own report of the lag says what the records say.
    behind = np.count_nonzero(lag > g["lag_threshold_ms"]) / len(lag)
    assert g["behind_fraction"] == pytest.approx(behind)
    assert g["fell_behind"] == (behind > 0.01)
    o = result.summary["overall"]
    assert o["requests"] == len(rec)
    assert o["slo_attainment"] == pytest.approx(1.0)
    assert o["offered_rps"] == pytest.approx(len(rec) / 1.5)
    # The stub saw the same schedule: its receive times move on at the
    # schedule's pace.
    got = np.sort(fast_stub.received())[-len(rec) :]
    assert 0.75 < pace(got, rec.intended) < 1.33, pace(got, rec.intended)


@pytest.mark.slow
def test_bursty_schedule_and_two_workers(fast_stub, tmp_path):
    workload, _ = make_workload(
        tmp_path, name="bursty", arrival="{process: gamma, shape: 0.2}", rate=300, duration=1.0
    )
    expected = generate_arrivals(workload, 1.0)
    result = run(fast_stub.url, workload, workers=2)
    np.testing.assert_array_equal(result.records.intended, expected.times)
    assert result.generator["workers"] == 2
    assert result.generator["not_sent"] == 0
    # Bursts of simultaneous arrivals cost a little lag, but no drift.
    assert_on_schedule(result.records.send_lag_ms, workload.duration_s)
    assert result.summary["overall"]["slo_attainment"] > 0.99


# --------------------------------------------------------------------------- open loop


@pytest.mark.slow
def test_slow_server_does_not_shift_the_schedule(tmp_path):
    """A 300 ms server with 200 r/s offered: ~60 requests in flight. A closed
    loop would stall; the open loop keeps sending on time, and latency counts
    from the intended time (≥ the server's delay, all late for a 100 ms SLO)."""
    stub = Stub(delay_ms=300.0)
    try:
        workload, _ = make_workload(tmp_path, name="slow", rate=200, duration=1.0, slo=100)
        result = run(stub.url, workload)
    finally:
        stub.close()
    rec = result.records
    lag = rec.send_lag_ms
    assert_on_schedule(lag, workload.duration_s)
    # No send waited for an answer: each left less than the server's 300 ms
    # after its time.
    assert lag.max() < 300.0, np.percentile(lag, [50, 90, 100])
    lat = rec.latency_ms
    assert (lat >= 300.0).all()
    # A closed loop would wait for answers; this one sent ~60 requests (0.3 s
    # at 200 r/s) before the first answer came back.
    first_answer = np.min(rec.intended + lat / 1000.0)
    assert np.count_nonzero(rec.sent < first_answer) >= 40
    o = result.summary["overall"]
    assert o["late_fraction"] == pytest.approx(1.0)
    assert o["goodput_rps"] == 0.0
    assert o["latency_p50_ms"] >= 300.0


@pytest.mark.slow
def test_latency_counts_from_the_intended_time(fast_stub, tmp_path):
    """Delay the generator's start artificially: the requests are sent late,
    and the lateness is in their latency (not hidden)."""
    workload, _ = make_workload(tmp_path, name="late", rate=100, duration=0.5)
    arrivals = generate_arrivals(workload, 1.0)
    # Everything due at t = 0: a burst the generator cannot send all at once;
    # the later ones in the burst carry their send lag in their latency.
    arrivals.times[:] = 0.0
    result = run(fast_stub.url, workload, arrivals=arrivals)
    rec = result.records
    lag = rec.send_lag_ms
    assert lag.max() > 0.5
    np.testing.assert_array_less(lag - 1e-6, rec.latency_ms)  # latency includes the lag
    order = np.argsort(lag)
    assert np.corrcoef(lag[order], rec.latency_ms[order])[0, 1] > 0.5


@pytest.mark.slow
def test_httpx_client_follows_the_schedule_too(fast_stub, tmp_path):
    workload, _ = make_workload(tmp_path, name="httpx", rate=100, duration=0.5)
    expected = generate_arrivals(workload, 1.0)
    result = run(fast_stub.url, workload, client="httpx")
    assert result.generator["client"] == "httpx"
    assert result.generator["not_sent"] == 0
    rec = result.records
    np.testing.assert_array_equal(rec.intended, expected.times)
    assert_on_schedule(rec.send_lag_ms, workload.duration_s)
    # The stub saw the same pace.
    got = np.sort(fast_stub.received())[-len(rec) :]
    assert 0.75 < pace(got, rec.intended) < 1.33, pace(got, rec.intended)
    o = result.summary["overall"]
    assert o["goodput_rps"] > 0 and o["mean_batch_size"] == pytest.approx(3.0)


@pytest.mark.parametrize("client", ["raw", "httpx"])
def test_targets_with_their_own_path_are_sent_there(fast_stub, tmp_path, client):
    # A peer speaking another API (KServe v2 here): each target names its path.
    workload, _ = make_workload(tmp_path, name=f"path-{client}", rate=100, duration=0.3)
    before = len(fast_stub.received())
    target = lg.ModelTarget("m", 100.0, b'{"inputs": []}', path="/v2/models/m/infer")
    result = run(fast_stub.url, workload, client=client, targets=[target])
    rec = result.records
    assert len(rec) > 10 and int(np.sum(rec.status == 200)) == len(rec)
    assert len(fast_stub.received()) - before == len(rec)
    # No `timing` in a KServe answer: the server's split is unknown, not zero.
    assert np.all(np.isnan(rec.queue_ms)) and np.all(rec.batch_size == 0)
    o = result.summary["overall"]
    assert o["goodput_rps"] > 0


@pytest.mark.slow
def test_timeouts_and_drops_are_classified(tmp_path):
    stub = Stub(delay_ms=400.0, models="m,m-drop")
    try:
        workload, _ = make_workload(tmp_path, name="timeouts", rate=50, duration=0.5, slo=20)
        result = run(stub.url, workload, timeout_margin_ms=50.0)
        o = result.summary["overall"]
        assert o["error_fraction"] == pytest.approx(1.0)
        # Timed out: given up on, not waited for until the stub's answer.
        assert set(o["error_reasons"]) == {"timeout"}
        dropped, _ = make_workload(tmp_path, name="drops", model="m-drop", rate=50, duration=0.5)
        d = run(stub.url, dropped).summary["overall"]
        assert d["drop_fraction"] == pytest.approx(1.0)
        assert d["drop_reasons"] == {"deadline": d["requests"]}
    finally:
        stub.close()


# --------------------------------------------------------------------------- checks


NOT_LOOPBACK = [
    "http://10.0.0.1:8000",
    "http://example.com",
    "http://192.168.1.2:80",
    "http://[2001:db8::1]:80",
    "http://0.0.0.0:8000",
    "ftp://127.0.0.1",
]


@pytest.mark.parametrize("url", NOT_LOOPBACK)
def test_non_loopback_urls_are_refused(url, tmp_path):
    with pytest.raises(lg.LoadGenError):
        lg.check_loopback(url)
    workload, _ = make_workload(tmp_path)
    with pytest.raises(lg.LoadGenError, match=r"loopback|http://"):
        run(url, workload)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--url", "http://10.1.2.3:8000"], "loopback"),
        (
            ["--url", "http://127.0.0.1:9", "--realtime-priority", "-2"],
            "--realtime-priority must be 0 (off) to 99, got -2",
        ),
    ],
)
def test_cli_refuses_bad_input_before_sending(tmp_path, run_module, args, message):
    _, path = make_workload(tmp_path)
    proc = run_module("bench.loadgen", "-q", "--workload", str(path), *args, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "http://127.5.6.7", "http://[::1]:9"])
def test_loopback_urls_are_accepted(url):
    assert lg.check_loopback(url + "/") == url


@pytest.mark.slow
def test_missing_model_is_a_clear_error(fast_stub, tmp_path):
    workload, _ = make_workload(tmp_path, model="nope")
    with pytest.raises(lg.LoadGenError, match=r"'nope'.*not on the server"):
        run(fast_stub.url, workload)


@pytest.mark.slow
def test_run_is_bounded_in_requests(fast_stub, tmp_path):
    workload, _ = make_workload(tmp_path, rate=1000, duration=2.0)
    with pytest.raises(lg.LoadGenError, match="max-requests"):
        run(fast_stub.url, workload, max_requests=100)


def test_body_is_built_from_metadata():
    body = json.loads(
        lg.build_body("m", [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 2]}], 25.0)
    )
    assert body["model"] == "m" and body["slo_ms"] == 25.0
    assert np.asarray(body["inputs"]["x"]).shape == (1, 3, 2)


# --------------------------------------------------------------------------- JSON


def _validate_metrics(m: dict) -> None:
    jsonschema.validate(m, {"$defs": SIM_SCHEMA["$defs"], **SIM_SCHEMA["$defs"]["metrics"]})
    total = m["slo_attainment"] + m["drop_fraction"] + m["late_fraction"] + m["error_fraction"]
    assert total == pytest.approx(1.0)


@pytest.mark.slow
def test_cli_json_validates_against_the_schemas(fast_stub, tmp_path, run_module):
    _, path = make_workload(tmp_path, rate=200, duration=0.5)
    plot = tmp_path / "run.png"
    proc = run_module(
        "bench.loadgen",
        "--url",
        fast_stub.url,
        "--workload",
        str(path),
        "--json",
        "--plot",
        str(plot),
        "--rate-scale",
        "1.5",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, LOADGEN_SCHEMA)
    _validate_metrics(doc["overall"])
    for m in doc["models"].values():
        _validate_metrics(m)
    assert doc["rate_scale"] == 1.5
    assert doc["overall"]["mean_batch_size"] == pytest.approx(3.0)  # from the stub's timing
    assert doc["overall"]["goodput_rps"] > 0
    assert doc["server"] == {"name": "stub", "version": "0"}
    assert plot.stat().st_size > 10_000


@pytest.mark.slow
def test_capacity_search_against_a_stub(tmp_path):
    """The stub serves everything in 30 ms; with a 25 ms SLO nothing passes,
    with 5 s everything does (the search ends at its upper bound)."""
    stub = Stub(delay_ms=30.0)
    try:
        workload, path = make_workload(tmp_path, rate=50, duration=1.0)
        cap, probes = lg.find_live_capacity(
            stub.url, workload, probe_duration_s=0.4, max_runs=2, settle_s=0.0
        )
        assert cap.capacity_rps > 0 and cap.status == "max_runs"
        assert all(p.passed for p in cap.probes) and len(probes) == 2
        assert [p.scale for p in cap.probes] == [1.0, 2.0]  # doubling while it passes
        tight = dataclasses.replace(
            workload, models=[dataclasses.replace(workload.models[0], slo_ms=25.0)]
        )
        # Nothing ever comes back within 25 ms, so the drain waits its whole timeout.
        cap, _ = lg.find_live_capacity(
            stub.url, tight, probe_duration_s=0.3, max_runs=1, settle_s=0.0, drain_timeout_s=0.5
        )
        assert cap.capacity_rps == 0.0 and cap.rate_scale is None
        doc = lg.build_document(tight, path, probes[max(probes)], cap)
        jsonschema.validate(doc, LOADGEN_SCHEMA)
    finally:
        stub.close()


@pytest.mark.slow
def test_paired_probes_take_the_daemons_in_turn_reversed_each_round(tmp_path):
    """bench.ray_executors --paired (ABBA): the same short run against each
    server in turn, the order reversed every round, its share within SLO
    and goodput per run."""
    from types import SimpleNamespace

    from bench.ray_executors import paired_probes

    first, second = Stub(delay_ms=2.0), Stub(delay_ms=2.0)
    try:
        handles = {"a": SimpleNamespace(url=first.url), "b": SimpleNamespace(url=second.url)}
        workload, _ = make_workload(tmp_path, rate=200)
        found = asyncio.run(paired_probes(handles, workload, 0.5, 2, 0.4))  # type: ignore[arg-type]
        runs = {"a": first.received(), "b": second.received()}
    finally:
        first.close()
        second.close()
    assert list(found) == ["a", "b"]
    for p in found.values():
        assert (p["rate_scale"], p["rounds"], p["probe_s"]) == (0.5, 2, 0.4)
        assert len(p["offered_rps"]) == len(p["within_slo"]) == len(p["goodput_rps"]) == 2
        assert all(50 < offered < 150 for offered in p["offered_rps"])  # half of 200 r/s
        assert p["within_slo"] == [1.0, 1.0] and p["mean_within_slo"] == 1.0
        assert p["mean_goodput_rps"] == pytest.approx(np.mean(p["goodput_rps"]))
    # A server's runs are 0.4 s long and ≥ 0.5 s apart (the settle, the other's
    # run); before them, prepare_targets tried its model with one request.
    order = sorted((t, name) for name, times in runs.items() for t in _run_starts(times[1:]))
    assert [name for _, name in order] == ["a", "b", "b", "a"]


def _run_starts(times: np.ndarray) -> list[float]:
    """When each run began: the first request, and each after a silence over 0.3 s."""
    return [float(times[0])] + [
        float(later) for earlier, later in itertools.pairwise(times) if later - earlier > 0.3
    ]


# --------------------------------------------------------------------------- the daemon


@pytest.fixture(scope="module")
def daemon(launch_daemon):
    return launch_daemon(ROOT / "bench" / "repositories" / "live", emulated_devices=2).url


@pytest.mark.slow
def test_end_to_end_against_the_daemon(daemon, tmp_path):
    workload, path = make_workload(
        tmp_path, name="daemon-e2e", model="resnet50-t4", slo=25, rate=150, duration=1.0
    )
    result = run(daemon, workload)
    server = asyncio.run(lg.server_info(daemon))
    doc = lg.build_document(workload, path, result, server=server)
    jsonschema.validate(doc, LOADGEN_SCHEMA)
    o = doc["overall"]
    _validate_metrics(o)
    assert o["goodput_rps"] > 0
    assert o["requests"] == doc["models"]["resnet50-t4"]["requests"] > 100
    assert o["mean_batch_size"] >= 1.0
    assert 0 < o["device_busy_fraction"] < 1
    assert o["latency_p50_ms"] > 1.053 + 5.072  # at least one emulated batch
    assert doc["server"]["name"] == "deadline-serve"
    # The daemon reports every part of a request's time; they add up to less
    # than the latency measured by the generator.
    parts = doc["timing_breakdown"]["served"]
    assert parts["requests"] == round((o["slo_attainment"] + o["late_fraction"]) * o["requests"])
    for name in lg.TIMING_PARTS:
        assert parts[name]["p50_ms"] is not None, name
    assert 0 <= parts["intake"]["p50_ms"] <= parts["queue"]["p50_ms"]
    assert parts["exec"]["p50_ms"] >= 1.053 + 5.072 - 0.1
    assert parts["answer"]["p50_ms"] >= 0
    # What the daemon reports happened inside the latency the generator saw.
    assert parts["outside"]["p50_ms"] >= 0


def test_records_count_their_errors_by_status_and_reason():
    rec = lg.Records.empty(np.zeros(5), np.zeros(5, dtype=np.int32))
    rec.reasons[:] = ["deadline", "queue_full"]
    rec.status[:] = [200, 503, 503, 429, 0]  # the last one never answered
    rec.reason[:] = [-1, 0, 0, 1, -1]
    assert rec.errors() == {"503 deadline": 2, "429 queue_full": 1}


def test_timing_breakdown_splits_each_latency_and_picks_the_late_ones():
    rec = lg.Records.empty(np.array([0.0, 0.01, 0.02, 0.03]), np.zeros(4, dtype=np.int32))
    rec.sent[:] = rec.intended + 0.001  # 1 ms send lag each
    rec.status[:] = [200, 200, 200, 503]
    rec.latency_ms[:] = [10.0, 30.0, 12.0, 5.0]
    rec.queue_ms[:3] = [3.0, 15.0, 4.0]
    rec.intake_ms[:3] = [0.5, 2.0, 0.5]
    rec.exec_ms[:3] = [5.0, 6.0, 5.0]
    rec.answer_ms[:3] = [0.5, 4.0, 1.0]
    breakdown = lg.timing_breakdown(rec, np.array([25.0]))
    served, late = breakdown["served"], breakdown["late"]
    assert served["requests"] == 3 and late["requests"] == 1
    # outside = latency − send lag − queue − exec − answer
    assert served["outside"]["p50_ms"] == pytest.approx(1.0)  # of 0.5, 4.0, 1.0
    assert late["outside"]["p50_ms"] == pytest.approx(30.0 - 1.0 - 15.0 - 6.0 - 4.0)
    assert late["answer"] == {"p50_ms": pytest.approx(4.0), "p99_ms": pytest.approx(4.0)}
    assert late["send_lag"]["p50_ms"] == pytest.approx(1.0)
    # A server that does not report a part: null, not zero.
    rec.answer_ms[:] = np.nan
    assert lg.timing_breakdown(rec, np.array([25.0]))["late"]["answer"]["p50_ms"] is None


@pytest.mark.slow
def test_daemon_rejects_a_model_it_does_not_serve(daemon, tmp_path):
    workload, _ = make_workload(tmp_path, model="resnet50-emulated")
    with pytest.raises(lg.LoadGenError, match="not on the server"):
        run(daemon, workload)


def test_variants_send_each_request_its_own_body():
    """With a body index, request i sends body `body_index[i]` (a dynamic
    model's requests carry different inputs) and is still timed and recorded
    against its model."""
    from bench.loadgen.client import Reply
    from bench.loadgen.driver import Schedule, drive

    class Recorder:
        def __init__(self) -> None:
            self.sent: list[int] = []

        async def send(self, m: int, on_sent) -> Reply:
            on_sent()
            self.sent.append(m)
            return Reply(200, b'{"timing":{"batch_size":1}}', asyncio.get_running_loop().time())

    schedule = Schedule(
        intended=np.array([0.0, 0.001, 0.002, 0.003]),
        model_index=np.array([0, 0, 1, 0]),
        timeouts_s=[1.0, 1.0],
        run_limit_s=2.0,
        body_index=np.array([3, 2, 0, 3]),
    )
    sender = Recorder()

    async def go() -> lg.Records:
        return await drive(schedule, asyncio.get_running_loop().time(), sender)

    records = asyncio.run(go())
    assert sender.sent == [3, 2, 0, 3]
    assert records.model_index.tolist() == [0, 0, 1, 0]
    assert (records.status == 200).all()
