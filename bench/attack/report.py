"""One attack's result, its targets, and the tables that show them.

Each attack yields an `AttackResult`: what it sent, what came back (answers
per HTTP status; `closed` where the server closed the connection without an
answer, `refused` where it would not accept one), what never came back
(`unanswered`: still waiting when the attack gave up), the front-end
process's resident memory, the concurrent normal client's latency, and its
`Check`s: a measured number beside the issue's target, passed or failed. A
check whose number could not be measured (the attack timed out, the event
never happened) fails and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

_OPS = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    ">=": lambda a, b: a >= b,
}


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank `q`-th percentile (an actual value; `inf` stands for a
    request that got no answer and stays `inf`); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Check:
    """`measured` `op` `target`, in `unit`; `note` says why nothing was measured."""

    what: str
    measured: float | None
    op: str
    target: float
    unit: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"check {self.what!r}: unknown comparison {self.op!r}")

    @property
    def passed(self) -> bool:
        if self.measured is None or math.isnan(self.measured):
            return False
        return _OPS[self.op](self.measured, self.target)

    def shown_measured(self) -> str:
        if self.measured is None:
            return self.note or "not measured"
        return _number(self.measured) + (f" {self.unit}" if self.unit else "")

    def shown_target(self) -> str:
        return f"{self.op} {_number(self.target)}" + (f" {self.unit}" if self.unit else "")


@dataclass
class ClientStats:
    """The concurrent normal client: requests sent, answers per status (or
    `unanswered`, `refused`, `error`), and the p99 latency over every request
    (an unanswered one counts as infinitely late)."""

    sent: int
    statuses: dict[str, int]
    p99_ms: float | None

    @property
    def not_ok(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != "200")


@dataclass
class AttackResult:
    name: str
    description: str
    sent: int  # attack requests or connections
    statuses: dict[str, int] = field(default_factory=dict)
    unanswered: int = 0
    rss_baseline_mb: float | None = None  # the front-end process, before the attack
    rss_peak_mb: float | None = None  # ... its peak during the attack
    client: ClientStats | None = None
    checks: list[Check] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    timed_out: list[str] = field(default_factory=list)  # what did not finish in time
    wall_s: float = 0.0

    @property
    def rss_growth_mb(self) -> float | None:
        if self.rss_baseline_mb is None or self.rss_peak_mb is None:
            return None
        return self.rss_peak_mb - self.rss_baseline_mb

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks) and not self.timed_out

    def to_json(self) -> dict[str, Any]:
        """A plain document (strict JSON: infinity is the string "inf")."""
        doc = asdict(self)
        doc["rss_growth_mb"] = self.rss_growth_mb
        doc["passed"] = self.passed
        for check, raw in zip(self.checks, doc["checks"], strict=True):
            raw["passed"] = check.passed
        if self.client is not None:
            doc["client"]["not_ok"] = self.client.not_ok
        return _finite(doc)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _number(x: float) -> str:
    if math.isinf(x):
        return "∞"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:.2f}"


def format_statuses(statuses: dict[str, int]) -> str:
    """Answers per status as `200: 950, 413: 6, 503: 44`: HTTP statuses in
    order, then the rest (`closed`, `refused`, …)."""
    if not statuses:
        return "—"
    numeric = sorted((k for k in statuses if k.isdigit()), key=int)
    other = sorted(k for k in statuses if not k.isdigit())
    return ", ".join(f"{k}: {statuses[k]:,}" for k in numeric + other)


def _mb(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


def _rss(r: AttackResult) -> str:
    if r.rss_peak_mb is None:
        return "—"
    growth = r.rss_growth_mb
    return f"{_mb(r.rss_peak_mb)} (+{_mb(growth)})" if growth is not None else _mb(r.rss_peak_mb)


def _client(r: AttackResult) -> tuple[str, str]:
    if r.client is None:
        return "—", "—"
    p99 = "—" if r.client.p99_ms is None else _number(round(r.client.p99_ms, 1))
    return p99, f"{r.client.not_ok:,} of {r.client.sent:,}"


SUMMARY_COLUMNS = (
    "attack",
    "sent",
    "answered per status",
    "unanswered",
    "front-end RSS peak, MB (growth)",
    "client p99, ms (∞: >1 % unanswered)",
    "client non-200",
    "targets met",
)
CHECK_COLUMNS = ("attack", "check", "measured", "target", "result")


def summary_rows(results: Sequence[AttackResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        p99, not_ok = _client(r)
        met = sum(c.passed for c in r.checks)
        verdict = f"{met} of {len(r.checks)}" + (" (timed out)" if r.timed_out else "")
        rows.append(
            (
                r.name,
                f"{r.sent:,}",
                format_statuses(r.statuses),
                f"{r.unanswered:,}",
                _rss(r),
                p99,
                not_ok,
                verdict,
            )
        )
    return rows


def check_rows(results: Sequence[AttackResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        for c in r.checks:
            rows.append(
                (
                    r.name,
                    c.what,
                    c.shown_measured(),
                    c.shown_target(),
                    "pass" if c.passed else "FAIL",
                )
            )
        for what in r.timed_out:
            rows.append((r.name, what, "timed out", "finishes", "FAIL"))
    return rows


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)])


def markdown(results: Sequence[AttackResult], command: str) -> str:
    """Both tables as markdown, with the command that produced them."""
    return (
        f"`{command}`\n\n"
        + _markdown_table(SUMMARY_COLUMNS, summary_rows(results))
        + "\n\n"
        + _markdown_table(CHECK_COLUMNS, check_rows(results))
        + "\n"
    )


def print_tables(results: Sequence[AttackResult], console: Console | None = None) -> None:
    console = console or Console(width=None if Console().is_terminal else 200)
    summary = Table(title="Attacks (RSS: the front-end process, not its executors)")
    for name in SUMMARY_COLUMNS:
        summary.add_column(name, overflow="fold")
    for row in summary_rows(results):
        summary.add_row(*row)
    console.print(summary)
    checks = Table(title="Targets")
    for name in CHECK_COLUMNS:
        checks.add_column(name, overflow="fold")
    for row in check_rows(results):
        style = "green" if row[-1] == "pass" else "red"
        checks.add_row(*row[:-1], f"[{style}]{row[-1]}[/{style}]")
    console.print(checks)
