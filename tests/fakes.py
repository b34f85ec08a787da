"""Fakes and builders shared by the tests: models and requests for the
scheduling core (virtual clock, no sleeping), ONNX and emulated model
configs, an in-memory inference service for the HTTP layer and a
collector of the executor pool's events (the live dispatcher's fakes are in
tests/fakes_live.py). Fixtures (what starts something and cleans up after it)
are in tests/conftest.py."""

from __future__ import annotations

import asyncio
import json
import math
import os
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.errors import Dropped, ModelNotFound, Overloaded
from app.planning.inss.plan import placement_plan, write_plan
from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import SEGMENT_PREFIX
from app.runtime.events import (
    BatchFinished,
    BatchStopped,
    ExecutorEvent,
)
from app.scheduling import DeviceInfo, LatencyProfile, ModelInfo, Request
from app.scheduling.types import Complete, Decision, Dispatch, Drop, Preempt
from app.server.service import InferResult
from app.server.statistics import Statistics

_ids = count()


def model(
    name: str = "m",
    alpha_ms: float = 1.0,
    beta_ms: float = 10.0,
    slo_ms: float = 50.0,
    max_batch: int = 32,
    expected_rate: float | None = None,
) -> ModelInfo:
    profile = LatencyProfile.linear(alpha_ms, beta_ms, max_batch)
    return ModelInfo(name, profile, slo_ms / 1000, max_batch, expected_rate)


def devices(n: int = 1) -> list[DeviceInfo]:
    return [DeviceInfo(i) for i in range(n)]


def request(info: ModelInfo, arrival: float, slo_s: float | None = None) -> Request:
    slo = info.slo if slo_s is None else slo_s
    return Request(next(_ids), info.name, arrival, arrival + slo)


def dispatches(decisions: list[Decision]) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]


def drops(decisions: list[Decision]) -> list[Drop]:
    return [d for d in decisions if isinstance(d, Drop)]


def preempts(decisions: list[Decision]) -> list[Preempt]:
    return [d for d in decisions if isinstance(d, Preempt)]


def decided(decisions: list[Decision]) -> list[Decision]:
    """The decisions other than Complete (a finished batch's answer)."""
    return [d for d in decisions if not isinstance(d, Complete)]


def ids(requests: list[Request]) -> list[int]:
    return [r.id for r in requests]


def before(t: float) -> float:
    """The float just before t: the latest instant that is not yet t."""
    return math.nextafter(t, -math.inf)


# ------------------------------------------------------- model files and configs
def save_onnx(graph: onnx.GraphProto, path: Path, opset: int = 17) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp_onnx(
    path: Path, width: int = 8, layers: int = 1, seed: int = 0, shared: bool = False
) -> Path:
    """Y = Relu(X·W + B) repeated `layers` times, FP32 [-1, width]; with
    `shared`, every layer uses the same W and B (compute grows with the
    layers, the file does not)."""
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        k = 0 if shared else i
        if i == k:
            w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            b = rng.standard_normal(width).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        out = "y" if i == layers - 1 else f"h{i}"
        nodes += [
            helper.make_node("MatMul", [prev, f"w{k}"], [f"mm{i}"]),
            helper.make_node("Add", [f"mm{i}", f"b{k}"], [f"add{i}"]),
            helper.make_node("Relu", [f"add{i}"], [out]),
        ]
        prev = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        inits,
    )
    return save_onnx(graph, path)


def shout_double_onnx(path: Path) -> Path:
    """text STRING [N, 1] → loud = text + "!"; x FLOAT [N, L] → y = 2x."""
    graph = helper.make_graph(
        [
            helper.make_node("StringConcat", ["text", "bang"], ["loud"]),
            helper.make_node("Mul", ["x", "two"], ["y"]),
        ],
        "shout_double",
        [
            helper.make_tensor_value_info("text", TensorProto.STRING, ["N", 1]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"]),
        ],
        [
            helper.make_tensor_value_info("loud", TensorProto.STRING, ["N", 1]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "L"]),
        ],
        [
            helper.make_tensor("bang", TensorProto.STRING, [1], [b"!"]),
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        ],
    )
    return save_onnx(graph, path, opset=20)  # StringConcat is opset 20


def elastic_config(name: str, path: Path) -> ModelConfig:
    """`shout_double_onnx` with elastic tensors: slots of 8 bytes a string
    and 4 a sequence, anything longer spilled (app/runtime/spill.py)."""
    return ModelConfig(
        name=name,
        backend="onnx",
        directory=path.parent,
        inputs=(
            TensorSpec("text", "BYTES", (-1, 1), max_bytes=8, elastic=True),
            TensorSpec("x", "FP32", (-1, -1), max_shape=(-1, 4), elastic=True),
        ),
        outputs=(
            TensorSpec("loud", "BYTES", (-1, 1), max_bytes=9, elastic=True),
            TensorSpec(
                "y", "FP32", (-1, -1), max_shape=(-1, 4), follows=(None, ("x", 1)), elastic=True
            ),
        ),
        max_batch_size=8,
        slo_ms=1000.0,
        model_file=path,
    )


