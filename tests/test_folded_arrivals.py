"""Folded-trace arrivals (the PPipe artifact's MAF-2021 workload): the
synthetic trace keeps the declared statistics, and folding plays it at the
target rate the artifact's way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.simulation.ppipe_run import plan_arrivals
from app.workloads.folded import (
    MAF21,
    TraceStatistics,
    burstiness,
    fold,
    read_invocation_trace,
    synthetic_trace,
)


def test_the_synthetic_maf21_trace_has_the_declared_size_and_rate_variation() -> None:
    trace = synthetic_trace(MAF21, seed=0)
    assert len(trace) == pytest.approx(1_980_951, rel=0.01)
    assert trace[0] >= 0.0 and trace[-1] < 1_209_600.0
    assert np.all(np.diff(trace) >= 0)
    counts = np.bincount((trace // 30.0).astype(np.int64), minlength=40_320)
    assert counts.mean() / 30.0 == pytest.approx(1.6377, rel=0.01)
    # The per-30-s rate's CV, Poisson noise included, is the declared 0.634.
    assert counts.std() / counts.mean() == pytest.approx(0.634, abs=0.01)
    # Seeded: the same seed, the same trace; another seed, another.
    assert np.array_equal(synthetic_trace(MAF21, seed=0)[:100], trace[:100])
    assert not np.array_equal(synthetic_trace(MAF21, seed=1)[:100], trace[:100])


def test_a_cv_below_poissons_is_refused() -> None:
    with pytest.raises(ValueError, match="below Poisson"):
        synthetic_trace(TraceStatistics(1000.0, 1000, 1.0, 0.5))


def test_folding_lays_the_trace_segments_on_top_of_each_other() -> None:
    # 10 starts 1 s apart at 3 requests/s: segments of (10 - 1) / 3 = 3 s,
    # folded times 0,0,0,0,1,1,1,2,2,2, replayed from 0 and wrapping at 3 s.
    starts = np.arange(10.0)
    times = fold(starts, 3.0, 6.0)
    assert times.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    # At 1 request/s the segment is 9 s (starts 0 and 9 coincide); a run
    # shorter than a segment replays only its start.
    assert fold(starts, 1.0, 2.5).tolist() == [0.0, 0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="rate"):
        fold(starts, 0.0, 1.0)


def test_folded_maf21_arrivals_run_at_the_rate_and_are_as_bursty_as_poisson() -> None:
    # ~600 trace windows superposed: the per-30-s swings average out, and
    # within a run the counts have Poisson's dispersion (declared: 1).
    trace = synthetic_trace(MAF21, seed=0)
    times = fold(trace, 1000.0, 30.0)
    assert len(times) / 30.0 == pytest.approx(1000.0, rel=0.05)
    for window in (0.01, 0.1):
        dispersion, gap_cv = burstiness(times, window, 30.0)
        assert dispersion == pytest.approx(1.0, abs=0.15), window
        assert gap_cv == pytest.approx(1.0, abs=0.05)


def test_a_bursty_trace_stays_bursty_when_folded() -> None:
    # Invocations that start together (clusters of 5) survive the fold:
    # the index of dispersion at 100 ms is the cluster size, not 1.
    rng = np.random.default_rng(0)
    clusters = np.sort(rng.uniform(0.0, 100_000.0, 40_000))
    trace = np.repeat(clusters, 5)
    times = fold(trace, 500.0, 20.0)
    dispersion, gap_cv = burstiness(times, 0.1, 20.0)
    assert dispersion == pytest.approx(5.0, rel=0.2)
    assert gap_cv > 2.0


def test_plan_arrivals_folds_each_model_from_the_given_trace() -> None:
    trace = synthetic_trace(MAF21, seed=3)
    times, index, names = plan_arrivals(
        {"a": 400.0, "b": 100.0}, 10.0, process="maf21", invocations=trace
    )
    counts = np.bincount(index, minlength=2)
    assert names == ["a", "b"]
    assert counts[0] / 10.0 == pytest.approx(400.0, rel=0.1)
    assert counts[1] / 10.0 == pytest.approx(100.0, rel=0.2)
    assert np.all(np.diff(times) >= 0)
    assert np.array_equal(times[index == 1], fold(trace, 100.0, 10.0))


def test_the_maf21_csv_layout_is_read_as_invocation_starts(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text("app,func,end_timestamp,duration\na,f,5.5,0.5\nb,g,2.0,1.5\n")
    assert read_invocation_trace(path).tolist() == [0.5, 5.0]
    bad = tmp_path / "bad.txt"
    bad.write_text("app,func,end\na,f,1\n")
    with pytest.raises(ValueError, match="end_timestamp"):
        read_invocation_trace(bad)


def test_the_capacity_table_gives_the_papers_per_cluster_gains() -> None:
    # The paper's "+75.1 %" is the mean of its clusters' gains; ratio of the
    # clusters' mean capacities, then their mean.
    from bench.ppipe_sim import plan_set, render, summarise

    def cell(cluster: str, ppipe: float, np_: float) -> dict:
        entry = {"capacity": 0.0, "low_utilisation": 0.0}
        cost = {"probes_per_batch": 1.0, "core_us_per_batch": 30.0}
        return {
            "group_index": 1,
            "cluster": cluster,
            "arrivals": "maf21",
            "plans": "maf21",
            "ppipe": {**entry, "capacity": ppipe},
            "np": {**entry, "capacity": np_},
            "cost": cost,
        }

    cells = [cell("HC1", 0.9, 0.3), cell("HC1", 1.0, 0.5), cell("HC2", 0.9, 0.6)]
    summary = summarise(cells, ["ppipe", "np"])["maf21"]
    assert summary["gain_over_np"] == pytest.approx(2.8 / 1.4 - 1)
    gains = summary["cluster_gain_over_np"]
    assert gains == pytest.approx({"HC1": 1.9 / 0.8 - 1, "HC2": 0.5, "mean": (1.375 + 0.5) / 2})
    text = render(cells, {"maf21": summary}, ["ppipe", "np"])
    assert "maf21: PPipe +100 % over np (per cluster HC1 +137 %, HC2 +50 %, mean +94 %)" in text
    assert [plan_set(a, "auto") for a in ("poisson", "maf21", "bursty")] == [
        "maf19",
        "maf21",
        "maf19",
    ]
    assert plan_set("poisson", "maf21") == "maf21"
