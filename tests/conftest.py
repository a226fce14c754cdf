"""Shared test fixtures: the project's spec, plus helpers to build repositories into tmp folders.

``make test`` runs three pytest-xdist workers (``--dist loadgroup``). Starting servers and exporting
models is where the time goes, so each worker must start a server only once: the tests of one file
stay on one worker (its module-scoped servers start once), and the files that share a session-scoped
server or build (``SHARED_FIXTURES``) all go to the worker that starts it. The groups are handed out in
collection order (``--no-loadscope-reorder``), longest work first, so that the many short unit files
fill the end of the run instead of one worker finishing a server test alone.
"""

from __future__ import annotations

import copy
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporters.schema.models import ModelSpec, parse_spec
from server import ports

ROOT = Path(__file__).resolve().parent.parent
# session fixtures that start a server or build a repository -> the one worker group that uses them
SHARED_FIXTURES = {"serving_repository": "integration-server", "fault_repository": "fault-server"}
# pytest-timeout's limit for a test of a shared fixture's group without its own (the default, in
# pyproject.toml, is lower): whichever of them runs first pays the fixture's build and server start,
# which took 470 s with make test's three workers on a 2-core host at load average 20. A hang guard,
# not a speed check.
SHARED_BUILD_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest work first: the shared servers' groups, then the other tests that start servers, then
    the rest; within each, the collected order (the sort is stable)."""

    def rank(item: pytest.Item) -> int:
        if any(fixture in getattr(item, "fixturenames", ()) for fixture in SHARED_FIXTURES):
            return 0
        return 1 if item.get_closest_marker("integration") else 2

    items.sort(key=rank)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks each test's worker group as it is collected, before pytest-xdist reads the groups, and
    gives a test of a shared fixture's group the time its build may take (``SHARED_BUILD_TIMEOUT_S``)."""
    fixtures = getattr(item, "fixturenames", ())
    shared = [group for fixture, group in SHARED_FIXTURES.items() if fixture in fixtures]
    item.add_marker(pytest.mark.xdist_group(shared[0] if shared else item.nodeid.split("::")[0]))
    if shared and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(SHARED_BUILD_TIMEOUT_S))


@pytest.fixture(scope="session")
def spec_data() -> dict[str, Any]:
    """``models.yaml`` as a dict; tests extend copies of it with test-only models."""
    return yaml.safe_load((ROOT / "models.yaml").read_text())


@pytest.fixture(scope="session")
def model_spec(spec_data: dict[str, Any]) -> Callable[..., ModelSpec]:
    """``model_spec(name, **changes)``: one model of ``models.yaml`` with fields replaced, validated."""

    def make(name: str, **changes: Any) -> ModelSpec:
        data = copy.deepcopy(spec_data)
        next(m for m in data["models"] if m["name"] == name).update(changes)
        return parse_spec(data).model(name)

    return make


@pytest.fixture(scope="session", autouse=True)
def conversion_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Outside archives converted in the sandbox are cached in a folder of the test session, not in
    the user's ``~/.cache`` (``exporters.sandbox.outside_archive.cache_root``)."""
    folder = tmp_path_factory.mktemp("conversion-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_BATCHING_CACHE", str(folder))
        yield folder


def free_port_base(count: int = ports.PORTS_PER_SERVER) -> int:
    """A base whose next ``count`` ports nothing listens on now, for tests that pass ``--port-base``.

    The start depends on the checkout so that two ``make test`` runs side by side look in different places;
    a port taken between this check and the server's launch is the launcher's error, naming the port.
    """
    for base in range(20000 + 10 * (hash(Path.cwd()) % 1000), 60000, 97):
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free block of ports")


@pytest.fixture
def port_base_finder() -> Callable[[int], int]:
    """``free_port_base`` for a test (conftest functions are not importable from every test folder)."""
    return free_port_base
