"""Triton's metrics: the `nv_inference_*` families, and a metrics port.

Triton's Grafana dashboards, its alerting examples and `perf_analyzer
--collect-metrics` read Triton's own metric names on port 8002. This module
serves them from the figures the statistics extension already keeps (one
source of truth: app/server/statistics.py), with Triton's names, units
(µs, counters) and labels (`model`, `version`):

    nv_inference_request_success{model,version}          requests that succeeded
    nv_inference_request_failure{model,version}          requests that failed
    nv_inference_count{model,version}                    inferences (items) performed
    nv_inference_exec_count{model,version}               batch executions
    nv_inference_request_duration_us{model,version}      cumulative request time (successes)
    nv_inference_queue_duration_us{model,version}        cumulative queue time
    nv_inference_compute_input_duration_us{model,version}   cumulative compute-input time
    nv_inference_compute_infer_duration_us{model,version}   cumulative compute-infer time
    nv_inference_compute_output_duration_us{model,version}  cumulative compute-output time
    nv_inference_pending_request_count{model,version}    gauge: requests accepted, not answered

`MetricsEndpoint` serves them, followed by ours (the `/metrics` of the
main port), on METRICS_PORT (default 8002, Triton's; 0: off) at
`/metrics`, in Prometheus's text format as Triton does (its counters have
no `_total` suffix, which prometheus_client would add: written here). The
endpoint is a small asyncio server on the event loop: a scrape reads the
statistics on the thread that writes them.
GPU families (`nv_gpu_*`) are not served: no device here is measured that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger("app.server")

# Statistics report → (family, help, inference_stats key, field, divisor)
_COUNTERS: tuple[tuple[str, str, str, str, int], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     "success", "count", 1),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     "fail", "count", 1),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds", "success", "ns", 1000),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds",
     "queue", "ns", 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds", "compute_input", "ns", 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds", "compute_infer", "ns", 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds", "compute_output", "ns",
     1000),
)  # fmt: skip
LABELS = ["model", "version"]

StatisticsReport = Callable[[], dict[str, Any]]
Pending = Callable[[str, str], int]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return repr(float(value)) if value != int(value) else f"{int(value)}"


def render_triton(report: dict[str, Any], pending: Pending | None = None) -> str:
    """The `nv_inference_*` families of a statistics report
    (`{"model_stats": [...]}`, Triton's) in Prometheus's text format, as
    Triton writes them: counters under their own names (no `_total`)."""
    stats = report.get("model_stats", [])
    rows: list[tuple[str, str, str, list[tuple[dict[str, Any], float]]]] = []
    for name, doc, key, part, divisor in _COUNTERS:
        values = [(m, m["inference_stats"][key][part] / divisor) for m in stats]
        rows.append((name, doc, "counter", values))
    rows.append(
        (
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            "counter",
            [(m, m["inference_count"]) for m in stats],
        )
    )
    rows.append(
        (
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            "counter",
            [(m, m["execution_count"]) for m in stats],
        )
    )
    if pending is not None:
        rows.append(
            (
                "nv_inference_pending_request_count",
                "Instantaneous number of pending requests awaiting execution per-model.",
                "gauge",
                [(m, pending(m["name"], m["version"])) for m in stats],
            )
        )
    lines = []
    for name, doc, kind, values in rows:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        for model, value in values:
            labels = f'model="{_label(model["name"])}",version="{_label(model["version"])}"'
            lines.append(f"{name}{{{labels}}} {_number(value)}")
    return "\n".join(lines) + "\n"


class MetricsEndpoint:
    """`GET /metrics` on its own port (Triton's metrics port): the registry's
    exposition, Prometheus text or OpenMetrics as the Accept header asks;
    any other path is a 404. One request per connection."""

    def __init__(
        self,
        registry: CollectorRegistry,
        report: StatisticsReport,
        pending: Pending | None = None,
    ) -> None:
        self.registry = registry
        self.report = report
        self.pending = pending
        self.server: asyncio.base_events.Server | None = None

    def render(self) -> bytes:
        """Triton's families, then ours (Prometheus text format 0.0.4)."""
        return render_triton(self.report(), self.pending).encode() + generate_latest(self.registry)

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port`; returns the port bound (0: any free one)."""
        self.server = await asyncio.start_server(self._serve, host, port)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            lines = head.decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method not in ("GET", "HEAD") or path != "/metrics":
                status, body, ctype = "404 Not Found", b"not found\n", "text/plain"
            else:
                status, body, ctype = "200 OK", self.render(), CONTENT_TYPE_LATEST
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
