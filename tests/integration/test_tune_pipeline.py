"""The tuner's probe on ``recommender_pipeline`` against a real tritonserver (explicit model control):
a candidate's batching really reaches the stage models (loaded configs and formed batch sizes), load
goes through the ensemble, and no request fails at the server. ``make plan`` verifies a split on this
session (``perf.plan.verify``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from exporters.resolve import load_spec
from perf.measure.engine import MeasureSettings, OurEngine
from perf.measure.noise import NoisePolicy
from perf.model.batcher import BatcherConfig
from perf.session.model import PipelineSession
from perf.session.probe import ProbePlan, probe

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
PIPELINE = "recommender_pipeline"
SHORT = MeasureSettings(warmup_s=0.2, window_s=0.3, stable_windows=3, max_windows=3, p99_samples=10)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PipelineSession]:
    workdir = tmp_path_factory.mktemp("tune_pipeline")
    noise = NoisePolicy(remeasure=False)
    with PipelineSession(load_spec(SPEC), PIPELINE, 32, workdir, OurEngine(), SHORT, noise) as running:
        yield running


def stage_batchers(session: PipelineSession) -> dict[str, dict | None]:
    """Each stage's ``dynamic_batching`` as the server reports its loaded config."""
    assert session.server is not None
    client = httpclient.InferenceServerClient(session.server.http_url)
    try:
        configs = {name: client.get_model_config(name) for name in session.pipeline.stage_names}
    finally:
        client.close()
    return {name: config.get("dynamic_batching") for name, config in configs.items()}


def test_the_probe_batches_the_stages_and_no_request_fails_at_the_server(session: PipelineSession) -> None:
    """The probe's ramps (batching at delay 0, then none) through the ensemble: the stages formed
    batches of more than one request as the rate rose with batching, never without it."""
    measured = probe(session, (1,), session.largest_batch, ProbePlan(step=2.0, max_runs=7))
    batched = [run for config, run in measured.runs if config.batching]
    unbatched = [run for config, run in measured.runs if not config.batching]
    assert max(size for run in batched for size in run.stats.batches) > 1
    assert unbatched and all(set(run.stats.batches) == {1} for run in unbatched)
    records = [record for _, run in measured.runs for record in run.records]
    # Nothing failed at the server; on a busy machine an open loop past saturation can fall behind, and
    # arrivals beyond the client's in-flight bound are shed (recorded, not sent).
    assert records and all(r.ok or r.shed for r in records), {r.status for r in records if not r.ok}


def test_a_candidate_s_delay_reaches_the_first_stage_and_later_stages_batch(session: PipelineSession) -> None:
    session.prepare(BatcherConfig(session.largest_batch, 1000))
    first, later = (stage_batchers(session)[name] for name in session.pipeline.stage_names)
    assert int(first.get("max_queue_delay_microseconds", 0)) == 1000
    assert later is not None
    session.prepare(BatcherConfig(1))
    assert all(batcher is None for batcher in stage_batchers(session).values())
