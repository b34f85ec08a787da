"""Orloj's queue structure: insertion and selection cost with many pending.

    python -m bench.orloj_queue [--sizes 10,100,1000,10000] [--inserts N] [--queries N]

For each number of pending requests, one dynamic model (two applications,
max_batch 16) on one busy device: the mean time of `add_request` (the
whole arrival path: the deadline-sorted list, the drop check and the drop
timer), of the top-request query (`select(model, 1, now)`: Q_1's best score)
and of the top-bs batch (`next_batch`: Algorithm 1's batch size, then the
top requests of that queue by eq. 2, vectorised). Two spreads of slack:
`wide` (0.3–10 s), where most requests lie past the batch-latency
histograms' last edge and score in deadline order (only bs of them are
evaluated), and `tight` (0.05–0.1 s), inside the histogram of a batch of
one (E[L_1] ≈ 47 ms, its last edge ≈ 0.1 s), where every pending request is
in Q_1 and is scored. The paper's target: < 0.5 ms per insertion at 10,000 pending
(orloj.txt §5).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.scheduling import DeviceInfo, LatencyProfile, ModelInfo, Request
from app.scheduling.model import InputDependence
from app.scheduling.orloj import OrlojScheduler


def dynamic_model(rng: np.random.Generator) -> ModelInfo:
    c0 = 0.005
    short = c0 + rng.normal(0.020, 0.002, 4000).clip(0.001)
    long = c0 + np.where(
        rng.random(4000) < 0.6, rng.normal(0.080, 0.004, 4000), rng.normal(0.040, 0.004, 4000)
    ).clip(0.001)
    prior = (("short", tuple(short)), ("long", tuple(long)))
    return ModelInfo(
        "bart",
        LatencyProfile.linear(10.0, 5.0, 16),
        10.0,
        16,
        dynamic=InputDependence(c0, prior=prior),
    )


SLACK_S = {"wide": (0.3, 10.0), "tight": (0.05, 0.1)}


def measure(
    pending: int,
    inserts: int,
    queries: int,
    seed: int = 0,
    slack_s: tuple[float, float] = (0.3, 10.0),
) -> tuple[float, ...]:
    """(µs per insertion, µs per top-request query, µs per top-bs batch)
    with `pending` requests queued, their slack uniform in `slack_s`."""
    rng = np.random.default_rng(seed)
    info = dynamic_model(rng)
    core = OrlojScheduler([info], [DeviceInfo(0)])
    now = 0.0
    core.add_request(Request(0, info.name, now, now + 1e6), now)  # keeps the device busy
    apps = ("short", "long")
    slack = rng.uniform(*slack_s, pending + inserts)
    for i in range(pending):
        core.add_request(Request(i + 1, info.name, now, now + slack[i], app=apps[i % 2]), now)
    extra = [
        Request(pending + 1 + i, info.name, now, now + slack[pending + i], app=apps[i % 2])
        for i in range(inserts)
    ]
    started = time.perf_counter()
    for request in extra:
        core.add_request(request, now)
    insert_us = (time.perf_counter() - started) / max(inserts, 1) * 1e6
    started = time.perf_counter()
    for _ in range(queries):
        core.select(info.name, 1, now)
    top_us = (time.perf_counter() - started) / max(queries, 1) * 1e6
    started = time.perf_counter()
    for _ in range(queries):
        core.next_batch(info.name, now)
    batch_us = (time.perf_counter() - started) / max(queries, 1) * 1e6
    return insert_us, top_us, batch_us


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--inserts", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    header = f"{'slack':>6}  {'pending':>8}  {'insert µs':>10}  {'top query µs':>12}"
    print(f"{header}  {'top-bs batch µs':>15}")
    for spread, slack_s in SLACK_S.items():
        for size in sizes:
            insert_us, top_us, batch_us = measure(size, args.inserts, args.queries, slack_s=slack_s)
            row = f"{spread:>6}  {size:>8,}  {insert_us:>10.1f}  {top_us:>12.1f}"
            print(f"{row}  {batch_us:>15.1f}")


if __name__ == "__main__":
    main()
