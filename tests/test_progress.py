"""Where a person waits, something is said at least every 5 s, also when
stderr is a log file or a pipe (where rich's live display draws nothing):
the simulator's capacity search and bench.compare's probes, each on a short
run, their stderr read line by line as it comes."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.progress import plain_lines
from tests.conftest import ROOT

PROMISE_S = 5.0


def _timed_stderr(args: list[str], env: dict[str, str], timeout: float) -> list[tuple[float, str]]:
    """Each stderr line of `python -m args` with the second it arrived."""
    process = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    start = time.monotonic()
    assert process.stderr is not None
    for line in process.stderr:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        assert time.monotonic() - start < timeout, lines
    assert process.wait(timeout=30) == 0, lines
    lines.append((time.monotonic() - start, "(exit)"))
    return lines


def _gaps(lines: list[tuple[float, str]], word: str) -> list[float]:
    """The silences between progress lines (those with `word`), from the
    first to the process's exit."""
    times = [t for t, text in lines if word in text]
    assert times, lines
    times.append(lines[-1][0])
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.slow
def test_the_simulators_capacity_search_says_how_far_it_is(cli_env) -> None:
    lines = _timed_stderr(
        [
            "bench.simulate",
            "--workload", "bench/workloads/symphony-table4-resnet50.yaml",
            "--policy", "symphony", "--policy", "clockwork", "--capacity",
        ],
        cli_env,
        timeout=300,
    )  # fmt: skip
    assert lines[-1][0] > 2 * PROMISE_S, "too short to show the cadence"
    assert max(_gaps(lines, "elapsed")) <= PROMISE_S, lines
    assert any("capacity probe at ×" in text for _, text in lines), lines


@pytest.mark.slow
def test_bench_compare_says_which_system_and_probe_runs(cli_env, tmp_path: Path) -> None:
    lines = _timed_stderr(
        [
            "bench.compare", "--workload", "ceiling", "--systems", "symphony", "--peers", "none",
            "--probe-duration", "1", "--max-probes", "2", "--cdf-fraction", "0.5",
            "--out", str(tmp_path),
        ],
        cli_env,
        timeout=300,
    )  # fmt: skip
    assert max(_gaps(lines, "elapsed")) <= PROMISE_S, lines
    said = "\n".join(text for _, text in lines)
    assert "(ceiling) symphony: capacity probe " in said and "of at most 2" in said, said


@pytest.mark.slow  # over a second of wall time
def test_plain_lines_in_a_log_none_when_quiet() -> None:
    from rich.console import Console

    from bench.progress import make_progress

    class Counting:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> int:
            self.text += text
            return len(text)

        def flush(self) -> None:
            pass

    out = Counting()
    quiet = make_progress(Console(file=out, force_terminal=False), quiet=True)
    with quiet, plain_lines(quiet, every_s=0.05):
        quiet.add_task("work", total=2)
        time.sleep(0.3)
    assert out.text == ""
    log = make_progress(Console(file=out, force_terminal=False, width=200))
    with log, plain_lines(log, every_s=0.05):
        log.add_task("work", total=2)
        time.sleep(0.75)
    assert out.text.count("work · 0/2 · elapsed 0:00") >= 3, out.text
