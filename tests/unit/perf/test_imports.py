"""perf/ has no import circle, and the batcher model imports nothing that does I/O.

Every import counts, a deferred one inside a function too: a circle broken only by importing late is
still two modules that need each other. The model package (``perf.model``) is what the tuner predicts
with and a planner of several batchers in a row will build on; it stays pure: the standard library,
numpy, and the pure leaves of perf (load shapes, errors)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.import_graph import circles, module_name, package_imports

PERF = Path(__file__).resolve().parents[3] / "perf"
PURE_LEAVES = {"perf.measure.loads", "perf.errors"}


def imports() -> dict[str, set[str]]:
    """Each perf module and the perf modules it imports."""
    return package_imports(PERF)


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
        name = module_name(path, PERF)
        outside = {m for m in graph[name] if not m.startswith("perf.model")} - PURE_LEAVES
        assert not outside, (name, outside)
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                tops.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.Import):
                tops |= {alias.name.split(".")[0] for alias in node.names}
        assert tops <= ALLOWED, (name, tops - ALLOWED)  # no file, socket, clock or server


def test_a_module_of_perf_measure_imports_under_its_dotted_name() -> None:
    # ``perf`` once re-exported the function ``measure``, which hid the package for this form.
    import perf
    import perf.measure.records as records

    assert perf.measure.records is records
