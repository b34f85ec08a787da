"""InSS's learned placement (app/planning/inss/learned.py, sac.py): the
MDP's state and reward on a hand-made case, SAC-D reaching the exact
objective on a tiny problem, the policy file and the command line."""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.planning.inss.cli import main as inss_main
from app.planning.inss.config import problem_from_dict
from app.planning.inss.learned import (
    PlacementEnv,
    load_policy,
    problem_signature,
    save_policy,
    solve_learned,
    train,
)
from app.planning.inss.placement import solve_exact
from app.planning.inss.problem import Problem
from app.planning.inss.sac import SacConfig


def _linear(alpha_ms: float) -> dict[str, Any]:
    return {"running_time": {"linear_ms": {"alpha": alpha_ms, "beta": 0.0}}}


# Two devices, two models, 50 % share steps; batch capped at 4 (the memory
# table) and a lax SLO, so throughput is linear in the share: h = ρ/α (α in
# s). A: 1000ρ on big, 500ρ on small; B: 500ρ, 250ρ. Best alone: A 1000,
# B 500, so H = 1500. Placements (A first): A big 100 %, B small 100 %:
# 1000 + 250 = 1250 ← optimum; A small 100 %, B big 100 %: 500 + 500 =
# 1000; both on big at 50 %: 500 + 250 = 750.
TINY: dict[str, Any] = {
    "share_step": 0.5,
    "devices": [
        {"name": "big", "memory_mb": 10000, "bandwidth_gb_per_s": 10},
        {"name": "small", "memory_mb": 1000, "bandwidth_gb_per_s": 10},
    ],
    "models": [
        {
            "name": "A",
            "rate": 100,
            "slo_ms": 1000,
            "memory_mb": {1: 100, 4: 100},
            "latency_per_kind": {"big": _linear(1), "small": _linear(2)},
        },
        {
            "name": "B",
            "rate": 100,
            "slo_ms": 1000,
            "memory_mb": {1: 100, 4: 100},
            "latency_per_kind": {"big": _linear(2), "small": _linear(4)},
        },
    ],
}
SMALL = SacConfig(hidden=(64, 64))


def _problem(body: dict[str, Any] = TINY) -> Problem:
    return problem_from_dict(copy.deepcopy(body), "test")


def test_state_and_reward_by_hand() -> None:
    env = PlacementEnv(_problem())
    assert env.actions == 1 + 2 * 2 and env.state_dim == 2 * 2 + 4 * 2
    assert env.scale == pytest.approx(1500.0)
    assert [env.decode(a) for a in range(5)] == [None, (0, 1), (0, 2), (1, 1), (1, 2)]
    state, mask = env.reset()
    assert mask.tolist() == [True] * 5
    # devices (memory, share) × 2, then per model (rate, queued, placed, next)
    assert state.tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 0, 0]

    state, reward, done, mask = env.step(2)  # A on big at 100 %: 1000 req/s
    assert reward == pytest.approx(0.99 * 10 * 1000 / 1500)
    assert not done and mask.tolist() == [True, False, False, True, True]
    assert state.tolist() == pytest.approx([0.01, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1])

    state, reward, done, _ = env.step(4)  # B on small at 100 %: 250 req/s
    assert reward == pytest.approx(0.99 * 10 * 1250 / 1500 - 10 * 1000 / 1500)
    assert done and state[:4].tolist() == pytest.approx([0.01, 1, 0.1, 1])

    env.reset()
    env.step(2)
    _, reward, _, _ = env.step(0)  # B skipped: ω per model not served
    assert reward == pytest.approx(0.99 * 10 * (1000 / 1500 - 1) - 10 * 1000 / 1500)
    with pytest.raises(ValueError, match="episode is over"):
        env.step(0)


def test_unserved_model_is_penalised_and_reported() -> None:
    """B on small at 50 % serves 125 req/s ≥ 100; at a rate of 200 it is not
    served there, and the plan says why."""
    body = copy.deepcopy(TINY)
    body["models"][1]["rate"] = 200
    env = PlacementEnv(_problem(body))
    env.reset()
    env.step(2)
    _, reward, _, _ = env.step(3)
    assert reward == pytest.approx(0.99 * 10 * (1000 / env.scale - 1) - 10 * 1000 / env.scale)
    assert env.outcomes()[1].served == () and "B" in env.outcomes()[1].failed


@pytest.mark.slow  # over a second
def test_training_reaches_the_exact_objective() -> None:
    problem = _problem()
    exact = solve_exact(problem)
    assert exact.objective == pytest.approx(1250.0)
    policy = train(problem, 600, seed=0, config=SMALL)
    plan = solve_learned(problem, policy)
    assert plan.method == "learned" and plan.feasible
    assert plan.objective == pytest.approx(exact.objective)
    assert (plan.model("A").device, plan.model("B").device) == ("big", "small")
    assert plan.details == {"steps": 600, "seed": 0, "episodes": 300}
    again = train(problem, 600, seed=0, config=SMALL)  # deterministic given the seed
    for key, value in policy.actor_state.items():
        assert np.array_equal(value.numpy(), again.actor_state[key].numpy()), key


@pytest.mark.slow  # over a second of wall time
def test_policy_file_round_trip_and_mismatch(tmp_path: Path) -> None:
    problem = _problem()
    policy = train(problem, 150, seed=1, config=SMALL)
    path = tmp_path / "policy.pt"
    save_policy(policy, path)
    loaded = load_policy(path)
    assert loaded.signature == problem_signature(problem) and loaded.config == SMALL
    assert loaded.training == policy.training
    assert solve_learned(problem, loaded) == solve_learned(problem, policy)

    other = copy.deepcopy(TINY)
    other["models"][0]["rate"] = 150
    with pytest.raises(ValueError, match="trained for another problem"):
        solve_learned(_problem(other), loaded)
    (tmp_path / "junk.pt").write_text("not torch")
    with pytest.raises(ValueError, match="not an InSS policy file"):
        load_policy(tmp_path / "junk.pt")


def test_cli_learned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    policy = tmp_path / "policy.pt"
    out, err = io.StringIO(), io.StringIO()
    args = [str(config), "--learned", "--train-steps", "120", "--policy-out", str(policy)]
    assert inss_main(args, out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert text.startswith(f"policy written to {policy}\nInSS plan (learned, 50% share steps)")
    assert "exact objective 1250.0 requests/s (feasible); learned gap " in text

    out = io.StringIO()
    assert inss_main([str(config), "--learned", "--policy", str(policy)], out, err) == 0
    assert out.getvalue() == text.split("\n", 1)[1]  # the same plan, loaded

    with pytest.raises(SystemExit) as exit_:
        inss_main([str(config), "--seed", "3"], io.StringIO(), io.StringIO())
    assert exit_.value.code == 2 and "--seed only with --learned" in capsys.readouterr().err
