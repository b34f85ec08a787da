"""The layout shows the architecture: the folders of `app/` import each other
without cycles, the scheduling core imports nothing that does I/O, and no
module of `app/` or `bench/` grows past ~600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _unit(module: str) -> str | None:
    """`app.<folder or top-level module>` a module belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "app" and len(parts) > 1 else None


def folder_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "app").rglob("*.py"):
        source = path.relative_to(ROOT / "app").parts[0].removesuffix(".py")
        for module in _imports(path):
            target = _unit(module)
            if target is not None and target != source:
                graph.setdefault(source, set()).add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_folders_of_app_import_each_other_without_cycles():
    graph = folder_graph()
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])
    # The core below everything: it imports no other folder of app/.
    assert graph.get("scheduling", set()) == set()
    assert "scheduling" in graph["server"] and "scheduling" in graph["simulation"]


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_the_scheduling_core_does_no_io():
    """Sans-IO (DESIGN.md): no clock, sleep, socket, process or event loop."""
    banned = {"time", "asyncio", "socket", "threading", "multiprocessing", "subprocess", "os"}
    for path in (ROOT / "app" / "scheduling").rglob("*.py"):
        used = {m.split(".")[0] for m in _imports(path)} & banned
        assert not used, f"{path.relative_to(ROOT)} imports {sorted(used)}"


def test_no_module_is_over_600_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for folder in ("app", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
