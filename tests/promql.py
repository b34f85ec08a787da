"""A PromQL parser for the tests of the shipped dashboard and alert rules
(tests/test_dashboards.py): it checks an expression's syntax and types the
way Prometheus's parser does, and returns the metric names it selects.

Covered: number, string and duration literals; vector selectors (a name,
label matchers, or both); range selectors, subqueries, `offset` and `@`;
every PromQL function and aggregation (grouping before or after the
arguments, and the parameter of topk, quantile, count_values, ...); unary
and binary operators by precedence, with `bool`, `on`/`ignoring` and
`group_left`/`group_right`; comments. Types follow Prometheus: `rate`
takes a range vector, `histogram_quantile` a scalar and an instant vector,
comparisons between scalars need `bool`, set operators take vectors. A
name that is neither a function, an aggregation nor a keyword is a metric
name. Bad input raises `PromQLError` saying what and where.

Written here rather than taken as a dependency: the only Python PromQL
parser on PyPI is a compiled binding, more than these checks need.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SCALAR, VECTOR, MATRIX, STRING = "scalar", "instant vector", "range vector", "string"


class PromQLError(ValueError):
    """An expression that Prometheus would not accept."""


# Functions: argument types (a trailing "..." repeats the type before it;
# `None` marks where optional arguments start) and the result type.
_V, _M, _S, _T = VECTOR, MATRIX, SCALAR, STRING
_OVER_TIME = (
    "avg", "min", "max", "sum", "count", "stddev", "stdvar", "last", "present", "mad"
)  # fmt: skip
_MATH = (
    "abs", "ceil", "exp", "floor", "ln", "log2", "log10", "sqrt", "sgn", "acos", "acosh", "asin",
    "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "tanh", "deg", "rad",
    "histogram_count", "histogram_sum", "histogram_avg", "histogram_stddev", "histogram_stdvar",
    "sort", "sort_desc",
)  # fmt: skip
_CALENDAR = (
    "day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month",
    "year",
)  # fmt: skip
FUNCTIONS: dict[str, tuple[tuple[str | None, ...], str]] = {
    **{f"{name}_over_time": ((_M,), _V) for name in _OVER_TIME},
    **{name: ((_V,), _V) for name in _MATH},
    **{name: ((None, _V), _V) for name in _CALENDAR},
    **{name: ((_M,), _V) for name in ("rate", "irate", "increase", "delta", "idelta")},
    **{name: ((_M,), _V) for name in ("deriv", "changes", "resets", "absent_over_time")},
    "quantile_over_time": ((_S, _M), _V),
    "predict_linear": ((_M, _S), _V),
    "holt_winters": ((_M, _S, _S), _V),
    "double_exponential_smoothing": ((_M, _S, _S), _V),
    "histogram_quantile": ((_S, _V), _V),
    "histogram_fraction": ((_S, _S, _V), _V),
    "absent": ((_V,), _V),
    "clamp": ((_V, _S, _S), _V),
    "clamp_max": ((_V, _S), _V),
    "clamp_min": ((_V, _S), _V),
    "round": ((_V, None, _S), _V),
    "label_replace": ((_V, _T, _T, _T, _T), _V),
    "label_join": ((_V, _T, _T, _T, "..."), _V),
    "sort_by_label": ((_V, _T, "..."), _V),
    "sort_by_label_desc": ((_V, _T, "..."), _V),
    "scalar": ((_V,), _S),
    "vector": ((_S,), _V),
    "timestamp": ((_V,), _V),
    "time": ((), _S),
    "pi": ((), _S),
}
# Aggregations, and the type of the parameter the ones that take one want.
AGGREGATIONS: dict[str, str | None] = {
    **dict.fromkeys(("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count")),
    "count_values": STRING,
    "topk": SCALAR,
    "bottomk": SCALAR,
    "quantile": SCALAR,
    "limitk": SCALAR,
    "limit_ratio": SCALAR,
}
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "atan2",
}  # fmt: skip
# Binary operators by precedence, lowest first; `^` is right-associative.
_LEVELS = (("or",), ("and", "unless"), ("==", "!=", "<=", "<", ">=", ">"), ("+", "-"))
_LEVELS += (("*", "/", "%", "atan2"),)
_COMPARISONS = {"==", "!=", "<=", "<", ">=", ">"}
_SET_OPERATORS = {"and", "or", "unless"}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<duration>(?:\d+(?:ms|s|m|h|d|w|y))+)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<name>(?:[a-zA-Z_]|:(?=[a-zA-Z_:]))[a-zA-Z0-9_:]*)  # not `:1m` of `[10m:1m]`
  | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=(){}\[\],:@])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Token:
    kind: str  # duration, number, string, name, op, end
    text: str
    at: int


def _tokens(expr: str) -> list[_Token]:
    out, at = [], 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"unexpected {expr[at]!r} at {at} in {expr!r}")
        kind = match.lastgroup or ""
        if kind != "space":
            out.append(_Token(kind, match.group(), at))
        at = match.end()
    out.append(_Token("end", "", len(expr)))
    return out


@dataclass
class _Parser:
    expr: str
    tokens: list[_Token]
    at: int = 0
    metric_names: set[str] = field(default_factory=set)
    selected_last: bool = False  # whether the last operand parsed was a vector selector
    is_selector: bool = False  # whether the primary before a postfix is a plain selector

    # -- tokens ------------------------------------------------------------------

    @property
    def peek(self) -> _Token:
        return self.tokens[self.at]

    def error(self, what: str) -> PromQLError:
        token = self.peek
        found = repr(token.text) if token.kind != "end" else "the end"
        return PromQLError(f"{what}, found {found} at {token.at} in {self.expr!r}")

    def take(self, text: str | None = None, kind: str | None = None) -> _Token:
        token = self.peek
        if (text is not None and token.text != text) or (kind is not None and token.kind != kind):
            raise self.error(f"expected {text or kind}")
        self.at += 1
        return token

    def accept(self, text: str) -> bool:
        if self.peek.text == text and self.peek.kind in ("op", "name"):
            self.at += 1
            return True
        return False

    # -- expressions ---------------------------------------------------------------

    def parse(self) -> str:
        kind = self.binary(0)
        if self.peek.kind != "end":
            raise self.error("expected an operator or the end")
        return kind

    def binary(self, level: int) -> str:
        if level == len(_LEVELS):
            return self.power()
        left = self.binary(level + 1)
        while self.peek.kind in ("op", "name") and self.peek.text in _LEVELS[level]:
            op = self.take().text
            returns_bool = self.modifiers(op)
            right = self.binary(level + 1)
            left = self.combine(op, left, right, returns_bool)
        return left

    def power(self) -> str:
        left = self.unary()
        if self.accept("^"):
            self.modifiers("^")
            right = self.power()  # right-associative
            left = self.combine("^", left, right, False)
        return left

    def modifiers(self, op: str) -> bool:
        """`bool`, `on(...)`/`ignoring(...)`, `group_left/right(...)` after `op`."""
        returns_bool = self.accept("bool")
        if returns_bool and op not in _COMPARISONS:
            raise self.error(f"bool is only for comparisons, not {op!r}")
        if self.peek.text in ("on", "ignoring"):
            self.take()
            self.labels()
            if self.peek.text in ("group_left", "group_right"):
                if op in _SET_OPERATORS:
                    raise self.error(f"no grouping modifier with {op!r}")
                self.take()
                if self.peek.text == "(":
                    self.labels()
        return returns_bool

    def combine(self, op: str, left: str, right: str, returns_bool: bool) -> str:
        for side in (left, right):
            if side not in (SCALAR, VECTOR):
                raise PromQLError(f"{op!r} takes scalars or instant vectors, not {side}")
        if op in _SET_OPERATORS and SCALAR in (left, right):
            raise PromQLError(f"{op!r} needs instant vectors on both sides in {self.expr!r}")
        if op in _COMPARISONS and left == right == SCALAR and not returns_bool:
            raise PromQLError(f"comparing scalars needs bool in {self.expr!r}")
        return VECTOR if VECTOR in (left, right) else SCALAR

    def unary(self) -> str:
        if self.peek.text in ("+", "-") and self.peek.kind == "op":
            self.take()
            kind = self.unary()
            if kind not in (SCALAR, VECTOR):
                raise PromQLError(f"unary minus of {kind} in {self.expr!r}")
            return kind
        kind = self.primary()
        return self.postfix(kind)

    def postfix(self, kind: str) -> str:
        while True:
            if self.peek.text == "[":
                self.take("[")
                self.take(kind="duration")
                if self.accept(":"):  # a subquery: [range:step]
                    if self.peek.kind == "duration":
                        self.take()
                    if kind not in (SCALAR, VECTOR):
                        raise self.error(f"a subquery of a {kind}")
                elif not self.is_selector:
                    raise self.error("a range needs a vector selector")
                elif kind != VECTOR:
                    raise self.error(f"a range of a {kind}")
                self.take("]")
                kind = MATRIX
            elif self.peek.text == "offset":
                self.take()
                self.accept("-")
                self.take(kind="duration")
            elif self.peek.text == "@":
                self.take()
                if not (self.accept("start") or self.accept("end")):
                    self.take(kind="number")
                    if self.peek.text == "(":  # start() / end()
                        raise self.error("expected a timestamp")
            else:
                return kind

    def primary(self) -> str:
        kind = self.operand()
        # Only a plain vector selector may take a range (`x[5m]`, not `(x)[5m]`).
        self.is_selector = self.tokens[self.at - 1].text in ("}",) or (
            self.tokens[self.at - 1].kind == "name" and self.selected_last
        )
        return kind

    def operand(self) -> str:
        token = self.peek
        self.selected_last = False
        if token.kind == "number" or token.text in ("Inf", "NaN", "inf", "nan"):
            self.take()
            return SCALAR
        if token.kind == "string":
            self.take()
            return STRING
        if token.text == "(":
            self.take("(")
            kind = self.binary(0)
            self.take(")")
            return kind
        if token.text == "{":
            return self.selector(None)
        if token.kind != "name" or token.text in KEYWORDS:
            raise self.error("expected an expression")
        name = self.take().text
        if name in AGGREGATIONS:
            return self.aggregation(name)
        if self.peek.text == "(":
            if name not in FUNCTIONS:
                raise PromQLError(f"unknown function {name}() in {self.expr!r}")
            return self.call(name)
        return self.selector(name)

    def selector(self, name: str | None) -> str:
        matchers = []
        if self.accept("{"):
            while not self.accept("}"):
                label = self.take(kind="name" if self.peek.kind == "name" else "string").text
                if self.peek.kind != "op" or self.peek.text not in ("=", "!=", "=~", "!~"):
                    raise self.error("expected a label matcher (=, !=, =~, !~)")
                op = self.take().text
                value = self.take(kind="string").text
                if label == "__name__" and op == "=":
                    name = value[1:-1]
                matchers.append((label, op, value))
                if not self.accept(","):
                    self.take("}")
                    break
        if name is None:
            raise PromQLError(f"a selector without a metric name in {self.expr!r}")
        self.metric_names.add(name)
        self.selected_last = True
        return VECTOR

    def labels(self) -> list[str]:
        self.take("(")
        names = []
        while not self.accept(")"):
            names.append(self.take(kind="name").text)
            if not self.accept(","):
                self.take(")")
                break
        return names

    def arguments(self) -> list[str]:
        self.take("(")
        kinds = []
        while not self.accept(")"):
            kinds.append(self.binary(0))
            if not self.accept(","):
                self.take(")")
                break
        return kinds

    def call(self, name: str) -> str:
        wanted, result = FUNCTIONS[name]
        given = self.arguments()
        required = list(wanted[: wanted.index(None)] if None in wanted else wanted)
        optional = list(wanted[wanted.index(None) + 1 :]) if None in wanted else []
        if "..." in required:
            repeated = required[-2]
            required = required[:-1]
            optional = [repeated] * max(len(given) - len(required), 0)
        if not len(required) <= len(given) <= len(required) + len(optional):
            raise PromQLError(f"{name}() takes {len(required)} arguments, got {len(given)}")
        for index, (want, got) in enumerate(zip(required + optional, given, strict=False)):
            if want != got:
                raise PromQLError(f"{name}() argument {index + 1}: wants {want}, got {got}")
        return result

    def aggregation(self, name: str) -> str:
        grouped = self.grouping()
        given = self.arguments()
        if not grouped:
            self.grouping()
        parameter = AGGREGATIONS[name]
        wanted = [VECTOR] if parameter is None else [parameter, VECTOR]
        if given != wanted:
            raise PromQLError(f"{name} takes ({', '.join(wanted)}), got ({', '.join(given)})")
        return VECTOR

    def grouping(self) -> bool:
        if self.peek.text in ("by", "without"):
            self.take()
            self.labels()
            return True
        return False


@dataclass(frozen=True)
class Parsed:
    """An expression Prometheus accepts: its type and the metrics it selects."""

    kind: str
    metric_names: frozenset[str]


def parse(expr: str) -> Parsed:
    """Parse `expr`; raise PromQLError when Prometheus would not accept it."""
    parser = _Parser(expr, _tokens(expr))
    kind = parser.parse()
    return Parsed(kind, frozenset(parser.metric_names))
