"""A small mixed-integer program builder solved with HiGHS (`highspy`).

Variables and rows are added one by one with their bounds; `solve` hands
HiGHS the whole program at once (row-wise sparse) with a time limit and
takes the incumbent when the limit ends the search, with the gap between it
and the proven bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

INF = float("inf")

# highspy's `Highs` wrapper prints a banner on the process's stdout when it is
# made, which would break a command whose stdout is one JSON object; the
# core class it wraps does not, and has all this module uses.
_Core = getattr(highspy, "_Highs", highspy.Highs)


@dataclass(frozen=True)
class Solution:
    """What HiGHS ended with. `values` is None when no feasible point was
    found; `gap` is HiGHS's relative gap |bound − objective| / |objective|
    (0 when proven optimal)."""

    status: str  # optimal | time-limit | infeasible | …
    objective: float
    bound: float
    gap: float
    runtime_s: float
    values: np.ndarray | None


class Program:
    """Maximise `cost · x` subject to rows lo ≤ a · x ≤ hi and bounds."""

    def __init__(self) -> None:
        self._lower: list[float] = []
        self._upper: list[float] = []
        self._cost: list[float] = []
        self._integer: list[bool] = []
        self._row_lower: list[float] = []
        self._row_upper: list[float] = []
        self._starts: list[int] = [0]
        self._index: list[int] = []
        self._value: list[float] = []

    @property
    def variables(self) -> int:
        return len(self._cost)

    @property
    def integers(self) -> int:
        return sum(self._integer)

    @property
    def rows(self) -> int:
        return len(self._row_lower)

    def var(self, lower: float = 0.0, upper: float = INF, integer: bool = False) -> int:
        self._lower.append(lower)
        self._upper.append(upper)
        self._cost.append(0.0)
        self._integer.append(integer)
        return len(self._cost) - 1

    def maximise(self, column: int, weight: float = 1.0) -> None:
        self._cost[column] = weight

    def row(self, terms: list[tuple[int, float]], lower: float = -INF, upper: float = INF) -> None:
        for column, coefficient in terms:
            if coefficient != 0.0:
                self._index.append(column)
                self._value.append(coefficient)
        self._starts.append(len(self._index))
        self._row_lower.append(lower)
        self._row_upper.append(upper)

    def _lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        lp.num_col_ = self.variables
        lp.num_row_ = self.rows
        lp.col_cost_ = np.asarray(self._cost, dtype=float)
        lp.col_lower_ = np.asarray(self._lower, dtype=float)
        lp.col_upper_ = np.asarray(self._upper, dtype=float)
        lp.row_lower_ = np.asarray(self._row_lower, dtype=float)
        lp.row_upper_ = np.asarray(self._row_upper, dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = self.variables
        lp.a_matrix_.num_row_ = self.rows
        lp.a_matrix_.start_ = np.asarray(self._starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(self._index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(self._value, dtype=float)
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
            for flag in self._integer
        ]
        lp.sense_ = highspy.ObjSense.kMaximize
        return lp

    def solve(
        self,
        time_limit_s: float,
        mip_rel_gap: float = 1e-4,
        start: np.ndarray | None = None,
        threads: int = 1,
    ) -> Solution:
        """Solve within `time_limit_s`; `start` is a feasible point to begin
        from (a warm start), e.g. the previous plan's."""
        if not time_limit_s > 0:
            raise ValueError(f"time limit must be > 0 s, got {time_limit_s}")
        highs = _Core()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("time_limit", float(time_limit_s))
        highs.setOptionValue("mip_rel_gap", float(mip_rel_gap))
        highs.setOptionValue("threads", int(threads))
        began = time.perf_counter()
        highs.passModel(self._lp())
        if start is not None:
            solution = highspy.HighsSolution()
            solution.col_value = list(map(float, start))
            solution.value_valid = True
            highs.setSolution(solution)
        highs.run()
        runtime = time.perf_counter() - began
        status = highs.getModelStatus()
        info = highs.getInfo()
        has_point = info.primal_solution_status == 2  # kSolutionStatusFeasible
        values = np.asarray(highs.getSolution().col_value) if has_point else None
        objective = float(info.objective_function_value) if has_point else float("nan")
        gap = float(info.mip_gap)
        if not np.isfinite(gap):  # no incumbent, or a program without integers
            gap = 0.0 if status == highspy.HighsModelStatus.kOptimal else float("inf")
        return Solution(
            status=_STATUS.get(status, highs.modelStatusToString(status)),
            objective=objective,
            bound=float(info.mip_dual_bound),
            gap=gap,
            runtime_s=runtime,
            values=values,
        )


_STATUS = {
    highspy.HighsModelStatus.kOptimal: "optimal",
    highspy.HighsModelStatus.kTimeLimit: "time-limit",
    highspy.HighsModelStatus.kInfeasible: "infeasible",
    highspy.HighsModelStatus.kInterrupt: "interrupted",
}
