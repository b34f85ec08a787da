"""InSS's learned placement (inss.txt §5.2's MDP, solved by SAC-D, sac.py)
against the latency model: no simulator, the reward is what the planner's
`DeviceEvaluator` (BDA under memory, SLO and rate, problem.py) predicts.

The MDP, one episode per placement of every model:

* step t places the t-th model of the problem (its order in the config) —
  the paper's action places all models at once; one model a step keeps the
  action space at 1 + K·U (U = 1/share_step) instead of (1 + K·U)^N;
* action: skip the model (y = 0), or (device k, share u·share_step),
  u = 1 … U; a share larger than what is left on k is masked (1a);
* state (§5.2: per device the memory used u_k, per model λ_i and the queued
  work G_i), normalised: per device the memory used by its served models
  / M_k and the share given out; per model λ_i / max λ, G_i = the fraction
  of λ_i not served (1 until the model is placed and served), whether it is
  placed, and whether it is the one to place next;
* evaluation: each device's placed models at their shares through
  `DeviceEvaluator.configure`; models it does not serve (memory, SLO, rate)
  are taken off the device and the rest evaluated again, as the plan
  reports them (a co-runner never speeds a model up, so the rest stay
  served);
* reward, eq. 3 with ω = 10: Φ = ω·(Σ_served h_i / H − models placed or
  skipped and not served), paid as the shaping
  r_t = γ·Φ(s_{t+1}) − Φ(s_t), so that an episode's return is γ^N·Φ(final)
  and the policy that maximises it maximises Φ. H = Σ_i (the most model i
  serves alone on any device), so Σ h / H ∈ [0, 1] and one more served
  model is worth more than any throughput — the planner's lexicographic
  objective (placement.py).

Deviations from §5.2, each for a reason: the throughput is normalised by
one H for all models, not per model by H_i (its throughput alone at 100 %
and batch 1), because per-model scales weigh a request of a slow model above
one of a fast model, and the objective (Σ requests/s) does not. ω is 10, not
100: with ĥ_i per model the paper's rewards are of the order of N·b; ours
are ≤ 1 per episode before ω, and ω sets their scale against the entropy
bonus τ·H(π) ≤ τ·log(1 + K·U). At ω = 1 the bonus outweighs throughput
differences until τ has fallen (the policy then prefers small shares, which
leave more actions open); at ω = 100 the actor turns greedy after a few
hundred updates and stops exploring; 10 did best on the hand-made cases
(tests/test_inss_learned.py). v_i is 1 or 0 per model (not served or
served), as the latency model's verdict is; the rates are fixed per
problem, so the agent is trained per problem (its signature is in the
saved policy).
BDA then sizes the batches, as for the exact and greedy placements.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.optional import import_torch
from app.planning.inss.placement import _Search, why_unserved
from app.planning.inss.plan import DevicePlan, ModelPlan, Plan
from app.planning.inss.problem import DeviceEvaluator, Problem, Served
from app.planning.inss.sac import ReplayBuffer, SacAgent, SacConfig, build_network, choose

POLICY_KIND = "inss-sac-policy"
POLICY_VERSION = 1
PENALTY = 10.0  # ω of eq. 3 (module docstring)

#: One model's action: None to skip it, else (device index, share units).
Action = tuple[int, int] | None


def problem_signature(problem: Problem) -> str:
    """A digest of everything the placement depends on: a policy is valid
    for the problem with the same signature only."""
    text = repr((problem.share_step, problem.devices, problem.models))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class DeviceOutcome:
    """A device's placed models evaluated: those served, and each one not
    served with its outcome when all placed models were evaluated."""

    served: tuple[Served, ...]
    failed: dict[str, Served]


class PlacementEnv:
    """The MDP (module docstring)."""

    def __init__(self, problem: Problem, penalty: float = PENALTY, gamma: float = 0.99) -> None:
        self.problem = problem
        self.penalty, self.gamma = penalty, gamma
        self.search = _Search(problem)
        self.evaluator: DeviceEvaluator = self.search.evaluator
        self.order = [m.name for m in problem.models]
        self.units = problem.units
        self.actions = 1 + len(problem.devices) * self.units
        self.state_dim = 2 * len(problem.devices) + 4 * len(self.order)
        scale = sum(self.search.alone_best(m) for m in self.order)
        self.scale = scale if scale > 0 else 1.0
        self._max_rate = max(m.rate for m in problem.models)
        self._devices: dict[tuple[int, frozenset[tuple[str, int]]], DeviceOutcome] = {}
        self.placed: list[Action] = []

    def decode(self, action: int) -> Action:
        if not 0 <= action < self.actions:
            raise ValueError(f"action {action} out of range 0 … {self.actions - 1}")
        if action == 0:
            return None
        k, u = divmod(action - 1, self.units)
        return (k, u + 1)

    def encode(self, placed: Action) -> int:
        return 0 if placed is None else 1 + placed[0] * self.units + placed[1] - 1

    def reset(self) -> tuple[np.ndarray, np.ndarray]:
        self.placed = []
        return self.state(), self.mask()

    @property
    def done(self) -> bool:
        return len(self.placed) == len(self.order)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, np.ndarray]:
        """Place the next model; (next state, reward, done, next valid actions)."""
        if self.done:
            raise ValueError("the episode is over: every model is placed")
        if not self.mask()[action]:
            raise ValueError(f"action {action} is not valid here (share left exceeded)")
        before = self.potential()
        self.placed.append(self.decode(action))
        reward = self.gamma * self.potential() - before
        return self.state(), reward, self.done, self.mask()

    def units_used(self) -> list[int]:
        used = [0] * len(self.problem.devices)
        for placed in self.placed:
            if placed is not None:
                used[placed[0]] += placed[1]
        return used

    def mask(self) -> np.ndarray:
        """Valid actions: skip, and every share that fits what is left."""
        valid = np.zeros(self.actions, dtype=bool)
        valid[0] = True
        if not self.done:
            for k, used in enumerate(self.units_used()):
                left = self.units - used
                valid[1 + k * self.units : 1 + k * self.units + left] = True
        return valid

    def device_outcome(self, k: int) -> DeviceOutcome:
        placed = frozenset(
            (self.order[i], p[1]) for i, p in enumerate(self.placed) if p is not None and p[0] == k
        )
        key = (k, placed)
        if key not in self._devices:
            device, step = self.problem.devices[k], self.problem.share_step
            shares = {name: u * step for name, u in sorted(placed)}
            failed: dict[str, Served] = {}
            served: tuple[Served, ...] = ()
            while shares:
                served = self.evaluator.configure(device, shares)
                bad = [s for s in served if not s.ok]
                if not bad:
                    break
                for s in bad:
                    failed.setdefault(s.model, s)
                    del shares[s.model]
                served = ()
            self._devices[key] = DeviceOutcome(served, failed)
        return self._devices[key]

    def outcomes(self) -> list[DeviceOutcome]:
        return [self.device_outcome(k) for k in range(len(self.problem.devices))]

    def potential(self) -> float:
        """Φ of the models placed so far (module docstring)."""
        outcomes = self.outcomes()
        throughput = sum(s.throughput for o in outcomes for s in o.served)
        served = sum(len(o.served) for o in outcomes)
        return self.penalty * (throughput / self.scale - (len(self.placed) - served))

    def state(self) -> np.ndarray:
        problem, outcomes = self.problem, self.outcomes()
        served = {s.model: s for o in outcomes for s in o.served}
        values: list[float] = []
        for device, outcome, used in zip(problem.devices, outcomes, self.units_used(), strict=True):
            memory = sum(s.memory_bytes for s in outcome.served)
            values += [memory / device.memory_bytes, used / self.units]
        for i, model in enumerate(problem.models):
            got = served.get(model.name)
            queued = 1.0 if got is None else max(0.0, 1.0 - got.throughput / model.rate)
            values += [
                model.rate / self._max_rate,
                queued,
                float(i < len(self.placed)),
                float(i == len(self.placed)),
            ]
        return np.asarray(values, dtype=np.float32)


@dataclass
class Policy:
    """A trained actor and what it was trained for."""

    signature: str
    devices: list[str]
    models: list[str]
    share_step: float
    config: SacConfig
    state_dim: int
    actions: int
    actor_state: dict[str, Any]
    q_states: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)

    def header(self) -> dict[str, Any]:
        return {
            "kind": POLICY_KIND,
            "version": POLICY_VERSION,
            "signature": self.signature,
            "devices": self.devices,
            "models": self.models,
            "share_step": self.share_step,
            "config": self.config.to_dict(),
            "state_dim": self.state_dim,
            "actions": self.actions,
            "training": self.training,
        }


def train(problem: Problem, steps: int, seed: int = 0, config: SacConfig | None = None) -> Policy:
    """SAC-D on the placement MDP for `steps` environment steps, one update
    a step once the buffer holds a mini-batch (sac.py)."""
    if steps < 1:
        raise ValueError(f"training needs at least 1 step, got {steps}")
    config = config or SacConfig()
    env = PlacementEnv(problem, gamma=config.gamma)
    agent = SacAgent(env.state_dim, env.actions, config, seed)
    buffer = ReplayBuffer(config.buffer_size, env.state_dim, env.actions)
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    torch = import_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small networks: threads cost more than they give
    try:
        episodes = _run(env, agent, buffer, rng, steps)
    finally:
        torch.set_num_threads(threads)
    return Policy(
        signature=problem_signature(problem),
        devices=[d.name for d in problem.devices],
        models=list(env.order),
        share_step=problem.share_step,
        config=config,
        state_dim=env.state_dim,
        actions=env.actions,
        actor_state={k: v.clone() for k, v in agent.actor.state_dict().items()},
        q_states=[{k: v.clone() for k, v in q.state_dict().items()} for q in agent.q],
        training={
            "steps": steps,
            "seed": seed,
            "episodes": episodes,
            "temperature": agent.temperature,
            "train_s": round(time.perf_counter() - started, 3),
        },
    )


def _run(
    env: PlacementEnv,
    agent: SacAgent,
    buffer: ReplayBuffer,
    rng: np.random.Generator,
    steps: int,
) -> int:
    """Algorithm 2's loop for `steps` steps; the number of episodes ended."""
    batch_size = agent.config.batch_size
    state, mask = env.reset()
    episodes = 0
    for _ in range(steps):
        if buffer.size < batch_size:
            action = int(rng.choice(np.flatnonzero(mask)))
        else:
            action = agent.act(state, mask, rng, greedy=False)
        next_state, reward, done, next_mask = env.step(action)
        buffer.add(state, mask, action, reward, next_state, done, next_mask)
        if buffer.size >= batch_size:
            agent.update(buffer.sample(rng, batch_size))
        state, mask = next_state, next_mask
        if done:
            episodes += 1
            state, mask = env.reset()
    return episodes


