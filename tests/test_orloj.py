"""Orloj (app/scheduling/orloj.py, orloj_scores.py) on virtual time: the
eq. 1–2 score against a numerical integral of eq. 1, queue membership at
the float boundary, Algorithm 1's batch-size choice, selection by score,
and the policy through the simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.results import Outcome
from app.scheduling import DropReason, LatencyProfile, ModelInfo, Request, make_scheduler
from app.scheduling.model import InputDependence
from app.scheduling.orloj import OrlojScheduler
from app.scheduling.orloj_scores import REBASE_EXPONENT, ScoreTable, needs_rebase, score_eq2
from app.scheduling.timers import first_instant_after
from app.simulation.engine import run_simulation
from tests.fakes import before, devices, dispatches, drops, model

EDGES = np.array([0.010, 0.020, 0.030, 0.050])
MASSES = np.array([0.2, 0.5, 0.3])
EXPECTED = 0.027


def eq1_numerically(slack: float, rate: float) -> float:
    """(E[C(t + τ + L)] − E[C(t + L)]) / E[L] with a unit step cost at the
    deadline, τ ~ Exp(rate), L uniform within each bin of EDGES/MASSES."""
    cdf = np.concatenate(([0.0], np.cumsum(MASSES)))

    def late(y):  # P(L > y)
        return 1.0 - np.interp(y, EDGES, cdf, left=0.0, right=1.0)

    # Beyond τ0 = slack − l_min every run is late: that part is e^{−b·τ0}.
    tau0 = max(slack - EDGES[0], 0.0)
    tau = np.linspace(0.0, tau0, 400_001)
    integrand = rate * np.exp(-rate * tau) * late(slack - tau)
    delayed = float(np.trapezoid(integrand, tau)) + math.exp(-rate * tau0)
    return (delayed - float(late(slack))) / EXPECTED


@pytest.mark.parametrize("rate", [0.1, 30.0])
@pytest.mark.parametrize("slack", [0.005, 0.010, 0.015, 0.020, 0.026, 0.049, 0.05, 0.07, 2.0])
def test_score_is_eq1_integrated(rate: float, slack: float) -> None:
    table = ScoreTable(EDGES, MASSES, EXPECTED, rate)
    t = 3.0
    (score,) = table.scores(np.array([t + slack]), t, base=1.0)
    assert score == pytest.approx(eq1_numerically(slack, rate), rel=1e-6, abs=1e-9)
    assert score == pytest.approx(score_eq2(EDGES, MASSES, EXPECTED, rate, slack), rel=1e-9)
    if slack <= EDGES[0]:
        assert score == 0.0


def test_alpha_beta_are_constant_between_milestones() -> None:
    table = ScoreTable(EDGES, MASSES, EXPECTED, 0.1)
    due = np.array([1.0, 1.025, 1.2])
    t = 1.0 - 0.001  # slacks 1, 26, 201 ms
    milestones = table.milestones(due, t)
    assert milestones.tolist() == pytest.approx([np.inf, 1.005, 1.15])
    a0, b0 = table.alpha_beta(due, t, 0.0)
    a1, b1 = table.alpha_beta(due, 1.005 - 1e-9, 0.0)
    assert a1[1] == a0[1] and b1[1] == b0[1]  # the same piece up to the milestone
    a2, b2 = table.alpha_beta(due, 1.005 + 1e-9, 0.0)
    assert (a2[1], b2[1]) != (a0[1], b0[1])
    # Beyond the last edge β is 0 and α ∝ e^{−b·D}: deadline order.
    assert b0[2] == 0.0 and a0[2] > 0.0


def test_rebase_keeps_scores_and_their_order() -> None:
    rate = 0.1
    table = ScoreTable(EDGES, MASSES, EXPECTED, rate)
    rng = np.random.default_rng(5)
    t = 20_000.0  # b·t = 2,000: e^{b·t} overflows without a rebase
    due = t + rng.uniform(0.0, 0.3, 200)
    assert needs_rebase(t, 0.0, rate)
    assert not needs_rebase(REBASE_EXPONENT / rate, 0.0, rate)
    with pytest.raises(OverflowError):
        table.scores(due, t, base=0.0)
    near = table.scores(due, t, base=t - 100.0)
    fresh = table.scores(due, t, base=t)
    assert fresh == pytest.approx(near, rel=1e-9)
    assert np.argsort(-fresh, kind="stable").tolist() == np.argsort(-near, kind="stable").tolist()


def test_the_policy_rebases_its_scores_late_in_a_run() -> None:
    # At 20,000 s, e^{b·t} (b = 0.1/s) overflows: the policy has moved its
    # base and still ranks requests by score.
    s = orloj([dynamic()])
    now = 20_000.0
    busy = occupy(s, "d", now)
    for i in range(4):
        s.add_request(Request(i + 1, "d", now, now + 0.3 + 0.01 * i), now)
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, now + 0.001))
    # Slacks 299..329 ms: all four are in Q_3 (E[L_3] = 232.5 ms), one in
    # Q_4 (328 ms): bs = 3, the three with the highest scores.
    assert [r.id for r in dispatch.batch.requests] == [2, 3, 4]
    assert s._base == now


def test_point_mass_is_the_narrow_bin_limit() -> None:
    point = ScoreTable(np.array([0.02, 0.02]), np.array([1.0]), 0.02, 5.0)
    narrow = ScoreTable(np.array([0.02, 0.02 + 1e-9]), np.array([1.0]), 0.02, 5.0)
    due = np.array([0.01, 0.02, 0.03, 0.5])
    assert point.scores(due, 0.0).tolist() == pytest.approx(narrow.scores(due, 0.0), abs=1e-6)
    # Running now saves the whole cost, 1/E[L], less the chance τ runs out.
    assert point.scores(due, 0.0)[2] == pytest.approx(math.exp(-5.0 * 0.01) / 0.02)
    assert point.scores(due, 0.0)[:2].tolist() == [0.0, 0.0]


def test_bad_histograms_are_refused() -> None:
    with pytest.raises(ValueError, match="n ≥ 1 masses and n \\+ 1 edges"):
        ScoreTable(np.array([0.0, 1.0]), np.array([0.5, 0.5]), 1.0, 0.1)
    with pytest.raises(ValueError, match="delay rate b must be a finite number > 0"):
        ScoreTable(EDGES, MASSES, EXPECTED, 0.0)
    with pytest.raises(ValueError, match="ascending"):
        ScoreTable(EDGES[::-1], MASSES, EXPECTED, 0.1)


# ------------------------------------------------------------------ the policy

UNIFORM = tuple(np.linspace(0.010, 0.100, 10_001))  # x ~ U[10, 100] ms


def dynamic(name: str = "d", c0: float = 0.0, slo: float = 0.5, **apps) -> ModelInfo:
    prior = tuple((a, tuple(c0 + x for x in xs)) for a, xs in (apps or {"": UNIFORM}).items())
    return ModelInfo(
        name,
        LatencyProfile.linear(10.0, 10.0, 8),
        slo,
        8,
        dynamic=InputDependence(c0, prior=prior),
    )


def orloj(models: list[ModelInfo], n: int = 1, **options) -> OrlojScheduler:
    scheduler = make_scheduler("orloj", models, devices(n), **options)
    assert isinstance(scheduler, OrlojScheduler)
    return scheduler


def occupy(s: OrlojScheduler, name: str, now: float = 0.0):
    """Dispatch one request so that the only device is busy."""
    (batch,) = [d.batch for d in dispatches(s.add_request(Request(-1, name, now, now + 10.0), now))]
    return batch


def test_queue_membership_ends_exactly_when_t_plus_expected_latency_passes_the_due_time() -> None:
    s = orloj([dynamic()])
    occupy(s, "d")
    # E[L_bs] = bs·E[max of bs U[10, 100] ms] = bs·(10 + 90·bs/(bs + 1)) ms.
    for bs in (1, 2, 5):
        assert s.expected_latency("d", bs) == pytest.approx(
            bs * (0.010 + 0.090 * bs / (bs + 1)), rel=1e-3
        )
    r = Request(1, "d", 0.0, 0.400)
    assert not s.add_request(r, 0.0)
    for bs in (2, 3):
        out = first_instant_after(r.due, s.expected_latency("d", bs))
        assert before(out) + s.expected_latency("d", bs) <= r.due
        assert r in s.queue("d", bs, before(out))
        assert r not in s.queue("d", bs, out)
    assert r in s.queue("d", 1, 0.3)
    # Too large for any size from 0.345 s on (E[L_1] = 55 ms): dropped by the
    # drop timer, at that instant, not one float earlier.
    hopeless = first_instant_after(r.due, s.expected_latency("d", 1))
    assert s.next_wakeup() == hopeless
    assert not drops(s.advance(before(hopeless)))
    (drop,) = drops(s.advance(hopeless))
    assert drop.reason is DropReason.DEADLINE and drop.requests == [r]
    assert s.queued() == 0 and s.next_wakeup() is None


STATIC = model(alpha_ms=1.0, beta_ms=10.0, slo_ms=200.0, max_batch=8)  # ℓ(k) = 10 + k ms


def batch_after_busy(requests: list[Request]) -> list[Request]:
    """The batch Orloj forms from `requests` queued while the device is busy
    and found when it frees at 11 ms."""
    s = orloj([STATIC])
    busy = occupy(s, STATIC.name)
    for r in requests:
        assert not dispatches(s.add_request(r, 0.001))
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.011))
    return dispatch.batch.requests


def test_batch_size_is_the_largest_whose_queue_holds_the_earliest_deadline() -> None:
    # The head can finish in a batch of 3 (11 + 13 ≤ 24.5 ms), not 4 (25 ms):
    # Q_1, Q_2 and Q_3 share its deadline, the tie goes to the larger.
    head = Request(1, "m", 0.001, 0.0245)
    lax = [Request(2 + i, "m", 0.001, 0.2) for i in range(5)]
    batch = batch_after_busy([*lax, head])
    assert len(batch) == 3 and head in batch


def test_batch_size_needs_bs_requests_in_its_queue() -> None:
    # As above, but only one other request: Q_3 holds 2 < 3, so bs = 2.
    head = Request(1, "m", 0.001, 0.0245)
    batch = batch_after_busy([Request(2, "m", 0.001, 0.2), head])
    assert [r.id for r in batch] == [1, 2]


def test_a_head_that_fits_only_alone_runs_alone() -> None:
    # 11 + 11 ≤ 22.5 < 11 + 12 ms: only Q_1 holds the head, and its deadline
    # is the earliest: bs = 1, though 7 more requests could fill a batch.
    head = Request(1, "m", 0.001, 0.0225)
    batch = batch_after_busy([*(Request(2 + i, "m", 0.001, 0.2) for i in range(7)), head])
    assert [r.id for r in batch] == [1]


def test_the_batch_is_the_top_requests_by_score_not_by_deadline() -> None:
    # x ~ U[10, 100] ms, c0 = 0: E[L_2] = 140 ms, E[L_3] = 232.5 ms. A
    # request with 150 ms of slack is in Q_2 but L_2 ≤ 150 ms only with
    # probability ≈ 0.52; two with 250 and 300 ms are almost sure to make
    # it. Q_1 and Q_2 share the earliest deadline (bs = 2), and the batch
    # takes the two likely ones: eq. 2 values the cost a run can still save.
    s = orloj([dynamic()])
    busy = occupy(s, "d")
    tight, sure, surer = (
        Request(i, "d", 0.0, 0.001 + slack) for i, slack in ((1, 0.150), (2, 0.250), (3, 0.300))
    )
    for r in (tight, sure, surer):
        s.add_request(r, 0.0)
    assert tight in s.queue("d", 2, 0.001) and tight not in s.queue("d", 3, 0.001)
    # In Q_1 all three lie beyond L_1's last edge (100 ms): deadline order.
    assert s.select("d", 1, 0.001) == [tight]
    assert s.next_batch("d", 0.001) == [sure, surer]
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.001))
    assert dispatch.batch.requests == [sure, surer]
    assert s.queue("d", 1, 0.001) == [tight]


def test_a_batch_of_two_applications_is_predicted_with_the_product_form() -> None:
    short = tuple(np.linspace(0.010, 0.020, 1001))
    long = tuple(np.linspace(0.060, 0.100, 1001))
    info = dynamic(c0=0.005, short=short, long=long)
    s = orloj([info])
    busy = occupy(s, "d")
    apps = ["short", "long", "short"]
    for i, app in enumerate(apps):
        s.add_request(Request(i + 1, "d", 0.0, 1.0, app=app), 0.0)
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.002))
    batch = dispatch.batch
    assert len(batch.requests) == 3
    latency = s.states["d"].dynamic
    assert latency is not None
    expected = latency.expected_batch([r.app for r in batch.requests], 3)
    assert batch.finish_at - batch.start_at == pytest.approx(expected)
    # Two short and one long: the long one sets the batch's time, ≈ c0 + 3·80 ms.
    assert expected == pytest.approx(0.005 + 3 * 0.080, rel=0.01)
    # The mixture (half of each) plans E[L_3] with 1 − 1/8 of a long draw.
    assert s.expected_latency("d", 3) < expected


def test_measured_alone_times_move_the_plan() -> None:
    s = orloj([dynamic(c0=0.0, slo=1.0)], min_samples=4, window_s=10.0)
    occupy(s, "d")
    r = Request(1, "d", 0.0, 0.2)
    s.add_request(r, 0.0)
    assert s.expected_latency("d", 1) == pytest.approx(0.055, rel=1e-3)
    for i in range(3):
        assert not s.record_alone_time("d", "", 0.25, 0.001 * i)
    assert s.expected_latency("d", 1) == pytest.approx(0.055, rel=1e-3)  # prior still in use
    # The fourth sample puts the window in use: E[L_1] = 250 ms > 200 ms of
    # slack, so the request can no longer finish and is dropped at once.
    (drop,) = drops(s.record_alone_time("d", "", 0.25, 0.004))
    assert s.expected_latency("d", 1) == pytest.approx(0.25)
    assert drop.requests == [r] and drop.reason is DropReason.DEADLINE


def test_a_failed_batch_is_judged_by_the_distributions_not_the_profile() -> None:
    # The profile says ℓ(1) = 20 ms; the histograms E[L_1] = 55 ms. When the
    # device fails at 50 ms with 50 ms left, the request cannot make it: it
    # is answered DEVICE_FAILED at once, not requeued.
    s = orloj([dynamic()], 2)
    request = Request(1, "d", 0.0, 0.100)
    (dispatch,) = dispatches(s.add_request(request, 0.0))
    assert s.expected_latency("d", 1) > 0.050 > s.latency(s.models["d"], 1)
    (drop,) = drops(s.device_down(dispatch.batch.device, 0.050))
    assert drop.reason is DropReason.DEVICE_FAILED and drop.requests == [request]
    assert s.queued() == 0


def test_alone_times_of_a_static_model_are_ignored() -> None:
    s = orloj([STATIC])
    before_ = [s.expected_latency("m", k) for k in range(1, 9)]
    s.record_alone_time("m", "", 5.0, 0.0)
    assert [s.expected_latency("m", k) for k in range(1, 9)] == before_
    assert before_ == [STATIC.profile.latency(k) for k in range(1, 9)]


def test_across_models_the_earliest_deadline_goes_first() -> None:
    a, b = model("a", slo_ms=200.0), model("b", slo_ms=200.0)
    s = orloj([a, b])
    busy = occupy(s, "a")
    s.add_request(Request(1, "a", 0.0, 0.15), 0.0)
    s.add_request(Request(2, "b", 0.0, 0.05), 0.0)
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.011))
    assert dispatch.batch.model == "b"


def test_a_small_workload_through_the_simulator_answers_every_request_once() -> None:
    rng = np.random.default_rng(9)
    infos = [model("m", slo_ms=60.0, max_batch=8), dynamic(slo=0.5)]
    times = np.sort(rng.uniform(0.0, 1.0, 400))
    # About 20 dynamic requests: each costs k·max x (x up to 100 ms, c0 = 0),
    # so two devices carry them beside the static model's 380.
    which = (rng.random(400) < 0.05).astype(int)
    devs = devices(2)
    # The dynamic model's requests each draw their own work from its prior.
    work = np.where(which == 1, rng.choice(np.array(UNIFORM), 400), 0.0)
    trace = run_simulation(orloj(infos, 2), infos, devs, times, which, work=work)
    assert (trace.status != int(Outcome.PENDING)).all()  # the engine raises on twice
    static = which == 0
    assert (trace.status[static] == int(Outcome.GOOD)).mean() > 0.95
    assert not (trace.status[static] == int(Outcome.LATE)).any()
    assert int(trace.batch_size.max()) > 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"window_s": 0}, "window_s must be a finite number > 0"),
        ({"window_s": math.inf}, "window_s must be a finite number > 0"),
        ({"delay_rate": -0.1}, "delay_rate must be a finite number > 0"),
        ({"min_samples": 2.5}, "min_samples must be an integer ≥ 1, got 2.5"),
        ({"min_samples": 0}, "min_samples must be an integer ≥ 1, got 0"),
        ({"bins": True}, "bins must be an integer ≥ 1"),
        ({"min_samples": 64, "max_samples": 10}, "max_samples must be an integer ≥ 64"),
        ({"bogus": 1}, "bad option for policy 'orloj'"),
        ({"batch_estimate": "batch"}, "batch_estimate must be one of"),
    ],
)
def test_bad_options_are_refused(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_scheduler("orloj", [STATIC], devices(1), **options)


def test_integral_float_options_are_taken() -> None:
    s = orloj([STATIC], min_samples=16.0, bins=32.0)
    assert (s.min_samples, s.bins) == (16, 32)
    with pytest.raises(ValueError, match=r"batch sizes 1\.\.8, not 9"):
        s.queue("m", 9, 0.0)


# Two applications, c0 = 5 ms: short x ~ U[10, 20] ms, long x ~ U[60, 100] ms.
SHORT = tuple(np.linspace(0.010, 0.020, 1001))
LONG = tuple(np.linspace(0.060, 0.100, 1001))


def two_apps(**options) -> OrlojScheduler:
    return orloj([dynamic(c0=0.005, short=SHORT, long=LONG)], **options)


def test_each_request_is_eligible_by_a_batch_of_its_own_kind() -> None:
    # Algorithm 1 line 20, EstimateBatchLatency(r, bs): a short request
    # expects c0 + 8·E[max of 8 short x] ≈ 156 ms of a batch of 8, so with
    # 199 ms left it is in Q_8; a long one expects 178 ms of a batch of 2
    # and 275 of 3, so it is in Q_2, not Q_3. With one estimate for the
    # model (the mixture, E[L_8] ≈ 0.8 s) neither is in Q_8.
    for mode, in_q8 in (("application", [1]), ("model", [])):
        s = two_apps(batch_estimate=mode)
        occupy(s, "d")
        short, long = Request(1, "d", 0.0, 0.2, app="short"), Request(2, "d", 0.0, 0.2, app="long")
        s.add_request(short, 0.0)
        s.add_request(long, 0.0)
        assert [r.id for r in s.queue("d", 8, 0.001)] == in_q8
        if mode == "application":
            assert s.expected_latency("d", 8) > 0.7  # the mixture's, for inspection
            assert long in s.queue("d", 2, 0.001) and long not in s.queue("d", 3, 0.001)


def test_cheaper_requests_batch_together_where_one_estimate_runs_them_alone() -> None:
    # Two short requests with 98 ms left and a long one with 298 ms: a batch
    # of 2 shorts is expected to take 38 ms, so bs = 2 and the shorts (whose
    # batch costs less worker time, eq. 1's 1/E[L]) go together. The
    # mixture plans 139 ms for any batch of 2 and 52 ms (x up to 105) alone:
    # bs = 1, and its L_1 makes a short (98 ms left) less likely to finish
    # than the long one, which runs first, alone.
    batches = {}
    for mode in ("application", "model"):
        s = two_apps(batch_estimate=mode)
        busy = occupy(s, "d")
        s1, s2 = (Request(i, "d", 0.0, 0.1, app="short") for i in (1, 2))
        long = Request(3, "d", 0.0, 0.3, app="long")
        for r in (s1, s2, long):
            s.add_request(r, 0.0)
        (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.002))
        batches[mode] = [r.id for r in dispatch.batch.requests]
    assert batches == {"application": [1, 2], "model": [3]}


def test_a_request_joins_only_if_the_formed_batch_still_meets_every_due_time() -> None:
    # Q_2 holds both (the short expects 38 ms of a batch of shorts); the
    # short scores first, and the long one would make the batch ≈ 165 ms,
    # past the short's 58 ms: it stays queued, the short runs alone.
    s = two_apps()
    busy = occupy(s, "d")
    short = Request(1, "d", 0.0, 0.06, app="short")
    long = Request(2, "d", 0.0, 0.5, app="long")
    s.add_request(short, 0.0)
    s.add_request(long, 0.0)
    assert s.queue("d", 2, 0.002) == [short, long]
    (dispatch,) = dispatches(s.batch_finished(0, busy.id, 0.002))
    assert dispatch.batch.requests == [short]
    assert s.queued() == 1
