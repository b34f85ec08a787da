"""Requests carry an application id (app/api/app_id.py) end to end: the
native `app_id`, KServe v2 `parameters.app_id` (gRPC: tests/test_grpc.py),
checked alike, echoed in the answer's timing, documented in the OpenAPI
schema, and handed by the dispatcher to the scheduling core as `Request.app`.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from app.api import create_api
from app.api.app_id import APP_ID_PATTERN, MAX_APP_ID_LENGTH, check_app_id
from app.errors import InvalidInput
from app.scheduling import make_scheduler
from app.server.dispatcher import CoreGroup, Dispatcher
from app.server.metrics import Metrics
from tests.fakes import FakeService, devices, model
from tests.fakes_live import FakeClock, FakeExecutors, FakeTimer

NATIVE = {"model": "add_one", "inputs": {"x": [[1, 2, 3, 4]]}}
V2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

# (value, taken): strings of 1–128 printable ASCII characters only.
VALUES = [
    ("short", True),
    ("tenant-7/chat v2", True),
    (" ~!", True),
    ("x" * MAX_APP_ID_LENGTH, True),
    ("x" * (MAX_APP_ID_LENGTH + 1), False),
    ("", False),
    ("line\n", False),
    ("tab\there", False),
    ("\x7f", False),
    ("café", False),
    (7, False),
    (True, False),
    (["a"], False),
]


@pytest.mark.parametrize(("value", "taken"), VALUES)
def test_check_app_id_takes_printable_ascii_of_1_to_128(value, taken) -> None:
    if taken:
        assert check_app_id(value) == value
    else:
        with pytest.raises(InvalidInput, match="app_id"):
            check_app_id(value)
    assert check_app_id(None) == ""


def test_the_schema_pattern_says_what_the_server_takes() -> None:
    for value, taken in VALUES:
        if isinstance(value, str):
            fits = re.fullmatch(APP_ID_PATTERN.strip("^$"), value) is not None
            assert (fits and 1 <= len(value) <= MAX_APP_ID_LENGTH) == taken, value


def test_openapi_documents_app_id_in_requests_and_answers() -> None:
    schemas = create_api(lambda: FakeService(), Metrics()).openapi()["components"]["schemas"]
    for request in ("InferRequest", "V2RequestParameters"):
        declared = schemas[request]["properties"]["app_id"]
        string, null = declared["anyOf"]
        assert string == {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_APP_ID_LENGTH,
            "pattern": APP_ID_PATTERN,
        }
        assert null == {"type": "null"}
        assert "default application" in declared["description"]
    for answer in ("Timing", "V2ResponseParameters"):
        assert schemas[answer]["properties"]["app_id"]["type"] == "string"
        assert "app_id" in schemas[answer]["required"]


# ------------------------------------------------------------------ HTTP


@pytest.mark.anyio
async def test_native_app_id_is_passed_on_and_echoed(client, service) -> None:
    r = await client.post("/infer", json={**NATIVE, "app_id": "tenant-7"})
    assert r.status_code == 200, r.text
    assert r.json()["timing"]["app_id"] == "tenant-7"
    assert service.calls[-1]["app"] == "tenant-7"
    for body in (NATIVE, {**NATIVE, "app_id": None}):
        r = await client.post("/infer", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["timing"]["app_id"] == ""
        assert service.calls[-1]["app"] == ""


@pytest.mark.anyio
@pytest.mark.parametrize("value", [v for v, taken in VALUES if not taken])
async def test_native_bad_app_id_is_a_400_naming_it(client, service, value) -> None:
    r = await client.post("/infer", json={**NATIVE, "app_id": value})
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "invalid_input"
    assert "app_id" in r.json()["error"]
    assert not service.calls


@pytest.mark.anyio
async def test_v2_app_id_parameter_is_passed_on_and_echoed(client, service) -> None:
    body = {**V2, "parameters": {"app_id": "short", "slo_ms": 20}}
    r = await client.post("/v2/models/add_one/infer", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["app_id"] == "short"
    assert (service.calls[-1]["app"], service.calls[-1]["slo_ms"]) == ("short", 20.0)
    r = await client.post("/v2/models/add_one/infer", json=V2)
    assert r.status_code == 200, r.text
    assert r.json()["parameters"]["app_id"] == ""
    assert service.calls[-1]["app"] == ""


@pytest.mark.anyio
@pytest.mark.parametrize("value", [v for v, taken in VALUES if not taken])
async def test_v2_bad_app_id_is_a_400_naming_it(client, service, value) -> None:
    body = {**V2, "parameters": {"app_id": value}}
    r = await client.post("/v2/models/add_one/infer", json=body)
    assert r.status_code == 400, r.text
    assert "app_id" in r.json()["error"]
    assert not service.calls


@pytest.mark.anyio
async def test_v2_a_custom_parameter_is_no_app_id(client, service) -> None:
    body = {**V2, "parameters": {"app": "short"}}  # accepted as Triton would, no effect
    r = await client.post("/v2/models/add_one/infer", json=body)
    assert r.status_code == 200, r.text
    assert service.calls[-1]["app"] == ""


# ------------------------------------------------------------- dispatcher


def test_the_dispatcher_hands_the_application_to_the_core() -> None:
    async def scenario() -> None:
        info = model("m")
        core = make_scheduler("clockwork", [info], devices(1))
        executors = FakeExecutors()
        timer = FakeTimer()
        group = CoreGroup(core, frozenset(core.models), tuple(core.devices))
        dispatcher = Dispatcher([group], executors, clock=FakeClock(), timer_factory=lambda: timer)
        short = dispatcher.submit_request("m", 0, info.slo, app="short")
        default = dispatcher.submit_request("m", 1, info.slo)
        assert (short.request.app, default.request.app) == ("short", "")
        (batch,) = core.in_flight.values()  # the first went at once, alone
        assert [r.app for r in batch.requests] == ["short"]

    asyncio.run(scenario())
