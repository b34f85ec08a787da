"""Prometheus metrics of the server, on their own registry.

The HTTP layer only serves them (`GET /metrics`); the service (dispatcher)
records scheduling events through the methods below. Every method is cheap
and thread-safe (prometheus_client's own locking).

Every name starts with the prefix (the METRICS_PREFIX setting, default
`deadline_serve_`), so ours do not collide with other exporters' on one
Prometheus. No `_created` series are exported: they double the series of
every counter and histogram and no dashboard or rule here reads them; they
are left out per registry (`_Registry`), so metrics of several servers in
one process stay independent.

    requests_total{model}                  requests accepted
    goodput_total{model}                   finished within their SLO
    late_total{model}                      finished after their deadline
    dropped_total{model,reason}            dropped (deadline, queue_full, ...)
    pending_requests{model}                gauge: accepted and not yet answered
    queue_delay_seconds{model}             histogram: arrival → batch start
    latency_seconds{model}                 histogram: arrival → finish (end to end)
    request_batch_size{model}              histogram: size of the batch each request ran in
    batch_size{model}                      histogram: size of each executed batch
    batches_total{model,device}            batches executed
    compute_seconds_total{model,device}    device time spent executing batches
    batch_compute_seconds{model}           histogram: execution time of each batch
    busy_fraction{device}                  gauge: device busy fraction (0..1), last period
    bad_rate                               gauge: Symphony's bad rate (fraction, 0..1)
    idle_fraction                          gauge: Symphony's idle fraction of the devices
    advised_device_change                  gauge: devices to add (+) or remove (-)
    executor_failures_total{device}        executors that died or hung
    executor_respawn_seconds{device}       gauge: failure → serving again, last respawn
    batch_time_ratio{model}                histogram: each batch's time on its executor / the
                                           time the scheduler planned for it
    alone_seconds{model}                   histogram: alone-times of sampled requests re-run by
                                           the executors' profiler
    alone_stopped_total{model}             profiler re-runs stopped for a planned batch
    alone_dropped_total{model}             samples dropped from an executor's full backlog
    preemptions_total{model}               batches stopped by a FLEX preemption
    preempted_requests_total{model}        requests of those batches (each re-queued if it
                                           can still finish alone, else dropped `preempted`)
    device_state{device,state}             gauge: 1 for each device's state (serving, parked,
                                           resharing, loading, down), 0 for the others
    alone_time_quantile_seconds{model,app,quantile}
                                           gauge: the alone-times Orloj plans with, per
                                           (model, application), at 0.5, 0.9 and 0.99
    plan_info{kind,version}                gauge: 1 for the plan in force (kind `none`: no plan)
    plan_loaded_timestamp_seconds          gauge: when it was taken up (Unix time)
    ignored_parameters_total{name}         request, input and output parameters accepted
                                           without effect (Triton's priority, sequence ones,
                                           custom ones; app/api/request_params.py): Triton's
                                           names and the first MAX_PARAMETER_NAMES others by
                                           name, any further one as `other`

The compute and pending families are Triton's (its compute-infer duration
and pending request count) in Prometheus's base units: seconds, not µs.
The autoscaling gauges (symphony.txt §4.4) and `busy_fraction` are set every
5 s from the cores' signals over that period (app/server/live.py). The
Grafana dashboard and alert rules over these names are in deploy/.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from app.repository.config import VERSION_KEY_SEP
from app.server.setting_parsers import MetricPrefix
from app.server.settings import DEFAULT_METRICS_PREFIX

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
# actual / planned batch time: 1 is a perfect plan; the tail above it is what
# a plan with one ℓ(b) misses on a model whose time depends on its input.
RATIO_BUCKETS = (0.5, 0.75, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

# ignored_parameters_total: Triton's own parameter names are always labels;
# of the others (clients' custom ones), the first MAX_PARAMETER_NAMES that
# are short printable ASCII, then OTHER_PARAMETER (bounded cardinality).
TRITON_PARAMETER_NAMES = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
        "triton_enable_empty_final_response",
    }
)
MAX_PARAMETER_NAMES = 32
MAX_PARAMETER_NAME_LENGTH = 64
OTHER_PARAMETER = "other"


# What `device_state` says of a device (app.runtime.pool_records' `state`).
DEVICE_STATES = ("serving", "parked", "resharing", "loading", "down")

# The quantiles of `alone_time_quantile_seconds`.
ALONE_QUANTILES = (0.5, 0.9, 0.99)

# Samples prometheus_client adds to these types, each family's start time.
_HAS_CREATED = ("counter", "histogram", "summary")


class _Registry(CollectorRegistry):
    """A registry whose exposition leaves out the `_created` samples (see
    the module docstring); `prometheus_client.disable_created_metrics()`
    would do it for every registry in the process."""

    def collect(self) -> Iterable[Metric]:
        for metric in super().collect():
            if metric.type in _HAS_CREATED:
                created = metric.name + "_created"
                kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                kept.samples = [s for s in metric.samples if s.name != created]
                metric = kept
            yield metric


class _DeviceStates:
    """`device_state` read from the service at each scrape: a parked device
    must not look like a crashed one, and a gauge set on every change
    would need a hook in every path that changes one."""

    def __init__(self, name: str, states: Callable[[], dict[str, str]]) -> None:
        self.name = name
        self.states = states

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            self.name,
            f"1 for the device's state ({', '.join(DEVICE_STATES)}), 0 for the others.",
            labels=["device", "state"],
        )
        for device, state in self.states().items():
            for each in DEVICE_STATES:
                family.add_metric([device, each], 1.0 if each == state else 0.0)
        yield family


class _AloneQuantiles:
    """`alone_time_quantile_seconds` read from the cores at each scrape:
    the per-application distributions Orloj keeps (orloj.txt §3), which
    the per-model `alone_seconds` histogram mixes together."""

    def __init__(self, name: str, source: Callable[[], dict[tuple[str, str], tuple]]) -> None:
        self.name = name
        self.source = source

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            self.name,
            "Alone-times (seconds) of a dynamic model's requests per application, at each "
            "quantile, over the samples the policy plans with now (Orloj's histograms).",
            labels=["model", "app", "quantile"],
        )
        for (model, app), values in sorted(self.source().items()):
            for q, seconds in zip(ALONE_QUANTILES, values, strict=False):
                family.add_metric([model, app, f"{q:g}"], seconds)
        yield family


@dataclass(frozen=True)
class _ModelSeries:
    """One model's labelled children, looked up once: `labels()` per request
    costs more than the increment itself on the hot path."""

    requests: Any
    goodput: Any
    late: Any
    pending: Any
    latency: Any
    queue_delay: Any
    request_batch_size: Any
    batch_size: Any
    batch_compute: Any
    batch_time_ratio: Any


class Metrics:
    """The server's metrics on a registry of their own, every name starting
    with `prefix` (letters, digits, `_`, `:`; empty for none)."""

    def __init__(self, prefix: str = DEFAULT_METRICS_PREFIX) -> None:
        self.prefix = MetricPrefix().parse(prefix, "metrics prefix")
        self.registry: CollectorRegistry = _Registry()
        self._by_model: dict[str, _ModelSeries] = {}
        self.requests = self._counter("requests", "Requests accepted.", ["model"])
        self.goodput = self._counter("goodput", "Requests finished within their SLO.", ["model"])
        self.late = self._counter("late", "Requests finished after their deadline.", ["model"])
        self.dropped = self._counter(
            "dropped",
            "Requests refused or dropped without a result, by reason (deadline, queue_full, "
            "overloaded, shutting_down, executor_failed, ...).",
            ["model", "reason"],
        )
        self.pending = self._gauge(
            "pending_requests",
            "Requests accepted and not yet answered (queued or running).",
            ["model"],
        )
        self.queue_delay = self._histogram(
            "queue_delay_seconds",
            "Seconds from a finished request's arrival to the start of its batch.",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        self.latency = self._histogram(
            "latency_seconds",
            "Seconds from a finished request's arrival to its result (end to end, before the "
            "reply is written).",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        self.request_batch_size = self._histogram(
            "request_batch_size",
            "Size of the batch each finished request ran in (request-weighted).",
            ["model"],
            BATCH_BUCKETS,
        )
        self._batch_series()
        self._device_series()
        self._executor_series()

    def _batch_series(self) -> None:
        """Batches: their sizes, compute time and its ratio to the plan."""
        self.batch_size = self._histogram(
            "batch_size", "Size of each executed batch.", ["model"], BATCH_BUCKETS
        )
        self.batches = self._counter("batches", "Batches executed.", ["model", "device"])
        self.compute_seconds = self._counter(
            "compute_seconds",
            "Seconds devices spent executing the model's batches (start to end of each batch "
            "on its executor).",
            ["model", "device"],
        )
        self.batch_compute = self._histogram(
            "batch_compute_seconds",
            "Execution time of each batch in seconds, on its executor.",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        self.batch_time_ratio = self._histogram(
            "batch_time_ratio",
            "Each batch's execution time on its executor divided by the time the scheduler "
            "planned for it (its predicted finish less its planned start): 1 is exact.",
            ["model"],
            RATIO_BUCKETS,
        )

    def _device_series(self) -> None:
        """The profiler's re-runs, and each device's load as the autoscaler sees it."""
        self.alone_seconds = self._histogram(
            "alone_seconds",
            "Alone-times in seconds of sampled requests of dynamic models, re-run alone by "
            "their executor while idle (PROFILE_SAMPLE_RATE).",
            ["model"],
            LATENCY_BUCKETS_S,
        )
        self.alone_stopped = self._counter(
            "alone_stopped",
            "Re-runs of sampled requests stopped because a planned batch arrived (their time "
            "is discarded).",
            ["model"],
        )
        self.alone_dropped = self._counter(
            "alone_dropped",
            "Sampled requests dropped from an executor's full backlog before being re-run.",
            ["model"],
        )
        self.busy_fraction = self._gauge(
            "busy_fraction",
            "Fraction of the last signal period (5 s) the device spent executing batches (0..1).",
            ["device"],
        )
        self.bad_rate = self._gauge(
            "bad_rate",
            "Symphony autoscaling signal: fraction (0..1) of the requests the scheduler settled "
            "in the last signal period (5 s) that finished late or were dropped.",
        )
        self.idle_fraction = self._gauge(
            "idle_fraction",
            "Symphony autoscaling signal: fraction (0..1) of device time idle in the last "
            "signal period (5 s), over all devices.",
        )
        self.advised_device_change = self._gauge(
            "advised_device_change",
            "Symphony autoscaling advice from the last signal period: devices to add "
            "(positive) or remove (negative).",
        )

    def _executor_series(self) -> None:
        """Executors failing and coming back; parameters ignored; gRPC calls refused."""
        self.executor_failures = self._counter(
            "executor_failures",
            "Executor processes that died or hung (killed by the watchdog).",
            ["device"],
        )
        self.ignored_parameters = self._counter(
            "ignored_parameters",
            "Request, input and output parameters accepted without effect (Triton's priority "
            "and sequence parameters, clients' custom ones), by name (Triton's names and the "
            f"first {MAX_PARAMETER_NAMES} others; any further name as '{OTHER_PARAMETER}').",
            ["name"],
        )
        self._parameter_names: set[str] = set()
        self._parameter_lock = threading.Lock()
        self.grpc_refused = self._counter(
            "grpc_refused",
            "gRPC calls refused at once with RESOURCE_EXHAUSTED overloaded: MAX_CONNECTIONS "
            "calls were in progress (app/grpc/admission.py).",
            ["method"],
        )
        self.executor_respawn_seconds = self._gauge(
            "executor_respawn_seconds",
            "Seconds from the last executor failure to serving again (respawned).",
            ["device"],
        )
        self._mechanism_series()

    def _mechanism_series(self) -> None:
        """What the policies and the control plane did: preemptions, the plan."""
        self.preemptions = self._counter(
            "preemptions", "Batches stopped by a FLEX preemption (Shepherd §5.2).", ["model"]
        )
        self.preempted_requests = self._counter(
            "preempted_requests",
            "Requests of preempted batches (re-queued if they can still finish alone, else "
            "dropped with reason preempted).",
            ["model"],
        )
        self.plan_info = self._gauge(
            "plan_info", "1 for the plan in force (kind none: no plan).", ["kind", "version"]
        )
        self.plan_loaded = self._gauge(
            "plan_loaded_timestamp_seconds", "When the plan in force was taken up (Unix time)."
        )
        self.record_plan("none", "", 0.0)
        self._device_states: _DeviceStates | None = None
        self._alone_quantiles: _AloneQuantiles | None = None

    def _counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> Counter:
        return Counter(self.prefix + name, doc, labels, registry=self.registry)

    def _gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> Gauge:
        return Gauge(self.prefix + name, doc, labels, registry=self.registry)

    def _histogram(
        self, name: str, doc: str, labels: Iterable[str], buckets: Iterable[float]
    ) -> Histogram:
        return Histogram(
            self.prefix + name, doc, labels, buckets=tuple(buckets), registry=self.registry
        )

    # -- what the service calls -------------------------------------------------

    def _series(self, model: str) -> _ModelSeries:
        series = self._by_model.get(model)
        if series is None:
            series = _ModelSeries(
                self.requests.labels(model),
                self.goodput.labels(model),
                self.late.labels(model),
                self.pending.labels(model),
                self.latency.labels(model),
                self.queue_delay.labels(model),
                self.request_batch_size.labels(model),
                self.batch_size.labels(model),
                self.batch_compute.labels(model),
                self.batch_time_ratio.labels(model),
            )
            self._by_model[model] = series
        return series

    def executor_failed(self, device: str) -> None:
        self.executor_failures.labels(device).inc()

    def executor_restarted(self, device: str, seconds_down: float) -> None:
        self.executor_respawn_seconds.labels(device).set(seconds_down)

    def grpc_call_refused(self, method: str) -> None:
        self.grpc_refused.labels(method=method).inc()

    def request_received(self, model: str) -> None:
        """A request is accepted: counted, and pending until `request_answered`."""
        series = self._series(model)
        series.requests.inc()
        series.pending.inc()

    def request_answered(self, model: str) -> None:
        """An accepted request got its answer (a result or an error)."""
        self._series(model).pending.dec()

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

    def batch_executed(self, model: str, device: str, size: int, compute_s: float) -> None:
        """A batch of `size` ran to its end on `device` in `compute_s` seconds."""
        self.batches.labels(model, str(device)).inc()
        self.compute_seconds.labels(model, str(device)).inc(max(compute_s, 0.0))
        series = self._series(model)
        series.batch_size.observe(size)
        series.batch_compute.observe(max(compute_s, 0.0))

    def batch_timed(self, model: str, planned_s: float, actual_s: float) -> None:
        """A batch ran `actual_s` on its executor; the core planned `planned_s`."""
        if planned_s > 0.0:
            self._series(model).batch_time_ratio.observe(max(actual_s, 0.0) / planned_s)

    def alone_profiled(self, model: str, seconds: float | None, dropped: int) -> None:
        """A sampled request re-run alone in `seconds` (None: stopped), and
        `dropped` samples lost to a full backlog since the last report."""
        if seconds is None:
            self.alone_stopped.labels(model).inc()
        else:
            self.alone_seconds.labels(model).observe(seconds)
        if dropped:
            self.alone_dropped.labels(model).inc(dropped)

    def parameter_ignored(self, name: str) -> tuple[str, bool]:
        """Count a parameter accepted without effect: (its label, whether
        this label is new — the caller logs it once)."""
        with self._parameter_lock:
            first = False
            if name in self._parameter_names:
                label = name
            elif name in TRITON_PARAMETER_NAMES or (
                len(self._parameter_names - TRITON_PARAMETER_NAMES) < MAX_PARAMETER_NAMES
                and 0 < len(name) <= MAX_PARAMETER_NAME_LENGTH
                and name.isascii()
                and name.isprintable()
                and name != OTHER_PARAMETER
            ):
                label, first = name, True
                self._parameter_names.add(name)
            else:
                label = OTHER_PARAMETER
                first = OTHER_PARAMETER not in self._parameter_names
                self._parameter_names.add(OTHER_PARAMETER)
        self.ignored_parameters.labels(label).inc()
        return label, first

    def batch_preempted(self, model: str, requests: int) -> None:
        self.preemptions.labels(model).inc()
        self.preempted_requests.labels(model).inc(requests)

    def record_plan(self, kind: str, version: str, loaded_at: float) -> None:
        """The plan in force: `kind` (a plan file's, or `none`), its version
        and when it was taken up; the previous plan's series is removed."""
        self.plan_info.clear()
        self.plan_info.labels(kind, version).set(1)
        self.plan_loaded.set(loaded_at)

    def watch_devices(self, states: Callable[[], dict[str, str]]) -> None:
        """`device_state` from `states()` (device name → state) at each scrape."""
        if self._device_states is not None:
            self.registry.unregister(self._device_states)
        self._device_states = _DeviceStates(self.prefix + "device_state", states)
        self.registry.register(self._device_states)

    def watch_alone_times(self, source: Callable[[], dict[tuple[str, str], tuple]]) -> None:
        """`alone_time_quantile_seconds` from `source()` ((model, app) → the
        alone-times at ALONE_QUANTILES) at each scrape."""
        if self._alone_quantiles is not None:
            self.registry.unregister(self._alone_quantiles)
        self._alone_quantiles = _AloneQuantiles(self.prefix + "alone_time_quantile_seconds", source)
        self.registry.register(self._alone_quantiles)

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


def metric_label(key: str) -> str:
    """A served model's `model` label in the metrics: its model's name (the
    versions of a model are counted together)."""
    return key.partition(VERSION_KEY_SEP)[0]
