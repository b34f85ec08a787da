"""Open-loop HTTP load generator for the serving daemon (and any server that
speaks its native `/infer` API).

    python -m bench.loadgen --url http://127.0.0.1:8000 \\
        --workload bench/workloads/live-a-resnet50-emulated.yaml [--rate-scale X] \\
        [--duration S] [--workers N] [--capacity] [--json] [--plot out.png]

The send schedule is the workload's arrival sequence — the very one the
simulator replays — so a live run and a simulated run of one workload file
compare field by field: both are summarised by `app.results`, with the same
outcomes (good, late, dropped, error) and the same keys. Sends keep to the
schedule whatever the server does (open loop), and latency counts from each
request's intended send time. Only loopback targets are accepted; each
request has a hard timeout, and the run as a whole a deadline.

The package, in the order a run goes through it:

- `targets`: the loopback check, the model checks and request bodies;
- `client`: the data-plane HTTP clients (`raw`, the default, and `httpx`);
- `driver`: the open-loop driver (`drive`, `Schedule`), also used by
  `bench.inprocess` with its own sender;
- `workers`: several sender processes on one clock (`--workers N`);
- `records`: what was measured, one row per request, and its outcomes;
- `results`: the summary, the timing breakdown and the generator's statistics;
- `run`: one run (`run_load`); `capacity`: the capacity search;
- `report`, `plot`: the JSON document, the table and the picture;
- `command_line`: the options (shared with `bench.inprocess`) and `main`.

Importable API (for bench.compare and tests)::

    targets = await prepare_targets(url, workload)          # optional, reusable
    targets = build_targets(workload, {name: v2_inputs})    # servers without /v2 metadata
    result = await run_load(url, workload, rate_scale=1.0, targets=targets)  # -> LiveResult
    result.summary["overall"]["goodput_rps"], result.to_dict(), result.records
    cap, probes = find_live_capacity(url, workload)         # sync (asyncio.run per probe)
    doc = build_document(workload, path, result, cap, probes)  # the --json document
"""

from bench.loadgen.capacity import find_live_capacity
from bench.loadgen.errors import LoadGenError, RunFailed
from bench.loadgen.records import Records
from bench.loadgen.report import build_document
from bench.loadgen.results import TIMING_PARTS, LiveResult, timing_breakdown
from bench.loadgen.run import RequestVariants, run_load
from bench.loadgen.targets import (
    ModelTarget,
    build_body,
    build_targets,
    check_loopback,
    prepare_targets,
    server_info,
)

__all__ = [
    "TIMING_PARTS",
    "LiveResult",
    "LoadGenError",
    "ModelTarget",
    "Records",
    "RequestVariants",
    "RunFailed",
    "build_body",
    "build_document",
    "build_targets",
    "check_loopback",
    "find_live_capacity",
    "prepare_targets",
    "run_load",
    "server_info",
    "timing_breakdown",
]
