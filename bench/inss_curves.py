"""How well the roofline running time o_r(b, ρ) = t₁(b)·max(1, u(b)/ρ)
(app/planning/inss/measured.py) fits real GPUs' shares, against the linear
(α·b + β)/ρ of the paper's setting, on the measured data in `data/`:

    python -m bench.inss_curves

* **PPipe's MPS timings** (data/ppipe/block-timing: whole GPU and ½, ⅓, ¼
  of it, batches 1–2 at every share): u(b) fitted on the ½ share alone,
  the ⅓ and ¼ shares predicted, per GPU, for the 18 DNNs of the paper's main
  evaluation (`model_list.txt`); the linear model's prediction is t₁(b)/ρ.
* **Gpulet's utilisation** (data/gpulet/{gpu}/UTIL.CSV): u(b), the share
  above which a larger one gains nothing, per small model, and inss.txt
  Table 3's MnasNet at batch 4 (24 %, 42 %, 60 %) against the roofline.

Output: tables on stdout; `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from app.planning.inss.measured import fit_used_fraction, from_gpulet
from app.planning.ppipe import profiles as ppipe_profiles

#: inss.txt Table 3: MnasNet at batch 4 alone, ms at each share.
TABLE3_MNASNET_B4 = {0.24: 4.24, 0.42: 3.47, 0.60: 3.41}
GPULET_MODELS = ("lenet", "mobilenet_v2", "mnasnet1_0", "googlenet", "resnet50", "vgg16")
GPULET_BATCHES = (1, 4, 16, 32)


@dataclass(frozen=True)
class ShareFit:
    """Relative errors predicting the ⅓ and ¼ shares from the ½ share."""

    gpu: str
    points: int
    roofline_median: float
    roofline_p90: float
    linear_median: float
    linear_p90: float
    used_median: float


def share_fits(
    models: Sequence[str], directory: Path = ppipe_profiles.BUNDLED_DIR
) -> list[ShareFit]:
    """Per GPU with ½-share timings: the roofline's and the linear model's
    errors on the smaller shares (module docstring)."""
    errors: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for model in models:
        profile = ppipe_profiles.load_profile(model, directory)
        for gpu in profile.classes():
            shares = profile.shares(gpu)
            if 1 not in shares or 2 not in shares:
                continue
            roof, linear, used = errors.setdefault(gpu, ([], [], []))
            for batch in range(1, profile.max_batch(gpu, 2) + 1):
                whole = profile.whole_latency(batch, gpu, 1)
                half = profile.whole_latency(batch, gpu, 2)
                u = fit_used_fraction(whole, [(0.5, half)])
                used.append(u)
                for v in shares:
                    if v <= 2 or batch > profile.max_batch(gpu, v):
                        continue
                    measured = profile.whole_latency(batch, gpu, v)
                    roof.append(abs(whole * max(1.0, u * v) - measured) / measured)
                    linear.append(abs(whole * v - measured) / measured)
    return [
        ShareFit(
            gpu,
            len(roof),
            statistics.median(roof),
            _p90(roof),
            statistics.median(linear),
            _p90(linear),
            statistics.median(used),
        )
        for gpu, (roof, linear, used) in sorted(errors.items())
        if roof
    ]


def _p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def table3_check(gpu: str = "3080") -> dict[float, tuple[float, float]]:
    """share → (Table 3's time / its time at 60 %, the roofline's ratio)."""
    curve = from_gpulet("mnasnet1_0", gpu)
    base_paper, base_roof = TABLE3_MNASNET_B4[0.60], curve.predict(4, 0.60)
    return {
        share: (ms / base_paper, curve.predict(4, share) / base_roof)
        for share, ms in TABLE3_MNASNET_B4.items()
    }


def gpulet_used(gpu: str = "3080") -> dict[str, dict[int, tuple[float, float]]]:
    """model → batch → (t₁ ms, u)."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for model in GPULET_MODELS:
        curve = from_gpulet(model, gpu)
        out[model] = {b: (curve.whole(b) * 1e3, curve.used_fraction(b)) for b in GPULET_BATCHES}
    return out


def render(fits: Sequence[ShareFit], table3: dict, used: dict) -> str:
    lines = [
        "PPipe MPS timings, ⅓ and ¼ shares predicted from the ½ share "
        "(relative error; 18 main DNNs, batches 1–2)",
        "",
        "| GPU | points | roofline median | roofline p90 | 1/ρ median | 1/ρ p90 | median u |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in fits:
        lines.append(
            f"| {f.gpu} | {f.points} | {f.roofline_median:.1%} | {f.roofline_p90:.1%} | "
            f"{f.linear_median:.1%} | {f.linear_p90:.1%} | {f.used_median:.2f} |"
        )
    lines += [
        "",
        "inss.txt Table 3, MnasNet batch 4, time / time at 60 % (paper; roofline, Gpulet 3080 u)",
        "",
        "| share | paper | roofline |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {s:.0%} | {p:.2f} | {r:.2f} |" for s, (p, r) in table3.items()]
    head = " | ".join(f"b={b}: t₁ ms, u" for b in GPULET_BATCHES)
    lines += ["", "Gpulet 3080: whole-GPU time and used fraction u(b)", ""]
    lines += [f"| model | {head} |", "|---|" + "---:|" * len(GPULET_BATCHES)]
    for model, row in used.items():
        cells = " | ".join(f"{t:.1f}, {u:.2f}" for t, u in row.values())
        lines.append(f"| {model} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.inss_curves", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    fits = share_fits(ppipe_profiles.bundled_models())
    table3, used = table3_check(), gpulet_used()
    print(render(fits, table3, used), end="")
    if args.json:
        body = {
            "ppipe_share_fits": [asdict(f) for f in fits],
            "table3_mnasnet_b4": {str(s): list(v) for s, v in table3.items()},
            "gpulet_3080": {m: {str(b): list(v) for b, v in r.items()} for m, r in used.items()},
        }
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
