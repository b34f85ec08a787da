"""InSS's latency model (app/planning/inss/): LWR against known surfaces, the
least-squares fits against synthetic data from known coefficients, §4.1's
execution time on a hand-computed case, eq. 2 against a simulated FIFO batch
queue, and the bundled Gpulet data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.planning.inss.fit import (
    fit_cache_interference,
    fit_l2_use,
    fit_sched_interference,
)
from app.planning.inss.gpulet_data import (
    BUNDLED_DIR,
    gpus,
    load_interference_constants,
    load_util,
)
from app.planning.inss.latency import (
    CoRunner,
    DeviceLatency,
    L2Use,
    ModelLatency,
    exec_breakdown,
    exec_time,
    task_latency,
    throughput,
)
from app.planning.inss.lwr import LocallyWeightedRegression, ProfilePoint

MS = 1e-3
GRID_BATCHES = (1, 4, 8, 12, 16, 20, 24, 28, 32)
GRID_SHARES = tuple(round(0.1 * k, 2) for k in range(1, 11))


def grid_lwr(surface, bandwidth: float, log_space: bool = False) -> LocallyWeightedRegression:
    b, r = np.meshgrid(GRID_BATCHES, GRID_SHARES)
    return LocallyWeightedRegression.from_arrays(
        b.ravel(), r.ravel(), surface(b, r).ravel(), bandwidth, log_space
    )


HELD_OUT = [(b, r) for b in (2, 6, 10, 14, 18, 22, 26, 30) for r in np.arange(0.15, 1.0, 0.1)]

# ---------------------------------------------------------------- LWR


def test_lwr_reproduces_a_plane_exactly_anywhere():
    lwr = grid_lwr(lambda b, r: 0.004 + 0.002 * b - 0.003 * r, bandwidth=0.3)
    for b, r in [(2, 0.15), (17, 0.55), (31, 0.95)]:
        assert lwr.predict(b, r) == pytest.approx(0.004 + 0.002 * b - 0.003 * r, rel=1e-9)


def test_lwr_in_log_space_reproduces_a_power_law_exactly():
    def power(b, r):
        return 0.0008 * b**0.9 / r**0.7

    lwr = grid_lwr(power, bandwidth=0.3, log_space=True)
    for b, r in HELD_OUT:
        assert lwr.predict(b, r) == pytest.approx(power(b, r), rel=1e-9)


def test_lwr_follows_a_curved_surface_at_held_out_points():
    # Fig. 11's shape: growing with batch, falling steeply with share.
    def surface(b, r):
        return 0.001 + 0.0008 * b**0.9 / r**0.7

    lwr = grid_lwr(surface, bandwidth=0.1)
    errors = [abs(lwr.predict(b, r) / surface(b, r) - 1) for b, r in HELD_OUT]
    assert len(errors) == 72
    assert np.mean(errors) < 0.02  # 1.3 % measured
    assert max(errors) < 0.08  # 7.2 % measured, at the smallest share


def test_lwr_on_one_axis_answers_only_at_the_profiled_value():
    lwr = LocallyWeightedRegression.from_arrays([4, 4, 4], [0.2, 0.4, 0.6], [3.0, 2.0, 1.0])
    assert lwr.predict(4, 0.3) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="single batch 4; it cannot predict batch 8"):
        lwr.predict(8, 0.3)
    single = LocallyWeightedRegression([ProfilePoint(4, 0.18, 0.01)])
    assert single.predict(4, 0.18) == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("batches", "shares", "seconds", "message"),
    [
        ([1, 2], [0.1, 0.5], [1.0, 2.0], "at least 3 points .* 2 varying axes, got 2"),
        ([1, 2, 4], [0.5, 0.5, 0.5], [1.0, math.nan, 2.0], "must be finite"),
        ([1, 2, 4], [0.5, 0.5, 1.5], [1.0, 2.0, 3.0], r"fractions in \(0, 1\], got 1.5"),
        ([1, 2, 4], [0.5, 0.5, 0.5], [1.0, 0.0, 3.0], "must be > 0 s"),
        ([0, 2, 4], [0.5, 0.5, 0.5], [1.0, 2.0, 3.0], "batch sizes must be ≥ 1"),
        ([], [], [], "at least one profiled point"),
    ],
)
def test_lwr_rejects_bad_profiles(batches, shares, seconds, message):
    with pytest.raises(ValueError, match=message):
        LocallyWeightedRegression.from_arrays(batches, shares, seconds)


def test_lwr_rejects_bad_queries_and_bandwidths():
    lwr = grid_lwr(lambda b, r: 0.01 * b / r, bandwidth=0.3)
    with pytest.raises(ValueError, match="must be finite"):
        lwr.predict(math.inf, 0.5)
    with pytest.raises(ValueError, match="fractions in"):
        lwr.predict(4, 0.0)
    with pytest.raises(ValueError, match="bandwidth must be finite and > 0"):
        LocallyWeightedRegression(lwr.points, bandwidth=0.0)
    falling = LocallyWeightedRegression.from_arrays([1, 2, 3], [1, 1, 1], [3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="non-positive running time"):
        falling.predict(10, 1.0)


# ---------------------------------------------------------------- fits


def test_l2_fit_recovers_its_coefficients():
    shares = np.array([0.06, 0.24, 0.42, 0.6, 0.78, 1.0])
    exact = fit_l2_use(shares, 0.35 * shares + 0.04)
    assert exact.l2.alpha_u == pytest.approx(0.35, abs=1e-9)
    assert exact.l2.beta_u == pytest.approx(0.04, abs=1e-9)
    assert exact.quality.rms_residual < 1e-12 and exact.quality.r_squared == pytest.approx(1.0)
    noise = np.random.default_rng(7).normal(0.0, 0.005, size=(40, len(shares)))
    noisy = fit_l2_use(np.tile(shares, 40), (0.35 * shares + 0.04 + noise).ravel())
    assert noisy.l2.alpha_u == pytest.approx(0.35, abs=0.005)  # σ = 0.005 on 240 points
    assert noisy.l2.beta_u == pytest.approx(0.04, abs=0.003)
    assert noisy.quality.rms_residual == pytest.approx(0.005, rel=0.15)
    assert noisy.quality.r_squared > 0.99


def test_sched_interference_fit_recovers_its_coefficients():
    o_sch, alpha_s, beta_s = 4e-6, 1.5e-6, -1e-6
    counts = np.array([2, 3, 4, 5, 6])
    exact = fit_sched_interference(counts, o_sch + alpha_s * counts + beta_s, o_sch)
    assert exact.alpha_s == pytest.approx(alpha_s, abs=1e-15)
    assert exact.beta_s == pytest.approx(beta_s, abs=1e-15)
    noise = np.random.default_rng(11).normal(0.0, 2e-7, size=(50, len(counts)))
    noisy = fit_sched_interference(
        np.tile(counts, 50), (o_sch + alpha_s * counts + beta_s + noise).ravel(), o_sch
    )
    assert noisy.alpha_s == pytest.approx(alpha_s, abs=5e-8)  # σ = 0.2 µs on 250 points
    assert noisy.beta_s == pytest.approx(beta_s, abs=2e-7)
    with pytest.raises(ValueError, match="0 by definition with ≤ 1 model"):
        fit_sched_interference([1, 2], [4e-6, 6e-6], o_sch)


def test_cache_interference_fit_recovers_alpha_with_and_without_alone_times():
    alpha = 0.8
    alone = np.array([0.010, 0.020, 0.015, 0.040, 0.012])
    load = np.array([0.10, 0.25, 0.40, 0.30, 0.55])
    exact = fit_cache_interference(load, alone * (1 + alpha * load), alone)
    assert exact.alpha_cache == pytest.approx(alpha, abs=1e-9)
    assert exact.alone_s is None and exact.quality.rms_residual < 1e-15
    # One model at one configuration, co-runners varied: alone time fitted too.
    fitted = fit_cache_interference(load, 0.02 * (1 + alpha * load))
    assert fitted.alpha_cache == pytest.approx(alpha, abs=1e-9)
    assert fitted.alone_s == pytest.approx(0.02, abs=1e-12)
    rng = np.random.default_rng(3)
    loads = rng.uniform(0.05, 0.6, 300)
    alones = rng.uniform(0.005, 0.05, 300)
    times = alones * (1 + alpha * loads) * (1 + rng.normal(0.0, 0.01, 300))  # 1 % noise
    assert fit_cache_interference(loads, times, alones).alpha_cache == pytest.approx(
        alpha, abs=0.02
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: fit_l2_use([0.5], [0.2]), "at least 2 points, got 1"),
        (lambda: fit_l2_use([0.5, 0.5], [0.2, 0.3]), "all shares are equal"),
        (lambda: fit_l2_use([0.2, 0.5], [0.2, math.inf]), "L2 use values must be finite"),
        (lambda: fit_l2_use([0.2, 0.5], [0.2]), "equal-length"),
        (lambda: fit_cache_interference([0.0, 0.0], [1.0, 1.0], [1.0, 1.0]), "not determined"),
        (lambda: fit_cache_interference([0.1], [1.0]), "≥ 2 points"),
    ],
)
def test_fits_reject_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------- §4.1


def hand_model(name: str, l2: L2Use, alpha_cache: float) -> ModelLatency:
    lwr = LocallyWeightedRegression.from_arrays(
        [1, 8, 1, 8], [0.2, 0.2, 0.6, 0.6], [6 * MS, 13 * MS, 2 * MS, 9 * MS]
    )  # a plane, so the local linear fit returns these points exactly
    return ModelLatency(
        name,
        input_bytes=600_000,
        output_bytes=4_000,
        sched_per_kernel_s=5e-6,
        kernels={1: 100, 8: 120},
        running_time=lwr,
        l2=l2,
        alpha_cache=alpha_cache,
    )


def test_exec_time_composes_the_terms_of_section_4_1():
    device = DeviceLatency("gpu", bandwidth_bytes_per_s=12e9, alpha_s=2e-6, beta_s=-1e-6)
    model = hand_model("r", L2Use(0.5, 0.05), alpha_cache=0.6)
    neighbours = [CoRunner(L2Use(0.4, 0.1), 0.2), CoRunner(L2Use(0.3, 0.0), 0.1)]
    terms = exec_breakdown(model, device, 8, 0.6, neighbours)
    assert terms.upload == pytest.approx(8 * 600_000 / 12e9)  # 0.4 ms
    assert terms.download == pytest.approx(8 * 4_000 / 12e9)
    # three models: int = 2 µs·3 − 1 µs = 5 µs; (5 + 5) µs × 120 kernels
    assert terms.scheduling == pytest.approx(10e-6 * 120)
    # L2: 0.4·0.2 + 0.1 = 0.18 and 0.3·0.1 = 0.03 → 9 ms × (1 + 0.6·0.21)
    assert terms.running == pytest.approx(9 * MS * 1.126)
    expected = 0.4 * MS + 1.2 * MS + 10.134 * MS + 32_000 / 12e9
    assert exec_time(model, device, 8, 0.6, neighbours) == pytest.approx(expected, rel=1e-12)
    assert throughput(model, device, 8, 0.6, neighbours) == pytest.approx(8 / expected)
    alone = exec_breakdown(model, device, 1, 0.2)
    assert alone.scheduling == pytest.approx(5e-6 * 100)  # one model: int = 0
    assert alone.running == pytest.approx(6 * MS)
    with pytest.raises(KeyError, match="no kernel count for batch 4"):
        exec_time(model, device, 4, 0.2)
    with pytest.raises(ValueError, match=r"sum to 1.3 > 1"):
        exec_time(model, device, 8, 0.6, [CoRunner(L2Use(0, 0), 0.7)])


def test_scheduling_interference_is_zero_for_one_model_and_linear_beyond():
    device = DeviceLatency("gpu", 1e9, alpha_s=2e-6, beta_s=1e-6)
    assert device.sched_interference(1) == 0.0
    assert [device.sched_interference(n) for n in (2, 3, 4)] == pytest.approx([5e-6, 7e-6, 9e-6])


# ---------------------------------------------------------------- eq. 2


def test_task_latency_follows_both_cases_of_eq_2():
    assert task_latency(0.003, queued=9, batch=4, rate=100, t_inf=0.010) == pytest.approx(0.033)
    assert task_latency(0.003, queued=4, batch=4, rate=100, t_inf=0.010) == pytest.approx(0.013)
    # W < b: max(exec, (b − W)/λ) + t_inf
    assert task_latency(0.003, queued=1, batch=4, rate=100, t_inf=0.010) == pytest.approx(0.040)
    assert task_latency(0.050, queued=1, batch=4, rate=100, t_inf=0.010) == pytest.approx(0.060)
    with pytest.raises(ValueError, match="arrival rate must be finite and > 0"):
        task_latency(0.0, queued=1, batch=4, rate=0.0, t_inf=0.01)
    with pytest.raises(ValueError, match="includes the task itself"):
        task_latency(0.0, queued=0, batch=4, rate=1.0, t_inf=0.01)


def simulate_batch_queue(rate: float, batch: int, t_inf: float, tasks: int, seed: int):
    """One server, FIFO, batches of exactly `batch` started as soon as that
    many are queued and the server is free; Poisson arrivals. Returns each
    task's latency, eq. 2's prediction from the state it arrived to, and the
    W it found (itself included)."""
    rng = np.random.default_rng(seed)
    tasks -= tasks % batch  # a last, incomplete batch never runs
    arrival = np.cumsum(rng.exponential(1.0 / rate, tasks))
    batches = tasks // batch
    start = np.empty(batches)
    free = 0.0
    for n in range(batches):
        start[n] = max(arrival[(n + 1) * batch - 1], free)
        free = start[n] + t_inf
    finish = start + t_inf
    latency = np.repeat(finish, batch) - arrival
    predicted = np.empty(tasks)
    queued_at = np.empty(tasks, dtype=int)
    for j in range(tasks):
        first_waiting = int(np.searchsorted(start, arrival[j], side="left"))
        queued = j - first_waiting * batch + 1  # tasks of not-yet-started batches, j included
        running = first_waiting - 1
        remaining = max(finish[running] - arrival[j], 0.0) if running >= 0 else 0.0
        predicted[j] = task_latency(remaining, queued, batch, rate, t_inf)
        queued_at[j] = queued
    return latency, predicted, queued_at


@pytest.mark.parametrize(
    ("rate", "tolerance"),
    [
        (150.0, 0.01),  # load λ·t_inf/b = 0.3: +0.24 % measured
        (320.0, 0.03),  # load 0.64: −1.4 % measured
        (380.0, 0.04),  # load 0.76: −2.2 % measured
    ],
)
def test_eq_2_predicts_the_mean_latency_of_a_simulated_fifo_batch_queue(rate, tolerance):
    batch, t_inf = 8, 0.016
    latency, predicted, _ = simulate_batch_queue(rate, batch, t_inf, tasks=40_000, seed=5)
    assert abs(predicted.mean() / latency.mean() - 1) < tolerance


def test_eq_2_is_exact_when_the_tasks_batch_is_full_and_a_bound_when_it_is_not():
    batch, t_inf, rate = 4, 0.010, 380.0  # load 0.95: long queues
    latency, predicted, queued = simulate_batch_queue(rate, batch, t_inf, tasks=8_000, seed=9)
    full = queued % batch == 0  # W a multiple of b: the task's own batch is complete
    assert full.mean() > 0.2
    assert np.max(np.abs(predicted[full] - latency[full])) < 1e-12
    # W > b but the task's batch still partial: eq. 2 counts ⌈W/b⌉ batches
    # back to back and never waits for the rest of its batch to arrive.
    partial = (queued > batch) & ~full
    assert partial.sum() > 1000
    assert np.all(latency[partial] >= predicted[partial] - 1e-12)
    assert np.max(latency[partial] - predicted[partial]) > 1e-3
    # W < b: eq. 2 uses the mean wait, so single tasks are off either way.
    few = queued < batch
    assert (
        np.min(latency[few] - predicted[few]) < -1e-3 < 1e-3 < np.max(latency[few] - predicted[few])
    )


# ---------------------------------------------------------------- Gpulet data


def test_gpulet_reader_returns_the_known_first_rows():
    assert gpus() == ["2080ti", "3080"]
    assert (BUNDLED_DIR / "README.md").read_text().count("casys-kaist/glet, commit 3c1c2aa") == 1
    util = load_util("3080")
    first = next(iter(util.values()))
    assert (first.model, first.batch) == ("bert", 4)
    assert first.duration_s == pytest.approx(7.106932367149757e-3)
    assert first.sm_util == pytest.approx(0.13920959021435845)
    assert first.l2_util == pytest.approx(0.20976145900954016)
    assert first.dram_util == pytest.approx(0.27473832958905895)
    assert first.theoretical_occupancy == pytest.approx(0.5032735802628586)
    assert len(util) == 90
    assert util[("resnet50", 1)].l2_util == pytest.approx(0.2223624739570287)
    old = load_util("2080ti")
    assert old[("resnet50", 1)].duration_s == pytest.approx(0.0227549e-3)
    constants = load_interference_constants("2080ti")
    assert constants.l2_self == pytest.approx(0.11290838746224496)
    assert constants.constant == pytest.approx(0.8953693917277343)
    own, other = util[("resnet50", 4)], util[("vgg16", 1)]
    three = load_interference_constants("3080")
    assert three.slowdown(own, 0.5, other, 0.5) == pytest.approx(
        1.018427067906819
        + 0.5 * (-0.17988746088090934 * own.l2_util + 0.038409119934405545 * other.l2_util)
        + 0.5 * (0.12551833308063143 * own.dram_util - 0.05648205937173589 * other.dram_util)
    )
    with pytest.raises(FileNotFoundError, match="have: 2080ti, 3080"):
        load_util("a100")


# ---------------------------------------------------------------- bench


def test_inss_tables_bench_fits_and_predicts_the_published_cells(tmp_path, capsys):
    from bench.inss_tables import main as tables_main

    assert tables_main(["--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tables.json").read_text())
    cells = {(c["row"], c["column"]): c for c in report["cells"]}
    assert len(cells) == 28
    roles = [c["role"] for c in report["cells"]]
    assert roles.count("predicted") == 14 and roles.count("fit") == 14
    # E*&M1: two cells fit (exactly), two predicted by the L2 cache term.
    assert cells[("E*&M1", "6%")]["ours_error_pct"] < 1e-9
    assert cells[("E*&M1", "24%")]["role"] == "predicted"
    assert cells[("E*&M1", "24%")]["ours_error_pct"] < 1.0  # 0.07 % measured
    assert cells[("E*&M1", "42%")]["ours_error_pct"] < 1.0  # 0.64 % measured
    assert report["cache_fit_e_m1"]["alpha_cache"] == pytest.approx(1.542, abs=1e-3)
    assert "predicted cells: paper mean 1.81 %" in capsys.readouterr().out
