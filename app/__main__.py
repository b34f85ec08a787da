"""`python -m app serve …` — start the inference server (uvicorn)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from app.scheduling.registry import policy_names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the model repository over HTTP")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, env HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, env PORT)")
    serve.add_argument("--repository", help="model repository (env MODEL_REPOSITORY)")
    serve.add_argument("--policy", choices=policy_names(), help="scheduling policy (env POLICY)")
    serve.add_argument(
        "--policy-options", help="JSON policy options, e.g. '{\"stagger_slack\": 2}'"
    )
    serve.add_argument("--cpu-slices", type=int, help="CPU executor processes (env CPU_SLICES)")
    serve.add_argument("--threads-per-slice", type=int, help="threads per CPU slice")
    serve.add_argument(
        "--emulated-devices", type=int, help="emulated devices (env EMULATED_DEVICES)"
    )
    serve.add_argument(
        "--realtime-priority",
        type=int,
        help="SCHED_FIFO priority of the event loop, executors one below (0: off; env "
        "REALTIME_PRIORITY; needs root or CAP_SYS_NICE)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)

    # The CLI sets the same environment variables the settings read, so
    # `uvicorn app.main:app` and `python -m app serve` behave the same.
    for flag, variable in [
        ("host", "HOST"),
        ("port", "PORT"),
        ("repository", "MODEL_REPOSITORY"),
        ("policy", "POLICY"),
        ("policy_options", "POLICY_OPTIONS"),
        ("cpu_slices", "CPU_SLICES"),
        ("threads_per_slice", "THREADS_PER_SLICE"),
        ("emulated_devices", "EMULATED_DEVICES"),
        ("realtime_priority", "REALTIME_PRIORITY"),
    ]:
        value = getattr(args, flag)
        if value is not None:
            os.environ[variable] = str(value)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    import uvicorn

    from app.api.received import receive_stamping_protocol
    from app.main import create_app
    from app.runtime.realtime import RealtimeUnavailable, check_permitted
    from app.server.settings import Settings

    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        check_permitted(settings.realtime_priority)
    except RealtimeUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        http=receive_stamping_protocol(),
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 1,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
