"""``make tune`` on a real tritonserver where nothing can meet the budget (p99 <= 0.05 ms: the client's
own round trip is longer): one line naming the closest figure, exit status 3, ``partial.md`` with every
run headed "no answer", no ``spec.tuned.yaml``; the server took its ports from ``--port-base``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from outcomes import over_the_budget
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_NOTHING_MEETS
from perf.measure.engine import MeasureSettings
from perf.model.grid import Grid
from perf.session.probe import ProbePlan
from perf.tune.cli import TuneSetup
from perf.tune.tuner import tune
from server import ports

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
TINY = Grid(delays_us=(0,), max_batches=(8,), instances=(1,))


def test_make_tune_says_nothing_meets_in_one_line_and_exits_3(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    quick_windows: MeasureSettings,
    port_base_finder: Callable[[int], int],
) -> None:
    seen: dict = {}

    def tune_briefly(server, request, plan=None, step=None, **kwargs):  # the CLI's tune, 3 probe runs a ramp
        seen["http_port"] = server.server.http_port
        return tune(server, request, ProbePlan(max_runs=3), step, **kwargs)

    base = port_base_finder(ports.PORTS_PER_SERVER)
    reports = tmp_path / "reports"
    try:
        code = main([
            "tune", "--spec", str(SPEC), "--model", "trivial", "--p99-ms", "0.05", "--engine", "ours",
            "--seconds", "0.9", "--reports", str(reports), "--port-base", str(base),
        ], PerfSetup(Console(width=400), tune=TuneSetup(
            quick_grid=TINY, workdir=tmp_path / "work", windows=quick_windows, tuner=tune_briefly,
        )))  # fmt: skip
    finally:
        ports.use_port_base(None)
    assert code == EXIT_NOTHING_MEETS == 3
    verdict = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nothing meets")]
    assert len(verdict) == 1, verdict
    assert verdict[0].startswith("nothing meets p99 <= 0.05 ms here: the closest measured was ")
    over_the_budget(verdict[0], 0.05)  # a run over the budget: none can be within 0.05 ms here
    assert seen["http_port"] == base  # the server's ports came from the base
    (folder,) = reports.iterdir()
    assert not (folder / "spec.tuned.yaml").exists() and not (folder / "overlay.yaml").exists()
    partial = (folder / "partial.md").read_text()
    assert partial.startswith("# Tuning trivial for p99 ≤ 0.05 ms: no answer")
    assert "| probe max 8, 0 ms ×1 @ " in partial and "| probe no batching ×1 @ " in partial
