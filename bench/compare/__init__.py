"""Side by side: this daemon (symphony, triton, clockwork policies) and the
servers users pick today — Ray Serve, the Triton Inference Server and
BentoML, each at the best point of its own small configuration grid — on the
same live workloads, devices and load generator.

    python -m bench.compare [--workload a b c] [--systems symphony,triton,clockwork]
                            [--peers ray,tritonserver,bentoml] [--devices N]
                            [--probe-duration 5] [--max-probes 8] [--screen-probes 4]
                            [--placements shared,partition]
                            [--out bench/results] [--realtime-priority N]

For each workload every system is started on a free loopback port, its
capacity (highest offered load with ≥ 99 % of requests within SLO) is found by
bisection over short open-loop runs of `bench.loadgen`, one more run at the
workload's nominal rate (`--cdf-scale`, or `--cdf-fraction` of each system's
own capacity) gives the latency CDF, and the system is stopped. `--devices N`
(default 1; for the many-model workloads zoo8 and zoo8-bursty, the file's 8)
gives every system N emulated devices and scales the workload's rates by N /
(the file's devices), so the nominal load per device is the file's; the CPU
workload (b) keeps its one CPU executor.

Each peer's grid (`bench.compare.peers`) is screened point by point at the
point's own capacity (`--screen-probes` probes), and the best point gets the
full search. The peers speak their own APIs (Ray Serve the daemon's /infer,
Triton KServe v2, BentoML its batchable endpoints); the generator sends each
its own pre-built request. Written under `--out/<workload>[-Ndev]/`:
results.json (every probe, every grid point), summary.md (the table),
goodput.png (goodput and attainment vs offered load) and cdf.png.

`--realtime-priority N` (root or CAP_SYS_NICE) runs the daemon with
REALTIME_PRIORITY=N and the load generator at SCHED_FIFO N while it measures;
the peers' processes stay at normal priority.
"""

from bench.compare.cli import DAEMON_POLICIES, main
from bench.compare.measure import Options, SystemResult, measure, run_daemon
from bench.compare.output import markdown_table, plot, write_outputs
from bench.compare.peers import PEERS, Peer, PeerUnavailable, run_peer
from bench.compare.setups import SETUPS, Setup

__all__ = [
    "DAEMON_POLICIES",
    "PEERS",
    "SETUPS",
    "Options",
    "Peer",
    "PeerUnavailable",
    "Setup",
    "SystemResult",
    "main",
    "markdown_table",
    "measure",
    "plot",
    "run_daemon",
    "run_peer",
    "write_outputs",
]
