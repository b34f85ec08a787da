"""`deadline-serve` — the project's command (pyproject's console script),
beside `python -m app`:

    deadline-serve serve …          = python -m app serve …
    deadline-serve plan PLANNER …   = python -m app plan PLANNER …
    deadline-serve profile MODEL …  = python -m app profile MODEL …
    deadline-serve simulate …       = python -m bench.simulate …
    deadline-serve bench NAME …     = python -m bench.NAME … (compare, loadgen, …)

The benchmarks (`bench/`) are not in the wheel, which installs `app` only (a
top-level package named `bench` would collide with any other): `simulate`
and `bench` run them from the checkout an editable install
(`pip install -e .`) points at, and say so when there is none.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

PROG = "deadline-serve"
USAGE = f"""usage: {PROG} {{serve,plan,profile,simulate,bench}} ...

  serve      serve the model repository over HTTP and gRPC ({PROG} serve --help)
  plan       make a serving plan: ppipe, inss, herd or partition ({PROG} plan --help)
  profile    measure a model's latency profile and cache it ({PROG} profile --help)
  simulate   compare policies in the simulator ({PROG} simulate --help)
  bench      run a benchmark of bench/ by name, e.g. {PROG} bench compare --help
"""
_NAME = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*")


def checkout() -> Path | None:
    """The checkout this `app` was installed from (an editable install), if
    its `bench/` is there."""
    import app

    root = Path(app.__file__).resolve().parent.parent
    return root if (root / "bench" / "__init__.py").is_file() else None


def run_bench(name: str, args: Sequence[str]) -> int:
    """`python -m bench.<name> args`, from the checkout."""
    root = checkout()
    if root is None:
        print(
            f"{PROG}: the benchmarks (bench/) are not installed with the wheel; run them from a "
            "checkout of the repository after `pip install -e .`",
            file=sys.stderr,
        )
        return 2
    if not _NAME.fullmatch(name):
        print(f"{PROG} bench: not a benchmark name: {name!r}", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = f"bench.{name}"
    if importlib.util.find_spec(module) is None:
        known = sorted(
            p.stem if p.is_file() else p.name
            for p in (root / "bench").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__main__.py").is_file()
        )
        there = ", ".join(known)
        print(f"{PROG} bench: no benchmark {name!r}; there are: {there}", file=sys.stderr)
        return 2
    argv, sys.argv = sys.argv, [f"{PROG} bench {name}", *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:  # the module's own exit status
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in ("serve", "plan", "profile"):
        from app.__main__ import main as app_main

        return app_main(argv)
    if command == "simulate":
        return run_bench("simulate", rest)
    if command == "bench":
        if not rest or rest[0] in ("-h", "--help"):
            sys.stdout.write(f"usage: {PROG} bench NAME [ARGS ...]  (= python -m bench.NAME)\n")
            return 0 if rest else 2
        return run_bench(rest[0], rest[1:])
    sys.stderr.write(USAGE + f"{PROG}: error: unknown command {command!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