def check_policy(problem: Problem, policy: Policy, source: str = "policy") -> None:
    """A policy trained for another problem is refused."""
    if policy.signature != problem_signature(problem):
        raise ValueError(
            f"{source} was trained for another problem (signature {policy.signature}: devices "
            f"{', '.join(policy.devices)}; models {', '.join(policy.models)}; "
            f"{policy.share_step:.0%} share steps), not this one (signature "
            f"{problem_signature(problem)}); train one for it with --learned --policy-out"
        )


def learned_actions(problem: Problem, policy: Policy) -> list[Action]:
    """The greedy rollout: each model's most likely action."""
    check_policy(problem, policy)
    env = PlacementEnv(problem, gamma=policy.config.gamma)
    actor = build_network(policy.state_dim, policy.actions, policy.config.hidden)
    actor.load_state_dict(policy.actor_state)
    state, mask = env.reset()
    while not env.done:
        state, _, _, mask = env.step(choose(actor, state, mask, None))
    return list(env.placed)


def solve_learned(problem: Problem, policy: Policy) -> Plan:
    """The plan of the policy's greedy placement, BDA's batch sizes; a model
    the placement leaves unserved is reported with its reason."""
    actions = learned_actions(problem, policy)
    env = PlacementEnv(problem, gamma=policy.config.gamma)
    env.placed = actions
    outcomes = env.outcomes()
    served: dict[str, tuple[str, Served]] = {}
    device_plans = []
    for device, outcome in zip(problem.devices, outcomes, strict=True):
        for s in outcome.served:
            served[s.model] = (device.name, s)
        device_plans.append(
            DevicePlan(
                device=device.name,
                kind=device.kind,
                models=tuple(s.model for s in outcome.served),
                shares_used=round(sum(s.share for s in outcome.served), 12),
                memory_bytes=device.memory_bytes,
                memory_used_bytes=sum(s.memory_bytes for s in outcome.served),
            )
        )
    model_plans = []
    for spec, action in zip(problem.models, actions, strict=True):
        if spec.name in served:
            name, s = served[spec.name]
            model_plans.append(ModelPlan.on(spec, name, s))
            continue
        failed = outcomes[action[0]].failed[spec.name] if action is not None else None
        model_plans.append(ModelPlan.unserved(spec, _why_unserved(env, spec.name, action, failed)))
    return Plan(
        method="learned",
        share_step=problem.share_step,
        models=tuple(model_plans),
        devices=tuple(device_plans),
        objective=sum(m.throughput for m in model_plans),
        feasible=all(m.served for m in model_plans),
        details={
            k: policy.training[k] for k in ("steps", "seed", "episodes") if k in policy.training
        },
    )