def picky_onnx(path: Path) -> Path:
    """Loads fine; at run time Reshape(x, [3, -1]) fails unless 3 divides N·8."""
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "s1"], ["r"]),
            helper.make_node("Reshape", ["r", "s2"], ["y"]),
        ],
        "picky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [
            numpy_helper.from_array(np.array([3, -1], dtype=np.int64), "s1"),
            numpy_helper.from_array(np.array([-1, 8], dtype=np.int64), "s2"),
        ],
    )
    return save_onnx(graph, path)


def onnx_config(name: str, path: Path, width: int = 8, max_batch: int = 16) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="onnx",
        directory=path.parent,
        inputs=(TensorSpec("x", "FP32", (-1, width)),),
        outputs=(TensorSpec("y", "FP32", (-1, width)),),
        max_batch_size=max_batch,
        slo_ms=100.0,
        model_file=path,
    )


def emulated_config(name: str = "emu", alpha_ms: float = 2.0, beta_ms: float = 20.0) -> ModelConfig:
    return ModelConfig(
        name=name,
        backend="emulated",
        directory=Path("."),
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(TensorSpec("x", "FP32", (-1, 4)), TensorSpec("ids", "INT64", (-1, 2))),
        max_batch_size=8,
        slo_ms=200.0,
        profile=ProfileSpec(alpha_ms=alpha_ms, beta_ms=beta_ms),
    )


def segments_of(pid: int) -> set[str]:
    """The shared-memory arenas in /dev/shm that process `pid` created (their
    names carry its pid)."""
    prefix = f"{SEGMENT_PREFIX}{pid}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def our_segments() -> list[str]:
    """The arenas this process created and has not unlinked yet."""
    return sorted(segments_of(os.getpid()))


# ------------------------------------------------------------ the executor pool


class PoolEvents:
    """The executor pool's event sink for tests: every event in order, and
    one future per batch id for its BatchFinished or BatchStopped."""

    def __init__(self) -> None:
        self.events: list[ExecutorEvent] = []
        self.futures: dict[int, asyncio.Future] = {}

    def expect(self, batch_id: int) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self.futures[batch_id] = fut
        return fut

    def __call__(self, event: ExecutorEvent) -> None:
        self.events.append(event)
        if isinstance(event, BatchFinished | BatchStopped):
            fut = self.futures.get(event.batch_id)
            if fut is not None and not fut.done():
                fut.set_result(event)


# ----------------------------------------------------------------- the HTTP layer

HDR = "Inference-Header-Content-Length"  # the binary tensor extension's header


def v2_binary_body(header: dict, *blobs: bytes) -> tuple[bytes, dict]:
    js = json.dumps(header).encode()
    return js + b"".join(blobs), {HDR: str(len(js))}


def parse_v2_binary(resp: httpx.Response) -> dict[str, np.ndarray]:
    n = int(resp.headers[HDR])
    head = json.loads(resp.content[:n])
    off = n
    out = {}
    for o in head["outputs"]:
        dt = {"FP32": np.float32, "INT32": np.int32, "BOOL": np.bool_, "FP16": np.float16}
        if "data" in o:
            out[o["name"]] = np.array(o["data"], dtype=dt[o["datatype"]]).reshape(o["shape"])
        else:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(
                resp.content[off : off + size], dtype=dt[o["datatype"]]
            ).reshape(o["shape"])
            off += size
    assert off == len(resp.content)
    return out


GOOD_V2 = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def v2_body(**changes: Any) -> dict:
    """GOOD_V2 with fields of its input changed; a field set to None is left out."""
    inp = {**GOOD_V2["inputs"][0], **changes}
    return {"inputs": [{k: v for k, v in inp.items() if v is not None}]}


def api_config(name, inputs, outputs, slo_ms=50.0, loosen=False, version="1"):
    return ModelConfig(
        name=name,
        backend="emulated",
        directory=Path("/nonexistent") / name,
        inputs=tuple(TensorSpec(n, dt, shape) for n, dt, shape in inputs),
        outputs=tuple(TensorSpec(n, dt, shape) for n, dt, shape in outputs),
        max_batch_size=32,
        slo_ms=slo_ms,
        allow_slo_loosening=loosen,
        version=version,
    )


