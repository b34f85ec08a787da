"""bench.scheduler_alone: the core driven alone answers every request once,
batches when arrivals crowd, and its quick mode prints what it measured."""

from __future__ import annotations

import pytest

from bench.scheduler_alone import AloneSetup, main, run_once


def test_every_request_is_answered_once_on_idle_devices():
    setup = AloneSetup(requests=3_000, rate=20_000.0)
    times, models = setup.arrivals()
    run = run_once(setup, times, models)
    assert run.requests == 3_000
    assert run.answered + run.dropped == 3_000
    assert run.dropped == 0  # ℓ ≈ 0 on 8 devices: nothing is late
    assert run.wall_s > 0 and run.rate > 0


def test_crowded_arrivals_form_batches_and_overload_drops():
    # One model on one device at 40,000 r/s (virtual), ℓ(b) = 20 µs·b + 100 µs:
    # a batch of 16 takes 420 µs, so only batching keeps up (≤ 38,000 r/s).
    setup = AloneSetup(
        models=1, devices=1, requests=4_000, rate=40_000.0, alpha_us=20.0, beta_us=100.0
    )
    run = run_once(setup, *setup.arrivals())
    assert run.answered + run.dropped == 4_000
    assert run.answered / run.batches > 4.0
    # At 4 times a single device's batch-16 capacity, most must be dropped.
    over = AloneSetup(
        models=1, devices=1, requests=4_000, rate=160_000.0, alpha_us=20.0, beta_us=100.0
    )
    heavy = run_once(over, *over.arrivals())
    assert heavy.answered + heavy.dropped == 4_000
    assert heavy.dropped > 1_000


def test_quick_mode_prints_the_rate_and_the_cores_kind(capsys):
    main(["--requests", "2000", "--repeat", "2", "--models", "2", "--devices", "2"])
    out = capsys.readouterr().out
    assert "symphony alone, 2 models on 2 devices" in out
    assert "2,000 requests" in out and "req/s" in out
    assert "pure Python core" in out or "compiled core" in out
    assert "dropped 0" in out


def test_the_same_arrivals_give_the_same_decisions():
    setup = AloneSetup(requests=2_000, rate=500_000.0, models=2, devices=1)
    times, models = setup.arrivals()
    a, b = run_once(setup, times, models), run_once(setup, times, models)
    assert (a.answered, a.dropped, a.batches) == (b.answered, b.dropped, b.batches)
    assert a.batches < 2_000  # crowded: batches of more than one request
    with pytest.raises(SystemExit):
        main(["--requests", "x"])
