"""Triton's statistics extension (issue 20, item 4): the accumulator
(app/server/statistics.py) on exact numbers, the routes in front of a fake
service, and the counts of a real LiveService (emulated devices, executor
processes) equal to the requests sent, per model and batch size."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest

from app.api import create_api
from app.server.live import LiveService
from app.server.metrics import Metrics
from app.server.settings import Settings
from app.server.statistics import Statistics
from tests.fakes import FakeService

ZERO = {"count": 0, "ns": 0}


# ------------------------------------------------------------------ the accumulator


def test_a_request_and_its_batch_in_triton_fields():
    stats = Statistics()
    stats.add_model("m", "1")
    stats.batch_executed("m", batch=(0, 7), batch_size=3, requests=2, infer_s=0.010)
    # a request of two items and one of one item, answered from that batch
    common = {"queue_s": 0.002, "infer_s": 0.010, "batch": (0, 7)}
    stats.request_succeeded(
        "m", items=2, total_s=0.015, input_s=0.001, output_s=0.0005, at_ms=1_000, **common
    )
    stats.request_succeeded(
        "m", total_s=0.016, input_s=0.0015, output_s=0.0002, at_ms=1_001, **common
    )
    stats.request_failed("m", total_s=0.004, at_ms=999)
    stats.request_failed("nope", total_s=1.0, at_ms=5_000)  # an unknown model: not counted
    (m,) = stats.report()["model_stats"]
    assert m == {
        "name": "m",
        "version": "1",
        "last_inference": 1_001,
        "inference_count": 3,
        "execution_count": 1,
        "inference_stats": {
            "success": {"count": 2, "ns": 31_000_000},
            "fail": {"count": 1, "ns": 4_000_000},
            "queue": {"count": 2, "ns": 4_000_000},
            "compute_input": {"count": 2, "ns": 2_500_000},
            "compute_infer": {"count": 2, "ns": 20_000_000},
            "compute_output": {"count": 2, "ns": 700_000},
            "cache_hit": ZERO,
            "cache_miss": ZERO,
        },
        "batch_stats": [
            {
                "batch_size": 3,
                # the batch's slowest request: intake 1.5 ms, answer 0.5 ms
                "compute_input": {"count": 1, "ns": 1_500_000},
                "compute_infer": {"count": 1, "ns": 10_000_000},
                "compute_output": {"count": 1, "ns": 500_000},
            }
        ],
    }


def test_reload_restarts_at_zero_and_unload_removes():
    stats = Statistics()
    stats.add_model("a", "1")
    stats.add_model("b", "2")
    stats.request_failed("a", total_s=0.1, at_ms=1)
    assert [m["name"] for m in stats.report()["model_stats"]] == ["a", "b"]
    assert stats.report("b", "1") == {"model_stats": []}
    stats.add_model("a", "1")
    assert stats.report("a")["model_stats"][0]["inference_stats"]["fail"] == ZERO
    stats.remove_model("a")
    assert stats.report("a") == {"model_stats": []}
    with pytest.raises(ValueError, match="at least one item"):
        stats.request_succeeded(
            "b", items=0, total_s=0, queue_s=0, input_s=0, infer_s=0, output_s=0, at_ms=0
        )


# ------------------------------------------------------------------ the routes


@pytest.mark.anyio
async def test_routes_in_triton_json(client):
    r = await client.get("/v2/models/stats")  # not the metadata of a model "stats"
    assert r.status_code == 200, r.text
    names = [m["name"] for m in r.json()["model_stats"]]
    assert names == sorted(FakeService().configs)
    r = await client.get("/v2/models/add_one/stats")
    assert r.status_code == 200, r.text
    (stat,) = r.json()["model_stats"]
    assert stat["name"] == "add_one" and stat["version"] == "1"
    assert set(stat) == {
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
    }
    r = await client.get("/v2/models/add_one/versions/1/stats")
    assert r.status_code == 200 and r.json()["model_stats"] == [stat]
    r = await client.get("/v2/models/add_one/versions/2/stats")
    assert r.status_code == 404 and "'add_one' version 2 is not found" in r.json()["error"]
    r = await client.get("/v2/models/nope/stats")
    assert r.status_code == 404 and r.json()["reason"] == "model_not_found"
    r = await client.get("/v2/models/stats/ready")  # a reserved name
    assert r.status_code == 400 and "reserved" in r.json()["error"]
    r = await client.get("/v2")
    assert "statistics" in r.json()["extensions"]


# ------------------------------------------------------------------ a live service

EMULATED = (
    "backend: emulated\n"
    "max_batch_size: 8\n"
    "slo_ms: {slo_ms}\n"
    "profile: {{alpha_ms: {alpha}, beta_ms: 20.0}}\n"
    "devices: [emulated]\n"
    "inputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]\n"
    "outputs: [{{name: x, datatype: FP32, shape: [-1, 4]}}]\n"
)


def emulated_repository(root: Path, names: dict[str, float], slo_ms: float = 5000) -> Path:
    """Emulated models (name → α in ms; β = 20 ms), SLO 5 s by default:
    nothing is late or dropped unless a request asks for a tighter SLO."""
    for name, alpha in names.items():
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text(EMULATED.format(alpha=alpha, slo_ms=slo_ms))
    return root


def live_settings(repository: Path, **overrides) -> Settings:
    return Settings(
        repository=repository,
        cpu_slices=0,
        emulated_devices=1,
        respawn=False,
        **overrides,
    )


def body(value: float, slo_ms: float | None = None) -> dict:
    request = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [value] * 4}]}
    if slo_ms is not None:
        request["parameters"] = {"slo_ms": slo_ms}
    return request


@pytest.mark.slow
@pytest.mark.anyio
async def test_counts_equal_the_requests_sent_per_model_and_batch_size(tmp_path):
    repository = emulated_repository(tmp_path / "models", {"alpha": 1.0, "beta": 2.0})
    service = LiveService(live_settings(repository), Metrics())
    await service.start()
    try:
        app = create_api(lambda: service, Metrics())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            sent = {"alpha": 23, "beta": 9}
            tight = {"alpha": 3, "beta": 0}  # 1 µs SLO: dropped, answered 503

            async def one(model: str, i: int, slo_ms: float | None = None) -> httpx.Response:
                return await client.post(f"/v2/models/{model}/infer", json=body(i, slo_ms))

            calls = [one(m, i) for m, n in sent.items() for i in range(n)]
            calls += [one(m, i, 0.001) for m, n in tight.items() for i in range(n)]
            # in waves, so that batches of several sizes form
            replies = []
            for start in range(0, len(calls), 7):
                replies += await asyncio.gather(*calls[start : start + 7])
            report = (await client.get("/v2/models/stats")).json()
            alone = (await client.get("/v2/models/alpha/stats")).json()
    finally:
        await service.stop()

    by_model = {m["name"]: m for m in report["model_stats"]}
    assert alone["model_stats"] == [by_model["alpha"]]
    assert sorted(by_model) == ["alpha", "beta"]
    outcomes = Counter(
        (r.json()["model_name"] if r.status_code == 200 else r.status_code) for r in replies
    )
    assert outcomes == Counter({"alpha": 23, "beta": 9, 503: 3}), outcomes
    for model in sent:
        ok = [r.json() for r in replies if r.status_code == 200 and r.json()["model_name"] == model]
        stat = by_model[model]
        inference = stat["inference_stats"]
        assert stat["inference_count"] == sent[model]
        for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert inference[key]["count"] == sent[model], key
            assert inference[key]["ns"] > 0 or key == "queue", key
        assert inference["fail"]["count"] == tight[model]
        assert inference["cache_hit"] == inference["cache_miss"] == ZERO
        # every batch ran its requests to their end: the batches of size b
        # are the answers that ran in one, b to a batch
        sizes = Counter(reply["parameters"]["batch_size"] for reply in ok)
        batches = {size: count // size for size, count in sizes.items()}
        assert all(count % size == 0 for size, count in sizes.items()), sizes
        got = {b["batch_size"]: b["compute_infer"]["count"] for b in stat["batch_stats"]}
        assert got == batches
        assert stat["execution_count"] == sum(batches.values())
        for entry in stat["batch_stats"]:
            n = entry["compute_infer"]["count"]
            assert entry["compute_input"]["count"] == entry["compute_output"]["count"] == n
            # ℓ(b) = α·b + β ms on the emulated device, each batch at least that
            floor_ns = n * (20.0 + {"alpha": 1.0, "beta": 2.0}[model] * entry["batch_size"]) * 1e6
            assert entry["compute_infer"]["ns"] >= floor_ns * 0.99
        assert stat["last_inference"] > 1_600_000_000_000  # ms since the epoch
    assert len({b["batch_size"] for b in by_model["alpha"]["batch_stats"]}) > 1


@pytest.mark.slow
def test_tritonclient_reads_the_statistics(live_server, triton):
    every = triton.get_inference_statistics()
    assert {m["name"] for m in every["model_stats"]} >= {"add_one", "typed"}
    one = triton.get_inference_statistics("add_one", "1")
    assert [m["name"] for m in one["model_stats"]] == ["add_one"]
    assert one["model_stats"][0]["inference_stats"]["cache_hit"] == ZERO
