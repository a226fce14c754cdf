"""Model Analyzer beside the tuner, without running it: the configuration written for it, reading its
CSV, log and variants back, the yardstick's rule for a ramp's figure, and the report section rendered
from saved figures. tests/integration/test_witness_model_analyzer.py runs the real thing."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from exporters.resolve import load_spec
from perf.bench import model_analyzer
from perf.bench.model_analyzer import Measured, Paths, SearchSpace
from perf.bench.versus_report import (
    OURS,
    SPEC,
    THEIRS,
    OursFigures,
    SearchFigures,
    WitnessFigures,
    YardstickFigures,
    section,
)
from perf.bench.yardstick import Plan, RampFigures, Step, closed_ramp, held_at, open_ramp
from perf.errors import StudyError
from perf.measure.analyzer import find_perf_analyzer
from perf.model.batcher import BatcherConfig
from perf.session.search import at_rung, on_ladder, rung

SPEC_FILE = Path(__file__).resolve().parents[2] / "models.yaml"
HEADER = (
    "Model,Batch,Concurrency,Model Config Path,Instance Group,Max Batch Size,Satisfies Constraints,"
    "Throughput (infer/sec),p99 Latency (ms)"
)


@pytest.fixture(scope="module")
def recommender():
    return load_spec(SPEC_FILE).model("recommender")


@pytest.mark.skipif(
    find_perf_analyzer() is None, reason="perf_analyzer is not installed (make perf-analyzer)"
)
@pytest.mark.parametrize("smoke", [False, True])
def test_the_configuration_launches_this_projects_server_for_the_same_search(recommender, tmp_path, smoke):
    paths = Paths(tmp_path)
    space = SearchSpace(max_instances=2, max_batch_size=64, smoke=smoke)
    config = model_analyzer.analyzer_config(recommender, 7.5, space, paths)
    assert config["triton_launch_mode"] == "local"
    assert Path(config["triton_server_path"]).is_file()
    backends = Path(config["triton_server_flags"]["backend-directory"])
    assert (backends / "onnxruntime" / "model.py").is_file() and (backends / "python").is_dir()
    assert "site-packages" in config["triton_server_environment"]["PYTHONPATH"]
    assert config["perf_analyzer_path"] == str(find_perf_analyzer())
    model = config["profile_models"]["recommender"]
    assert model["cpu_only"] and model["constraints"] == {"perf_latency_p99": {"max": 7.5}}
    assert model["perf_analyzer_flags"]["input-data"] == str(paths.inputs.resolve())
    ports = [config["triton_http_endpoint"], config["triton_grpc_endpoint"], config["triton_metrics_url"]]
    assert not any(p.rstrip("/metrics").endswith((":8000", ":8001", ":8002")) for p in ports)
    if smoke:
        assert config["run_config_search_disable"] and model["parameters"]["concurrency"] == [4]
    else:
        assert config["run_config_search_mode"] == "brute"
        assert config["run_config_search_max_instance_count"] == 2
        assert config["run_config_search_max_model_batch_size"] == 64


def test_the_prepared_model_lets_every_variant_load(recommender, tmp_path) -> None:
    """No queue policy (the 2.51 stall), built at the largest batch searched, a warm-up only at batch 1
    (a variant with a smaller max_batch_size loads), and valid rows for perf_analyzer."""
    paths = Paths(tmp_path)
    model_analyzer.prepare(recommender, SearchSpace(2, 128), paths)
    config = text_format.Parse(
        (paths.repository / "recommender" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert config.max_batch_size == 128
    assert not config.dynamic_batching.HasField("default_queue_policy")
    assert [w.batch_size for w in config.model_warmup] == [1]
    rows = json.loads(paths.inputs.read_text())["data"]
    assert len(rows) == model_analyzer.INPUT_ROWS
    low, high = next(t.range for t in recommender.inputs if t.name == "sparse_ids")
    assert all(low <= i < high for row in rows for i in row["sparse_ids"]["content"])


def test_its_csv_is_read_and_its_pick_is_the_most_throughput_within_the_budget(tmp_path) -> None:
    path = tmp_path / model_analyzer.CSV_NAME
    path.write_text(
        "\n".join(
            [
                HEADER,
                "recommender,1,16,recommender_config_3,2:CPU,16,Yes,4000.0,9.3",
                "recommender,1,32,recommender_config_3,2:CPU,16,No,5000.0,12.0",
                "recommender,1,16,recommender_config_3,2:CPU,16,Yes,4000.0,9.3",  # repeated by it
                "recommender,1,8,recommender_config_default,1:CPU,64,Yes,2500.0,6.1",
            ]
        )
    )
    rows = model_analyzer.read_rows(path)
    assert len(rows) == 3
    assert model_analyzer.pick(rows) == Measured("recommender_config_3", 16, 2, 16, True, 4000.0, 9.3)
    assert model_analyzer.pick([r for r in rows if not r.within_budget]) is None
    path.write_text("Model,Batch\nrecommender,1\n")
    with pytest.raises(Exception, match="no column"):
        model_analyzer.read_rows(path)


def test_a_variant_it_wrote_is_read_back_as_the_tuners_candidate(tmp_path) -> None:
    config = model_config_pb2.ModelConfig(name="recommender", max_batch_size=16)
    config.dynamic_batching.SetInParent()
    config.instance_group.add(count=2, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    (tmp_path / "recommender_config_3").mkdir()
    (tmp_path / "recommender_config_3" / "config.pbtxt").write_text(text_format.MessageToString(config))
    assert model_analyzer.variant_config(tmp_path, "recommender_config_3") == BatcherConfig(16, 0, (), 2)


def test_its_runs_are_counted_from_its_log() -> None:
    log = (
        "[Model Analyzer] Profiling recommender_config_default: concurrency=1\n"
        "[Model Analyzer] Profiling recommender_config_default: concurrency=2\n"
        "[Model Analyzer] Existing measurement found for run config. Skipping profile\n"
        "[Model Analyzer] Profiling recommender_config_1: concurrency=1\n"
    )
    assert model_analyzer.profiled(log) == [
        ("recommender_config_default", 1),
        ("recommender_config_default", 2),
        ("recommender_config_1", 1),
    ]


def test_the_spec_configuration_as_a_candidate(recommender) -> None:
    assert model_analyzer.base_config(recommender) == BatcherConfig(
        recommender.max_batch_size,
        recommender.batching.max_queue_delay_us,
        recommender.batching.preferred_batch_sizes,
        recommender.instances.cpu,
    )


def step(load: float, met: bool, error: str = "") -> Step:
    return Step(load, 5.0 if met else 20.0, load, met, 0.0, False, error)


def test_a_ramps_figure_is_the_highest_load_a_point_held_the_budget_at_by_the_searchs_rule() -> None:
    assert (
        held_at([step(100, True), step(200, True), step(300, False), step(300, False)], 10.0, "open") == 200
    )
    assert held_at([step(100, False), step(100, False)], 10.0, "open") is None
    # one miss alone decides nothing: its point holds once a second run met the budget and a third agreed
    noisy = [step(100, True), step(200, False), step(200, True), step(200, True), step(300, False)]
    assert held_at(noisy, 10.0, "open") == 200
    # a closed loop whose windows never agreed says nothing of the budget: skipped
    failed = Step(8, math.nan, math.nan, False, math.nan, False, "Failed to obtain stable measurement.")
    assert held_at([step(4, True), failed, step(16, True)], 10.0, "closed") == 16
    assert held_at([step(4, True), failed], 10.0, "open") == 4  # in the open loop: a miss by far


def witness(with_pick: bool) -> WitnessFigures:
    steps = {
        OURS: (step(1000, True), step(1500, True), step(2000, False)),
        THEIRS: (step(1000, True), step(1500, False)),
        SPEC: (step(1000, False),),
    }
    names = [OURS, THEIRS, SPEC] if with_pick else [OURS, SPEC]
    ramps = tuple(
        RampFigures(n, 1, kind, 1000.0, steps[n], held_at(steps[n], 10.0, kind))
        for n in names
        for kind in ("open", "closed")
    )
    return WitnessFigures(
        version="1.58.0",
        budget_ms=10.0,
        configs={OURS: "max 8, 2 ms ×2", THEIRS: "max 16, 0 ms ×2", SPEC: "max 64, 1 ms ×1"}
        if with_pick
        else {OURS: "max 8, 2 ms ×2", SPEC: "max 64, 1 ms ×1"},
        search=SearchFigures(
            seconds=1000.0,
            pick="max 16, 0 ms ×2" if with_pick else None,
            pick_variant="recommender_config_3" if with_pick else None,
            pick_row=Measured("recommender_config_3", 16, 2, 16, True, 4000.0, 9.3) if with_pick else None,
            variants=("recommender_config_default", "recommender_config_3"),
            profiled=(("recommender_config_default", 1), ("recommender_config_3", 16)),
            rows=(),
            config="config.yaml",
            smoke=False,
        ),
        ours=OursFigures(seconds=300.0, tuner_s=200.0),
        yardstick=YardstickFigures(
            engine="perf_analyzer 2.41.0",
            plan=Plan(10.0, start=1000.0, rounds=1, first_concurrency=4),
            ramps=ramps,
        ),
    )


def test_the_section_names_both_picks_their_times_and_the_tool_behind_each_figure() -> None:
    text = "\n".join(section(witness(with_pick=True)))
    assert "| pick | max 8, 2 ms ×2 | max 16, 0 ms ×2 |" in text
    assert "300 s" in text and "1000 s" in text and "2 perf_analyzer runs" in text
    assert "4,000/s at p99 9.3 ms, concurrency 16" in text and "(Model Analyzer)" in text
    assert "perf_analyzer 2.41.0" in text
    assert "| tuner pick |" in text and "1,500/s vs 1,000/s: 1.50×" in text
    assert "| tuner time |" in text and "0.30×" in text
    without = "\n".join(section(witness(with_pick=False)))
    assert "none within the budget" in without and "| tuner pick |" not in without


class Yardstick:
    """Stands in for the yardstick's session: holds the budget up to ``capacity`` (a rate, or a
    concurrency for a closed loop); perf_analyzer fails to measure at ``failing``."""

    noise = SimpleNamespace(holds_noise=lambda run: False)

    def __init__(self, capacity: float, failing: tuple[float, ...] = ()) -> None:
        self.capacity, self.failing = capacity, failing

    def measure(self, load, label: str) -> SimpleNamespace:
        value = load.rate or load.concurrency
        if value in self.failing:
            raise StudyError("perf_analyzer: Failed to obtain stable measurement.")
        p99 = 5.0 if value <= self.capacity else 60.0
        served = load.rate or 100.0 * value
        return SimpleNamespace(
            p99_ms=p99, throughput=served, stolen_share=0.0, meets=lambda budget: p99 <= budget
        )


def test_the_yardsticks_open_loop_is_the_one_search_and_its_closed_loop_the_same_rule() -> None:
    plan = Plan(10.0, start=on_ladder(1500.0), rounds=1)
    ramp = open_ramp(Yardstick(1000.0), "ours", plan, 1)
    assert ramp.steps[0].load == plan.start and all(s.load == on_ladder(s.load) for s in ramp.steps)
    assert held_at(ramp.steps, 10.0, "open") == at_rung(int(rung(1000.0)))  # the search's answer
    closed = closed_ramp(Yardstick(16.0, failing=(8.0,)), "ours", plan, 1)
    assert [s.load for s in closed.steps] == [4, 8, 16, 32]  # a run without a measurement is skipped
    assert closed.steps[1].error and held_at(closed.steps, 10.0, "closed") == 16
