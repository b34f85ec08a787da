"""Fakes and builders shared by the tests: models and requests for the
scheduling core (virtual clock, no sleeping), ONNX and emulated model
configs, an in-memory inference service for the HTTP layer, a collector
of the executor pool's events, and a fake clock, timer and executors for the
live dispatcher. Fixtures (what starts something and cleans up after it)
are in tests/conftest.py."""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import os
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from app.errors import Dropped, ExecutorFailed, ModelNotFound, Overloaded
from app.repository.config import ModelConfig, ProfileSpec, TensorSpec
from app.runtime.arena import SEGMENT_PREFIX
from app.runtime.events import (
    BatchFinished,
    BatchStopped,
    DeviceDown,
    DeviceUp,
    ExecutorEvent,
)
from app.scheduling import DeviceInfo, LatencyProfile, ModelInfo, Request
from app.scheduling.types import Complete, Decision, Dispatch, Drop, Preempt
from app.server.dispatcher import Pending
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
def save_onnx(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
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


# ---------------------------------------------------------- the live driver


def summarize_decisions(decisions: list[Decision]) -> list[tuple]:
    """Decisions as plain tuples: what two drivers must agree on."""
    out: list[tuple] = []
    for d in decisions:
        if isinstance(d, Dispatch):
            b = d.batch
            ids = [r.id for r in b.requests]
            out.append(("dispatch", b.id, b.device, b.model, ids, b.start_at, b.release_at))
        elif isinstance(d, Complete):
            out.append(("complete", d.batch.id, [r.id for r in d.requests]))
        elif isinstance(d, Drop):
            out.append(("drop", d.reason.value, [r.id for r in d.requests]))
        elif isinstance(d, Preempt):
            out.append(("preempt", d.device, d.batch_id))
    return out


class RecordingCore:
    """A scheduling core that logs every driver call, its time and its
    decisions; everything else is the wrapped core's."""

    _CALLS = ("add_request", "batch_finished", "batch_stopped", "advance")
    _CALLS += ("device_down", "device_up")

    def __init__(self, core: Any) -> None:
        self.core = core
        self.log: list[tuple] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.core, name)
        if name not in self._CALLS:
            return attr

        def call(*args: Any) -> list[Decision]:
            decisions = attr(*args)
            now = args[-1]
            what = args[0].id if name == "add_request" else args[:-1]
            self.log.append((name, what, now, summarize_decisions(decisions)))
            return decisions

        return call


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTimer:
    """The dispatcher's timer, fired by the test (`fire`)."""

    precise = True

    def __init__(self) -> None:
        self.when: float | None = None
        self._callback: Any = None

    def call_at(self, when: float, callback: Any, *args: Any) -> None:
        self.when, self._callback = when, (callback, args)

    def cancel(self) -> None:
        self.when = self._callback = None

    def close(self) -> None:
        self.cancel()

    def fire(self) -> None:
        callback, args = self._callback
        self.when = self._callback = None
        callback(*args)


class FakeExecutors:
    """Records what the dispatcher sends; `refuse` makes a device's submits
    raise, as a dead executor's do."""

    def __init__(self) -> None:
        self.submits: list[tuple[int, int, str, list[int], float]] = []
        self.cancels: list[tuple[int, int]] = []
        self.refuse: set[int] = set()
        self.on_submit: Any = None  # called before a refused submit raises

    def submit(
        self, device_id: int, batch_id: int, model: str, slots: list[int], start_at: float
    ) -> None:
        if device_id in self.refuse:
            if self.on_submit is not None:
                self.on_submit(device_id, batch_id)
            raise ExecutorFailed(f"executor emulated:{device_id} is not running")
        self.submits.append((device_id, batch_id, model, list(slots), start_at))

    def cancel(self, device_id: int, batch_id: int) -> bool:
        self.cancels.append((device_id, batch_id))
        return True


@dataclass
class _FakeDevice:
    speed: float
    waiting: list[tuple[int, str, int, float]] = field(default_factory=list)
    running: tuple[int, float, float] | None = None  # (batch id, begin, end)
    stop_at: float | None = None
    cancelled: set[int] = field(default_factory=set)


