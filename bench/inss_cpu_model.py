"""InSS's latency model (app/planning/inss/) measured on this machine's CPU:
bundled ONNX models in executors of the real runtime on shares of the CPU,
alone and two at once, the model fitted to part of the measurements and its
prediction error reported on the rest.

    python -m bench.inss_cpu_model [--quick] [--out-dir DIR]

The full run, on a quiet machine (nothing else running; a minute or two on
the project's 2-core VM), writing bench/results/inss/cpu-model.json:

    python -m bench.inss_cpu_model --out-dir bench/results/inss

`--quick` (cnn and mlp, batch sizes 1, 2, 4, a few runs each; well under a
minute) checks that everything works; its numbers are not a measurement.

What is measured (bench/inss_cpu_measure.py). Models: `mlp` (4 dense layers
4096 wide, 256 MiB of weights read once a batch: memory-bound), `cnn` (small
convolutions: compute-bound), `encoder` (a 2-layer transformer at its
longest, 128 tokens: in between); `torchcnn` is not ONNX and the emulated
models have no real work. Shares: the CPU split by `DEVICE_SHARES` rules
(`detect_devices(shares=…)`) as `cpu=0.5,0.5` — two executors pinned to one
core each — and `cpu=1`, one executor on both cores. On 2 cores a third
co-located executor would share a core with another (time-sharing, not the
spatial sharing the model describes), so co-location is two executors.

1. Alone: every model at both shares and batch sizes 1, 2, 4, 8, 16 (up to
   its max_batch_size; the encoder's is 8), the median of the timed runs
   after warm-up, timed in the executor (`ExecutorPool.profile`).
2. Co-located: every pair of models and each model with itself, one per
   core, both running batches back to back, at batch sizes 1, 4, 16 (both at
   the same size; up to the smaller max_batch_size); each model's time while
   the other runs.
3. The arena's copy bandwidth (gather of the inputs, scatter of the
   outputs): the upload/download term t_d + t_f = (p_d + p_f)·b / B with B
   measured, reported beside the compute term (it is µs against ms, and the
   profiled times do not contain it).

What is fitted on what, and scored on what (bench/inss_cpu_fit.py):

* o_r(b, ρ): LWR on each model's alone points at batch sizes 1, 4, 16
  (encoder 1, 4, 8; both shares); scored on batch sizes 2 and 8 (encoder
  2) at both shares. In log space — log o_r against (log b, log ρ) —
  because the share acts as a factor on the time (about 1/ρ where the work
  spreads over the cores) and so does the batch size, roughly: in log space
  both are additive, which LWR's local plane represents, while on the raw
  axes the plane must follow a b × 1/ρ interaction it has no term for; and
  the batch sizes are spaced geometrically, evenly in log b. Chosen for
  these reasons before any measurement; the raw-axis LWR (the paper's) is
  scored too (`alone_raw`), not used further.
* Co-location slowdown (1 + α_cache,i · Σ l_v(ρ_v)): the CPU has no L2
  utilisation counter we can read in a VM, and a proxy from the alone run
  (weight bytes per second, say) leaves out activations, which dominate the
  cnn's and the encoder's traffic at larger batches. So l_v is an intensity
  per model, fitted from the pairs together with each model's α_cache (the
  product is all the data fix; the l are scaled to a largest of 1). l(ρ) is
  taken constant in ρ (α_u = 0): every co-located executor has one core, so
  its slope in the share cannot be measured here. Scored leave one ordered
  pair out: the model's time beside a co-runner predicted with α and l
  fitted on every other ordered pair (against the measured alone times at
  the same batch sizes) and o_r from the alone LWR above at one core. The
  co-located batch sizes are training sizes of that LWR, so what is held
  out there is the pair, not the batch size. The coefficients in `fit` are
  those fitted on all pairs.
* Scheduling term: 0 (o_sch = α_s = β_s = 0, no kernel counts): each
  executor dispatches its own operators on its own core, so the dispatch
  cost is inside the measured running time and what two executors cost
  each other is in the cache term.

Errors are |predicted / measured − 1| of the running time (compute), per
model and overall; the paper reports < 4 % on GPUs, our goal is a median
≤ 10 %. The JSON holds every measured point, every prediction with its
error, the fitted coefficients and the summaries.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.inss_cpu_fit import (
    Prediction,
    alone_predictions,
    co_predictions,
    cpu_device,
    fit_alone,
    fit_intensities,
    observations,
    split_batches,
    summary,
    transfer_seconds,
)
from bench.inss_cpu_measure import (
    ONE_CORE,
    AlonePoint,
    CoPoint,
    arena_bandwidth,
    batches_of,
    item_bytes,
    load_models,
    measure_alone,
    measure_pair,
    started_pool,
)

DEFAULT_OUT = Path("bench/results/inss")
RESULT_FILE = "cpu-model.json"


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...]
    batches: tuple[int, ...]
    co_batches: tuple[int, ...]
    warmup: int
    repeats: int
    calls: int  # kept profile calls per co-located configuration
    call_s: float  # about how long each co-located profile call lasts


FULL = Settings(("mlp", "cnn", "encoder"), (1, 2, 4, 8, 16), (1, 4, 16), 3, 15, 8, 0.1)
QUICK = Settings(("cnn", "mlp"), (1, 2, 4), (1, 4), 1, 3, 2, 0.02)


async def measure(settings: Settings) -> dict[str, Any]:
    configs = load_models(settings.models)
    split = await started_pool([ONE_CORE, ONE_CORE], configs)
    try:
        alone = await measure_alone(
            configs, settings.batches, settings.warmup, settings.repeats, split
        )
        at = {(p.model, p.batch): p.seconds for p in alone if p.share == ONE_CORE}
        co: list[CoPoint] = []
        names = list(configs)
        for i, first in enumerate(names):
            for second in names[i:]:
                limit = min(configs[first].max_batch_size, configs[second].max_batch_size)
                for b in (b for b in settings.co_batches if b <= limit):
                    co += await measure_pair(
                        split,
                        first,
                        second,
                        b,
                        lambda m, b=b: at[(m, b)],
                        settings.calls,
                        settings.call_s,
                    )
    finally:
        await split.stop()
    bandwidth = arena_bandwidth(configs, max(settings.batches), settings.repeats)
    train = {n: split_batches(batches_of(c, settings.batches))[0] for n, c in configs.items()}
    return {
        "alone": alone,
        "co": co,
        "bandwidth": bandwidth,
        "train": train,
        "item_bytes": {n: item_bytes(c) for n, c in configs.items()},
    }


def fit_and_score(measured: dict[str, Any]) -> dict[str, Any]:
    alone: list[AlonePoint] = measured["alone"]
    co: list[CoPoint] = measured["co"]
    train: dict[str, list[int]] = measured["train"]
    sizes: dict[str, tuple[float, float]] = measured["item_bytes"]
    device = cpu_device(measured["bandwidth"])
    lwr = {m: fit_alone(alone, m, b, log_space=True) for m, b in train.items()}
    predicted = {
        "alone": alone_predictions(alone, train, log_space=True),
        "alone_raw": alone_predictions(alone, train, log_space=False),
        "co": co_predictions(co, alone, lwr, sizes, device),
    }
    alpha, intensity = fit_intensities([o for _, o in observations(co, alone)])
    largest = {m: max(b for b in train[m]) for m in train}
    fit = {
        m: {
            "train_batches": train[m],
            "held_out_batches": sorted({p.batch for p in alone if p.model == m} - set(train[m])),
            "alpha_cache": alpha.get(m),
            "intensity": intensity.get(m),
            "input_bytes": sizes[m][0],
            "output_bytes": sizes[m][1],
            "transfer_s_at_largest_batch": transfer_seconds(sizes[m], largest[m], device),
        }
        for m in train
    }
    summaries = {kind: summary(p) for kind, p in predicted.items()}
    summaries["overall"] = summary(predicted["alone"] + predicted["co"])
    return {"fit": fit, "predictions": predicted, "summary": summaries}


def _prediction_row(p: Prediction) -> dict[str, Any]:
    return {**asdict(p), "error": p.error}


def report(
    settings: Settings, measured: dict[str, Any], scored: dict[str, Any], argv: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        "command": " ".join(["python -m bench.inss_cpu_model", *argv]),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor(),
            "platform": platform.platform(),
        },
        "settings": asdict(settings),
        "lwr": {"log_space": True, "bandwidth": 1.0, "raw_scored_as": "alone_raw"},
        "arena_bandwidth_bytes_per_s": measured["bandwidth"],
        "alone_points": [asdict(p) for p in measured["alone"]],
        "co_points": [asdict(p) for p in measured["co"]],
        "fit": scored["fit"],
        "predictions": {
            k: [_prediction_row(p) for p in v] for k, v in scored["predictions"].items()
        },
        "summary": scored["summary"],
    }


def table(doc: dict[str, Any]) -> str:
    """Median / max |error| per model: alone (log LWR), alone (raw LWR), co-located."""
    kinds = ("alone", "alone_raw", "co", "overall")
    head = f"{'model':<10}" + "".join(f"{k:>22}" for k in kinds)
    lines = [head, f"{'':<10}" + f"{'median / max % (n)':>22}" * len(kinds), "-" * len(head)]
    for m in [*doc["fit"], "all"]:
        cells = []
        for k in kinds:
            s = doc["summary"][k].get(m)
            if s is None:
                cells.append(f"{'-':>22}")
                continue
            med, top = 100 * s["median_abs_error"], 100 * s["max_abs_error"]
            cells.append(f"{med:.1f} / {top:.1f} ({s['n']})".rjust(22))
        lines.append(f"{m:<10}" + "".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.inss_cpu_model", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a tiny run that checks the pipeline")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT}")
    given = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(given)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = QUICK if args.quick else FULL
    measured = asyncio.run(measure(settings))
    doc = report(settings, measured, fit_and_score(measured), given)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / RESULT_FILE
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    print(f"arena bandwidth {doc['arena_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    for m, f in doc["fit"].items():
        print(
            f"{m}: α_cache {f['alpha_cache']:.3f}, intensity {f['intensity']:.3f}, "
            f"t_d + t_f at b={max(f['train_batches'])}: "
            f"{1e6 * f['transfer_s_at_largest_batch']:.1f} µs"
        )
    print(table(doc))
    med = doc["summary"]["overall"]["all"]["median_abs_error"]
    print(f"median |error| overall (held out): {100 * med:.1f} % (goal ≤ 10 %); wrote {path}")
    return 0 if math.isfinite(med) else 1


if __name__ == "__main__":
    raise SystemExit(main())
