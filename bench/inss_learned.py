"""InSS's learned placement (SAC-D, app/planning/inss/learned.py) against the
exact branch and bound on small cases: the gap in Σ throughput it leaves.

    python -m bench.inss_learned                 # the full run (~15 min on one core)
    python -m bench.inss_learned --quick         # a few hundred steps (a smoke run)

Options: --steps (training steps per case; 20000, quick 300), --seed,
--config (default bench/workloads/inss/paper-setting.yaml), --out-dir
(default bench/results/inss; writes learned.json and learned.md).

The cases are subsets of the paper's setting (2–3 of its devices, 3–4 of
its models, at its rates × a factor so that the subset loads the devices
about as the whole does) and one hand-made case whose optimum is known
(tests/test_inss_learned.py's). Each row: the exact objective, the learned
plan's, the gap in % of the exact one, the models each serves, the training
time and steps. The agent has Table 1's settings (app/planning/inss/sac.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from app.planning.inss.config import problem_from_dict
from app.planning.inss.learned import gap_percent, solve_learned, train
from app.planning.inss.placement import solve_exact
from app.planning.inss.plan import Plan

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "bench" / "workloads" / "inss" / "paper-setting.yaml"
OUT_DIR = ROOT / "bench" / "results" / "inss"
FULL_STEPS = 20_000
QUICK_STEPS = 300

#: case → (devices, models, rate factor) taken from the paper's setting.
SUBSETS: dict[str, tuple[list[str], list[str], float]] = {
    "2 GPUs × 3 CNNs (A, R, V)": (["gpu0", "gpu2"], ["alexnet", "resnet50", "vgg16"], 0.6),
    "2 GPUs × 3 light (M, M1, E)": (
        ["gpu0", "gpu2"],
        ["mnasnet", "mobilenet", "efficientnet"],
        1.0,
    ),
    "3 GPUs × 4 models": (
        ["gpu0", "gpu1", "gpu2"],
        ["alexnet", "resnet50", "mnasnet", "mobilenet"],
        0.8,
    ),
    "3 GPUs × 5 models": (
        ["gpu0", "gpu1", "gpu2"],
        ["alexnet", "resnet50", "vgg16", "mnasnet", "efficientnet"],
        0.7,
    ),
}


def _linear(alpha_ms: float) -> dict[str, Any]:
    return {"running_time": {"linear_ms": {"alpha": alpha_ms, "beta": 0.0}}}


HAND = {
    "share_step": 0.5,
    "devices": [
        {"name": "big", "memory_mb": 10000, "bandwidth_gb_per_s": 10},
        {"name": "small", "memory_mb": 1000, "bandwidth_gb_per_s": 10},
    ],
    "models": [
        {"name": "A", "rate": 100, "slo_ms": 1000, "memory_mb": {1: 100, 4: 100},
         "latency_per_kind": {"big": _linear(1), "small": _linear(2)}},
        {"name": "B", "rate": 100, "slo_ms": 1000, "memory_mb": {1: 100, 4: 100},
         "latency_per_kind": {"big": _linear(2), "small": _linear(4)}},
    ],
}  # fmt: skip


def cases(config: Path) -> dict[str, dict[str, Any]]:
    raw = yaml.safe_load(config.read_text())
    out = {"hand-made 2 × 2 (optimum 1250)": copy.deepcopy(HAND)}
    for name, (devices, models, factor) in SUBSETS.items():
        body = copy.deepcopy(raw)
        body["devices"] = [d for d in body["devices"] if d["name"] in devices]
        body["models"] = [m for m in body["models"] if m["name"] in models]
        for m in body["models"]:
            m["rate"] = round(m["rate"] * factor, 3)
        out[name] = body
    return out


def _served(plan: Plan) -> str:
    return f"{sum(m.served for m in plan.models)}/{len(plan.models)}"


def run_case(name: str, body: dict[str, Any], steps: int, seed: int) -> dict[str, Any]:
    problem = problem_from_dict(body, name)
    exact = solve_exact(problem)
    started = time.perf_counter()
    policy = train(problem, steps, seed)
    train_s = time.perf_counter() - started
    learned = solve_learned(problem, policy)
    return {
        "case": name,
        "devices": len(problem.devices),
        "models": len(problem.models),
        "exact_objective": exact.objective,
        "exact_served": _served(exact),
        "learned_objective": learned.objective,
        "learned_served": _served(learned),
        "gap_percent": gap_percent(exact.objective, learned.objective),
        "train_s": train_s,
        "steps": steps,
        "episodes": policy.training["episodes"],
    }


def render(body: dict[str, Any]) -> str:
    lines = [
        "# InSS: learned (SAC-D) vs exact placement",
        "",
        f"`{body['command']}` — {body['steps']} training steps per case, seed {body['seed']}.",
        "",
        "| case | exact req/s | served | learned req/s | served | gap % | train s | steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in body["rows"]:
        lines.append(
            f"| {r['case']} | {r['exact_objective']:.1f} | {r['exact_served']} | "
            f"{r['learned_objective']:.1f} | {r['learned_served']} | {r['gap_percent']:.2f} | "
            f"{r['train_s']:.1f} | {r['steps']} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.inss_learned", description=__doc__.split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps, the first two cases")
    p.add_argument("--steps", type=int, help=f"training steps per case (default {FULL_STEPS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--out-dir", type=Path, default=OUT_DIR)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    if steps < 1:
        raise SystemExit("--steps must be ≥ 1")
    chosen = cases(args.config)
    if args.quick:
        chosen = dict(list(chosen.items())[:2])
    rows = []
    for name, body in chosen.items():
        print(name, file=sys.stderr)
        rows.append(run_case(name, body, steps, args.seed))
    argv_text = sys.argv[1:] if argv is None else list(argv)
    body = {
        "command": shlex.join(["python", "-m", "bench.inss_learned", *argv_text]),
        "steps": steps,
        "seed": args.seed,
        "rows": rows,
    }
    table = render(body)
    print(table)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "learned.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out_dir / "learned.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
