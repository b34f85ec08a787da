"""Prometheus metrics of the server, on their own registry.

The HTTP layer only serves them (`GET /metrics`); the service (dispatcher)
records scheduling events through the methods below. Every method is cheap
and thread-safe (prometheus_client's own locking).

Metric names (with `namespace`, default "", as a `<namespace>_` prefix):

    requests_total{model}                  requests received
    goodput_total{model}                   finished within their SLO
    late_total{model}                      finished after their deadline
    dropped_total{model,reason}            dropped (deadline, queue_full, ...)
    queue_delay_seconds{model}             histogram: arrival → batch start
    latency_seconds{model}                 histogram: arrival → finish (end to end)
    request_batch_size{model}              histogram: size of the batch each request ran in
    batch_size{model}                      histogram: size of each executed batch
    batches_total{model,device}            batches executed
    busy_fraction{device}                  gauge: device busy fraction (0..1)
    bad_rate                               gauge: Symphony's bad rate (requests/s not served)
    idle_fraction                          gauge: Symphony's idle fraction of the devices
    advised_device_change                  gauge: devices to add (+) or remove (-)
    executor_failures_total{device}        executors that died or hung
    executor_respawn_seconds{device}       gauge: failure → serving again, last respawn
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)


@dataclass(frozen=True)
class _ModelSeries:
    """One model's labelled children, looked up once: `labels()` per request
    costs more than the increment itself on the hot path."""

    requests: Any
    goodput: Any
    late: Any
    latency: Any
    queue_delay: Any
    request_batch_size: Any
    batch_size: Any


class Metrics:
    """The server's metrics on one `CollectorRegistry` (a fresh one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None, namespace: str = "") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg, ns = self.registry, namespace
        self._by_model: dict[str, _ModelSeries] = {}
        self.requests = Counter(
            "requests", "Requests received.", ["model"], namespace=ns, registry=reg
        )
        self.goodput = Counter(
            "goodput", "Requests finished within their SLO.", ["model"], namespace=ns, registry=reg
        )
        self.late = Counter(
            "late", "Requests finished after their deadline.", ["model"], namespace=ns, registry=reg
        )
        self.dropped = Counter(
            "dropped",
            "Requests dropped, by reason.",
            ["model", "reason"],
            namespace=ns,
            registry=reg,
        )
        self.queue_delay = Histogram(
            "queue_delay_seconds",
            "Arrival to batch start.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            namespace=ns,
            registry=reg,
        )
        self.latency = Histogram(
            "latency_seconds",
            "End-to-end latency, arrival to finish.",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            namespace=ns,
            registry=reg,
        )
        self.request_batch_size = Histogram(
            "request_batch_size",
            "Size of the batch each finished request ran in (request-weighted).",
            ["model"],
            buckets=BATCH_BUCKETS,
            namespace=ns,
            registry=reg,
        )
        self.batch_size = Histogram(
            "batch_size",
            "Size of each executed batch.",
            ["model"],
            buckets=BATCH_BUCKETS,
            namespace=ns,
            registry=reg,
        )
        self.batches = Counter(
            "batches", "Batches executed.", ["model", "device"], namespace=ns, registry=reg
        )
        self.busy_fraction = Gauge(
            "busy_fraction", "Fraction of time the device is busy.", ["device"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self.bad_rate = Gauge(
            "bad_rate",
            "Symphony autoscaling signal: rate of requests not served within SLO (1/s).",
            namespace=ns,
            registry=reg,
        )
        self.idle_fraction = Gauge(
            "idle_fraction",
            "Symphony autoscaling signal: idle fraction of the devices.",
            namespace=ns,
            registry=reg,
        )
        self.advised_device_change = Gauge(
            "advised_device_change",
            "Symphony autoscaling advice: devices to add (positive) or remove (negative).",
            namespace=ns,
            registry=reg,
        )
        self.executor_failures = Counter(
            "executor_failures",
            "Executor processes that died or hung (killed by the watchdog).",
            ["device"],
            namespace=ns,
            registry=reg,
        )
        self.executor_respawn_seconds = Gauge(
            "executor_respawn_seconds",
            "Seconds from the last executor failure to serving again (respawned).",
            ["device"],
            namespace=ns,
            registry=reg,
        )

    # -- what the service calls -------------------------------------------------

    def _series(self, model: str) -> _ModelSeries:
        series = self._by_model.get(model)
        if series is None:
            series = _ModelSeries(
                self.requests.labels(model),
                self.goodput.labels(model),
                self.late.labels(model),
                self.latency.labels(model),
                self.queue_delay.labels(model),
                self.request_batch_size.labels(model),
                self.batch_size.labels(model),
            )
            self._by_model[model] = series
        return series

    def executor_failed(self, device: str) -> None:
        self.executor_failures.labels(device).inc()

    def executor_restarted(self, device: str, seconds_down: float) -> None:
        self.executor_respawn_seconds.labels(device).set(seconds_down)

    def request_received(self, model: str) -> None:
        self._series(model).requests.inc()

    def request_finished(
        self,
        model: str,
        latency_s: float,
        queue_s: float,
        batch_size: int,
        within_slo: bool,
    ) -> None:
        series = self._series(model)
        (series.goodput if within_slo else series.late).inc()
        series.latency.observe(latency_s)
        series.queue_delay.observe(queue_s)
        series.request_batch_size.observe(batch_size)

    def request_dropped(self, model: str, reason: str) -> None:
        self.dropped.labels(model, reason).inc()

    def batch_executed(self, model: str, device: str, size: int) -> None:
        self.batches.labels(model, str(device)).inc()
        self._series(model).batch_size.observe(size)

    def set_device_busy(self, device: str, fraction: float) -> None:
        self.busy_fraction.labels(str(device)).set(fraction)

    def set_autoscale(self, bad_rate: float, idle_fraction: float, advised_change: float) -> None:
        self.bad_rate.set(bad_rate)
        self.idle_fraction.set(idle_fraction)
        self.advised_device_change.set(advised_change)

    # -- exposition ---------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type): Prometheus text, or OpenMetrics if `accept` asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type
