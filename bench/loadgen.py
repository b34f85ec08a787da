"""Open-loop HTTP load generator for the serving daemon (and any server that
speaks its native `/infer` API).

    python -m bench.loadgen --url http://127.0.0.1:8000 \\
        --workload bench/workloads/live-a-resnet50-emulated.yaml [--rate-scale X] \\
        [--duration S] [--workers N] [--capacity] [--json] [--plot out.png]

The send schedule is the workload's arrival sequence — the very one the
simulator replays (`generate_arrivals(workload, rate_scale)`) — so a live run
and a simulated run of one workload file compare field by field.

**Open loop, no coordinated omission.** Request *i* is due at `t0 +
arrival[i]` whatever happened to earlier requests; a slow server never delays
a send. A request the generator sends late is still measured from its
*intended* send time (latency = response time − intended time), and the
schedule is never shifted to catch up. How far behind the generator fell is
reported (`generator.send_lag_*`), and the run is flagged
(`generator.fell_behind`) when more than 1 % of sends left over
`--lag-threshold-ms` (5 ms) late: its numbers then measure the generator as
well as the server. The generator waits for each send time on a Linux timerfd
(`bench/precise_sleep.py`): `asyncio.sleep` would wake up to 1 ms late (the
selector's millisecond timeouts), and every send with it. "Sent" is when the
request was written to its socket, so time spent in the client and waiting
for a free pooled connection counts as lag, not as server latency.

**Client.** Control-plane calls (metadata, checks) use httpx. The requests
themselves go, by default (`--client raw`), through a small asyncio HTTP/1.1
client: each model's whole request (request line, headers, JSON body) is
built once as bytes and written with one `transport.write` on a pooled
keep-alive connection (enough of them, opened before the start). It costs
~0.1 ms of CPU per request, so one process keeps p99 send lag under 2 ms up
to ~10 000 requests/s on an idle core. `--client httpx` sends through
httpx.AsyncClient instead (send time from httpcore's `trace` extension); it
costs ~1.5-2.5 ms of CPU per request here, too much to share a 2-core box
with the server above a few hundred requests/s.

**Workers.** With `--workers N`, N processes (spawned) each take every N-th
arrival and start on a common CLOCK_MONOTONIC `t0`. Scripts that call
`run_load(workers>1)` need the usual `if __name__ == "__main__":` guard.

**Bounded.** Only loopback targets (127.0.0.0/8, ::1, localhost) are
accepted. Each request has a hard timeout of its model's SLO + margin
(`--timeout-margin-ms`, 500) counted from its intended send time; the run
stops by itself at `t0 + duration + the longest timeout + 2 s`, whatever is
still outstanding then counts as an error (`run_deadline`); and a run of more
than `--max-requests` (500 000) arrivals is refused.

**What is measured.** Models named in the workload must be on the server
(`GET /v2/models/{name}`; a missing one is an error before any load is sent).
One request body per model is built from the server's input metadata (random
FP32 rows of the right shape, batch dimension 1), serialised once, with the
workload's SLO as `slo_ms`. Per request: intended and actual send time,
HTTP status, latency, and the server's `timing` (queue_ms, exec_ms,
batch_size, device). Outcomes, as in the simulator:

- good: 200 with latency ≤ the model's SLO (counts towards goodput),
- late: 200 over the SLO,
- dropped: 503 with a scheduler drop reason (deadline, queue_timeout,
  preempted, overloaded, not_served) or 429,
- error: anything else (other statuses, transport errors, timeouts).

`--capacity` finds the highest offered load with ≥ `--target` (99 %) of
requests within SLO by bisection over short runs (`--probe-duration`, 5 s),
reusing the simulator's `find_capacity`.

Output: a rich table on stdout, or with `--json` one JSON document
(bench/loadgen_schema.json; its `overall` and `models` entries carry every
field of the simulator's per-model metrics, bench/simulate_schema.json, plus
`error_fraction`, `latency_p999_ms` and `error_reasons`). Progress goes to
stderr. Exit status: 0 run done, 1 the run failed (server unreachable,
worker crashed), 2 usage errors (bad arguments, workload, non-loopback URL,
model not on the server).

Importable API (for bench.compare and tests)::

    targets = await prepare_targets(url, workload)          # optional, reusable
    targets = build_targets(workload, {name: v2_inputs})    # servers without /v2 metadata
    result = await run_load(url, workload, rate_scale=1.0, targets=targets)  # -> LiveResult
    result.summary["overall"]["goodput_rps"], result.to_dict(), result.records
    cap, probes = find_live_capacity(url, workload)         # sync (asyncio.run per probe)
    doc = build_document(workload, path, result, cap, probes)  # the --json document
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import ipaddress
import json
import math
import multiprocessing
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np

from app.runtime.realtime import RealtimeUnavailable, check_priority, fifo_priority, set_fifo
from app.simulation.capacity_search import CapacityResult, find_capacity
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload
from bench import cli
from bench.cli import UsageError, sanitize
from bench.precise_sleep import PreciseSleeper

try:
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is a dependency of the daemon
    _loads = json.loads

DEFAULT_TIMEOUT_MARGIN_MS = 500.0
DEFAULT_MAX_REQUESTS = 500_000
DEFAULT_LAG_THRESHOLD_MS = 5.0
BEHIND_FRACTION_LIMIT = 0.01  # flag the run when more sends than this were late
DEFAULT_PROBE_DURATION_S = 5.0
RUN_GRACE_S = 2.0  # after the last request's timeout, before the run is cut off
START_DELAY_S = 0.1  # from "ready" to t0, so every worker starts on time
MAX_CONNECTIONS = 1024  # per worker

# Outcome codes (per request).
GOOD, LATE, DROPPED, ERROR = 0, 1, 2, 3
# 503 reasons that mean "the scheduler dropped it" (app.scheduling.types.DropReason).
DROP_REASONS = frozenset({"deadline", "queue_timeout", "preempted", "overloaded", "not_served"})
# Status codes the generator records for requests without an HTTP answer.
NO_RESPONSE = 0


class LoadGenError(Exception):
    """A problem with the target or the inputs (exit status 2 from the CLI)."""


class RunFailed(Exception):
    """The run could not be carried out (exit status 1 from the CLI)."""


# --------------------------------------------------------------------------- target checks


def check_loopback(url: str) -> str:
    """The base URL without a trailing slash, if its host is loopback; else
    LoadGenError. Accepts 127.0.0.0/8, ::1 and localhost (which must resolve
    to loopback addresses only)."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise LoadGenError(f"bad --url {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise LoadGenError(f"--url must be http://HOST:PORT, got {url!r}")
    host = parsed.host
    if not host:
        raise LoadGenError(f"--url has no host: {url!r}")
    if host.lower().rstrip(".") == "localhost":
        try:
            infos = socket.getaddrinfo("localhost", parsed.port or 80, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise LoadGenError(f"cannot resolve localhost: {exc}") from None
        addresses = {info[4][0] for info in infos}
        if not addresses or not all(_is_loopback(a) for a in addresses):
            raise LoadGenError(
                f"refusing {url!r}: localhost resolves to non-loopback {sorted(addresses)}"
            )
    elif not _is_loopback(host):
        raise LoadGenError(
            f"refusing to send load to {url!r}: the load generator targets loopback only "
            "(127.0.0.0/8, ::1, localhost)"
        )
    return str(parsed).rstrip("/")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class ModelTarget:
    """One workload model as the generator sends it."""

    name: str
    slo_ms: float
    body: bytes  # the pre-serialised POST /infer body


_RANDOM_KINDS = {
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def build_body(name: str, inputs: Sequence[dict[str, Any]], slo_ms: float, seed: int = 0) -> bytes:
    """The native /infer body for one request (batch dimension 1) from v2
    input metadata `[{"name", "datatype", "shape"}]`: random floats in [-1, 1)
    for float inputs, small random integers for integer inputs."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, Any] = {}
    for spec in inputs:
        tname, dtype, shape = spec["name"], str(spec["datatype"]).upper(), spec["shape"]
        dims = [1 if (i == 0 or d < 0) else int(d) for i, d in enumerate(shape)]
        if not shape or shape[0] != -1:
            dims = [1, *[max(int(d), 1) for d in shape]]  # no batch dim in metadata: add one
        if dtype in _RANDOM_KINDS:
            arr = rng.uniform(-1.0, 1.0, dims).astype(_RANDOM_KINDS[dtype]).astype(np.float64)
            data = np.round(arr, 6).tolist()
        elif dtype.startswith(("INT", "UINT")):
            data = rng.integers(0, 10, dims).tolist()
        elif dtype == "BOOL":
            data = (rng.random(dims) < 0.5).tolist()
        else:
            raise LoadGenError(f"model {name!r}: input {tname!r} has datatype {dtype}, unsupported")
        tensors[tname] = data
    doc = {"model": name, "inputs": tensors, "slo_ms": float(slo_ms)}
    return json.dumps(doc, separators=(",", ":")).encode()


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and "error" in body:
            return str(body["error"])
    except ValueError:
        pass
    return response.text[:200]


def build_targets(
    workload: Workload, inputs: dict[str, Sequence[dict[str, Any]]]
) -> list[ModelTarget]:
    """Targets without asking the server: `inputs[model]` is the model's v2
    input metadata (`[{"name", "datatype", "shape"}]`). For servers without
    `GET /v2/models/{name}`; pass the result to `run_load(targets=...)`."""
    missing = [m.name for m in workload.models if m.name not in inputs]
    if missing:
        raise LoadGenError(f"no input metadata for model(s) {missing}")
    return [
        ModelTarget(m.name, float(m.slo_ms), build_body(m.name, inputs[m.name], m.slo_ms, seed=k))
        for k, m in enumerate(workload.models)
    ]


async def prepare_targets(
    url: str, workload: Workload, *, client: httpx.AsyncClient | None = None, check: bool = True
) -> list[ModelTarget]:
    """Check every workload model on the server and build its request body.

    `GET /v2/models/{name}` must answer 200 (else LoadGenError naming the
    model); `GET /v2/models/{name}/config` is consulted when the server has it
    (an SLO tighter than the workload's, without `allow_slo_loosening`, is an
    error); with `check`, one request per model is sent and must not be
    refused as invalid (4xx other than 429)."""
    base = check_loopback(url)
    own = client is None
    if client is None:
        client = httpx.AsyncClient(base_url=base, timeout=10.0, trust_env=False)
    try:
        targets = []
        for k, model in enumerate(workload.models):
            try:
                meta = await client.get(f"/v2/models/{model.name}")
            except httpx.HTTPError as exc:
                raise RunFailed(f"cannot reach the server at {base}: {exc!r}") from None
            if meta.status_code == 404:
                raise LoadGenError(
                    f"model {model.name!r} (named in workload {workload.name!r}) is not on "
                    f"the server at {base}: GET /v2/models/{model.name} -> 404 "
                    f"({_error_text(meta)})"
                )
            if meta.status_code != 200:
                raise LoadGenError(
                    f"GET /v2/models/{model.name} -> {meta.status_code}: {_error_text(meta)}"
                )
            inputs = meta.json().get("inputs") or []
            if not inputs:
                raise LoadGenError(f"model {model.name!r}: the server lists no inputs")
            config = await client.get(f"/v2/models/{model.name}/config")
            if config.status_code == 200:
                cfg = config.json()
                server_slo = cfg.get("slo_ms")
                if (
                    isinstance(server_slo, (int, float))
                    and model.slo_ms > server_slo
                    and not cfg.get("allow_slo_loosening", False)
                ):
                    raise LoadGenError(
                        f"model {model.name!r}: the workload's SLO {model.slo_ms:g} ms is looser "
                        f"than the server's {server_slo:g} ms, which does not allow loosening"
                    )
            body = build_body(model.name, inputs, model.slo_ms, seed=k)
            targets.append(ModelTarget(model.name, float(model.slo_ms), body))
        if check:
            for t in targets:
                reply = await client.post(
                    "/infer", content=t.body, headers={"content-type": "application/json"}
                )
                if 400 <= reply.status_code < 500 and reply.status_code != 429:
                    raise LoadGenError(
                        f"model {t.name!r}: the server refused a test request with "
                        f"{reply.status_code}: {_error_text(reply)}"
                    )
        return targets
    finally:
        if own:
            await client.aclose()


# --------------------------------------------------------------------------- records


@dataclass
class Records:
    """One row per request, in intended-send order. Times are seconds since the
    run's t0; NaN where there is no value."""

    model_index: np.ndarray  # int32
    intended: np.ndarray  # float64: scheduled send time
    sent: np.ndarray  # float64: request written to the socket; NaN never sent
    latency_ms: np.ndarray  # float64: response time - intended time; NaN no response
    status: np.ndarray  # int16: HTTP status; 0 no response
    reason: np.ndarray  # int16: index into `reasons` (error/drop reason); -1 none
    queue_ms: np.ndarray  # float64: server timing
    exec_ms: np.ndarray  # float64
    intake_ms: np.ndarray  # float64 (NaN from servers that do not report it)
    answer_ms: np.ndarray  # float64
    batch_size: np.ndarray  # int32; 0 when not served
    device: np.ndarray  # int16: index into `devices`; -1 none
    reasons: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, intended: np.ndarray, model_index: np.ndarray) -> Records:
        n = len(intended)
        nan = np.full(n, np.nan)
        return cls(
            model_index=np.asarray(model_index, dtype=np.int32),
            intended=np.asarray(intended, dtype=np.float64),
            sent=nan.copy(),
            latency_ms=nan.copy(),
            status=np.zeros(n, dtype=np.int16),
            reason=np.full(n, -1, dtype=np.int16),
            queue_ms=nan.copy(),
            exec_ms=nan.copy(),
            intake_ms=nan.copy(),
            answer_ms=nan.copy(),
            batch_size=np.zeros(n, dtype=np.int32),
            device=np.full(n, -1, dtype=np.int16),
        )

    def __len__(self) -> int:
        return len(self.intended)

    @property
    def send_lag_ms(self) -> np.ndarray:
        return (self.sent - self.intended) * 1000.0

    def outcomes(self, slo_ms: np.ndarray) -> np.ndarray:
        """GOOD/LATE/DROPPED/ERROR per request; `slo_ms[model]`."""
        out = np.full(len(self), ERROR, dtype=np.int8)
        ok = self.status == 200
        within = self.latency_ms <= slo_ms[self.model_index]
        out[ok & within] = GOOD
        out[ok & ~within] = LATE
        drop_codes = [i for i, r in enumerate(self.reasons) if r in DROP_REASONS]
        dropped = (self.status == 429) | ((self.status == 503) & np.isin(self.reason, drop_codes))
        out[dropped] = DROPPED
        return out

    @staticmethod
    def merge(parts: Sequence[Records]) -> Records:
        """Concatenate (remapping reason/device codes) and sort by intended time."""
        reasons: list[str] = []
        devices: list[str] = []

        def remap(codes: np.ndarray, names: list[str], into: list[str]) -> np.ndarray:
            table = np.array([_code(into, n) for n in names] + [-1], dtype=np.int16)
            return table[codes]  # -1 indexes the trailing -1

        cols: dict[str, list[np.ndarray]] = {k: [] for k in _ARRAY_FIELDS}
        for p in parts:
            for k in _ARRAY_FIELDS:
                cols[k].append(getattr(p, k))
            cols["reason"][-1] = remap(p.reason, p.reasons, reasons)
            cols["device"][-1] = remap(p.device, p.devices, devices)
        merged = {k: np.concatenate(v) for k, v in cols.items()}
        order = np.argsort(merged["intended"], kind="stable")
        return Records(**{k: v[order] for k, v in merged.items()}, reasons=reasons, devices=devices)


_ARRAY_FIELDS = (
    "model_index",
    "intended",
    "sent",
    "latency_ms",
    "status",
    "reason",
    "queue_ms",
    "exec_ms",
    "intake_ms",
    "answer_ms",
    "batch_size",
    "device",
)


def _code(names: list[str], name: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        names.append(name)
        return len(names) - 1


# --------------------------------------------------------------------------- the sender


@dataclass
class _Plan:
    """What one worker sends (picklable: it crosses to worker processes)."""

    base_url: str
    bodies: list[bytes]
    timeouts_s: list[float]  # per model: SLO + margin, from the intended time
    intended: np.ndarray
    model_index: np.ndarray
    connections: int
    warm_connections: int
    run_limit_s: float  # relative to t0: stop everything then
    client: str = "raw"  # "raw" or "httpx"


class _Reply:
    __slots__ = ("body", "end", "status", "timing")

    def __init__(
        self, status: int, body: bytes, end: float, timing: dict[str, Any] | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.end = end  # loop time the last byte arrived
        # A 200's `timing` object when the sender has it already (in-process);
        # else it is read from `body`.
        self.timing = timing


class _ConnectionLost(Exception):
    def __init__(self, message: str, fresh: bool) -> None:
        super().__init__(message)
        self.fresh = fresh  # nothing of the reply had arrived


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. Responses
    are framed by Content-Length or chunked encoding (or the connection's
    end, HTTP/1.0 style)."""

    def __init__(self, pool: _RawPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[_Reply] | None = None
        self.buf = bytearray()
        self.closed = False
        self.used = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.header_end = -1
        self.length = -1  # Content-Length; -1 unknown
        self.chunked = False
        self.keep_alive = True
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future[_Reply]:
        assert self.transport is not None
        self.waiter = self.pool.loop.create_future()
        self._reset()
        self.buf.clear()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return  # nothing asked: ignore (a reply to a request we gave up on)
        try:
            self._parse()
        except ValueError as exc:
            self._fail(_ConnectionLost(f"bad HTTP response: {exc}", fresh=False))
            self.abort()

    def _parse(self) -> None:
        buf = self.buf
        if self.header_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise ValueError("response headers too long")
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise ValueError(f"bad status line {lines[0][:80]!r}")
            self.status = int(parts[1])
            self.keep_alive = parts[0] != "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    self.length = int(value)
                elif name == "transfer-encoding":
                    self.chunked = "chunked" in value.lower()
                elif name == "connection":
                    v = value.strip().lower()
                    if v == "close":
                        self.keep_alive = False
                    elif v == "keep-alive":
                        self.keep_alive = True
            self.header_end = end + 4
            del buf[: self.header_end]
        if self.chunked:
            while True:
                line_end = buf.find(b"\r\n")
                if line_end < 0:
                    return
                size = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
                if size == 0:
                    trailer_end = buf.find(b"\r\n\r\n", line_end)
                    if trailer_end < 0 and buf[line_end : line_end + 4] != b"\r\n\r\n":
                        return
                    self._finish(b"".join(self.chunks))
                    return
                if len(buf) < line_end + 2 + size + 2:
                    return
                self.chunks.append(bytes(buf[line_end + 2 : line_end + 2 + size]))
                del buf[: line_end + 2 + size + 2]
        elif self.length >= 0:
            if len(buf) >= self.length:
                self._finish(bytes(buf[: self.length]))
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._finish(b"")
        # else: read until the server closes (connection_lost finishes it)

    def _finish(self, body: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        self.buf.clear()
        if waiter is not None and not waiter.done():
            waiter.set_result(_Reply(self.status, body, self.pool.loop.time()))
        if self.keep_alive and not self.closed:
            self.pool.release(self)
        else:
            self.abort()

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed, self.closed = self.closed, True
        if self.waiter is not None:
            if self.header_end >= 0 and self.length < 0 and not self.chunked:
                self._finish(bytes(self.buf))  # body delimited by the close
            else:
                fresh = self.header_end < 0 and not self.buf
                self._fail(_ConnectionLost(f"connection closed by the server ({exc})", fresh))
        if not was_closed:
            self.pool.discard(self)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.discard(self)
        if self.transport is not None:
            self.transport.abort()


class _RawPool:
    """Keep-alive connections to one server, most recently used first (so
    idle ones the server may time out are the last picked), at most
    `limit`; beyond that, requests wait for a free connection (which shows as
    send lag: the send time is when the request is written)."""

    def __init__(self, host: str, port: int, limit: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port, self.limit = host, port, limit
        self.idle: list[_Connection] = []
        self.count = 0
        self.waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()

    async def _open(self) -> _Connection:
        self.count += 1
        try:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self), self.host, self.port
            )
        except BaseException:
            self.count -= 1
            self._wake(None)
            raise
        return conn

    async def acquire(self) -> _Connection:
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
            if self.count < self.limit:
                return await self._open()
            waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
            self.waiters.append(waiter)
            conn = await waiter
            if conn is not None and not conn.closed:
                return conn

    def _wake(self, conn: _Connection | None) -> bool:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def release(self, conn: _Connection) -> None:
        if not self._wake(conn):
            self.idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        self.count -= 1
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._wake(None)  # a waiter may now open a connection

    async def warm(self, count: int) -> None:
        count = min(count, self.limit) - self.count
        if count <= 0:
            return
        opened = await asyncio.gather(*(self._open() for _ in range(count)), return_exceptions=True)
        ok = [c for c in opened if isinstance(c, _Connection)]
        if not ok:
            raise RunFailed(f"cannot connect to {self.host}:{self.port}: {opened[0]!r}")
        for conn in ok:
            self.release(conn)

    def close(self) -> None:
        for conn in list(self.idle):
            conn.abort()
        self.idle.clear()


class _RawSender:
    """The default data-plane client: requests are pre-built bytes (request
    line, headers and body), written with one `transport.write` on a pooled
    keep-alive connection; the send time is that write. A fraction of the
    CPU httpx needs per request, which matters when the generator shares a
    small machine with the server."""

    def __init__(self, plan: _Plan) -> None:
        url = httpx.URL(plan.base_url)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        if url.scheme != "http":
            raise LoadGenError("the raw client speaks plain http only (use --client httpx)")
        prefix = url.raw_path.decode().rstrip("/")
        host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.requests = [
            (
                f"POST {prefix}/infer HTTP/1.1\r\nHost: {host_header}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "User-Agent: bench.loadgen\r\n\r\n"
            ).encode()
            + body
            for body in plan.bodies
        ]
        self.pool = _RawPool(host, port, plan.connections)

    async def warm(self, count: int) -> None:
        await self.pool.warm(count)

    async def send(self, m: int, on_sent: Callable[[], None]) -> _Reply:
        for attempt in range(2):
            conn = await self.pool.acquire()
            reused = conn.used
            conn.used = True
            waiter = conn.send(self.requests[m])
            on_sent()
            try:
                return await waiter
            except _ConnectionLost as exc:
                # A kept-alive connection the server had just closed: retry
                # once on another one (nothing of the reply had arrived).
                if not (exc.fresh and reused and attempt == 0):
                    raise
            except BaseException:
                conn.abort()  # a reply may still come: the connection is unusable
                raise
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.pool.close()


class _HttpxSender:
    """httpx.AsyncClient as the data-plane client (`--client httpx`).

    httpcore's pool scans all its connections for every request, so one big
    pool costs O(connections) per request; the connections are therefore
    spread over clients of at most 8, and each request goes to the client
    with the fewest in flight. The send time is when httpcore finished
    writing the request (its `trace` extension)."""

    PER_CLIENT = 8

    def __init__(self, plan: _Plan) -> None:
        shards = max(1, math.ceil(plan.connections / self.PER_CLIENT))
        per = math.ceil(plan.connections / shards)
        limits = httpx.Limits(
            max_connections=per, max_keepalive_connections=per, keepalive_expiry=60.0
        )
        # Deadlines are the generator's (from the intended time); httpx's own
        # timeouts only back them up.
        timeout = httpx.Timeout(max(plan.timeouts_s, default=1.0) + RUN_GRACE_S)
        self.clients = [
            httpx.AsyncClient(
                base_url=plan.base_url, limits=limits, timeout=timeout, trust_env=False
            )
            for _ in range(shards)
        ]
        self.inflight = [0] * shards
        self.bodies = plan.bodies
        self.headers = {"content-type": "application/json"}

    async def warm(self, count: int) -> None:
        if count <= 0:
            return
        per = max(1, math.ceil(count / len(self.clients)))
        replies = await asyncio.gather(
            *(c.get("/v2/health/live") for c in self.clients for _ in range(per)),
            return_exceptions=True,
        )
        failed = [r for r in replies if isinstance(r, BaseException)]
        if len(failed) == len(replies):
            raise RunFailed(f"cannot connect to {self.clients[0].base_url}: {failed[0]!r}")

    async def send(self, m: int, on_sent: Callable[[], None]) -> _Reply:
        k = self.inflight.index(min(self.inflight))
        self.inflight[k] += 1

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "http11.send_request_body.complete":
                on_sent()

        try:
            response = await self.clients[k].post(
                "/infer", content=self.bodies[m], headers=self.headers, extensions={"trace": trace}
            )
            return _Reply(response.status_code, response.content, asyncio.get_running_loop().time())
        finally:
            self.inflight[k] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients))


CLIENTS = ("raw", "httpx")


class Sender(Protocol):
    """What `_drive` sends through: `send(m, on_sent)` sends one request for
    workload model `m`, calls `on_sent()` once it is out, and returns the reply."""

    async def send(self, m: int, on_sent: Callable[[], None]) -> _Reply: ...


def _make_sender(plan: _Plan) -> _RawSender | _HttpxSender:
    if plan.client == "raw":
        return _RawSender(plan)
    if plan.client == "httpx":
        return _HttpxSender(plan)
    raise LoadGenError(f"client must be one of {CLIENTS}, got {plan.client!r}")


if sys.version_info >= (3, 11):

    def _deadline(when: float) -> Any:
        return asyncio.timeout_at(when)

else:  # pragma: no cover - Python 3.10

    @contextlib.asynccontextmanager
    async def _deadline(when: float) -> Any:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        handle = loop.call_at(when, task.cancel)
        try:
            yield
        except asyncio.CancelledError:
            if loop.time() >= when:
                raise TimeoutError from None
            raise
        finally:
            handle.cancel()


async def _drive(
    plan: _Plan,
    t0: float,
    sender: Sender,
    report: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> Records:
    """Send `plan` on its schedule from `t0`; return the records. Times are
    `clock()` seconds (default: the loop's, which on the selector loop is
    time.monotonic(); uvloop's counts whole milliseconds)."""
    loop = asyncio.get_running_loop()
    clock = clock or loop.time
    rec = Records.empty(plan.intended, plan.model_index)
    intended = rec.intended
    model_index = rec.model_index
    sent, latency, status, reason = rec.sent, rec.latency_ms, rec.status, rec.reason
    queue_ms, exec_ms, batch, device = rec.queue_ms, rec.exec_ms, rec.batch_size, rec.device
    intake_ms, answer_ms = rec.intake_ms, rec.answer_ms
    reasons, devices = rec.reasons, rec.devices
    timeouts = plan.timeouts_s
    n = len(intended)
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        m = int(model_index[i])

        def on_sent() -> None:
            sent[i] = clock() - t0

        try:
            async with _deadline(t0 + intended[i] + timeouts[m]):
                reply = await sender.send(m, on_sent)
        except TimeoutError:
            reason[i] = _code(reasons, "timeout")
        except _ConnectionLost:
            reason[i] = _code(reasons, "connection_lost")
        except (httpx.HTTPError, OSError) as exc:
            reason[i] = _code(reasons, type(exc).__name__)
        else:
            latency[i] = (reply.end - t0 - intended[i]) * 1000.0
            code = reply.status
            status[i] = code
            if code == 200:
                timing = reply.timing if reply.timing is not None else _timing(reply.body)
                if timing is not None:
                    queue_ms[i] = timing.get("queue_ms", np.nan)
                    exec_ms[i] = timing.get("exec_ms", np.nan)
                    intake_ms[i] = timing.get("intake_ms", np.nan)
                    answer_ms[i] = timing.get("answer_ms", np.nan)
                    batch[i] = timing.get("batch_size", 0) or 0
                    dev = timing.get("device")
                    if dev is not None:
                        device[i] = _code(devices, str(dev))
            else:
                reason[i] = _code(reasons, _reason(code, reply.body))
        finally:
            done += 1

    pending: set[asyncio.Task[None]] = set()
    limit = t0 + plan.run_limit_s
    ticker = None
    if report is not None:

        async def tick() -> None:
            while True:
                report(i, done)
                await asyncio.sleep(0.1)

        ticker = loop.create_task(tick())
    # asyncio.sleep would send up to 1 ms late (millisecond epoll timeouts).
    sleeper = PreciseSleeper(loop)
    i = 0
    try:
        while i < n:
            due = t0 + intended[i]
            if due > clock():
                # Never returns early; no re-check against `clock()`, which
                # on some loops (uvloop) lags time.monotonic() by up to 1 ms.
                await sleeper.sleep_until(due)
            now = clock()
            if now >= limit:
                break  # the rest was never sent: recorded as "not_sent"
            task = loop.create_task(one(i))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(set(pending), timeout=max(0.0, limit - clock()))
    finally:
        sleeper.close()
        for task in list(pending):
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    dispatched = np.arange(n) < i
    cut = dispatched & (status == NO_RESPONSE) & (reason < 0)
    if cut.any():  # still outstanding at the run deadline
        reason[cut] = _code(reasons, "run_deadline")
    if not dispatched.all():  # the run deadline came before their send time
        reason[~dispatched] = _code(reasons, "not_sent")
    if report is not None:
        report(n, n)
    return rec


_TIMING_KEY = b'"timing":'


def _timing(content: bytes) -> dict[str, Any] | None:
    """The `timing` object of a 200 reply, without parsing the outputs (it is
    the last key the daemon writes); falls back to a full parse."""
    at = content.rfind(_TIMING_KEY)
    if at >= 0:
        end = content.find(b"}", at)
        if end > at:
            try:
                value = _loads(content[at + len(_TIMING_KEY) : end + 1])
                if isinstance(value, dict):
                    return value
            except ValueError:
                pass
    try:
        doc = _loads(content)
    except ValueError:
        return None
    timing = doc.get("timing") if isinstance(doc, dict) else None
    return timing if isinstance(timing, dict) else None


def _reason(status: int, content: bytes) -> str:
    try:
        doc = _loads(content)
        if isinstance(doc, dict) and isinstance(doc.get("reason"), str):
            return doc["reason"]
    except ValueError:
        pass
    return "overloaded" if status == 429 else f"http_{status}"


# --------------------------------------------------------------------------- worker processes


def _worker_main(conn: Any, progress: Any, slot: int) -> None:
    # The plan comes through the pipe, not as a Process argument: a spawn
    # payload the child never reads (it died importing) blocks the parent.
    try:
        plan = conn.recv()
        asyncio.run(_worker_async(plan, conn, progress, slot))
    except BaseException as exc:  # report anything to the parent, then exit
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _worker_async(plan: _Plan, conn: Any, progress: Any, slot: int) -> None:
    sender = _make_sender(plan)
    try:
        await sender.warm(plan.warm_connections)
        conn.send(("ready", None))
        message, t0 = conn.recv()
        if message != "start":
            return

        def report(sent: int, done: int) -> None:
            progress[2 * slot] = sent
            progress[2 * slot + 1] = done

        records = await _drive(plan, t0, sender, report)
    finally:
        await sender.aclose()
    conn.send(("done", records))


async def _recv(conn: Any, timeout: float) -> tuple[str, Any]:
    """One message from a worker pipe, without blocking the event loop."""
    ready = await asyncio.to_thread(conn.poll, max(0.0, timeout))
    if not ready:
        raise RunFailed(f"a load generator worker did not answer within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError:
        raise RunFailed("a load generator worker exited unexpectedly") from None


async def _run_workers(
    plans: list[_Plan], progress_cb: Callable[[int, int], None] | None
) -> tuple[list[Records], float]:
    ctx = multiprocessing.get_context("spawn")
    shared = ctx.Array("q", 2 * len(plans), lock=False)
    pipes, procs = [], []
    try:
        for w in range(len(plans)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker_main, args=(child, shared, w), daemon=True, name=f"loadgen-{w}"
            )
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        for w, (plan, conn) in enumerate(zip(plans, pipes, strict=True)):
            try:
                await asyncio.to_thread(conn.send, plan)
            except OSError:
                raise RunFailed(f"load generator worker {w} exited on start") from None
        for conn in pipes:
            kind, payload = await _recv(conn, 60.0)
            if kind != "ready":
                raise RunFailed(f"load generator worker failed to start: {payload}")
        t0 = time.monotonic() + START_DELAY_S  # CLOCK_MONOTONIC: shared by all processes
        for conn in pipes:
            conn.send(("start", t0))
        limit = max(p.run_limit_s for p in plans)
        results: list[Records | None] = [None] * len(plans)
        while any(r is None for r in results):
            for w, conn in enumerate(pipes):
                if results[w] is None and conn.poll():
                    kind, payload = conn.recv()
                    if kind != "done":
                        raise RunFailed(f"load generator worker {w} failed: {payload}")
                    results[w] = payload
            if progress_cb is not None:
                progress_cb(sum(shared[0::2]), sum(shared[1::2]))
            if time.monotonic() > t0 + limit + 30.0:
                raise RunFailed("load generator workers did not finish by the run deadline")
            if any(
                r is None and not p.is_alive() and not c.poll()
                for r, p, c in zip(results, procs, pipes, strict=True)
            ):
                raise RunFailed("a load generator worker died during the run")
            await asyncio.sleep(0.1)
        return [r for r in results if r is not None], t0
    finally:
        for conn in pipes:
            with contextlib.suppress(Exception):
                conn.send(("stop", None))
            conn.close()
        for proc in procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


# --------------------------------------------------------------------------- results


@dataclass
class LiveResult:
    """One live run: the simulator's summary shape plus the generator's own."""

    url: str
    workload: str
    rate_scale: float
    duration_s: float
    devices: int
    summary: dict[str, Any]  # {"overall": {...}, "models": {name: {...}}}, as SimResult
    generator: dict[str, Any]
    wall_s: float
    model_names: list[str]
    slo_ms: list[float]
    records: Records = field(repr=False)

    @property
    def attainment(self) -> float:
        return self.summary["overall"]["slo_attainment"]

    @property
    def goodput(self) -> float:
        return self.summary["overall"]["goodput_rps"]

    @property
    def fell_behind(self) -> bool:
        return bool(self.generator["fell_behind"])

    def to_dict(self) -> dict[str, Any]:
        """Shaped like a simulator policy entry (rate_scale, overall, models,
        wall_s) plus the target URL and the generator's statistics."""
        return {
            "url": self.url,
            "rate_scale": self.rate_scale,
            "duration_s": self.duration_s,
            **self.summary,
            "generator": self.generator,
            "timing_breakdown": timing_breakdown(self.records, np.asarray(self.slo_ms)),
            "wall_s": self.wall_s,
        }

    def columns(self) -> dict[str, np.ndarray]:
        """Per-request columns (for plots and ad-hoc analysis)."""
        r = self.records
        return {k: getattr(r, k) for k in _ARRAY_FIELDS}


def summarize_live(
    records: Records,
    model_names: Sequence[str],
    slo_ms: Sequence[float],
    duration_s: float,
    devices: int,
) -> dict[str, Any]:
    """{"overall", "models"} with the simulator's metric keys (plus
    error_fraction, latency_p999_ms, error_reasons)."""
    slo = np.asarray(slo_ms, dtype=np.float64)
    outcome = records.outcomes(slo)
    overall = _summarize(records, outcome, np.ones(len(records), bool), duration_s, devices)
    models = {
        name: _summarize(records, outcome, records.model_index == k, duration_s, devices)
        for k, name in enumerate(model_names)
    }
    return {"overall": overall, "models": models}


def _summarize(
    rec: Records, outcome: np.ndarray, mask: np.ndarray, duration_s: float, devices: int
) -> dict[str, Any]:
    out = outcome[mask]
    total = int(out.size)
    counts = np.bincount(out, minlength=4)
    served = mask & (rec.status == 200)
    latency = rec.latency_ms[served]
    queue = rec.queue_ms[served]
    queue = queue[~np.isnan(queue)]
    sizes = rec.batch_size[served]
    sizes = sizes[sizes > 0]
    exec_ms = rec.exec_ms[served]
    per_req = exec_ms / np.maximum(rec.batch_size[served], 1)
    busy_s = float(np.nansum(per_req)) / 1000.0

    def frac(code: int) -> float:
        return int(counts[code]) / total if total else 0.0

    def reasons_for(code: int) -> dict[str, int]:
        codes, counts_ = np.unique(rec.reason[mask & (outcome == code)], return_counts=True)
        found: dict[str, int] = {}
        for idx, n in zip(codes, counts_, strict=True):
            name = rec.reasons[idx] if idx >= 0 else "unknown"
            found[name] = found.get(name, 0) + int(n)
        return found

    return {
        "requests": total,
        "offered_rps": total / duration_s,
        "goodput_rps": int(counts[GOOD]) / duration_s,
        "slo_attainment": frac(GOOD),
        "drop_fraction": frac(DROPPED),
        "late_fraction": frac(LATE),
        "error_fraction": frac(ERROR),
        "latency_p50_ms": _percentile(latency, 50),
        "latency_p99_ms": _percentile(latency, 99),
        "latency_p999_ms": _percentile(latency, 99.9),
        "queue_delay_p50_ms": _percentile(queue, 50),
        "queue_delay_p99_ms": _percentile(queue, 99),
        "mean_batch_size": float(sizes.mean()) if sizes.size else 0.0,
        "device_busy_fraction": busy_s / (duration_s * max(devices, 1)),
        "drop_reasons": reasons_for(DROPPED),
        "error_reasons": reasons_for(ERROR),
    }


TIMING_PARTS = ("send_lag", "intake", "queue", "exec", "answer", "outside")


def timing_breakdown(records: Records, slo_ms: np.ndarray) -> dict[str, Any]:
    """Where the served requests' time went (p50 / p99 ms of each part), for
    all of them and for the late ones: `send_lag` (the generator's), then the
    server's `queue` (arrival → batch start; `intake` is its first part, until
    the scheduler saw the request), `exec` and `answer` (batch end → answer
    ready), and `outside` — the rest of the latency: the sockets and both
    event loops. Parts a server does not report are null."""
    served = records.status == 200
    late = served & (records.outcomes(slo_ms) == LATE)
    parts = {
        "send_lag": records.send_lag_ms,
        "intake": records.intake_ms,
        "queue": records.queue_ms,
        "exec": records.exec_ms,
        "answer": records.answer_ms,
        "outside": records.latency_ms
        - records.send_lag_ms
        - records.queue_ms
        - records.exec_ms
        - records.answer_ms,
    }

    def stats(mask: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": int(np.count_nonzero(mask))}
        for name in TIMING_PARTS:
            values = parts[name][mask]
            out[name] = {"p50_ms": _percentile(values, 50), "p99_ms": _percentile(values, 99)}
        return out

    return {"served": stats(served), "late": stats(late)}


def _percentile(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return None
    return float(np.percentile(values, q))


def generator_stats(
    records: Records, lag_threshold_ms: float, workers: int, connections: int
) -> dict[str, Any]:
    lag = records.send_lag_ms
    sent = ~np.isnan(lag)
    lag = lag[sent]
    behind = float(np.count_nonzero(lag > lag_threshold_ms)) / lag.size if lag.size else 0.0
    not_sent = int(np.count_nonzero(~sent))
    return {
        "workers": workers,
        "connections_per_worker": connections,
        "sent": int(lag.size),
        "not_sent": not_sent,
        "send_lag_p50_ms": _percentile(lag, 50),
        "send_lag_p99_ms": _percentile(lag, 99),
        "send_lag_max_ms": float(lag.max()) if lag.size else None,
        "lag_threshold_ms": lag_threshold_ms,
        "behind_fraction": behind,
        "fell_behind": bool(behind > BEHIND_FRACTION_LIMIT or not_sent > 0),
        "realtime_priority": fifo_priority(),
    }


# --------------------------------------------------------------------------- running


ProgressCallback = Callable[[int, int, int], None]  # (sent, done, total)


async def run_load(
    url: str,
    workload: Workload,
    rate_scale: float = 1.0,
    *,
    duration_s: float | None = None,
    workers: int = 1,
    connections: int | None = None,
    timeout_margin_ms: float = DEFAULT_TIMEOUT_MARGIN_MS,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS,
    devices: int | None = None,
    client: str = "raw",
    targets: Sequence[ModelTarget] | None = None,
    arrivals: Arrivals | None = None,
    progress: ProgressCallback | None = None,
) -> LiveResult:
    """Send `workload` (at `rate_scale`, for `duration_s` or the workload's
    duration) to the server at `url`, open loop; return the measurements.

    `targets` (from `prepare_targets`) skips the model checks; `arrivals`
    replaces the generated schedule (times in seconds from the start, as
    `generate_arrivals` makes them). `devices` is only the denominator of
    `device_busy_fraction` (default: the workload's device count).
    `progress(sent, done, total)` is called about ten times a second.
    `client` is the data-plane HTTP client: "raw" (pre-built request bytes
    on pooled keep-alive asyncio connections, the default) or "httpx".
    Raises LoadGenError (bad target/inputs) or RunFailed.
    """
    base = check_loopback(url)
    if workers < 1:
        raise LoadGenError(f"workers must be ≥ 1, got {workers}")
    if client not in CLIENTS:
        raise LoadGenError(f"client must be one of {CLIENTS}, got {client!r}")
    workload, arrivals = run_schedule(workload, rate_scale, duration_s, max_requests, arrivals)
    total = len(arrivals)
    if targets is None:
        targets = await prepare_targets(base, workload)
    if [t.name for t in targets] != [m.name for m in workload.models]:
        raise LoadGenError("targets do not match the workload's models")

    slo_ms = [t.slo_ms for t in targets]
    timeouts = [(s + timeout_margin_ms) / 1000.0 for s in slo_ms]
    run_limit = workload.duration_s + max(timeouts) + RUN_GRACE_S
    rate = total / workload.duration_s / workers if workload.duration_s else 0.0
    # In flight = rate × latency, and latency ≤ the timeout: enough connections
    # for that (up to MAX_CONNECTIONS), of which those for rate × 2·SLO are
    # opened before the start; the pool opens the others when needed.
    conns = connections or min(MAX_CONNECTIONS, max(32, math.ceil(rate * max(timeouts)) + 16))
    warm = min(conns, math.ceil(rate * max(slo_ms) / 1000.0 * 2.0) + 16)
    plans = [
        _Plan(
            base_url=base,
            bodies=[t.body for t in targets],
            timeouts_s=timeouts,
            intended=arrivals.times[w::workers].copy(),
            model_index=arrivals.model_index[w::workers].copy(),
            connections=conns,
            warm_connections=warm,
            run_limit_s=run_limit,
            client=client,
        )
        for w in range(workers)
    ]

    def cb(sent: int, done: int) -> None:
        if progress is not None:
            progress(sent, done, total)

    started = time.perf_counter()
    if workers == 1:
        plan = plans[0]
        sender = _make_sender(plan)
        try:
            await sender.warm(plan.warm_connections)
            t0 = asyncio.get_running_loop().time() + START_DELAY_S
            parts = [await _drive(plan, t0, sender, cb if progress else None)]
        finally:
            await sender.aclose()
    else:
        parts, t0 = await _run_workers(plans, cb if progress else None)
    wall = time.perf_counter() - started
    records = Records.merge(parts)
    gen = generator_stats(records, lag_threshold_ms, workers, conns)
    gen["client"] = client
    n_devices = devices if devices is not None else len(workload.devices)
    names = [t.name for t in targets]
    return live_result(base, workload, rate_scale, records, names, slo_ms, n_devices, gen, wall)


def run_schedule(
    workload: Workload,
    rate_scale: float,
    duration_s: float | None,
    max_requests: int,
    arrivals: Arrivals | None = None,
) -> tuple[Workload, Arrivals]:
    """A run's workload (`duration_s` applied) and arrival schedule
    (`arrivals`, or the workload's at `rate_scale`), checked."""
    if not (rate_scale > 0 and math.isfinite(rate_scale)):
        raise LoadGenError(f"rate scale must be a positive number, got {rate_scale}")
    if duration_s is not None:
        if not (duration_s > 0 and math.isfinite(duration_s)):
            raise LoadGenError(f"duration must be a positive number of seconds, got {duration_s}")
        workload = dataclasses.replace(workload, duration_s=float(duration_s))
    if arrivals is None:
        arrivals = generate_arrivals(workload, rate_scale)
    if len(arrivals) > max_requests:
        raise LoadGenError(
            f"{len(arrivals)} requests at rate scale {rate_scale:g} over "
            f"{workload.duration_s:g} s exceed the limit of {max_requests} (--max-requests)"
        )
    return workload, arrivals


def live_result(
    url: str,
    workload: Workload,
    rate_scale: float,
    records: Records,
    names: list[str],
    slo_ms: list[float],
    devices: int,
    generator: dict[str, Any],
    wall_s: float,
) -> LiveResult:
    """A run's LiveResult: its records summarised as the simulator's metrics."""
    return LiveResult(
        url=url,
        workload=workload.name,
        rate_scale=rate_scale,
        duration_s=workload.duration_s,
        devices=devices,
        summary=summarize_live(records, names, slo_ms, workload.duration_s, devices),
        generator=generator,
        wall_s=wall_s,
        model_names=names,
        slo_ms=slo_ms,
        records=records,
    )


def find_live_capacity(
    url: str,
    workload: Workload,
    *,
    target: float = 0.99,
    lo: float = 0.5,
    hi: float = 1.0,
    rel_tol: float = 0.05,
    max_runs: int = 12,
    probe_duration_s: float | None = DEFAULT_PROBE_DURATION_S,
    settle_s: float = 0.5,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    targets: Sequence[ModelTarget] | None = None,
    on_probe: Callable[[float], ProgressCallback | None] | None = None,
    **run_kwargs: Any,
) -> tuple[CapacityResult, dict[float, LiveResult]]:
    """Highest rate scale with overall SLO attainment ≥ `target`, by bisection
    over short live runs (`find_capacity` of the simulator). Synchronous: each
    probe is an `asyncio.run(run_load(...))`; from async code call it through
    `asyncio.to_thread`. Returns the search and every probe's LiveResult by
    scale. `on_probe(scale)` may return a progress callback for that probe;
    `run_kwargs` go to every `run_load` (workers, client, ...)."""
    if targets is None:
        targets = asyncio.run(prepare_targets(url, probe_workload(workload, probe_duration_s)))

    def run_probe(short: Workload, scale: float, progress: ProgressCallback | None) -> LiveResult:
        run = run_load(
            url,
            short,
            scale,
            targets=targets,
            max_requests=max_requests,
            progress=progress,
            **run_kwargs,
        )
        return asyncio.run(run)

    return search_capacity(
        run_probe,
        workload,
        target=target,
        lo=lo,
        hi=hi,
        rel_tol=rel_tol,
        max_runs=max_runs,
        probe_duration_s=probe_duration_s,
        settle_s=settle_s,
        max_requests=max_requests,
        on_probe=on_probe,
    )


def probe_workload(workload: Workload, probe_duration_s: float | None) -> Workload:
    """`workload` cut to the length of one capacity probe (None: its own)."""
    duration = probe_duration_s or workload.duration_s
    return dataclasses.replace(workload, duration_s=float(duration))


ProbeRunner = Callable[[Workload, float, ProgressCallback | None], LiveResult]


def search_capacity(
    run_probe: ProbeRunner,
    workload: Workload,
    *,
    target: float,
    lo: float,
    hi: float,
    rel_tol: float,
    max_runs: int,
    probe_duration_s: float | None,
    settle_s: float,
    max_requests: int,
    on_probe: Callable[[float], ProgressCallback | None] | None,
) -> tuple[CapacityResult, dict[float, LiveResult]]:
    """The simulator's `find_capacity` over live probes: `run_probe(short,
    scale, progress)` runs `short` (the workload cut to one probe) at a rate
    scale, synchronously. Each probe waits `settle_s` first; no rate scale
    whose probe would exceed `max_requests` is tried. Returns the search and
    every probe's LiveResult by scale."""
    short = probe_workload(workload, probe_duration_s)
    results: dict[float, LiveResult] = {}

    def probe(scale: float) -> LiveResult:
        time.sleep(settle_s)  # let the server drain the previous probe
        progress = on_probe(scale) if on_probe is not None else None
        results[scale] = run_probe(short, scale, progress)
        return results[scale]

    nominal = short.offered_rate() * short.duration_s
    max_scale = 1024.0 if nominal <= 0 else max(hi, min(1024.0, max_requests / nominal / 1.2))
    capacity = find_capacity(
        probe,  # type: ignore[arg-type]  # LiveResult has the .summary find_capacity reads
        target=target,
        lo=min(lo, max_scale),
        hi=min(hi, max_scale),
        rel_tol=rel_tol,
        max_runs=max_runs,
        max_scale=max_scale,
        min_scale=min(1.0 / 1024, lo),
    )
    return capacity, results


# --------------------------------------------------------------------------- document


def build_document(
    workload: Workload,
    path: str | Path,
    result: LiveResult,
    capacity: CapacityResult | None = None,
    probes: dict[float, LiveResult] | None = None,
    server: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `--json` document (bench/loadgen_schema.json)."""
    doc: dict[str, Any] = {"workload": cli.workload_info(workload, path)}
    if server:
        doc["server"] = server
    doc.update(result.to_dict())
    if capacity is not None:
        probes = probes or {}
        doc["capacity_target"] = capacity.target
        doc["capacity_rps"] = capacity.capacity_rps
        doc["capacity_rate_scale"] = capacity.rate_scale
        doc["capacity_status"] = capacity.status
        doc["capacity_probes"] = [
            {
                **dataclasses.asdict(p),
                "duration_s": probes[p.scale].duration_s if p.scale in probes else None,
                "send_lag_p99_ms": (
                    probes[p.scale].generator["send_lag_p99_ms"] if p.scale in probes else None
                ),
                "fell_behind": probes[p.scale].fell_behind if p.scale in probes else None,
            }
            for p in capacity.probes
        ]
    return sanitize(doc)


async def server_info(url: str) -> dict[str, Any] | None:
    """`GET /v2` (name, version), when the server has it."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5.0, trust_env=False) as client:
            reply = await client.get("/v2")
        if reply.status_code == 200:
            body = reply.json()
            return {k: body[k] for k in ("name", "version") if k in body}
    except (httpx.HTTPError, ValueError):
        pass
    return None


# --------------------------------------------------------------------------- plot


def plot_run(
    result: LiveResult,
    out: Path,
    capacity: CapacityResult | None = None,
    target: float = 0.99,
) -> None:
    """Latency CDF per model, a per-second timeline of outcomes, the send lag
    over the run, and (with --capacity) the probes' attainment vs offered load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = result.records
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    cdf, timeline, lag_ax, cap_ax = axes.ravel()
    for k, name in enumerate(result.model_names):
        lat = rec.latency_ms[(rec.model_index == k) & (rec.status == 200)]
        lat = np.sort(lat[~np.isnan(lat)])
        if lat.size:
            (line,) = cdf.plot(lat, np.arange(1, lat.size + 1) / lat.size * 100, label=name)
            cdf.axvline(result.slo_ms[k], ls="--", lw=0.8, color=line.get_color())
    cdf.set_xlabel("latency from intended send (ms)")
    cdf.set_ylabel("% of answered requests")
    cdf.set_title("latency CDF (dashed: SLO)")
    cdf.grid(alpha=0.3)
    cdf.legend(fontsize="small")

    outcome = rec.outcomes(np.asarray(result.slo_ms))
    bins = np.arange(0.0, math.ceil(result.duration_s) + 1.0)
    second = np.clip(rec.intended, 0, bins[-1] - 1e-9)
    for code, label in ((GOOD, "good"), (LATE, "late"), (DROPPED, "dropped"), (ERROR, "error")):
        counts, _ = np.histogram(second[outcome == code], bins)
        if counts.any() or code == GOOD:
            timeline.stairs(counts, bins, label=label)
    offered, _ = np.histogram(second, bins)
    timeline.stairs(offered, bins, color="grey", ls=":", label="offered")
    timeline.set_xlabel("intended send time (s)")
    timeline.set_ylabel("requests per second")
    timeline.set_title("outcomes over the run")
    timeline.grid(alpha=0.3)
    timeline.legend(fontsize="small")

    lag = rec.send_lag_ms
    ok = ~np.isnan(lag)
    lag_ax.plot(rec.intended[ok], lag[ok], ",", alpha=0.5)
    lag_ax.axhline(result.generator["lag_threshold_ms"], ls="--", color="red", lw=0.8)
    lag_ax.set_xlabel("intended send time (s)")
    lag_ax.set_ylabel("send lag (ms)")
    lag_ax.set_title(
        f"generator send lag: p99 {result.generator['send_lag_p99_ms'] or 0:.2f} ms"
        + (" (fell behind)" if result.fell_behind else "")
    )
    lag_ax.grid(alpha=0.3)

    if capacity is not None and capacity.probes:
        probes = sorted(capacity.probes, key=lambda p: p.offered_rps)
        cap_ax.plot(
            [p.offered_rps for p in probes], [100 * p.attainment for p in probes], marker="o"
        )
        cap_ax.axhline(100 * target, ls="--", color="red", lw=0.8)
        if capacity.capacity_rps:
            cap_ax.axvline(capacity.capacity_rps, ls=":", color="green", lw=0.8)
        cap_ax.set_xlabel("offered load (req/s)")
        cap_ax.set_ylabel("requests within SLO (%)")
        cap_ax.set_title(f"capacity probes: {capacity.capacity_rps:,.1f} req/s")
        cap_ax.grid(alpha=0.3)
    else:
        cap_ax.axis("off")
    o = result.summary["overall"]
    fig.suptitle(
        f"{result.workload} → {result.url}: offered {o['offered_rps']:,.1f} req/s, "
        f"goodput {o['goodput_rps']:,.1f} req/s ({100 * o['slo_attainment']:.2f} % within SLO)"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.loadgen",
        description="Open-loop HTTP load generator: send a workload to a server on loopback "
        "and measure goodput at SLO.",
    )
    p.add_argument("--url", required=True, help="server base URL (loopback only)")
    cli.add_workload_options(p)
    p.add_argument("--workers", type=int, default=1, metavar="N", help="sender processes (1)")
    p.add_argument(
        "--connections", type=int, metavar="N", help="HTTP connections per worker (auto)"
    )
    p.add_argument(
        "--client",
        choices=CLIENTS,
        default="raw",
        help="data-plane HTTP client: raw (pre-built requests on asyncio keep-alive "
        "connections; default, cheapest) or httpx",
    )
    p.add_argument(
        "--devices",
        type=int,
        help="devices the server runs (only for device_busy_fraction; default: the workload's)",
    )
    add_run_options(p, what="the server's capacity")
    return p


def add_run_options(
    p: argparse.ArgumentParser, *, what: str, realtime_what: str = "the generator"
) -> None:
    """The options of a measured run and its capacity search, and the output
    options (bench.loadgen and bench.inprocess)."""
    p.add_argument(
        "--duration", type=float, metavar="S", help="run length (default: the workload's)"
    )
    p.add_argument(
        "--timeout-margin-ms",
        type=float,
        default=DEFAULT_TIMEOUT_MARGIN_MS,
        help="per-request hard timeout = SLO + this, from the intended send time (500)",
    )
    p.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help=f"refuse runs with more arrivals than this ({DEFAULT_MAX_REQUESTS})",
    )
    p.add_argument(
        "--lag-threshold-ms",
        type=float,
        default=DEFAULT_LAG_THRESHOLD_MS,
        help="a send this late counts as the generator falling behind (5)",
    )
    cli.add_capacity_options(p, what=what, tol=0.05)
    p.add_argument(
        "--probe-duration",
        type=float,
        default=DEFAULT_PROBE_DURATION_S,
        metavar="S",
        help="length of each capacity probe (5)",
    )
    p.add_argument("--max-probes", type=int, default=12, help="capacity probes at most (12)")
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=0,
        metavar="N",
        help=f"SCHED_FIFO priority of {realtime_what} (0: off; needs root or CAP_SYS_NICE)",
    )
    cli.add_output_options(p, plot="write a plot of the run")


def read_run_args(args: argparse.Namespace) -> tuple[Path, Workload]:
    """Check the options of `add_run_options`; the workload file's path and
    the workload, with --duration applied."""
    for name in ("rate_scale", "probe_duration", "capacity_tol", "timeout_margin_ms"):
        cli.check_positive(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.duration is not None:
        cli.check_positive("--duration", args.duration)
    cli.check_target(args.target)
    cli.check_plot(args.plot)
    try:
        check_priority(args.realtime_priority, "--realtime-priority")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    path, workload = cli.read_workload(args.workload)
    if args.duration is not None:
        workload = dataclasses.replace(workload, duration_s=float(args.duration))
    return path, workload


def search_options(
    args: argparse.Namespace, bar: Callable[[str], ProgressCallback]
) -> dict[str, Any]:
    """The capacity search's options from `add_run_options`: bisection from
    --rate-scale, one progress bar per probe."""
    return {
        "target": args.target,
        "lo": args.rate_scale,
        "hi": args.rate_scale,
        "rel_tol": args.capacity_tol,
        "max_runs": args.max_probes,
        "probe_duration_s": args.probe_duration,
        "on_probe": lambda scale: bar(f"capacity probe ×{scale:.4g}"),
    }


def progress_bars(err: Any, quiet: bool) -> tuple[Any, Callable[[str], ProgressCallback]]:
    """A rich Progress on `err` and `bar(description)`, which adds a bar
    and returns the ProgressCallback that moves it."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sent {task.fields[sent]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=quiet,
        refresh_per_second=4,
    )

    def bar(description: str) -> ProgressCallback:
        task = progress.add_task(description, total=None, sent=0)

        def update(sent: int, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, sent=sent)

        return update

    return progress, bar


def report_run(
    args: argparse.Namespace,
    err: Any,
    workload: Workload,
    path: Path,
    result: LiveResult,
    capacity: CapacityResult | None,
    probes: dict[float, LiveResult] | None,
    server: dict[str, Any] | None,
) -> None:
    """Warn if the generator fell behind; write the plot (--plot) and the
    JSON document (--json) or the table."""
    if result.fell_behind:
        g = result.generator
        err.print(
            f"[yellow]warning:[/] the generator fell behind: {100 * g['behind_fraction']:.2f} % "
            f"of sends over {g['lag_threshold_ms']:g} ms late (p99 {g['send_lag_p99_ms']:.2f} ms, "
            f"max {g['send_lag_max_ms']:.2f} ms): latencies include the generator's delay "
            "(busy machine? simultaneous bursts? more --workers on a bigger machine)",
            highlight=False,
        )
    doc = build_document(workload, path, result, capacity, probes, server)
    if args.plot:
        plot_run(result, Path(args.plot), capacity, args.target)
        err.print(f"wrote {args.plot}", highlight=False)
    if args.json:
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    else:
        print_table(doc)


def main(argv: list[str] | None = None) -> int:
    return cli.run_main(_main, argv, usage_errors=(LoadGenError,), run_errors=(RunFailed,))


def _main(argv: list[str] | None, err: Any) -> int:
    args = build_parser().parse_args(argv)
    url = check_loopback(args.url)
    if args.workers < 1 or args.workers > 64:
        raise UsageError(f"--workers must be in 1..64, got {args.workers}")
    path, workload = read_run_args(args)
    try:
        # Before any worker starts: they inherit it.
        set_fifo(args.realtime_priority, "--realtime-priority")
    except RealtimeUnavailable as exc:
        raise UsageError(str(exc)) from None
    progress, bar = progress_bars(err, args.quiet)
    common = {
        "client": args.client,
        "workers": args.workers,
        "connections": args.connections,
        "timeout_margin_ms": args.timeout_margin_ms,
        "lag_threshold_ms": args.lag_threshold_ms,
        "devices": args.devices,
    }
    with progress:
        targets = asyncio.run(prepare_targets(url, workload))
        server = asyncio.run(server_info(url))
        result = asyncio.run(
            run_load(
                url,
                workload,
                args.rate_scale,
                targets=targets,
                max_requests=args.max_requests,
                progress=bar(f"{workload.name} ×{args.rate_scale:g}"),
                **common,
            )
        )
        capacity = probes = None
        if args.capacity:
            capacity, probes = find_live_capacity(
                url,
                workload,
                max_requests=args.max_requests,
                **search_options(args, bar),
                **common,
            )
    report_run(args, err, workload, path, result, capacity, probes, server)
    return 0


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console(width=None if sys.stdout.isatty() else 200)
    w = doc["workload"]
    table = Table(
        title=f"{w['name']} → {doc['url']}: {doc['duration_s']:g} s, rate ×{doc['rate_scale']:g}",
        title_justify="left",
    )
    cols = ["", "requests", "offered", "goodput", "attain", "drop", "late", "error"]
    cols += ["p50 ms", "p99 ms", "p99.9 ms", "mean batch"]
    for c in cols:
        table.add_column(c, justify="left" if not c else "right", no_wrap=True)

    def row(label: str, m: dict[str, Any], style: str | None = None) -> None:
        def pct(x: float) -> str:
            return f"{100 * x:.2f}%"

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}"

        table.add_row(
            label,
            f"{m['requests']:,}",
            f"{m['offered_rps']:,.1f}",
            f"{m['goodput_rps']:,.1f}",
            pct(m["slo_attainment"]),
            pct(m["drop_fraction"]),
            pct(m["late_fraction"]),
            pct(m["error_fraction"]),
            ms(m["latency_p50_ms"]),
            ms(m["latency_p99_ms"]),
            ms(m["latency_p999_ms"]),
            f"{m['mean_batch_size']:.2f}",
            style=style,
        )

    row("overall", doc["overall"], "bold")
    if len(doc["models"]) > 1:
        for name, m in doc["models"].items():
            row(f"  └ {name}", m, "dim")
    out.print(table)
    g = doc["generator"]
    out.print(
        f"generator: {g['workers']} worker(s), send lag p50 {g['send_lag_p50_ms'] or 0:.2f} ms, "
        f"p99 {g['send_lag_p99_ms'] or 0:.2f} ms, max {g['send_lag_max_ms'] or 0:.2f} ms; "
        f"{100 * g['behind_fraction']:.2f} % over {g['lag_threshold_ms']:g} ms"
        + ("  [FELL BEHIND]" if g["fell_behind"] else ""),
        highlight=False,
    )
    for name in doc["overall"]["error_reasons"]:
        out.print(f"errors: {name} x{doc['overall']['error_reasons'][name]}", highlight=False)
    breakdown = doc.get("timing_breakdown")
    for group in ("served", "late"):
        parts = breakdown[group] if breakdown else None
        if not parts or not parts["requests"]:
            continue
        shown = [
            f"{name} {parts[name]['p50_ms']:.2f}/{parts[name]['p99_ms']:.2f}"
            for name in TIMING_PARTS
            if parts[name]["p50_ms"] is not None
        ]
        out.print(
            f"{group} ({parts['requests']}), p50/p99 ms: " + ", ".join(shown), highlight=False
        )
    if "capacity_rps" in doc:
        out.print(
            f"capacity (≥ {100 * doc['capacity_target']:g} % within SLO): "
            f"{doc['capacity_rps']:,.1f} req/s at ×{doc['capacity_rate_scale'] or 0:.4g} "
            f"({doc['capacity_status']}, {len(doc['capacity_probes'])} probes)",
            highlight=False,
        )


if __name__ == "__main__":
    # Run the canonical module's main, so that what crosses to worker
    # processes pickles as bench.loadgen.*, not __main__.*.
    from bench import loadgen as _canonical

    sys.exit(_canonical.main())
