"""What the planners' command lines share to read one cluster
(app/planning/cluster.py): `--repository DIR` (the repository and the
daemon's settings), `--from URL` (a serving daemon, rates measured over
`--window S`), and the cluster file (app/planning/cluster_file.py) given as
the planner's CONFIG. The reading of a repository or a daemon is passed in
(app/cluster_sources/, by `python -m app plan`): planning sits below them
in the layout."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from app.planning.cluster import ClusterDescription
from app.planning.cluster_file import apply_cluster_file, is_cluster_file, read_yaml
from app.planning.config_input import InputError

ClusterReader = Callable[[argparse.Namespace], ClusterDescription]
DEFAULT_WINDOW_S = 10.0


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cluster",
        "plan the repository's models on the server's devices; CONFIG is then a cluster file "
        "(docs/architecture.md, Planning), optional",
    )
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--repository",
        type=Path,
        metavar="DIR",
        help="a model repository (with the daemon's "
        "settings from the environment: EMULATED_DEVICES, CPU_SLICES, DEVICE_SHARES, …)",
    )
    source.add_argument(
        "--from",
        dest="from_url",
        metavar="URL",
        help="a serving daemon: its devices, profiles and measured rates",
    )
    group.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help=f"with --from: measure rates over S seconds (default {DEFAULT_WINDOW_S:g}; 0: none)",
    )
    group.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="with --from: the daemon's ADMIN_TOKEN (default: the ADMIN_TOKEN variable)",
    )


def wants_cluster(args: argparse.Namespace) -> bool:
    """Whether the planner reads a cluster rather than its own YAML."""
    config = getattr(args, "config", None)
    return (
        args.repository is not None
        or args.from_url is not None
        or (config is not None and is_cluster_file(config))
    )


def load_cluster(
    args: argparse.Namespace, reader: ClusterReader | None, err: TextIO
) -> ClusterDescription:
    """The cluster the arguments name, the cluster file over it; its notes
    (models left out, where rates come from) are written to `err`."""
    if not args.window >= 0:
        raise InputError(f"--window must be ≥ 0, got {args.window}")
    base = None
    if args.repository is not None or args.from_url is not None:
        if reader is None:
            raise InputError("--repository and --from need `python -m app plan`")
        base = reader(args)
    if args.config is not None:
        cluster = apply_cluster_file(read_yaml(args.config), str(args.config), base)
    elif base is None:
        raise InputError("give a cluster file, --repository DIR or --from URL")
    else:
        cluster = base
    for note in cluster.notes:
        err.write(f"note: {note}\n")
    return cluster


def left_out(notes: tuple[str, ...], err: TextIO) -> None:
    for note in notes:
        err.write(f"note: left out: {note}\n")
