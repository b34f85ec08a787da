"""A request's SLO clock starts when its bytes reach the server
(app/api/received.py): the uvicorn protocol stamps it, the fast path passes
the stamp to the service, and the dispatcher sets arrival and deadline from
it (never later than now, never in the future)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.api import create_api
from app.api.received import RECEIVED_AT, receive_stamping_protocol, received_at
from app.scheduling.flex import FlexScheduler
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.metrics import Metrics
from tests.fakes import GOOD_V2, FakeService, devices, model
from tests.fakes_live import FakeExecutors


def _dispatcher() -> Dispatcher:
    info = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=1000.0)
    core = FlexScheduler([info], devices(1), deadline_margin=0.002)
    return Dispatcher([CoreGroup(core, frozenset({"m"}), (0,))], FakeExecutors())


def test_dispatcher_counts_the_slo_from_when_the_request_was_received():
    async def scenario() -> None:
        d = _dispatcher()
        before = time.monotonic()
        received = before - 0.25  # parsed 250 ms after its bytes arrived
        pending = d.submit_request("m", 0, 1.0, received_at=received)
        assert pending.request.arrival == received
        # Its deadline is where its SLO ends; the core plans 2 ms before it.
        assert pending.request.deadline == pytest.approx(received + 1.0)
        assert pending.request.due == pytest.approx(received + 1.0 - 0.002)
        unstamped = d.submit_request("m", 1, 1.0)
        assert before <= unstamped.request.arrival <= time.monotonic()
        # A stamp from the future (another clock) is clamped to now.
        future = d.submit_request("m", 2, 1.0, received_at=time.monotonic() + 5.0)
        assert future.request.arrival <= time.monotonic()

    asyncio.run(scenario())


@pytest.mark.anyio
async def test_fast_path_stamps_unstamped_requests_and_passes_the_stamp_on():
    service = FakeService()
    app = create_api(lambda: service, Metrics(), max_body_bytes=1 << 20)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        before = time.monotonic()
        res = await client.post("/v2/models/add_one/infer", json=GOOD_V2)
        after = time.monotonic()
    assert res.status_code == 200, res.text
    stamp = service.calls[-1]["received_at"]
    assert isinstance(stamp, float) and before <= stamp <= after


def test_received_at_reads_only_float_stamps():
    assert received_at({RECEIVED_AT: 12.5}) == 12.5
    assert received_at({}) is None
    assert received_at({RECEIVED_AT: "12.5"}) is None


@pytest.mark.slow
def test_uvicorn_protocol_stamps_each_request_before_the_app_runs(uvicorn_in_thread):
    seen: list[tuple[float | None, float]] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append((scope.get(RECEIVED_AT), time.monotonic()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol = receive_stamping_protocol()
    assert protocol != "auto", "uvicorn[standard] (httptools) is a dependency"
    address = uvicorn_in_thread(app, http=protocol, log_level="error", lifespan="auto")
    before = time.monotonic()
    with httpx.Client(base_url=f"http://{address}") as client:
        # Two requests on one keep-alive connection: each gets its own stamp.
        assert client.get("/a").status_code == 204
        assert client.get("/b").status_code == 204
    assert len(seen) == 2
    (first, first_seen), (second, second_seen) = seen
    assert isinstance(first, float) and isinstance(second, float)
    assert before <= first <= first_seen < second <= second_seen
