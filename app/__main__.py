"""`python -m app serve …` — start the inference server (uvicorn);
`python -m app profile MODEL [--force]` — measure a model's latency profile
and store it in the profile cache (app/server/profile_command.py);
`python -m app plan ppipe …` — make a PPipe serving plan (app/planning/ppipe/cli.py);
`python -m app plan inss …` — place models on shared devices (app/planning/inss/cli.py).

Every setting has a flag (`--help` lists them, docs/settings.md's table
too); a flag wins over its environment variable. The flags are passed to
`create_app` as `Settings`, never written into the environment.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from app.server.settings import SETTING_BY_NAME, Settings, read_settings
from app.server.settings_cli import add_setting_flags, flag_values

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class ServeCommand:
    """What `python -m app serve …` was asked to run."""

    settings: Settings
    log_level: str = "info"
    flags: frozenset[str] = field(default_factory=frozenset)  # settings given as flags

    def label(self, name: str) -> str:
        """How the user named a setting: its flag if given as one, else its variable."""
        setting = SETTING_BY_NAME[name]
        return setting.flag if name in self.flags else setting.env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app", description="Start the inference server (uvicorn)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve the model repository over HTTP",
        description="Serve the model repository over HTTP.",
    )
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    add_setting_flags(serve)
    profile = commands.add_parser(
        "profile",
        help="measure a model's latency profile and cache it",
        description="Print a model's latency profile and fit: the cached one when its fit is "
        "good, else measured now and stored in the profile cache (PROFILE_CACHE_DIR).",
    )
    profile.add_argument("model", help="the model's name (its directory in the repository)")
    profile.add_argument(
        "--force", action="store_true", help="measure even when a good one is cached"
    )
    profile.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    add_setting_flags(profile)
    commands.add_parser(
        "plan", help="make a serving plan (`python -m app plan {ppipe,inss} --help`)"
    )
    return parser


def parse_command(argv: Sequence[str], env: Mapping[str, str]) -> ServeCommand:
    """argv and the environment → what to serve; reads, never writes, `env`.
    A bad setting raises ValueError naming the flag or variable; a malformed
    command line exits through argparse (status 2)."""
    args = build_parser().parse_args(list(argv))
    flags = flag_values(args)
    return ServeCommand(read_settings(env, flags), args.log_level, frozenset(flags))


def profile_main(argv: Sequence[str]) -> int:
    """`python -m app profile MODEL [--force]`."""
    import asyncio

    from app.server.profile_command import ProfileCommandError, profile_model

    args = build_parser().parse_args(list(argv))
    try:
        settings = read_settings(os.environ, flag_values(args))
    except ValueError as exc:
        print(f"python -m app profile: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asyncio.run(profile_model(settings, args.model, args.force, sys.stdout))
    except ProfileCommandError as exc:
        print(f"python -m app profile: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["profile"]:
        return profile_main(argv)
    if argv[:1] == ["plan"]:
        from app.cluster_sources import read_cluster
        from app.planning.cli import main as plan_main
        from app.simulation.herd_goodput import MeasuredGoodput

        return plan_main(argv[1:], herd_measurer=MeasuredGoodput, cluster_reader=read_cluster)
    try:
        command = parse_command(argv, os.environ)
    except ValueError as exc:
        print(f"python -m app serve: error: {exc}", file=sys.stderr)
        return 2

    from app.runtime.realtime import RealtimeUnavailable, check_permitted

    try:
        check_permitted(command.settings.realtime_priority, command.label("realtime_priority"))
    except RealtimeUnavailable as exc:
        print(f"python -m app serve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=command.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import uvicorn

    from app.api.connection import uvicorn_connection_options
    from app.main import create_app
    from app.server.stop_signals import safety_net_s

    settings = command.settings
    try:
        connections = uvicorn_connection_options(settings)
    except ValueError as exc:  # the open-file limit leaves no room for clients
        print(f"python -m app serve: error: {exc}", file=sys.stderr)
        return 2
    if settings.api_workers:  # API worker processes (app/frontdoor/)
        from app.frontdoor.supervisor import serve

        return serve(settings, command.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=command.log_level,
        access_log=settings.access_log,  # ACCESS_LOG, off by default
        timeout_graceful_shutdown=safety_net_s(settings.shutdown_grace_s),
        server_header=False,  # no software name in answers (docs/reliability.md: Exposure)
        **connections,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