class FakeService:
    """add_one: y = x + 1 (FP32 [-1, 4]); loose: same, SLO may be loosened;
    typed: several datatypes and a variable dimension; dropper raises Dropped;
    busy raises Overloaded; broken raises a bug; cold is never ready."""

    def __init__(self) -> None:
        x = [("x", "FP32", (-1, 4))]
        y = [("y", "FP32", (-1, 4))]
        self.configs = {
            "add_one": api_config("add_one", x, y),
            "loose": api_config("loose", x, y, loosen=True),
            "typed": api_config(
                "typed",
                [("a", "INT32", (-1, 2)), ("b", "BOOL", (-1, 2)), ("c", "FP16", (-1, -1, 3))],
                [("a2", "INT32", (-1, 2)), ("nb", "BOOL", (-1, 2)), ("c", "FP16", (-1, -1, 3))],
            ),
            "dropper": api_config("dropper", x, y, slo_ms=1.0),
            "busy": api_config("busy", x, y),
            "broken": api_config("broken", x, y),
            "cold": api_config("cold", x, y),
        }
        self.ready = True
        self.calls: list[dict] = []
        self.statistics = Statistics()
        for name, config in self.configs.items():
            self.statistics.add_model(name, config.version)

    def model_statistics(self, name=None, version=None):
        return self.statistics.report(name, version)

    async def load_model(self, name, config_override=None):
        self.model_config(name)
        self.calls.append({"load": name, "config": config_override})

    async def unload_model(self, name):
        self.model_config(name)
        self.calls.append({"unload": name})

    # One emulated device, `emulated:0`, at its whole share.
    def device_index(self):
        return [
            {
                "name": "emulated:0",
                "kind": "emulated",
                "share": 1.0,
                "cpus": None,
                "threads": 1,
                "alive": True,
                "models": sorted(self.configs),
            }
        ]

    # add_one's profile on emulated:0: ℓ(b) = 2·b + 1 ms up to batch 4.
    def profile_index(self):
        return [
            {
                "name": "add_one",
                "slo_ms": 100.0,
                "max_batch_size": 4,
                "allowed_devices": None,
                "devices": ["emulated:0"],
                "measured_on": {"name": "emulated:0", "kind": "emulated", "share": 1.0},
                "latency_ms": {str(b): 2.0 * b + 1.0 for b in range(1, 5)},
                "memory_bytes": None,
                "input_bytes": 16,
                "output_bytes": 16,
            }
        ]

    async def reshare_device(self, name, share):
        from app.server.reallocation import DeviceNotFound

        if name != "emulated:0":
            raise DeviceNotFound(f"no device {name!r}; devices: emulated:0")
        self.calls.append({"reshare": name, "share": share})
        return {"name": name, "old_share": 1.0, "new_share": share}

    def model_names(self):
        return list(self.configs)

    def model_config(self, name):
        try:
            return self.configs[name]
        except KeyError:
            raise ModelNotFound(f"unknown model '{name}'") from None

    def model_ready(self, name):
        self.model_config(name)
        return name != "cold"

    def server_ready(self):
        return self.ready

    def repository_index(self):
        return [
            {
                "name": n,
                "version": "1",
                "state": "UNAVAILABLE" if n == "cold" else "READY",
                "reason": "loading" if n == "cold" else "",
            }
            for n in self.configs
        ]

    async def infer(self, model, inputs, *, slo_ms=None, request_id=None, received_at=None, app=""):
        self.calls.append(
            {
                "model": model,
                "inputs": inputs,
                "slo_ms": slo_ms,
                "id": request_id,
                "received_at": received_at,
                "app": app,
            }
        )
        config = self.configs[model]
        for name, arr in inputs.items():  # the HTTP layer's contract
            spec = next(s for s in config.inputs if s.name == name)
            assert arr.dtype == spec.dtype, (name, arr.dtype)
            assert 1 <= arr.shape[0] <= config.max_batch_size, (name, arr.shape)
        assert len({a.shape[0] for a in inputs.values()}) == 1
        if model == "dropper":
            raise Dropped("deadline can no longer be met (needs 7.0 ms, 1.0 left)", "deadline")
        if model == "busy":
            raise Overloaded("queue of model 'busy' is full")
        if model == "broken":
            raise RuntimeError("executor exploded")
        if model == "typed":
            outs = {"a2": inputs["a"] * 2, "nb": ~inputs["b"], "c": inputs["c"].copy()}
        else:
            outs = {"y": inputs["x"] + np.float32(1)}
        return InferResult(model, request_id, outs, 1.25, 3.5, 4, "cpu:0", 0.5, 0.75, app)


class SyncASGITransport(httpx.BaseTransport):
    """A blocking httpx transport that calls an ASGI app in-process (each
    request on an event loop of its own), for code that takes an
    `httpx.Client`."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app, raise_app_exceptions=False)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        async def call() -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            body = await response.aread()
            return httpx.Response(response.status_code, headers=response.headers, content=body)

        return asyncio.run(call())


def inss_plan(path: Path, placed: dict[str, tuple[str, float, int]]) -> Path:
    """An InSS plan: model → (device, share, batch)."""
    write_plan(placement_plan(placed, "emulated", 1.0, 4e9), path)
    return path
