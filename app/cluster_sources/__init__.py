"""Where the planners' cluster comes from (docs/architecture.md,
"Planning"): a model repository and the daemon's settings
(`repository.py`), or a running daemon (`daemon.py`). Planning sits below
the repository and the server in the layout, so `python -m app plan` hands
`read_cluster` to the planners' command lines."""

from __future__ import annotations

import argparse
import os

from app.planning.cluster import ClusterDescription


def read_cluster(args: argparse.Namespace) -> ClusterDescription:
    """The cluster `--repository DIR` or `--from URL` names (app/planning/
    cluster_cli.py's arguments)."""
    if args.from_url is not None:
        from app.cluster_sources.daemon import cluster_from_daemon

        token = args.admin_token or os.environ.get("ADMIN_TOKEN") or None
        return cluster_from_daemon(args.from_url, args.window, token)
    from app.cluster_sources.repository import cluster_from_repository

    return cluster_from_repository(args.repository, os.environ)
