"""``--witness model-analyzer`` in its smoke setting against real servers: Model Analyzer (its own venv,
installed on first use) profiles the prepared recommender on this project's tritonserver with
perf_analyzer, its pick is read back, and the yardstick measures it beside the tuner's pick and the
spec's configuration on a fresh server; the report section renders from the saved figures.

Skipped, with the reason, where Model Analyzer cannot be installed or perf_analyzer does not run. No
figure is held to a value: a shared machine measures what it measures."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.resolve import load_spec
from perf.bench import model_analyzer
from perf.bench.versus import run_witness, search_space
from perf.bench.versus_report import OURS, SPEC, THEIRS, WitnessFigures, section
from perf.measure.analyzer import PerfAnalyzerEngine, find_perf_analyzer, unavailable_message
from perf.measure.engine import MeasureSettings
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.model_analyzer_install import InstallError, ensure
from perf.saved import load_document, save_document
from perf.session.model import ModelSession
from perf.tune.result import Seconds

pytestmark = pytest.mark.integration
SPEC_FILE = Path(__file__).resolve().parents[2] / "models.yaml"
MODEL = "recommender"
SHORT = MeasureSettings(warmup_s=0.2, window_s=0.5, stable_windows=3, max_windows=4, tolerance=1.0)
# A budget no stall of a busy host reaches: Model Analyzer's one measurement is within it, so it picks.
BUDGET_MS = 5000.0


@pytest.fixture(scope="module")
def program() -> Path:
    if find_perf_analyzer() is None:
        pytest.skip(unavailable_message())
    try:
        return ensure()
    except InstallError as error:
        pytest.skip(f"Model Analyzer cannot be installed here: {error}")


def test_the_smoke_witness_runs_model_analyzer_and_one_yardstick(program: Path, tmp_path: Path) -> None:
    spec = load_spec(SPEC_FILE)
    base = spec.model(MODEL)
    seconds = Seconds(probe=0.5, predict=0.2, shortlist=0.3, verify=0.5, tuner=1.0, make_tune=2.0)
    ours = BatcherConfig(8, 2000, instances=1)
    engine = PerfAnalyzerEngine(log_folder=tmp_path)

    def session() -> ModelSession:
        noise = NoisePolicy(remeasure=False)
        return ModelSession(spec, MODEL, 64, tmp_path / "yardstick", engine, SHORT, noise)

    figures = run_witness(
        spec, MODEL, BUDGET_MS, 500.0, seconds, ours, search_space(64, (1, 2), smoke=True), session, tmp_path,
        lambda text: None, rounds=1, max_steps=2, max_concurrency=4,
    )  # fmt: skip
    search = figures.search
    assert search.profiled == (("recommender_config_default", 4),)
    assert search.rows and all(row.concurrency == 4 for row in search.rows)
    # its one variant is the prepared base: read back from the file it wrote, it is the spec's batching
    assert search.pick_variant == "recommender_config_default"
    assert search.pick == model_analyzer.base_config(base).label
    assert figures.configs == {OURS: ours.label, THEIRS: search.pick, SPEC: search.pick}
    ramps = figures.yardstick.ramps
    assert sorted((r.name, r.kind) for r in ramps) == sorted(
        (name, kind) for name in (OURS, THEIRS, SPEC) for kind in ("open", "closed")
    )
    # its pick is the spec's configuration: measured once, the same ramps under both names
    assert [r.steps for r in ramps if r.name == THEIRS] == [r.steps for r in ramps if r.name == SPEC]
    for ramp in ramps:  # the search's guard: two rates at most (closed: concurrency 4 alone), 3 runs each
        loads = {s.load for s in ramp.steps}
        assert 1 <= len(loads) <= (2 if ramp.kind == "open" else 1) and len(ramp.steps) <= 3 * len(loads)
        assert ramp.held_at is None or ramp.held_at in loads
        measured = [s for s in ramp.steps if not s.error]
        assert all(s.throughput > 0 and s.p99_ms > 0 for s in measured)
    assert figures.ours.seconds == 2.0 and figures.ours.tuner_s == 1.0  # the whole make tune, and the tuner
    assert "yardstick" in (tmp_path / "perf_analyzer.log").read_text()
    saved = load_document(save_document(tmp_path / "witness.json", figures), WitnessFigures)  # as written
    text = "\n".join(section(saved))
    assert text == "\n".join(section(figures))
    assert ours.label in text and search.pick in text and "(Model Analyzer)" in text
