"""Compare scheduling policies on a workload in the simulator.

    python -m bench.simulate --workload bench/workloads/symphony-table4-resnet50.yaml
    python -m bench.simulate --workload W.yaml --policy symphony --policy flex --capacity
    python -m bench.simulate --workload W.yaml --policy symphony:pruning=prefix \\
        --policy triton:max_queue_delay_ms=2 --json
    python -m bench.simulate --workload W.yaml --plot goodput.png --scales 0.5,1,1.5,2

Every policy runs on the same arrival sequence (generated once per rate scale
from the workload's seed). Output is a rich table on stdout, or with `--json`
one JSON document (schema: bench/simulate_schema.json); progress and messages
go to stderr.

`--capacity` searches, per policy, the highest offered load with ≥ 99 % of
requests within SLO (Symphony's goodput definition) by bisection on the rate
scale. `--plot` sweeps `--scales` and draws goodput and SLO attainment against
offered load (Symphony Figure 10, left); `--scales` alone adds the sweep to the
JSON without a picture. Each sweep point simulates about `--sweep-requests`
requests (default SWEEP_REQUESTS: the workload's first seconds, as many as
that takes at the point's rate, at most its whole duration); the point at the
main `--rate-scale` is the main run. Run in full, the sweep simulated every
policy again at every scale (9x the main run's requests, and the overloaded
points are the slowest), turning a 7-s comparison into a 70-s one; 20,000
requests put a point's attainment within about ±0.1 % (binomial, near 99 %)
for a fraction of that. `--sweep-requests 0` runs every point in full, as a
workload whose arrivals change over time (bursts, traces) may need.

Exit status: 0 when at least one policy ran, 1 when none did (each failure is
reported on stderr and under "errors" in the JSON), 2 for usage errors (bad
workload file, unknown policy or option, bad arguments).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from app.scheduling import policy_spec
from app.scheduling.registry import make_scheduler, policy_names, scheduler_class
from app.simulation.capacity_search import CapacityResult, find_capacity
from app.simulation.run import SimResult, simulate
from app.workloads.arrivals import Arrivals, generate_arrivals
from app.workloads.spec import Workload
from bench import cli
from bench.cli import UsageError, sanitize
from bench.progress import make_progress, plain_lines
from bench.simulate_report import build_document, plot_curves, print_table

DEFAULT_SCALES = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
SWEEP_REQUESTS = 20_000  # per sweep point (see the module docstring)


@dataclasses.dataclass(frozen=True)
class ServingPath:
    """The live serving path, for setting a simulation beside a live run: the
    core's own slack options (the daemon's DEADLINE_MARGIN_MS and
    TIMER_LEAD_MS) and the intake delay that only the live path has."""

    deadline_margin_ms: float = 0.0
    timer_lead_ms: float = 0.0
    intake_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (value >= 0.0 and math.isfinite(value)):
                flag = "--" + field.name.replace("_", "-")
                raise UsageError(f"{flag} must be a finite number ≥ 0, got {value}")

    @property
    def is_direct(self) -> bool:
        return self == ServingPath()

    def core_options(self) -> dict[str, float]:
        options = {}
        if self.deadline_margin_ms:
            options["deadline_margin"] = self.deadline_margin_ms / 1000.0
        if self.timer_lead_ms:
            options["timer_lead"] = self.timer_lead_ms / 1000.0
        return options


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    label: str  # key in the output: the name, or "name:k=v,..." with options
    name: str  # registry name
    params: dict[str, Any]


# --------------------------------------------------------------------------- parsing


def parse_value(text: str) -> Any:
    """A policy option value: bool, None, int, float, else the string."""
    return policy_spec.parse_value(text)


def parse_policy(text: str, known: list[str]) -> PolicySpec:
    """`NAME`, `NAME:key=value,key=value` or `NAME:{JSON object}`: the one
    syntax of app/scheduling/policy_spec.py, as the daemon's POLICY reads it."""
    try:
        spec = policy_spec.parse_policy(text, "--policy")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if spec.name not in known:
        raise UsageError(f"unknown policy {spec.name!r}; choose from: {', '.join(known)}")
    return PolicySpec(spec.label, spec.name, spec.options)


