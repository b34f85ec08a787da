"""Workload files and arrival processes: parsing, validation, statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.workloads.arrivals import _mmpp_segments, generate_arrivals
from app.workloads.spec import Workload, load_workload, parse_workload

WORKLOADS = Path(__file__).resolve().parent.parent / "bench" / "workloads"
PROFILE = {"alpha_ms": 1.0, "beta_ms": 5.0}


def make(tmp_path: Path, models: list[dict], **top) -> Workload:
    doc = {"duration_s": 10, "seed": 3, "devices": 2, "max_batch": 32, "slo_ms": 50}
    doc.update(top)
    doc["models"] = [{"profile": PROFILE, **m} for m in models]
    return parse_workload(doc, tmp_path, source="test.yaml")


def one(tmp_path: Path, arrival: dict | None, rate: float | None = None, **top) -> Workload:
    model: dict = {"name": "m"}
    if arrival is not None:
        model["arrival"] = arrival
    if rate is not None:
        model["rate"] = rate
    return make(tmp_path, [model], **top)


def write_trace(path: Path, rows: list[list[int]]) -> Path:
    n = len(rows[0])
    lines = ["HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(m + 1) for m in range(n))]
    for i, row in enumerate(rows):
        lines.append(f"o{i},a{i},f{i},http," + ",".join(map(str, row)))
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- processes


def test_poisson_rate_and_cv(tmp_path):
    w = one(tmp_path, {"process": "poisson"}, rate=2000, duration_s=100)
    a = generate_arrivals(w)
    assert len(a) / 100 == pytest.approx(2000, rel=0.03)
    gaps = np.diff(a.times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert a.times.dtype == np.float64 and a.model_index.dtype == np.int32
    assert np.all(np.diff(a.times) >= 0) and a.times[0] >= 0 and a.times[-1] < 100


@pytest.mark.parametrize("shape", [0.1, 1.0])
def test_gamma_rate_and_cv(tmp_path, shape):
    w = one(tmp_path, {"process": "gamma", "shape": shape}, rate=1000, duration_s=300)
    a = generate_arrivals(w)
    assert len(a) / 300 == pytest.approx(1000, rel=0.03)
    gaps = np.diff(a.times)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(shape), rel=0.10)


def test_constant_gaps_exact(tmp_path):
    w = one(tmp_path, {"process": "constant", "offset_ms": 2.5}, rate=1000, duration_s=1)
    a = generate_arrivals(w)
    assert len(a) == 998  # 2.5 ms, 3.5 ms, ..., 999.5 ms
    assert a.times[0] == pytest.approx(0.0025, abs=1e-15)
    np.testing.assert_allclose(np.diff(a.times), 0.001, rtol=0, atol=1e-12)
    assert w.offered_rate() == 1000


def test_burst_instants_and_sizes_exact(tmp_path):
    burst = {"process": "burst", "size": 1024, "period_ms": 120, "offset_ms": 5}
    w = one(tmp_path, burst, duration_s=6)
    a = generate_arrivals(w)
    instants, sizes = np.unique(a.times, return_counts=True)
    np.testing.assert_allclose(instants, 0.005 + 0.120 * np.arange(50), atol=1e-12)
    assert np.all(sizes == 1024) and len(a) == 50 * 1024
    assert w.offered_rate() == pytest.approx(1024 / 0.120)
    # rate_scale scales the burst size (rounded, never below one request).
    assert np.all(np.unique(generate_arrivals(w, 0.5).times, return_counts=True)[1] == 512)
    assert len(generate_arrivals(w, 1e-6)) == 50


def test_mmpp_time_average_rate(tmp_path):
    states = [
        {"rate": 100, "dwell_s": 0.05},
        {"rate": 1000, "dwell_s": 0.01},
        {"rate": 0, "dwell_s": 0.02},
    ]
    expected = (100 * 0.05 + 1000 * 0.01 + 0) / 0.08  # dwell-weighted: 187.5 r/s
    for order in ("random", "cycle"):
        w = one(tmp_path, {"process": "mmpp", "states": states, "order": order}, duration_s=2000)
        assert w.offered_rate() == pytest.approx(expected)
        a = generate_arrivals(w)
        assert len(a) / 2000 == pytest.approx(expected, rel=0.03)
        assert len(generate_arrivals(w, 2.0)) / 2000 == pytest.approx(2 * expected, rel=0.03)


def test_mmpp_state_sequence():
    rng = np.random.default_rng(0)
    dwell = np.array([0.1, 0.2, 0.3])
    seq, starts, lengths = _mmpp_segments(rng, dwell, "random", 2, 500.0)
    assert seq[0] == 2 and np.all(seq[1:] != seq[:-1])  # always jumps to another state
    assert np.bincount(seq) / len(seq) == pytest.approx([1 / 3] * 3, abs=0.02)
    assert starts[0] == 0 and starts[-1] + lengths[-1] == pytest.approx(500.0)
    np.testing.assert_allclose(starts[1:], starts[:-1] + lengths[:-1])
    seq, _, _ = _mmpp_segments(rng, dwell, "cycle", 1, 50.0)
    assert np.all(seq == (1 + np.arange(len(seq))) % 3)


def test_trace_replays_counts_round_robin(tmp_path):
    rows = [[3, 0, 5, 2], [1, 4, 0, 0], [2, 2, 2, 2], [0, 7, 1, 3], [6, 0, 0, 1]]
    write_trace(tmp_path / "t.csv", rows)
    arrival = {"process": "trace", "file": "t.csv", "minute_s": 0.5}
    w = make(tmp_path, [{"name": "a"}, {"name": "b"}], arrival=arrival, duration_s=2)
    counts = np.array(rows)
    per_model = [counts[[0, 2, 4]].sum(axis=0), counts[[1, 3]].sum(axis=0)]
    for scale in (1.0, 2.0):
        a = generate_arrivals(w, scale)
        for m in range(2):
            t = a.times[a.model_index == m]
            hist = np.histogram(t, bins=np.arange(5) * 0.5)[0]
            np.testing.assert_array_equal(hist, per_model[m] * int(scale))
    assert w.model_rates() == pytest.approx([s.sum() / 2 for s in per_model])


def test_trace_window_start_minute_and_cut(tmp_path):
    write_trace(tmp_path / "t.csv", [[10, 20, 30, 40]])
    arrival = {"process": "trace", "file": "t.csv", "minute_s": 1.0, "start_minute": 2}
    w = one(tmp_path, arrival, duration_s=1.5)  # minute 2 whole, minute 3 half
    a = generate_arrivals(w)
    assert np.sum(a.times < 1.0) == 20 and 0 < np.sum(a.times >= 1.0) < 30
    assert w.offered_rate() == pytest.approx((20 + 15) / 1.5)
    # Past the end of the file the replay stops (no wrap-around).
    w = one(tmp_path, {**arrival, "start_minute": 4}, duration_s=5)
    assert len(generate_arrivals(w)) == 40


def test_trace_fractional_scale_is_unbiased(tmp_path):
    write_trace(tmp_path / "t.csv", [[1] * 400, [2] * 400])
    arrival = {"process": "trace", "file": "t.csv", "minute_s": 0.1, "scale": 0.3}
    w = one(tmp_path, arrival, duration_s=40)
    assert w.offered_rate() == pytest.approx(3 * 0.3 / 0.1)
    # Plain rounding would turn 0.9 a minute into 1 (or 0.3 into 0).
    assert len(generate_arrivals(w)) / 400 == pytest.approx(0.9, rel=0.1)


def test_trace_group_composes_with_own_arrivals(tmp_path):
    write_trace(tmp_path / "t.csv", [[1, 1], [2, 2], [4, 4], [8, 8]])
    arrival = {"process": "trace", "file": "t.csv", "minute_s": 1.0}
    models = [
        {"name": "a"},
        {"name": "p", "arrival": {"process": "poisson"}, "rate": 10},
        {"name": "b"},
        {"name": "own", "arrival": {**arrival, "scale": 1.0, "start_minute": 1}},
        {"name": "solo", "arrival": {**arrival, "minute_s": 2.0}},
    ]
    w = make(tmp_path, models, arrival=arrival, duration_s=2)
    # a and b inherit the global trace and share it (rows 0,2 and 1,3);
    # own's spec equals the global one once defaults are filled in, so it
    # joins that group; solo's differs, so it gets every row.
    rates = w.model_rates()
    assert rates[0] == (1 + 8) and rates[2] == 2 and rates[3] == 4
    assert rates[1] == 10 and rates[4] == pytest.approx(15 * 2 / 2 / 2)


def test_rate_scale_scales_poisson_and_rejects_bad_values(tmp_path):
    w = one(tmp_path, {"process": "poisson"}, rate=1000, duration_s=100)
    assert len(generate_arrivals(w, 2.0)) / 100 == pytest.approx(2000, rel=0.03)
    with pytest.raises(ValueError, match="rate_scale"):
        generate_arrivals(w, 0.0)


def test_generates_a_million_arrivals(tmp_path):
    w = make(
        tmp_path,
        [{"name": "p", "rate": 30_000}, {"name": "g", "rate": 20_000, "count": 2}],
        arrival={"process": "gamma", "shape": 0.5},
        duration_s=15,
    )
    a = generate_arrivals(w)
    assert len(a) == pytest.approx(1_050_000, rel=0.02)
    assert np.all(np.diff(a.times) >= 0) and a.times[0] >= 0 and a.times[-1] < 15


# --------------------------------------------------------------------------- rates


def test_zipf_popularity(tmp_path):
    models = [{"name": f"m{i}"} for i in range(4)]
    w = make(tmp_path, models, total_rate=1000, popularity={"zipf": 0.9})
    rates = np.array([m.rate for m in w.models])
    assert rates.sum() == pytest.approx(1000)
    assert np.all(np.diff(rates) < 0)
    assert rates[0] / rates[1] == pytest.approx(2**0.9)
    assert rates[0] / rates[3] == pytest.approx(4**0.9)
    a = generate_arrivals(w)
    assert a.counts(4)[0] > a.counts(4)[3]


def test_even_split_and_shares(tmp_path):
    models = [{"name": f"m{i}"} for i in range(4)]
    w = make(tmp_path, models, total_rate=1000)
    assert [m.rate for m in w.models] == [250.0] * 4
    shared = [{"name": "a", "share": 0.7}, {"name": "b", "share": 0.3}]
    w = make(tmp_path, shared, total_rate=1000)
    assert [m.rate for m in w.models] == pytest.approx([700, 300])


def test_total_rate_skips_self_rated_processes(tmp_path):
    models = [
        {"name": "a"},
        {"name": "b", "arrival": {"process": "burst", "size": 10, "period_ms": 100}},
    ]
    w = make(tmp_path, models, total_rate=500)
    assert w.models[0].rate == 500 and w.models[1].rate is None
    assert w.model_rates() == [500, 100] and w.offered_rate() == 600
    assert [i.expected_rate for i in w.model_infos()] == [500, 100]


def test_count_expansion(tmp_path):
    w = make(tmp_path, [{"name": "resnet", "count": 3, "rate": 100}, {"name": "x", "rate": 5}])
    assert [m.name for m in w.models] == ["resnet-0", "resnet-1", "resnet-2", "x"]
    assert [m.rate for m in w.models] == [100, 100, 100, 5]
    assert w.models[0].profile == w.models[2].profile
    w = make(tmp_path, [{"name": "r", "count": 20}], total_rate=2000)
    assert len(w.models) == 20 and all(m.rate == 100 for m in w.models)
    assert make(tmp_path, [{"name": "solo", "count": 1, "rate": 1}]).models[0].name == "solo"


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_arrays(tmp_path):
    models = [{"name": "a", "rate": 300}, {"name": "b", "rate": 200}]
    arrival = {"process": "gamma", "shape": 0.2}
    a1 = generate_arrivals(make(tmp_path, models, arrival=arrival))
    a2 = generate_arrivals(make(tmp_path, models, arrival=arrival))
    np.testing.assert_array_equal(a1.times, a2.times)
    np.testing.assert_array_equal(a1.model_index, a2.model_index)
    a3 = generate_arrivals(make(tmp_path, models, arrival=arrival, seed=4))
    assert len(a3) != len(a1) or not np.array_equal(a3.times, a1.times)


def test_adding_a_model_keeps_earlier_streams(tmp_path):
    states = [{"rate": 100, "dwell_s": 0.3}, {"rate": 900, "dwell_s": 0.1}]
    first = [
        {"name": "a", "arrival": {"process": "mmpp", "states": states}},
        {"name": "g", "rate": 200, "arrival": {"process": "gamma", "shape": 0.3}},
    ]
    base = generate_arrivals(make(tmp_path, first))
    more = generate_arrivals(make(tmp_path, [*first, {"name": "b", "rate": 500}]))
    for m in range(2):
        np.testing.assert_array_equal(
            base.times[base.model_index == m], more.times[more.model_index == m]
        )
    assert np.sum(more.model_index == 2) > 0


# --------------------------------------------------------------------------- conversions


def test_model_and_device_infos(tmp_path):
    devices = [{"name": "big", "speed": 2.0, "kind": "cuda"}, {"count": 2, "speed": 0.5}]
    w = make(tmp_path, [{"name": "m", "rate": 10, "slo_ms": 25}], devices=devices, jitter=0.1)
    info = w.model_infos()[0]
    assert info.slo == pytest.approx(0.025) and info.max_batch == 32
    assert info.expected_rate == 10 and info.profile.latency(2) == pytest.approx(0.007)
    d = w.device_infos()
    assert [(x.id, x.name, x.speed, x.kind) for x in d] == [
        (0, "big", 2.0, "cuda"),
        (1, "dev1", 0.5, "emulated"),
        (2, "dev2", 0.5, "emulated"),
    ]
    assert w.jitter == 0.1 and w.preemption_delay_ms == 0.0
    named = make(tmp_path, [{"name": "m", "rate": 1}], devices=[{"name": "gpu", "count": 2}])
    assert [x.name for x in named.devices] == ["gpu-0", "gpu-1"]
    assert [x.name for x in make(tmp_path, [{"name": "m", "rate": 1}]).devices] == [
        "dev0",
        "dev1",
    ]


def test_latency_table_profile(tmp_path):
    profile = {"latency_ms": {1: 5.0, 8: 12.0, "32": 40.0}}
    w = make(tmp_path, [{"name": "m", "rate": 1, "profile": profile}])
    p = w.models[0].profile
    assert p.latency(8) == pytest.approx(0.012) and p.max_batch == 32


# --------------------------------------------------------------------------- samples


@pytest.mark.parametrize("path", sorted(WORKLOADS.glob("*.yaml")), ids=lambda p: p.name)
def test_sample_workloads_load_and_generate(path):
    w = load_workload(path)
    a = generate_arrivals(w)
    assert len(a) > 0 and a.times[-1] < w.duration_s
    # A Gamma(k) stream's count over N expected arrivals has relative spread
    # ≈ 1/sqrt(k·N): allow 4 of those for very bursty samples (k = 0.1).
    expected = w.offered_rate() * w.duration_s
    shapes = [m.arrival.params.get("shape", 1.0) for m in w.models if m.arrival.process == "gamma"]
    spread = 4.0 / np.sqrt(min(shapes, default=1.0) * expected)
    assert len(a) / w.duration_s == pytest.approx(w.offered_rate(), rel=max(0.1, spread))


def test_sample_workload_contents():
    r50 = load_workload(WORKLOADS / "symphony-table4-resnet50.yaml")
    assert len(r50.devices) == 8 and r50.offered_rate() == 5000 and r50.duration_s == 20
    assert r50.models[0].profile.latency(16) == pytest.approx((1.053 * 16 + 5.072) / 1000)
    zoo = load_workload(WORKLOADS / "symphony-table5-zoo.yaml")
    assert len(zoo.models) == 35 and len(zoo.devices) == 64
    assert zoo.models[0].name == "NASNetMobile" and zoo.models[-1].name == "BERT"
    assert {m.arrival.params["shape"] for m in zoo.models} == {0.5}
    assert len({m.rate for m in zoo.models}) == 1
    for slo in (90, 250):
        fig = load_workload(WORKLOADS / f"shepherd-fig11a-slo{slo}.yaml")
        a = generate_arrivals(fig)
        assert len(fig.devices) == 1 and {m.slo_ms for m in fig.models} == {slo}
        assert a.counts(2).tolist() == [50 * 1024, 6000]
    trace = load_workload(WORKLOADS / "trace-synthetic.yaml")
    assert trace.duration_s == pytest.approx(10) and len(trace.models) == 4


def test_synthetic_trace_is_reproducible(tmp_path):
    import importlib.util

    script = WORKLOADS / "traces" / "make_synthetic_trace.py"
    spec = importlib.util.spec_from_file_location("make_synthetic_trace", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OUT = tmp_path / "out.csv"
    module.main()
    committed = WORKLOADS / "traces" / "azure-functions-synthetic.csv"
    assert module.OUT.read_text() == committed.read_text()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slo": 5}, r"top level: unknown key\(s\) \['slo'\]"),
        ({"duration_s": -1}, r"duration_s: must be > 0"),
        ({"devices": 0}, r"devices: must be ≥ 1"),
        ({"arrival": {"process": "weibull"}}, r"arrival.process: unknown process 'weibull'"),
        ({"arrival": {"process": "gamma"}}, r"arrival.shape: missing required value"),
        ({"arrival": {"process": "gamma", "shape": 0}}, r"arrival.shape: must be > 0"),
        ({"arrival": {"process": "poisson", "shape": 1}}, r"unknown key\(s\) \['shape'\]"),
        ({"popularity": "even"}, r"popularity: only applies with total_rate"),
        ({"total_rate": 10}, r"models\[0\] \(m\).rate: give total_rate or per-model rates"),
        (
            {"total_rate": 10, "popularity": "hot", "models": [{"name": "m", "profile": PROFILE}]},
            r"popularity: must be 'even' or \{zipf: s\}",
        ),
        ({"seed": "x"}, r"seed: must be a number, got 'x'"),
    ],
)
def test_top_level_errors(tmp_path, change, message):
    doc = {"duration_s": 1, "devices": 1, "slo_ms": 10, "max_batch": 8}
    doc["models"] = [{"name": "m", "profile": PROFILE, "rate": 5}]
    doc.update(change)
    with pytest.raises(ValueError, match=r"^wl\.yaml: .*" + message):
        parse_workload(doc, tmp_path, source="wl.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slo": 5}, r"models\[0\] \(m\): unknown key\(s\) \['slo'\]"),
        ({"profile": None}, r"models\[0\] \(m\).profile: must be a mapping"),
        ({"profile": {"alpha_ms": 1}}, r"profile: needs alpha_ms and beta_ms, or latency_ms"),
        ({"rate": -5}, r"models\[0\] \(m\).rate: must be ≥ 0, got -5"),
        ({"rate": None}, r"\.rate: missing: a 'poisson' arrival needs a rate"),
        ({"slo_ms": 0}, r"\.slo_ms: must be > 0"),
        ({"max_batch": 2.5}, r"\.max_batch: must be an integer"),
        ({"share": 0.5}, r"\.share: share needs a top-level total_rate"),
        ({"count": 0}, r"\.count: must be ≥ 1"),
        ({"arrival": {"process": "burst", "size": 4, "period_ms": 10}}, r"rate/share do not"),
        ({"arrival": {"shape": 1}}, r"\.arrival: missing required key 'process'"),
        ({"profile": {"latency_ms": {1: 5, 4: 3}}}, r"latency table must not decrease"),
    ],
)
def test_model_errors(tmp_path, change, message):
    model = {"name": "m", "profile": PROFILE, "slo_ms": 10, "max_batch": 8, "rate": 5}
    model.update(change)
    doc = {"duration_s": 1, "devices": 1, "models": [model]}
    with pytest.raises(ValueError, match=r"^wl\.yaml: .*" + message):
        parse_workload(doc, tmp_path, source="wl.yaml")


def test_missing_profile_and_duplicates(tmp_path):
    with pytest.raises(ValueError, match=r"models\[0\] \(m\): missing required key 'profile'"):
        parse_workload({"duration_s": 1, "devices": 1, "models": [{"name": "m"}]}, tmp_path)
    with pytest.raises(ValueError, match=r"duplicate model name 'a-1'"):
        make(tmp_path, [{"name": "a", "count": 2, "rate": 1}, {"name": "a-1", "rate": 1}])
    with pytest.raises(ValueError, match=r"duplicate device name 'g'"):
        make(tmp_path, [{"name": "m", "rate": 1}], devices=[{"name": "g"}, {"name": "g"}])
    with pytest.raises(ValueError, match=r"shares must sum to 1, they sum to 0.9"):
        make(tmp_path, [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}], total_rate=1)


def test_trace_errors(tmp_path):
    with pytest.raises(ValueError, match=r"arrival.file: trace file not found: .*nope\.csv"):
        one(tmp_path, {"process": "trace", "file": "nope.csv"})
    (tmp_path / "bad.csv").write_text("a,b,c,d,1,2\nx,y,z,http,1,2\n")
    with pytest.raises(ValueError, match=r"arrival.file: .*header must start with HashOwner"):
        one(tmp_path, {"process": "trace", "file": "bad.csv"})
    write_trace(tmp_path / "t.csv", [[1, 2]])
    with pytest.raises(ValueError, match=r"arrival.start_minute: must be in 1..2"):
        one(tmp_path, {"process": "trace", "file": "t.csv", "start_minute": 3})
    with pytest.raises(ValueError, match=r"rate/share do not apply to a 'trace' arrival"):
        one(tmp_path, {"process": "trace", "file": "t.csv"}, rate=5)
    w = make(
        tmp_path, [{"name": "a"}, {"name": "b"}], arrival={"process": "trace", "file": "t.csv"}
    )
    with pytest.raises(ValueError, match=r"1 functions cannot feed 2 models"):
        generate_arrivals(w)


def test_load_workload_errors_name_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nmodels: [unclosed\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: not valid YAML"):
        load_workload(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match=r"broken\.yaml: top level: must be a mapping"):
        load_workload(bad)
    with pytest.raises(ValueError, match=r"missing\.yaml: cannot read workload file"):
        load_workload(tmp_path / "missing.yaml")
    good = tmp_path / "ok.yaml"
    good.write_text(
        "duration_s: 1\ndevices: 1\nmodels:\n"
        "  - {name: m, profile: {alpha_ms: 1, beta_ms: 2}, slo_ms: 9, max_batch: 4, rate: 5e3}\n"
    )
    w = load_workload(good)
    assert w.name == "ok" and w.seed == 0 and w.models[0].rate == 5000
