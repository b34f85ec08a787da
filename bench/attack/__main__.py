"""`python -m bench.attack`: the attacks of issue 19 against a live daemon.

    python -m bench.attack                          # every attack, long versions
    python -m bench.attack --quick --only gzip-bomb,slowloris
    python -m bench.attack --set MAX_BODY_BYTES=1000000 --out bench/results/scratch/attack

Each attack starts a fresh `python -m app serve` of this checkout (see
bench.attack.daemon; `--set NAME=VALUE` adds a daemon setting to every
one), runs a steady normal client beside it, and reports what the attack
sent, what came back, the front-end process's RSS peak and the client's p99
latency, with the issue's targets. It prints the tables, then the same as
markdown (or writes it to `--markdown FILE`), and the full results as JSON
to `--out DIR/attack.json`. It measures; it does not judge: the exit status
is 0 whether or not targets are met (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from bench.attack.catalog import ATTACKS, select
from bench.attack.connections import IDLE_CONNECTIONS
from bench.attack.proc import raise_nofile_limit
from bench.attack.report import markdown, print_tables
from bench.attack.runner import Options, run_attack

# Files this process opens at once, beyond the few it always has: connections.
_FILES_NEEDED = {"idle-connections": IDLE_CONNECTIONS + 200, "big-json": 1000 + 200}


def _setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        help="comma-separated attacks to run, of: " + ", ".join(s.name for s in ATTACKS),
    )
    parser.add_argument("--quick", action="store_true", help="the short versions")
    parser.add_argument(
        "--client-rate", type=float, default=50.0, help="normal client requests/s (default 50)"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a daemon setting (environment variable) for every attack's daemon; repeatable",
    )
    parser.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="the daemon's header timeout; slowloris connections must close within it + 2 s",
    )
    parser.add_argument(
        "--grace-s",
        type=float,
        default=2.0,
        help="SHUTDOWN_GRACE_S of the sigterm attack's daemon (default 2)",
    )
    parser.add_argument(
        "--command",
        choices=("serve", "uvicorn"),
        default="serve",
        help="start the daemon with `python -m app serve` (default) or plain "
        "`uvicorn app.main:app`",
    )
    parser.add_argument("--out", type=Path, help="write attack.json and summary.md here")
    parser.add_argument("--markdown", type=Path, help="write the markdown tables here")
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 160)
    if args.list:
        for spec in ATTACKS:
            print(f"{spec.name:18} {spec.description}")
        return 0
    try:
        specs = select(args.only)
    except ValueError as exc:
        print(f"python -m bench.attack: error: {exc}", file=sys.stderr)
        return 2
    limit = raise_nofile_limit()
    needed = max(_FILES_NEEDED.get(spec.name, 64) for spec in specs)
    if limit < needed:
        print(
            f"python -m bench.attack: error: this process may open {limit} files; "
            f"{', '.join(s.name for s in specs)} need {needed} (raise `ulimit -Hn`)",
            file=sys.stderr,
        )
        return 2
    options = Options(
        quick=args.quick,
        client_rate_rps=args.client_rate,
        settings=dict(args.settings),
        header_timeout_s=args.header_timeout_s,
        grace_s=args.grace_s,
        command=args.command,
    )
    command = "python -m bench.attack " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    results = []
    for spec in specs:
        console.print(f"[bold]{spec.name}[/bold]: {spec.description}")
        result = run_attack(spec, options)
        verdict = "targets met" if result.passed else "targets not met"
        console.print(f"  done in {result.wall_s:g} s, {verdict}")
        results.append(result)
    wall_s = round(time.monotonic() - started, 1)
    print_tables(results)
    table = markdown(results, command.strip())
    if args.markdown:
        args.markdown.write_text(table)
    else:
        print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        doc = {
            "command": command.strip(),
            "quick": args.quick,
            "wall_s": wall_s,
            "options": {
                "client_rate_rps": options.client_rate_rps,
                "settings": options.settings,
                "header_timeout_s": options.header_timeout_s,
                "grace_s": options.grace_s,
            },
            "rss_of": "the front-end process (python -m app serve), VmRSS from /proc",
            "results": [r.to_json() for r in results],
        }
        text = json.dumps(doc, indent=2, default=str, allow_nan=False)
        (args.out / "attack.json").write_text(text + "\n")
        (args.out / "summary.md").write_text(table)
    console.print(f"all attacks in {wall_s:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
