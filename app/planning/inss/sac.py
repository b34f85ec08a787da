"""SAC-D, InSS's learned scheduler TS (inss.txt §5.4, Algorithm 2; Table 1).

A Soft-Actor-Critic for discrete actions (Christodoulou 2019, the paper's
[8]) as the paper describes it:

* an actor π_φ(a|s): a softmax over the discrete actions;
* two Q-networks Q_θ1, Q_θ2 with one output per action, and two target
  Q-networks θ'_v ← κ·θ_v + (1 − κ)·θ'_v after every update (line 14);
  clipped double Q: the minimum of the two is used wherever a Q-value is
  read (eq. 7 and 8);
* experience replay: transitions (s, a, r, s') in a bounded FIFO buffer,
  mini-batches drawn uniformly (lines 9–10);
* entropy regularisation with a learned temperature τ (eq. 5, 9): τ starts
  at 1.0 and follows J(τ) = π(s)ᵀ[−τ(log π(s) + Ĥ)] toward the target
  entropy Ĥ = −log(1 + ι), ι the number of actions (Table 1);
* the updates (lines 11–13): each Q-network regressed on
  Q̂ = r + γ·(1 − done)·π(s')ᵀ[min_v Q_θ'v(s') − τ·log π(s')] (eq. 7), the
  actor on J_π = π(s)ᵀ[τ·log π(s) − min_v Q_θv(s)] (eq. 8);
* Table 1's values: hidden layers 512 and 256 with ReLU, Adam with learning
  rate 1e-4 for ℓ_Q, ℓ_π, ℓ_τ, γ 0.99, buffer 10,000, mini-batch 100, κ 0.01.

Deviations, each for a reason:

* Eq. 6 as printed regresses Q̂ against min_v Q_θv; each Q-network is
  regressed on Q̂ with its own Q_θv(s, a) instead, as the text beside it
  says ("trained independently") and as SAC does: through the minimum only
  one network would get a gradient per sample.
* Invalid actions are masked (their logits set to −1e9, so π gives them
  probability 0 and they add nothing to the entropy or the sums above).
  The caller says which actions are valid in each state (for the placement,
  the shares left on a device, learned.py); the paper leaves such actions
  to its penalty, which spends samples on moves that can never be taken.
* The temperature is learned as log τ (τ stays > 0); J(τ) is unchanged.
  Note that with the paper's negative target entropy, J(τ)'s gradient
  H(π) − Ĥ is always > 0: τ only ever falls, at ℓ_τ per Adam step (an
  annealed exploration bonus). We keep the paper's value.
* Warm-up: until the buffer holds one mini-batch, actions are drawn
  uniformly among the valid ones and no update runs (Algorithm 2 updates
  from the first step, when there is nothing to sample).
* All of Table 1's numbers are `SacConfig` fields; the defaults are the
  paper's. Its 1500 episodes × 200 steps become a budget of environment
  steps chosen by the caller (one update per step, as Algorithm 2).

Deterministic given a seed: `torch.manual_seed` before the networks are
built, and a numpy `Generator` for the actions and the mini-batches.
PyTorch is an optional extra, imported through `app.optional.import_torch`
when an agent is built.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from app.optional import import_torch

_MASKED = -1e9  # a masked action's logit: exp underflows to exactly 0


@dataclass(frozen=True)
class SacConfig:
    """Table 1 of inss.txt (module docstring); `target_entropy` None means
    the paper's −log(1 + ι)."""

    hidden: tuple[int, int] = (512, 256)
    buffer_size: int = 10_000
    batch_size: int = 100
    lr: float = 1e-4
    gamma: float = 0.99
    initial_temperature: float = 1.0
    kappa: float = 0.01
    target_entropy: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        if len(self.hidden) != 2 or min(self.hidden) < 1:
            raise ValueError(f"two hidden layer sizes ≥ 1 expected, got {self.hidden}")
        if self.batch_size < 1 or self.buffer_size < self.batch_size:
            raise ValueError(
                f"need 1 ≤ batch size ≤ buffer size, got {self.batch_size}, {self.buffer_size}"
            )
        if not (self.lr > 0 and 0 <= self.gamma <= 1 and 0 < self.kappa <= 1):
            raise ValueError(f"need lr > 0, 0 ≤ γ ≤ 1, 0 < κ ≤ 1, got {self}")
        if not self.initial_temperature > 0:
            raise ValueError(f"initial temperature must be > 0, got {self.initial_temperature}")

    def entropy_target(self, actions: int) -> float:
        return -math.log(1 + actions) if self.target_entropy is None else self.target_entropy

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["hidden"] = list(self.hidden)
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> SacConfig:
        return cls(**{**body, "hidden": tuple(body["hidden"])})


class ReplayBuffer:
    """A bounded FIFO of transitions (s, valid actions in s, a, r, s', done,
    valid actions in s')."""

    def __init__(self, capacity: int, state_dim: int, actions: int) -> None:
        self.capacity = capacity
        self.states = np.zeros((capacity, state_dim), dtype=np.float32)
        self.masks = np.zeros((capacity, actions), dtype=bool)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.next_states = np.zeros((capacity, state_dim), dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.next_masks = np.zeros((capacity, actions), dtype=bool)
        self._next = 0
        self.size = 0

    def add(
        self,
        state: np.ndarray,
        mask: np.ndarray,
        action: int,
        reward: float,
        next_state: np.ndarray,
        done: bool,
        next_mask: np.ndarray,
    ) -> None:
        i = self._next
        self.states[i], self.masks[i] = state, mask
        self.actions[i], self.rewards[i] = action, reward
        self.next_states[i], self.dones[i], self.next_masks[i] = next_state, done, next_mask
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, ...]:
        idx = rng.integers(0, self.size, size=count)
        return (
            self.states[idx],
            self.masks[idx],
            self.actions[idx],
            self.rewards[idx],
            self.next_states[idx],
            self.dones[idx],
            self.next_masks[idx],
        )


