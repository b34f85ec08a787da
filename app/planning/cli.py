"""`python -m app plan PLANNER …` — the planners' command lines: `ppipe`
(app/planning/ppipe/cli.py), `inss` (app/planning/inss/cli.py), `herd`
(app/planning/herd/cli.py) and `partition` (app/planning/partition/cli.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from app.planning.cluster_cli import ClusterReader

USAGE = (
    "usage: python -m app plan {ppipe,inss,herd,partition} ...\n\n"
    "  ppipe  PPipe: partitioned models on pools of heterogeneous devices "
    "(`python -m app plan ppipe --help`)\n"
    "  inss   InSS: several models sharing devices with MPS shares "
    "(`python -m app plan inss --help`)\n"
    "  herd   Shepherd's HERD: streams, models and devices in serving groups "
    "(`python -m app plan herd --help`)\n"
    "  partition  Symphony: models into sub-clusters, one scheduling core each "
    "(`python -m app plan partition --help`)\n\n"
    "Each plans the repository's models on the server's devices with --repository DIR or "
    "--from URL\n(a serving daemon), a cluster file over them (docs/architecture.md, "
    "Planning).\n"
)


def main(
    argv: Sequence[str],
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    herd_measurer: Callable[[], Any] | None = None,
    cluster_reader: ClusterReader | None = None,
) -> int:
    """`argv` is what follows `plan`; `herd_measurer` makes HERD's measured
    T_i (app/simulation/herd_goodput.py) and `cluster_reader` reads
    `--repository DIR` and `--from URL` (app/cluster_sources/); `python -m
    app` passes both."""
    argv = list(argv)
    if argv[:1] == ["inss"]:
        from app.planning.inss.cli import main as inss_main

        return inss_main(argv[1:], out, err, cluster_reader)
    if argv[:1] == ["herd"]:
        from app.planning.herd.cli import main as herd_main

        return herd_main(argv[1:], out, err, herd_measurer, cluster_reader)
    if argv[:1] == ["ppipe"]:
        from app.planning.ppipe.cli import main as ppipe_main

        return ppipe_main(argv, out, err, cluster_reader)
    if argv[:1] == ["partition"]:
        from app.planning.partition.cli import main as partition_main

        return partition_main(argv[1:], out, err, cluster_reader)
    if argv[:1] in (["-h"], ["--help"]):
        out.write(USAGE)
        return 0
    err.write(USAGE + "python -m app plan: error: name a planner: ppipe, inss, herd or partition\n")
    return 2
