"""exporters/ imports in one order: ``exporters.LAYERS``, each part from the layers before it alone.

A part is a folder of exporters/ or one of its top-level modules. Every import counts, a deferred one
inside a function too, so a part that needs a later one cannot hide it by importing late; and every
part stands in the order, so a new folder or module says where it belongs before it can land."""

from __future__ import annotations

from pathlib import Path

import exporters
from tests.unit.import_graph import circles, package_imports

EXPORTERS = Path(exporters.__file__).resolve().parent
TOP_LEVEL_MODULES = 12  # more, and the top of the package is a hall again: give the idea a folder


def part(module: str) -> str:
    """The part a module belongs to: ``exporters.schema.models`` → ``schema``, ``exporters.resolve`` →
    ``resolve``; the package itself is ``""``."""
    return module.split(".")[1] if "." in module else ""


def breaches(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[tuple[str, str]]:
    """Every (importer, imported) where the imported module's part is not in an earlier layer than the
    importer's, outside its own part. The package itself (``exporters``) imports nothing and is
    importable from everywhere (the sandbox finds the project's files by it)."""
    layer = {name: index for index, names in enumerate(layers) for name in names}
    found = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            mine, theirs = part(module), part(other)
            if (theirs == "" and mine != "") or theirs == mine != "":
                continue
            if mine == "" or layer[theirs] >= layer[mine]:
                found.append((module, other))
    return found


def test_every_part_stands_in_the_order_once() -> None:
    parts = {
        p.stem if p.is_file() else p.name for p in EXPORTERS.iterdir() if p.suffix == ".py" or p.is_dir()
    }
    parts -= {"__init__", "__pycache__"}
    named = [name for names in exporters.LAYERS for name in names]
    assert sorted(named) == sorted(parts)


def test_the_top_level_holds_few_modules() -> None:
    assert len(list(EXPORTERS.glob("*.py"))) <= TOP_LEVEL_MODULES


def test_each_part_imports_only_from_the_layers_before_it() -> None:
    assert breaches(package_imports(EXPORTERS), exporters.LAYERS) == []


def test_exporters_has_no_import_circle() -> None:
    assert circles(package_imports(EXPORTERS)) == []


def test_the_check_finds_an_import_against_the_order() -> None:
    layers = (("errors",), ("schema",), ("sources", "configs"))
    graph = {
        "exporters": set(),
        "exporters.errors": set(),
        "exporters.schema.models": {"exporters.errors", "exporters.schema.typed"},  # below; its own part
        "exporters.schema.typed": {"exporters.sources.load"},  # upward
        "exporters.sources.load": {"exporters.configs.models", "exporters"},  # sideways; the package
        "exporters.configs.models": set(),
    }
    assert breaches(graph, layers) == [
        ("exporters.schema.typed", "exporters.sources.load"),
        ("exporters.sources.load", "exporters.configs.models"),
    ]
    assert breaches({"exporters": {"exporters.errors"}, "exporters.errors": set()}, layers) == [
        ("exporters", "exporters.errors")
    ]