def build_network(state_dim: int, actions: int, hidden: tuple[int, int]) -> Any:
    """Input → hidden[0] → hidden[1] → one output per action, ReLU between
    (the paper's four-layer networks, §6.1)."""
    nn = import_torch().nn
    return nn.Sequential(
        nn.Linear(state_dim, hidden[0]),
        nn.ReLU(),
        nn.Linear(hidden[0], hidden[1]),
        nn.ReLU(),
        nn.Linear(hidden[1], actions),
    )


def masked_policy(actor: Any, states: Any, masks: Any) -> tuple[Any, Any]:
    """π(·|s) and log π(·|s) with invalid actions at probability 0."""
    torch = import_torch()
    logits = actor(states).masked_fill(~masks, _MASKED)
    return torch.softmax(logits, dim=-1), torch.log_softmax(logits, dim=-1)


class SacAgent:
    """The actor, the two Q-networks and their targets, τ and the optimisers."""

    def __init__(self, state_dim: int, actions: int, config: SacConfig, seed: int) -> None:
        torch = import_torch()
        torch.manual_seed(seed)
        self.torch = torch
        self.config = config
        self.state_dim, self.actions = state_dim, actions
        self.actor = build_network(state_dim, actions, config.hidden)
        self.q = [build_network(state_dim, actions, config.hidden) for _ in range(2)]
        self.q_target = [build_network(state_dim, actions, config.hidden) for _ in range(2)]
        for target, q in zip(self.q_target, self.q, strict=True):
            target.load_state_dict(q.state_dict())
            target.requires_grad_(False)
        self.log_tau = torch.tensor(math.log(config.initial_temperature), requires_grad=True)
        self.target_entropy = config.entropy_target(actions)
        adam = torch.optim.Adam
        self.actor_opt = adam(self.actor.parameters(), lr=config.lr)
        self.q_opt = [adam(q.parameters(), lr=config.lr) for q in self.q]
        self.tau_opt = adam([self.log_tau], lr=config.lr)

    @property
    def temperature(self) -> float:
        return float(self.log_tau.detach().exp())

    def act(
        self, state: np.ndarray, mask: np.ndarray, rng: np.random.Generator, greedy: bool
    ) -> int:
        """An action drawn from π (training) or its most likely one (greedy)."""
        return choose(self.actor, state, mask, rng if not greedy else None)

    def update(self, batch: tuple[np.ndarray, ...]) -> dict[str, float]:
        """One step of Algorithm 2's lines 11–14 on a mini-batch."""
        torch, cfg = self.torch, self.config
        states, masks, actions, rewards, next_states, dones, next_masks = (
            torch.as_tensor(x) for x in batch
        )
        tau = self.log_tau.exp().detach()
        with torch.no_grad():
            probs, logp = masked_policy(self.actor, next_states, next_masks)
            q_next = torch.min(*(t(next_states) for t in self.q_target))
            soft = (probs * (q_next - tau * logp)).masked_fill(~next_masks, 0.0).sum(-1)
            target = rewards + cfg.gamma * (1.0 - dones) * soft
        q_losses = []
        for q, opt in zip(self.q, self.q_opt, strict=True):
            taken = q(states).gather(1, actions.unsqueeze(1)).squeeze(1)
            loss = 0.5 * ((taken - target) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            q_losses.append(float(loss.detach()))

        probs, logp = masked_policy(self.actor, states, masks)
        with torch.no_grad():
            q_now = torch.min(*(q(states) for q in self.q))
        actor_loss = (probs * (tau * logp - q_now)).masked_fill(~masks, 0.0).sum(-1).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()

        entropy = -(probs * logp).masked_fill(~masks, 0.0).sum(-1).detach()
        tau_loss = (self.log_tau.exp() * (entropy - self.target_entropy)).mean()
        self.tau_opt.zero_grad()
        tau_loss.backward()
        self.tau_opt.step()

        with torch.no_grad():
            for target, q in zip(self.q_target, self.q, strict=True):
                for t, p in zip(target.parameters(), q.parameters(), strict=True):
                    t.mul_(1.0 - cfg.kappa).add_(cfg.kappa * p)
        return {
            "q1_loss": q_losses[0],
            "q2_loss": q_losses[1],
            "actor_loss": float(actor_loss.detach()),
            "temperature": self.temperature,
        }


def choose(actor: Any, state: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None) -> int:
    """The actor's action in `state`: drawn with `rng`, or the most likely
    one when `rng` is None (ties to the lowest index)."""
    torch = import_torch()
    with torch.no_grad():
        probs, _ = masked_policy(
            actor,
            torch.as_tensor(state, dtype=torch.float32).unsqueeze(0),
            torch.as_tensor(mask).unsqueeze(0),
        )
    p = probs.squeeze(0).double().numpy()
    p[~mask] = 0.0
    if rng is None:
        return int(np.argmax(p))
    return int(rng.choice(len(p), p=p / p.sum()))