def parse_scales(text: str) -> list[float]:
    try:
        scales = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--scales: expected comma-separated numbers, got {text!r}") from None
    if not scales or any(not (s > 0 and math.isfinite(s)) for s in scales):
        raise UsageError(f"--scales: expected positive numbers, got {text!r}")
    return sorted(set(scales))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.simulate",
        description="Simulate scheduling policies on a workload and compare goodput.",
    )
    cli.add_workload_options(p)
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME[:k=v,...]",
        help="policy to run (repeatable), with options, e.g. symphony:pruning=prefix or "
        '\'symphony:{"pruning": "prefix"}\' (the daemon\'s POLICY syntax); '
        "default: all registered policies",
    )
    cli.add_capacity_options(p, what="each policy's capacity", tol=0.01)
    cli.add_output_options(
        p, plot="sweep --scales and plot goodput and SLO attainment against offered load"
    )
    p.add_argument(
        "--scales",
        metavar="LIST",
        help="rate scales for the sweep, comma-separated "
        f"(default {','.join(f'{s:g}' for s in DEFAULT_SCALES)}); "
        "given without --plot, the sweep goes into the JSON only",
    )
    p.add_argument(
        "--sweep-requests",
        type=int,
        default=SWEEP_REQUESTS,
        metavar="N",
        help="simulate about N requests per sweep point (the workload's first seconds); "
        f"0: every point runs the whole workload; default {SWEEP_REQUESTS:,}",
    )
    p.add_argument(
        "--deadline-margin-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="the core's deadline margin, as the daemon's DEADLINE_MARGIN_MS: plan every "
        "request to finish this much before its SLO (still judged at the SLO); default 0",
    )
    p.add_argument(
        "--intake-delay-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="model the live daemon's intake: the core sees each request after an exponential "
        "delay of this mean past its arrival (the SLO starts at the arrival); default 0",
    )
    p.add_argument(
        "--timer-lead-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="the core's timer lead, as the daemon's TIMER_LEAD_MS: handle every timer this "
        "long before it is due (a batch is formed that early and may start that early); "
        "default 0",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up on a policy whose single simulation runs longer than S wall seconds "
        "(reported as an error; the other policies go on)",
    )
    return p


# --------------------------------------------------------------------------- running


class Runner:
    """Runs policies, caching one summary-only result per (policy, scale)."""

    def __init__(
        self,
        workload: Workload,
        progress: Progress,
        task: Any,
        timeout_s: float | None = None,
        serving: ServingPath | None = None,
    ) -> None:
        self.workload = workload
        self.serving = serving or ServingPath()
        self.timeout_s = timeout_s
        self.progress = progress
        self.task = task
        self.cache: dict[tuple[str, float, float], SimResult] = {}

    def run(
        self,
        spec: PolicySpec,
        scale: float,
        arrivals: Arrivals | None = None,
        *,
        extra=False,
        workload: Workload | None = None,
    ) -> SimResult:
        """`spec` at `scale` on the workload (or `workload`, a shortened one)."""
        workload = workload or self.workload
        key = (spec.label, scale, workload.duration_s)
        if key in self.cache:
            if not extra:
                self.progress.advance(self.task)
            return self.cache[key]
        if extra:  # a capacity probe: its count is not known up front
            self.progress.update(self.task, total=self.progress.tasks[self.task].total + 1)
        what = "capacity probe" if extra else "run"
        self.progress.update(self.task, description=f"{spec.label}: {what} at ×{scale:.4g}")
        with _time_limit(self.timeout_s):
            result = simulate(
                workload,
                spec.name,
                {**self.serving.core_options(), **spec.params},
                rate_scale=scale,
                arrivals=arrivals,
                intake_delay_ms=self.serving.intake_delay_ms,
            )
        # Keep the summary only: traces of large runs are big.
        result = dataclasses.replace(result, trace=None)
        self.cache[key] = result
        self.progress.advance(self.task)
        return result


class RunTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise RunTimeout after `seconds` of wall time (SIGALRM; main thread only)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise RunTimeout(f"simulation ran longer than {seconds:g} s (--run-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def preflight(
    specs: list[PolicySpec], workload: Workload, errors: dict[str, str], err: Console
) -> list[PolicySpec]:
    """Policies that import and accept their options. A policy that cannot be
    imported or built is reported and skipped; bad explicit options are a
    usage error."""
    models, devices = workload.model_infos(), workload.device_infos()
    ok: list[PolicySpec] = []
    for spec in specs:
        try:
            scheduler_class(spec.name)
            make_scheduler(spec.name, models, devices, **spec.params)
        except ImportError as exc:
            errors[spec.label] = f"policy not available: {exc}"
        except (ValueError, TypeError) as exc:
            if spec.params:
                raise UsageError(f"--policy {spec.label}: {exc}") from None
            errors[spec.label] = f"cannot build policy: {exc}"
        else:
            ok.append(spec)
            continue
        err.print(f"[yellow]warning:[/] {spec.label}: {errors[spec.label]}", highlight=False)
    return ok