def _why_unserved(env: PlacementEnv, model: str, action: Action, failed: Served | None) -> str:
    if all(env.search.min_units(d, model) is None for d in env.problem.devices):
        return why_unserved(env.search, model)  # no device serves it even alone
    if action is None or failed is None:
        return "the learned placement leaves it off (it is served alone on some device)"
    where = f"the learned placement puts it on {env.problem.devices[action[0]].name} at "
    where += f"{action[1] * env.problem.share_step:.0%}"
    spec = env.problem.model(model)
    if failed.batch is None:
        return where + ", where not even batch 1 meets its memory and SLO"
    if failed.throughput < spec.rate:
        return where + (
            f", where it serves at most {failed.throughput:.1f} req/s < rate {spec.rate:g} req/s"
        )
    return where + ", where the device's memory does not hold it beside its co-runners"


def save_policy(policy: Policy, path: Path) -> None:
    """torch.save of the state dicts beside a JSON header (kind, version,
    the problem's signature, the config)."""
    torch = import_torch()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "header": json.dumps(policy.header()),
        "actor": policy.actor_state,
        "q": policy.q_states,
    }
    torch.save(body, path)


def load_policy(path: Path) -> Policy:
    torch = import_torch()
    if not path.is_file():
        raise ValueError(f"{path}: no such policy file")
    try:
        body = torch.load(path, weights_only=True)
        header = json.loads(body["header"])
    except Exception as error:  # a torch file of another shape, or not one at all
        raise ValueError(f"{path}: not an InSS policy file: {error}") from error
    if header.get("kind") != POLICY_KIND or header.get("version") != POLICY_VERSION:
        raise ValueError(
            f"{path}: not an InSS policy file (kind {header.get('kind')!r}, version "
            f"{header.get('version')!r}; expected {POLICY_KIND!r} version {POLICY_VERSION})"
        )
    return Policy(
        signature=header["signature"],
        devices=list(header["devices"]),
        models=list(header["models"]),
        share_step=float(header["share_step"]),
        config=SacConfig.from_dict(header["config"]),
        state_dim=int(header["state_dim"]),
        actions=int(header["actions"]),
        actor_state=body["actor"],
        q_states=list(body["q"]),
        training=dict(header["training"]),
    )


def gap_percent(exact: float, learned: float) -> float:
    """How far `learned` is below `exact`, in % of it."""
    return 0.0 if exact == 0 else 100.0 * (exact - learned) / exact