class EmulatedExecutors:
    """Executors of emulated devices for the live dispatcher, on a virtual
    clock: each runs its batches in order from max(start_at, free) for
    ℓ(b)/speed, stops a preempted batch `preemption_delay` later (or lets it
    finish first), and skips a cancelled batch that has not started. What
    they report reaches the dispatcher through `post` at the time it
    happens (`LiveHarness` runs the clock)."""

    def __init__(
        self,
        models: dict[str, ModelInfo],
        devices: list[DeviceInfo],
        preemption_delay: float,
    ) -> None:
        self.models = models
        self.preemption_delay = preemption_delay
        self.devices = {d.id: _FakeDevice(d.speed) for d in devices}
        self.events: list[tuple[float, int, int, int]] = []  # (time, batch, device, kind)
        self.now = 0.0

    def submit(
        self, device_id: int, batch_id: int, model: str, slots: list[int], start_at: float
    ) -> None:
        device = self.devices[device_id]
        device.waiting.append((batch_id, model, len(slots), start_at))
        if device.running is None:
            self._begin_next(device_id, self.now)

    def cancel(self, device_id: int, batch_id: int) -> bool:
        device = self.devices[device_id]
        if device.running is not None and device.running[0] == batch_id:
            _, _, end = device.running
            stop_at = self.now + self.preemption_delay
            if stop_at < end:
                device.stop_at = stop_at
                heapq.heappush(self.events, (stop_at, batch_id, device_id, 1))
            return True
        if any(w[0] == batch_id for w in device.waiting):
            device.cancelled.add(batch_id)
            return True
        return False

    def fail(self, device_id: int) -> None:
        """The device's executor dies: everything on it is lost."""
        self.devices[device_id] = _FakeDevice(self.devices[device_id].speed)

    def _begin_next(self, device_id: int, now: float) -> None:
        device = self.devices[device_id]
        while device.waiting:
            batch_id, model, size, start_at = device.waiting.pop(0)
            if batch_id in device.cancelled:
                device.cancelled.discard(batch_id)
                heapq.heappush(self.events, (now, batch_id, device_id, 1))
                continue
            begin = max(start_at, now)
            end = begin + self.models[model].profile.latency(size) / device.speed
            device.running, device.stop_at = (batch_id, begin, end), None
            heapq.heappush(self.events, (end, batch_id, device_id, 0))
            return

    def pop_event(self) -> ExecutorEvent | None:
        """The next event (at `self.events[0][0]`), or None for a stale one."""
        at, batch_id, device_id, kind = heapq.heappop(self.events)
        device = self.devices[device_id]
        running = device.running
        if kind == 1 and (running is None or running[0] != batch_id):
            return BatchStopped(device_id, batch_id, at)  # skipped while waiting
        if running is None or running[0] != batch_id:
            return None
        if kind == 0 and device.stop_at is not None:
            return None
        device.running = None
        self._begin_next(device_id, at)
        if kind == 0:
            return BatchFinished(device_id, batch_id, running[1], at)
        return BatchStopped(device_id, batch_id, at)


class LiveHarness:
    """Runs the live dispatcher over `EmulatedExecutors` on a fake clock, in
    the simulator's order of events at equal times: device events, then
    faults, then the core's timer, then arrivals."""

    def __init__(self, dispatcher: Any, executors: EmulatedExecutors, clock: FakeClock,
                 timer: FakeTimer) -> None:  # fmt: skip
        self.dispatcher = dispatcher
        self.executors = executors
        self.clock = clock
        self.timer = timer

    def run(
        self,
        arrivals: list[tuple[float, str, float]],  # (time, model, slo_s)
        faults: list[tuple[float, int, bool]] = (),  # (time, device, up)
    ) -> list[Pending]:
        inf = float("inf")
        arrivals = sorted(arrivals, key=lambda a: a[0])
        faults = sorted(faults, key=lambda f: f[0])
        pending = []
        i = j = 0
        while True:
            t_event = self.executors.events[0][0] if self.executors.events else inf
            t_fault = faults[j][0] if j < len(faults) else inf
            t_timer = self.timer.when if self.timer.when is not None else inf
            t_arrival = arrivals[i][0] if i < len(arrivals) else inf
            now = min(t_event, t_fault, t_timer, t_arrival)
            idle = t_event == t_fault == t_arrival == inf and not self.dispatcher.pending
            if now == inf or idle:  # idle: only periodic timers (Nexus's epochs) remain
                return pending
            self.clock.now = self.executors.now = now
            if t_event == now:
                event = self.executors.pop_event()
                if event is not None:
                    self.dispatcher.post(event)
            elif t_fault == now:
                _, device, up = faults[j]
                j += 1
                if not up:
                    self.executors.fail(device)
                event = DeviceUp(device, 0.0) if up else DeviceDown(device, "killed")
                self.dispatcher.post(event)
            elif t_timer == now:
                self.timer.fire()
            else:
                _, model_name, slo_s = arrivals[i]
                i += 1
                pending.append(self.dispatcher.submit_request(model_name, i - 1, slo_s))
