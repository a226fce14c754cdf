"""Fault matrix row: ``python -m exporters build`` while ``make serve`` serves the repository.

Every file the build writes must land whole: a reader that holds a file open across the rebuild (as a
stub that starts meanwhile would) still reads the whole old file, because the new one is written
aside and renamed over it (a new inode); in-place writes (``write_text``, ``shutil.copy2``) truncate
the very file it reads, even when they then write the same bytes back. Requests keep succeeding. And
what is served now differs from what is on disk (the rebuild changed a batching delay): ``python -m
client health`` and ``python -m server status`` must say so, naming the field, and stop saying so
once the model is reloaded (``python -m server load``, which names the model where the fronts look for
changed configs: fault matrix row 79).

Runs the real CLI in its own folder (its own ``.run/``) on free ports, importing this tree's code.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from harness import trivial_inputs
from resilience_fixtures import HANG_GUARD_S, tree_environment

from client.__main__ import main as client_main
from client.connection import connect
from exporters.__main__ import main as exporters_main
from server.__main__ import main as server_main
from tests.faults.harness import start_arguments

pytestmark = pytest.mark.integration
DRIFT = "SERVED CONFIG DIFFERS from"


def _spec(spec_data: dict[str, Any], delay_us: int) -> dict[str, Any]:
    """trivial (its batching delay given) and the recommender's embedding/dense pipeline, whose stage
    folders hold the stage runner's helpers."""
    data = copy.deepcopy(spec_data)
    data["models"] = [m for m in data["models"] if m["name"] in ("trivial", "recommender")]
    next(m for m in data["models"] if m["name"] == "trivial")["batching"]["max_queue_delay_us"] = delay_us
    data["pipelines"] = [p for p in data["pipelines"] if p["name"] == "recommender_pipeline"]
    data.pop("text_embeddings", None)
    return data


def _server(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=checkout, env=tree_environment(), capture_output=True,
        text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip


@pytest.fixture
def served(spec_data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A checkout whose ``model_repository`` (trivial with a 100 µs delay) ``python -m server start``
    serves in explicit model control; stopped afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "1000")
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(_spec(spec_data, 100)))
    assert exporters_main(["build", "--gpus", "0"]) == 0
    ports = start_arguments()
    started = _server(tmp_path, "start", "--model-control-mode", "explicit", *ports)
    assert started.returncode == 0, started.stderr
    try:
        yield tmp_path
    finally:
        stopped = _server(tmp_path, "stop")
        assert stopped.returncode == 0, stopped.stderr


def _report(main: Any, argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    return code, capsys.readouterr().out


def _trivial_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith("trivial"))


def test_a_rebuild_while_serving_replaces_files_whole_and_the_drift_is_reported(
    served: Path, spec_data: dict[str, Any], capsys: pytest.CaptureFixture
) -> None:
    repository = served / "model_repository"
    code, health = _report(client_main, ["health"], capsys)
    assert code == 0 and DRIFT not in health, health  # what was built is what is served

    held = {}  # every file of the repository, opened before the rebuild: its bytes and its inode
    for path in (p for p in repository.rglob("*") if p.is_file()):
        descriptor = os.open(path, os.O_RDONLY)
        held[path] = (descriptor, path.read_bytes(), os.fstat(descriptor))
    failures: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        client = connect("http")
        while not stop.is_set():
            try:
                answer = client.infer("trivial", trivial_inputs("http")).as_numpy("y")
                assert np.array_equal(answer, np.full((1, 16), 2.0, np.float32))
            except Exception as error:  # anything at all is a failed request here
                failures.append(repr(error))

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        (served / "models.yaml").write_text(yaml.safe_dump(_spec(spec_data, 7777)))
        assert exporters_main(["build", "--gpus", "0"]) == 0
    finally:
        stop.set()
        sender.join(timeout=60)
    assert failures == []
    torn, in_place = [], []
    for path, (descriptor, before, old) in held.items():
        if os.pread(descriptor, len(before) + 1, 0) != before:
            torn.append(str(path.relative_to(repository)))
        now = os.stat(path)
        if now.st_ino == old.st_ino and now.st_ctime_ns != old.st_ctime_ns:
            in_place.append(str(path.relative_to(repository)))
        os.close(descriptor)
    assert torn == [], f"a reader holding these files saw them change under it: {torn}"
    assert in_place == [], f"rewritten in place, not replaced whole: {in_place}"

    expected = "dynamic_batching.max_queue_delay_microseconds: 7777 on disk, 100 served"
    code, health = _report(client_main, ["health"], capsys)
    assert code == 0, health  # drift is reported, it does not make the model unhealthy
    assert DRIFT in _trivial_line(health) and expected in _trivial_line(health), health
    assert health.count(DRIFT) == 1, health  # the rest of the repository serves what is on disk
    code, status = _report(server_main, ["status"], capsys)
    assert code == 0 and expected in status and status.count(DRIFT) == 1, status

    assert _report(server_main, ["load", "trivial"], capsys)[0] == 0
    # the fronts learn of the load before their next check (row 79): the record names the file they read
    changes = Path(json.loads((served / ".run" / "server.json").read_text())["config_changes"])
    assert changes.read_text().splitlines()[-1] == '"trivial"'
    code, health = _report(client_main, ["health"], capsys)
    assert code == 0 and DRIFT not in health, health