def _failed(label: str, exc: BaseException, errors: dict[str, str], err: Console) -> None:
    errors[label] = f"{type(exc).__name__}: {exc}"
    err.print(f"[red]error:[/] {label}: {errors[label]}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    return cli.run_main(_main, argv)


def _main(argv: list[str] | None, err: Console) -> int:
    args = build_parser().parse_args(argv)
    cli.check_positive("--rate-scale", args.rate_scale)
    cli.check_target(args.target)
    if args.sweep_requests < 0:
        raise UsageError(f"--sweep-requests must be ≥ 0, got {args.sweep_requests}")
    if args.run_timeout is not None and not args.run_timeout > 0:
        raise UsageError(f"--run-timeout must be > 0, got {args.run_timeout}")
    if not args.capacity_tol > 0:
        raise UsageError(f"--capacity-tol must be > 0, got {args.capacity_tol}")
    serving = ServingPath(args.deadline_margin_ms, args.timer_lead_ms, args.intake_delay_ms)
    scales = parse_scales(args.scales) if args.scales else list(DEFAULT_SCALES)
    sweep = bool(args.plot or args.scales)
    cli.check_plot(args.plot)
    path, workload = cli.read_workload(args.workload)

    known = policy_names()
    specs: list[PolicySpec] = []
    for text in args.policy or known:
        spec = parse_policy(text, known)
        if spec.label not in {s.label for s in specs}:
            specs.append(spec)

    errors: dict[str, str] = {}
    specs = preflight(specs, workload, errors, err)
    results: dict[str, SimResult] = {}
    capacities: dict[str, CapacityResult] = {}
    curves: dict[str, list[dict[str, float]]] = {}

    # On a terminal a live bar; in a log a line every few seconds (bench/progress.py).
    progress = make_progress(err, quiet=args.quiet)
    runs = len(specs) * (1 + (len(scales) if sweep else 0))
    with progress, plain_lines(progress):
        task = progress.add_task("simulating", total=runs)
        runner = Runner(workload, progress, task, args.run_timeout, serving)

        main_arrivals = generate_arrivals(workload, args.rate_scale)
        for spec in specs:
            try:
                results[spec.label] = runner.run(spec, args.rate_scale, main_arrivals)
            except Exception as exc:  # one broken policy must not sink the comparison
                _failed(spec.label, exc, errors, err)
        del main_arrivals
        ran = [s for s in specs if s.label in results]
        progress.update(task, total=len(ran) * (1 + (len(scales) if sweep else 0)))

        if sweep:
            for scale in scales:
                point = sweep_workload(workload, args.rate_scale, scale, args.sweep_requests)
                arrivals = generate_arrivals(point, scale)
                for spec in ran:
                    if spec.label in errors:
                        continue
                    try:
                        r = runner.run(spec, scale, arrivals, workload=point)
                    except Exception as exc:
                        _failed(spec.label, exc, errors, err)
                        continue
                    curves.setdefault(spec.label, []).append(_curve_point(r, point.duration_s))

        if args.capacity:
            for spec in ran:
                if spec.label in errors:
                    continue
                probe: Callable[[float], SimResult] = functools.partial(
                    runner.run, spec, extra=True
                )
                try:
                    capacities[spec.label] = find_capacity(
                        probe,
                        target=args.target,
                        lo=args.rate_scale,
                        hi=args.rate_scale,
                        rel_tol=args.capacity_tol,
                        max_scale=max(1024.0, args.rate_scale),
                        min_scale=min(1.0 / 1024, args.rate_scale),
                    )
                except Exception as exc:
                    _failed(spec.label, exc, errors, err)

    doc = build_document(workload, path, args.rate_scale, results, capacities, curves, errors)
    if not serving.is_direct:
        doc["serving_path"] = dataclasses.asdict(serving)
    if sweep:
        doc["sweep_requests"] = args.sweep_requests
    if args.plot:
        try:
            plot_curves(doc, Path(args.plot), target=args.target)
        except OSError as exc:
            raise UsageError(f"--plot: cannot write {args.plot}: {exc}") from None
        err.print(f"wrote {args.plot}", highlight=False)

    if args.json:
        sys.stdout.write(json.dumps(sanitize(doc), indent=2, allow_nan=False) + "\n")
    else:
        print_table(doc, workload, args.capacity)
    return 0 if results else 1


def sweep_workload(workload: Workload, main_scale: float, scale: float, requests: int) -> Workload:
    """The workload a sweep point at `scale` simulates: its first seconds,
    about `requests` requests at that rate; the whole workload when
    `requests` is 0, when that needs its whole duration, and at the main run's
    scale (the main run is the point)."""
    offered = workload.offered_rate() * scale
    if requests == 0 or scale == main_scale or offered <= 0:
        return workload
    duration = requests / offered
    if duration >= workload.duration_s:
        return workload
    return dataclasses.replace(workload, duration_s=duration)


def _curve_point(r: SimResult, duration_s: float) -> dict[str, float]:
    overall = r.summary["overall"]
    return {
        "rate_scale": r.rate_scale,
        "duration_s": duration_s,
        "offered_rps": overall["offered_rps"],
        "goodput_rps": overall["goodput_rps"],
        "slo_attainment": overall["slo_attainment"],
    }


if __name__ == "__main__":
    sys.exit(main())
