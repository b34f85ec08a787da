"""The shipped Grafana dashboard (deploy/grafana/) and Prometheus alert rules
(deploy/prometheus/): every expression parses as PromQL (tests/promql.py)
and selects only series the server exports, as its /metrics shows them;
every alert says how long, how bad and what happened. And the exposition
itself: every family carries METRICS_PREFIX, none has `_created` series."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from app.repository import BUNDLED_REPOSITORY
from app.server.metrics import Metrics
from app.server.settings import DEFAULT_METRICS_PREFIX, Settings
from tests.promql import VECTOR, PromQLError, parse

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "deadline-serve.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
# Grafana's interval variables, as a query would see them.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
LABEL_VALUES = re.compile(r"label_values\((?P<expr>.+),\s*(?P<label>\w+)\)")
SEVERITIES = {"critical", "warning", "info"}
DURATION = re.compile(r"(?:\d+(?:ms|s|m|h|d|w|y))+")
# What Prometheus accepts in a rule; anything else fails `promtool check rules`.
RULE_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _alerts() -> dict[str, Any]:
    return yaml.safe_load(ALERTS.read_text())


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included."""
    return [p for panel in panels for p in (panel, *_panels(panel.get("panels", [])))]


def _grafana(expr: str) -> str:
    for variable, value in GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, value)
    return expr


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every query the dashboard and the rules run."""
    out = []
    dashboard = _dashboard()
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", _grafana(target["expr"])))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = LABEL_VALUES.fullmatch(variable["query"]["query"])
            assert match, f"variable {variable['name']}: not label_values(metric, label)"
            out.append((f"variable {variable['name']!r}", match["expr"]))
    for group in _alerts()["groups"]:
        for rule in group["rules"]:
            out.append((f"alert {rule['alert']}", rule["expr"]))
    return out


def exported_series(text: str) -> dict[str, set[str]]:
    """{family: the series names it exports} from a /metrics text: a family
    without samples yet still says its type, hence its suffixes."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
        "gauge": ("",),
    }
    return {
        family.name: {family.name + s for s in suffixes[family.type]}
        | {sample.name for sample in family.samples}
        for family in text_string_to_metric_families(text)
    }


def _every_family_in_use(metrics: Metrics) -> str:
    """`metrics` after one call of every recording method: its /metrics text."""
    metrics.request_received("m")
    metrics.request_finished("m", 0.02, 0.005, 4, True)
    metrics.request_dropped("m", "deadline")
    metrics.request_answered("m")
    metrics.batch_executed("m", "emulated:0", 4, 0.01)
    metrics.set_device_busy("emulated:0", 0.5)
    metrics.set_autoscale(0.02, 0.1, 1)
    metrics.executor_failed("emulated:0")
    metrics.executor_restarted("emulated:0", 0.8)
    metrics.batch_timed("m", 0.01, 0.012)
    metrics.alone_profiled("m", 0.004, 1)
    metrics.alone_profiled("m", None, 0)
    metrics.parameter_ignored("priority")
    metrics.batch_preempted("m", 4)
    metrics.watch_devices(lambda: {"emulated:0": "parked"})
    metrics.record_plan("inss-plan", "2", 1.0)
    metrics.watch_alone_times(lambda: {("m", "app"): (0.01, 0.02, 0.03)})
    return metrics.render()[0].decode()


def _check_references(text: str) -> None:
    families = exported_series(text)
    names = set().union(*families.values())
    for where, expr in expressions():
        missing = parse(expr).metric_names - names
        assert not missing, f"{where} selects {sorted(missing)}, not exported: {expr}"
    # And the other way round: every family is on the dashboard.
    used = set().union(*(parse(expr).metric_names for _, expr in expressions()))
    unused = [family for family, series in families.items() if not series & used]
    assert not unused, f"families on no panel or rule: {unused}"


def _check_prefixed(text: str, prefix: str) -> None:
    families = exported_series(text)
    assert len(families) >= 18
    unprefixed = [name for name in families if not name.startswith(prefix)]
    assert not unprefixed, unprefixed
    created = [n for series in families.values() for n in series if n.endswith("_created")]
    assert not created and "_created" not in text, created


