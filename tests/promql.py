"""PromQL for the dashboard tests: `promql-parser` (Prometheus's own grammar
and type checks, as a Rust binding) parses; this walks the tree for the
metric names an expression selects and the kind of value it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import promql_parser

VECTOR = "vector"
MATRIX = "matrix"
SCALAR = "scalar"
STRING = "string"


class PromQLError(ValueError):
    """Not PromQL Prometheus would accept."""


@dataclass(frozen=True)
class Parsed:
    kind: str
    metric_names: frozenset[str]


def parse(expr: str) -> Parsed:
    try:
        tree = promql_parser.parse(expr)
    except ValueError as exc:  # the binding's parse and type errors
        raise PromQLError(f"{expr!r}: {exc}") from exc
    names: set[str] = set()
    kind = _walk(tree, names)
    return Parsed(kind, frozenset(names))


def _walk(node: Any, names: set[str]) -> str:
    """The kind of `node`'s value; collects the metric names it selects."""
    kind_of = type(node).__name__
    if kind_of == "VectorSelector":
        if node.name:
            names.add(node.name)
        names.update(m.value for m in node.matchers.matchers if m.name == "__name__" and m.value)
        return VECTOR
    if kind_of == "MatrixSelector":
        _walk(node.vector_selector, names)
        return MATRIX
    if kind_of == "SubqueryExpr":
        _walk(node.expr, names)
        return MATRIX
    if kind_of == "NumberLiteral":
        return SCALAR
    if kind_of == "StringLiteral":
        return STRING
    if kind_of in ("ParenExpr", "UnaryExpr"):
        return _walk(node.expr, names)
    if kind_of == "AggregateExpr":
        if node.param is not None:
            _walk(node.param, names)
        _walk(node.expr, names)
        return VECTOR
    if kind_of == "Call":
        for arg in node.args:
            _walk(arg, names)
        return str(node.func.return_type).rsplit(".", 1)[-1].lower()
    if kind_of == "BinaryExpr":
        sides = {_walk(node.lhs, names), _walk(node.rhs, names)}
        return VECTOR if VECTOR in sides else SCALAR
    raise PromQLError(f"unexpected PromQL node {kind_of}")
