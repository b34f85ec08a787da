"""`python -m bench.reliability`: the management plane and gRPC under attack.

    python -m bench.reliability grpc-burst --calls 1500,3000,10000
    python -m bench.reliability model-control --cycles 300 --rate 200
    python -m bench.reliability --set MAX_CONNECTIONS=500 grpc-burst --calls 3000

Each starts a fresh `python -m app serve` of this checkout on bench.attack's
repository (`tiny`: ℓ(b) = 0.05·b + 0.5 ms, batches of up to 8, SLO 1 s;
two emulated devices, Symphony), gRPC on a free port.

- **grpc-burst**: for each N, N concurrent `ModelInfer` calls of `tiny`
  (one item each, each with its own id, over 8 channels), at once. It
  counts the status codes, checks every OK answer's id against its call, and
  reports the refusals' reason and how long the burst took to be answered;
  with the server's `grpc_refused_total` and its log lines about it.
- **model-control**: a client sends `tiny` requests at `--rate` r/s (v2
  HTTP, each its own id, checked against the answer) while `--cycles`
  model-control calls go one after the other, in turn: a reload with
  `{"max_batch_size": "16"}` (Triton's numbers as strings), `{"slo_ms":
  Infinity}`, `{"max_batch_size": 100000000}`, `{"devices": ["tpu"]}`, and a
  plain reload. It reports each call's statuses and slowest time, whether
  `tiny` was ever missing from the repository index, the client's answers
  by status, and the slowest `/v2/health/live` (probed every 50 ms).

It prints what it measured (and JSON with `--json`); it does not judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.attack.daemon import BASE_ENV, NORMAL_MODEL, launch, traceback_count, write_repository
from bench.daemon_launcher import free_port, stop_daemon

CHANNELS = 8
OVERRIDES = (
    ("mbs-string", '{"max_batch_size": "16"}'),
    ("slo-infinity", '{"slo_ms": Infinity}'),
    ("mbs-1e8", '{"max_batch_size": 100000000}'),
    ("devices-tpu", '{"devices": ["tpu"]}'),
    ("plain", None),
)


SETTINGS: dict[str, str] = {}  # --set NAME=VALUE: extra daemon settings


def _start(grpc_port: int = 0) -> Any:
    repo = write_repository(Path(tempfile.mkdtemp(prefix="reliability-")) / "models")
    env = {**BASE_ENV, "GRPC_PORT": str(grpc_port), **SETTINGS}
    return launch(repo, env)


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


# ------------------------------------------------------------------ gRPC bursts


async def _burst(address: str, calls: int) -> dict[str, Any]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    channels = [grpc.aio.insecure_channel(address) for _ in range(CHANNELS)]
    stubs = [service_pb2_grpc.GRPCInferenceServiceStub(c) for c in channels]
    for stub in stubs:
        await stub.ServerLive(pb.ServerLiveRequest(), timeout=10)
    codes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    wrong = 0
    done_at: list[float] = []

    async def one(i: int) -> None:
        nonlocal wrong
        request = pb.ModelInferRequest(model_name=NORMAL_MODEL, id=f"c{i}")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(np.full((1, 4), i, np.float32).tobytes())
        try:
            reply = await stubs[i % CHANNELS].ModelInfer(request, timeout=120)
            codes["OK"] += 1
            wrong += reply.id != f"c{i}"
        except grpc.aio.AioRpcError as exc:
            codes[exc.code().name] += 1
            reason = dict(exc.trailing_metadata() or ()).get("reason", "")
            reasons[f"{exc.code().name} {reason or '(none)'}"] += 1
        done_at.append(time.monotonic())

    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(calls)))
    for channel in channels:
        await channel.close()
    return {
        "calls": calls,
        "codes": dict(codes),
        "reasons": dict(reasons),
        "wrong_id": wrong,
        "answered": sum(codes.values()),
        "all_answered_s": round(max(done_at) - began, 3),
    }


def grpc_burst(sizes: list[int]) -> list[dict[str, Any]]:
    port = free_port()
    handle = _start(port)
    results = []
    try:
        for size in sizes:
            before = _metric(handle.url, "deadline_serve_grpc_refused_total")
            result = asyncio.run(_burst(f"127.0.0.1:{port}", size))
            result["grpc_refused_total"] = (
                _metric(handle.url, "deadline_serve_grpc_refused_total") - before
            )
            results.append(result)
            print(json.dumps(result), flush=True)
            time.sleep(1.0)
    finally:
        code = stop_daemon(handle)
        log = handle.log_path.read_text(errors="replace")
        summary = {
            "exit": code,
            "tracebacks": traceback_count(log),
            "refusal_log_lines": log.count("RESOURCE_EXHAUSTED overloaded"),
        }
        results.append(summary)
        print(json.dumps(summary), flush=True)
    return results


# ------------------------------------------------------------------ model control under load


async def _model_control(url: str, cycles: int, rate: float) -> dict[str, Any]:
    stop = asyncio.Event()
    client_codes: Counter[str] = Counter()
    wrong = 0
    live_worst = 0.0
    body_of = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0] * 4}],
    }
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(i: int) -> None:
            nonlocal wrong
            try:
                reply = await client.post(
                    f"/v2/models/{NORMAL_MODEL}/infer", json={**body_of, "id": f"r{i}"}
                )
            except httpx.HTTPError as exc:
                client_codes[type(exc).__name__] += 1
                return
            reason = ""
            if reply.status_code == 200:
                wrong += reply.json().get("id") != f"r{i}"
            else:
                reason = " " + str(reply.json().get("reason", ""))
            client_codes[f"{reply.status_code}{reason}"] += 1

        async def load() -> None:
            tasks = set()
            i = 0
            began = time.monotonic()
            while not stop.is_set():
                i += 1
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(max(0.0, began + i / rate - time.monotonic()))
            await asyncio.gather(*tasks)

        async def probe() -> None:
            nonlocal live_worst
            while not stop.is_set():
                t = time.monotonic()
                await client.get("/v2/health/live")
                live_worst = max(live_worst, time.monotonic() - t)
                await asyncio.sleep(0.05)

        calls: dict[str, Counter[str]] = {name: Counter() for name, _ in OVERRIDES}
        slowest: dict[str, float] = dict.fromkeys(calls, 0.0)
        missing = 0
        workers = [asyncio.create_task(load()), asyncio.create_task(probe())]
        await asyncio.sleep(1.0)
        began = time.monotonic()
        for k in range(cycles):
            name, override = OVERRIDES[k % len(OVERRIDES)]
            body = {"parameters": {"config": override}} if override is not None else None
            t = time.monotonic()
            reply = await client.post(f"/v2/repository/models/{NORMAL_MODEL}/load", json=body)
            slowest[name] = max(slowest[name], time.monotonic() - t)
            calls[name][f"{reply.status_code} {reply.json().get('reason', 'ok')}"] += 1
            index = (await client.post("/v2/repository/index")).json()
            missing += not any(e["name"] == NORMAL_MODEL for e in index)
        control_s = time.monotonic() - began
        stop.set()
        await asyncio.gather(*workers)
    return {
        "cycles": cycles,
        "control_s": round(control_s, 1),
        "calls": {name: dict(c) for name, c in calls.items()},
        "slowest_call_s": {name: round(s, 3) for name, s in slowest.items()},
        "index_missing_model": missing,
        "client": dict(client_codes),
        "client_wrong_id": wrong,
        "slowest_live_s": round(live_worst, 3),
    }


def model_control(cycles: int, rate: float) -> dict[str, Any]:
    handle = _start()
    try:
        result = asyncio.run(_model_control(handle.url, cycles, rate))
    finally:
        began = time.monotonic()
        code = stop_daemon(handle)
        stop_s = time.monotonic() - began
        log = handle.log_path.read_text(errors="replace")
    result.update(exit=code, stop_s=round(stop_s, 2), tracebacks=traceback_count(log))
    print(json.dumps(result, indent=1), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reliability",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    burst = commands.add_parser("grpc-burst", help="concurrent gRPC calls at once")
    burst.add_argument("--calls", default="1500,3000,10000", help="burst sizes, comma-separated")
    control = commands.add_parser("model-control", help="model control under load")
    control.add_argument("--cycles", type=int, default=300)
    control.add_argument("--rate", type=float, default=200.0, help="client requests/s")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a daemon setting (environment variable); repeatable",
    )
    args = parser.parse_args(argv)
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            print(f"--set: expected NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        SETTINGS[name.strip()] = value
    if args.command == "grpc-burst":
        try:
            sizes = [int(n) for n in args.calls.split(",")]
        except ValueError:
            print(f"--calls: expected numbers, got {args.calls!r}", file=sys.stderr)
            return 2
        results: Any = grpc_burst(sizes)
    else:
        results = model_control(args.cycles, args.rate)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
