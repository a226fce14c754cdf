"""perf/ has no import circle, and the batcher model imports nothing that does I/O.

Every import counts, a deferred one inside a function too: a circle broken only by importing late is
still two modules that need each other. The model package (``perf.model``) is what the tuner predicts
with and a planner of several batchers in a row will build on; it stays pure: the standard library,
numpy, and the pure leaves of perf (load shapes, errors)."""

from __future__ import annotations

import ast
from pathlib import Path

PERF = Path(__file__).resolve().parents[2] / "perf"
PURE_LEAVES = {"perf.measure.loads", "perf.errors"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PERF.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each perf module and the perf modules it imports (a package import names its ``__init__``)."""
    modules = {module_name(path): path for path in PERF.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("perf"):
                for alias in node.names:  # ``from perf import x`` may name a module
                    child = f"{node.module}.{alias.name}"
                    found.add(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("perf")}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (depth-first search, each reported once by its path)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for child in sorted(graph[node]):
            if state.get(child) == "open":
                found.append([*path[path.index(child) :], child])
            elif child not in state:
                visit(child, [*path, child])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_perf_has_no_import_circle() -> None:
    assert circles(imports()) == []


def test_the_search_finds_a_circle_where_there_is_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


ALLOWED = {
    "__future__",
    "bisect",
    "collections",
    "dataclasses",
    "heapq",
    "itertools",
    "math",
    "numpy",
    "perf",
}


def test_the_model_package_imports_only_itself_and_pure_leaves() -> None:
    graph = imports()
    for path in (PERF / "model").glob("*.py"):
        name = module_name(path)
        outside = {m for m in graph[name] if not m.startswith("perf.model")} - PURE_LEAVES
        assert not outside, (name, outside)
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                tops.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.Import):
                tops |= {alias.name.split(".")[0] for alias in node.names}
        assert tops <= ALLOWED, (name, tops - ALLOWED)  # no file, socket, clock or server