# ------------------------------------------------------------------ the expressions


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=lambda v: v.split("\n")[0][:60])
def test_expression_is_valid_promql_of_an_instant_vector(where, expr):
    assert parse(expr).kind == VECTOR, where


def test_expressions_select_only_series_the_metrics_export():
    _check_references(_every_family_in_use(Metrics()))


GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"instance", "job"}


def _labels_of(text: str) -> dict[str, set[str]]:
    """{series name: every label its samples carry} of a /metrics text."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def _check_labels(text: str) -> None:
    labels = _labels_of(text)
    for where, expr in expressions():
        names = parse(expr).metric_names
        if not names & set(labels):
            continue  # no samples yet to tell
        carried = set().union(*(labels.get(name, set()) for name in names)) | TARGET_LABELS
        used = {m for group in GROUPING.findall(expr) for m in re.findall(r"\w+", group)}
        used |= set(MATCHER.findall(expr)) - {"__name__"}
        missing = used - carried
        assert not missing, f"{where} uses labels {sorted(missing)} that {sorted(names)} lack"


def test_expressions_group_and_match_only_labels_the_series_carry():
    """Every label an expression groups by or matches on is one that a
    series it selects carries (or Prometheus's target labels), for the
    series that have samples: a renamed label is caught."""
    _check_labels(_every_family_in_use(Metrics()))
    with pytest.raises(AssertionError, match=r"uses labels \['state'\]"):
        _check_labels(_every_family_in_use(Metrics()).replace('state="', 'status="'))


def test_a_renamed_or_missing_series_is_caught():
    text = _every_family_in_use(Metrics())
    renamed = text.replace("deadline_serve_goodput_total", "deadline_serve_good_total")
    with pytest.raises(AssertionError, match="deadline_serve_goodput_total"):
        _check_references(renamed)
    with pytest.raises(AssertionError, match="not exported"):
        _check_references(_every_family_in_use(Metrics("other_")))


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(x_total[5m])",  # unbalanced
        "rate(x_total)",  # rate of an instant vector
        "histogram_quantile(x_bucket, 0.99)",  # arguments swapped
        "sum by (model) (x) by (device)",  # two groupings
        "x_total[$__rate_interval]",  # a Grafana variable left in
        "x > bool",
        "rates(x_total[5m])",
    ],
)
def test_the_parser_refuses_what_prometheus_refuses(expr):
    with pytest.raises(PromQLError):
        parse(expr)


def test_the_parser_finds_the_selected_metrics_not_labels_or_functions():
    parsed = parse(
        'sum by (model, le) (rate(a_bucket{model=~"m"}[5m])) / on (model) group_left '
        'max without (device) ({__name__="b", device!="x"} offset 5m) > bool 0.5'
    )
    assert parsed.metric_names == {"a_bucket", "b"}


# ------------------------------------------------------------------ the rules and the dashboard


def test_every_alert_has_for_severity_summary_and_description():
    groups = _alerts()["groups"]
    assert [g["name"] for g in groups] == ["deadline-serve"]
    alerts = [rule for group in groups for rule in group["rules"]]
    names = [rule["alert"] for rule in alerts]
    assert len(names) == len(set(names)) >= 9
    for rule in alerts:
        assert set(rule) <= RULE_KEYS, (rule["alert"], set(rule) - RULE_KEYS)
        assert DURATION.fullmatch(str(rule["for"])), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
        for text in rule["annotations"].values():
            assert text.count("{{") == text.count("}}"), (rule["alert"], text)
    page = (ROOT / "docs" / "reliability.md").read_text()
    undocumented = [name for name in names if f"| `{name}` |" not in page]
    assert not undocumented, f"alerts missing from docs/reliability.md's table: {undocumented}"
    covered = " ".join(rule["expr"] for rule in alerts)
    for family in ("goodput", "dropped", "queue_delay", "busy_fraction", "bad_rate"):
        assert f"deadline_serve_{family}" in covered, family
    for family in ("idle_fraction", "advised_device_change", "executor_failures"):
        assert f"deadline_serve_{family}" in covered, family


def test_dashboard_is_importable_and_uses_its_datasource_variable():
    dashboard = _dashboard()
    assert dashboard["uid"] == "deadline-serve" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = _panels(dashboard["panels"])
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    graphs = [panel for panel in panels if panel["type"] != "row"]
    assert len(graphs) >= 12
    source = {"type": "prometheus", "uid": "${datasource}"}
    for panel in graphs:
        assert panel["datasource"] == source, panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(target["datasource"] == source for target in panel["targets"])
    titles = {panel["title"] for panel in graphs}
    for title in ("Goodput", "SLO attainment", "Drops by reason", "Queue delay", "Batch size"):
        assert title in titles
    for title in ("Device busy", "Bad rate and idle fraction", "Advised device change"):
        assert title in titles


# ------------------------------------------------------------------ the exposition


async def _scrape(app: Any) -> str:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        reply = await client.get("/metrics")
    assert reply.status_code == 200
    return reply.text


@pytest.mark.anyio
@pytest.mark.parametrize("prefix", [DEFAULT_METRICS_PREFIX, "acme:serve_"])
async def test_metrics_prefix_setting_names_every_family(prefix):
    settings = Settings.from_env({"METRICS_PREFIX": prefix})
    text = await _scrape(create_app(settings))
    _check_prefixed(text, prefix)
    if prefix != DEFAULT_METRICS_PREFIX:
        assert DEFAULT_METRICS_PREFIX not in text
        assert f"# TYPE {prefix}goodput_total counter" in text


def test_an_empty_prefix_is_no_prefix():
    assert Settings.from_env({"METRICS_PREFIX": ""}).metrics_prefix == ""
    assert "# TYPE goodput_total counter" in Metrics("").render()[0].decode()


ECHO = """\
backend: emulated
max_batch_size: 8
slo_ms: 500
profile: {alpha_ms: 0.5, beta_ms: 5.0}
devices: [emulated]
inputs: [{name: x, datatype: FP32, shape: [-1, 4]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
"""


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_running_server_exports_what_dashboard_and_rules_select(tmp_path):
    """The daemon's app in-process (executor process, scheduler and all) with
    one emulated model: after a few requests and a drop, its /metrics holds
    every series the dashboard and the rules select, all prefixed."""
    repository = tmp_path / "models"
    (repository / "echo").mkdir(parents=True)
    (repository / "echo" / "config.yaml").write_text(ECHO)
    shutil.copytree(BUNDLED_REPOSITORY / "resnet50-emulated", repository / "resnet50-emulated")
    settings = Settings(repository=repository, emulated_devices=1, cpu_slices=0)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for value in range(4):
                body = {"model": "echo", "inputs": {"x": [[value, 1, 2, 3]]}}
                reply = await client.post("/infer", json=body)
                assert reply.status_code == 200, reply.text
            body = {"model": "echo", "inputs": {"x": [[1, 2, 3, 4]]}, "slo_ms": 0.01}
            assert (await client.post("/infer", json=body)).status_code == 503
            text = (await client.get("/metrics")).text
    _check_prefixed(text, DEFAULT_METRICS_PREFIX)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    value = {
        (sample.name, sample.labels.get("model")): sample.value
        for family in families.values()
        for sample in family.samples
    }
    p = DEFAULT_METRICS_PREFIX
    assert value[(f"{p}requests_total", "echo")] == 5
    assert value[(f"{p}goodput_total", "echo")] + value[(f"{p}late_total", "echo")] == 4
    assert value[(f"{p}pending_requests", "echo")] == 0
    assert value[(f"{p}batch_size_sum", "echo")] == 4
    assert value[(f"{p}batch_compute_seconds_count", "echo")] >= 1
    compute = [s for s in families[f"{p}compute_seconds"].samples if s.labels["model"] == "echo"]
    # Each batch holds the device for at least ℓ(1) = 5.5 ms.
    assert (
        sum(s.value for s in compute) >= 0.0055 * value[(f"{p}batch_compute_seconds_count", "echo")]
    )
    _check_references(text)
