"""Shapes as served (``perf.measure.shapes``): request lengths follow the spec's sampler or its ``shapes:``,
buckets are chosen at quantiles and pad to the smallest that fits, the padding cost is accounted from
timed lengths, and formed batches per length come from the client's records. No server."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from exporters.errors import SpecError
from exporters.schema.models import ModelSpec, parse_model
from perf.measure.records import Record
from perf.measure.shapes import (
    ShapeMix,
    bucket_candidates,
    bucket_of,
    bucket_ways,
    formed_batches,
    mix_of,
    padded_share,
    padding_cost,
    resized,
    shape_mix,
    shape_plan,
    shape_rows,
    shape_table,
)
from perf.measure.target import target_from_spec

FACTORIES = Path(__file__).resolve().parents[3] / "data" / "own_factories"
SEQUENCE = {
    "name": "seq", "source": {"python": "factories:sequence_gru", "path": str(FACTORIES)},
    "sample": "factories:sequence_sample", "max_batch_size": 8,
    "inputs": [{"name": "frames", "dtype": "fp32", "shape": [-1, 16], "max_shape": [200, 16]}],
    "outputs": [{"name": "state", "dtype": "fp32", "shape": [32]}],
}  # fmt: skip


def model(**fields: object) -> ModelSpec:
    return parse_model({**SEQUENCE, **fields}, "models[0]")


def test_lengths_follow_the_sampler() -> None:
    mix = shape_mix(model(), seed=0)
    # the factory's sampler draws 10-200 uniformly: 256 draws span most of it, mean near 105
    assert mix.lengths[0] < 20 and mix.longest > 190 and 90 < mix.mean < 120
    assert len(mix.lengths) > 100 and abs(sum(mix.weights) - 1) < 1e-9
    assert "factories:sequence_sample" in mix.source


def test_lengths_follow_the_spec_shapes_and_requests_draw_them() -> None:
    spec = model(shapes={"lengths": [20, 150], "weights": [3, 1]})
    mix = shape_mix(spec)
    assert mix.lengths == (20, 150) and mix.weights == pytest.approx((0.75, 0.25))
    plan = shape_plan(spec, rows=4, seed=1, requests=4000)
    true = np.array([length for length, _ in plan.requests])
    assert set(true) == {20, 150} and 0.72 < np.mean(true == 20) < 0.78
    assert {n: p["frames"].shape for n, p in plan.pools.items()} == {20: (4, 20, 16), 150: (4, 150, 16)}


def test_the_spec_lengths_are_the_sampler_without_a_sample_function() -> None:
    spec = model(sample=None, lengths=[8, 64])
    assert shape_mix(spec, draws=64).lengths == (8, 64)


def test_a_target_sends_the_traffic_lengths_or_one() -> None:
    spec = model()
    varied = target_from_spec(spec, "unused", rows=4)
    assert varied.shapes is not None and len(varied.shapes.pools) > 100
    sent = sorted(n for _, n in varied.shapes.requests)
    assert varied.inputs["frames"].shape[1] == sent[len(sent) // 2]  # the median, for one-shape users
    single = target_from_spec(spec, "unused", rows=4, vary_shapes=False)
    assert single.shapes is None
    with_shm = target_from_spec(spec, "unused", rows=4, shared_memory=True)
    assert with_shm.shapes is None  # regions are sized once: one length


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"shapes": {"lengths": [250]}}, "models[0].shapes.lengths[0]: 250 exceeds"),
        ({"shapes": {"lengths": [10, 20], "weights": [1]}}, "models[0].shapes.weights: must give one"),
        ({"shapes": {"lengths": [10], "weights": [-1]}}, "models[0].shapes.weights: must all be > 0"),
        ({"shapes": {"lengths": [10, 10]}}, "models[0].shapes.lengths: must not repeat"),
        ({"buckets": [100, 50]}, "models[0].buckets: must be strictly increasing"),
        ({"buckets": [300]}, "models[0].buckets[0]: 300 exceeds"),
    ],
)
def test_bad_shapes_and_buckets_name_the_field(fields: dict, problem: str) -> None:
    with pytest.raises(SpecError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        model(**fields)


def test_shapes_need_a_variable_axis() -> None:
    fixed = {**SEQUENCE, "sample": None, "inputs": [{"name": "frames", "dtype": "fp32", "shape": [4, 16]}]}
    with pytest.raises(SpecError, match=r"models\[0\]\.buckets: is for variable axes"):
        parse_model({**fixed, "buckets": [2]}, "models[0]")


def test_buckets_pad_to_the_smallest_that_fits() -> None:
    assert bucket_of(37, (), 200) == 37
    assert [bucket_of(n, (32, 64), 200) for n in (1, 32, 33, 64, 65)] == [32, 32, 64, 64, 200]


def test_bucket_candidates_sit_at_quantiles_of_the_lengths() -> None:
    mix = mix_of(range(1, 101), "test")  # 1..100, equally often
    candidates = bucket_candidates(mix)
    assert candidates == {"exact lengths": (), "2 buckets": (50, 100), "4 buckets": (25, 50, 75, 100)}
    assert bucket_candidates(mix_of([5, 9], "test")) == {"exact lengths": ()}  # nothing to merge


def test_the_ways_measured_add_the_spec_buckets_where_the_candidates_lack_them() -> None:
    spec = model(shapes={"lengths": list(range(1, 101))})
    assert bucket_ways(spec) == bucket_candidates(shape_mix(spec))  # no spec buckets: the candidates
    assert bucket_ways(model(shapes={"lengths": list(range(1, 101))}, buckets=[50, 100])) == bucket_ways(spec)
    ways = bucket_ways(model(shapes={"lengths": list(range(1, 101))}, buckets=[64, 200]))
    assert ways["the spec's buckets"] == (64, 200) and len(ways) == len(bucket_ways(spec)) + 1


def test_padding_cost_is_compute_at_padded_over_true_lengths() -> None:
    mix = ShapeMix((10, 50, 100), (0.5, 0.25, 0.25), "test")
    timed: list[int] = []

    def linear(length: int) -> float:  # a batch costs 1 ms plus 0.1 ms per position
        timed.append(length)
        return 1e-3 + 1e-4 * length

    cost = padding_cost(mix, (50, 100), 100, linear)
    true = 0.5 * 2e-3 + 0.25 * 6e-3 + 0.25 * 11e-3
    padded = 0.75 * 6e-3 + 0.25 * 11e-3
    assert cost.ratio == pytest.approx(padded / true)
    assert cost.padded_share == pytest.approx(1 - 42.5 / 62.5) == padded_share(mix, (50, 100), 100)
    assert {10, 50, 100} <= set(timed)
    assert padding_cost(mix, (), 100, linear).ratio == pytest.approx(1.0)


def test_resizing_crops_or_pads_with_valid_values() -> None:
    spec = model()
    frames = np.arange(2 * 3 * 16, dtype=np.float32).reshape(2, 3, 16)
    longer = resized(spec, {"frames": frames}, 5)["frames"]
    assert longer.shape == (2, 5, 16) and (longer[:, 3:] == frames[:, 2:3]).all()
    assert resized(spec, {"frames": frames}, 2)["frames"].shape == (2, 2, 16)
    assert resized(spec, {"frames": frames}, 999)["frames"].shape == (2, 200, 16)  # the axis bound


def record(recv_s: float, length: int, sent: int, ok: bool = True) -> Record:
    return Record("seq", recv_s - 0.01, recv_s, 1, 0, 0, ok, length=length, sent_length=sent)


def test_formed_batches_per_length_from_the_responses() -> None:
    # two batches of length 64 (3 and 2 responses arriving together), one request alone at 128
    records = [record(t, n, 64) for t, n in [(1.0, 40), (1.0001, 60), (1.0002, 64), (1.02, 50), (1.0201, 33)]]
    records += [record(1.01, 100, 128), record(1.03, 100, 128, ok=False)]
    rows = shape_rows(records, max_batch=8)
    assert [(r.sent_length, r.requests, r.batches, r.shortest, r.longest) for r in rows] == [
        (64, 5, 2, 33, 64),
        (128, 1, 1, 100, 100),
    ]
    assert rows[0].mean_batch == 2.5 and rows[0].share == pytest.approx(5 / 6)
    assert formed_batches([0.0] * 10, max_batch=4) == 3  # never more than the largest batch in one
    # Triton counted 6 executions over the span: the split between lengths stays the responses'
    scaled = shape_rows(records, max_batch=8, executions=6)
    assert [r.batches for r in scaled] == pytest.approx([4.0, 2.0])
    lines = shape_table(rows)
    assert lines[2].startswith("| 64 | 33-64 | 5 |") and lines[3].startswith("| 128 | 100 | 1 |")
    many = shape_table(shape_rows([record(i, i, i) for i in range(1, 30)], 8), limit=5)
    assert many[-1].startswith("| 24 more lengths |")


class Measured:
    """The figures ``choose`` reads of a measurement (a stand-in value, not a server)."""

    def __init__(self, throughput: float, p99_ms: float, sustained: bool = True) -> None:
        self.throughput, self.p99_ms, self.sustained = throughput, p99_ms, sustained

    def meets(self, budget_ms: float) -> bool:
        return self.sustained and self.p99_ms <= budget_ms


def test_the_tuner_chooses_the_buckets_that_meet_the_budget_with_the_lowest_p99() -> None:
    from perf.measure.bucket_runs import BucketRun, choose

    one = BucketRun("one length (172)", None, Measured(900, 5.0), None)  # optimistic, not the traffic
    exact = BucketRun("exact lengths", (), Measured(500, 30.0), None)
    two = BucketRun("2 buckets", (112, 198), Measured(500, 12.0), None)
    four = BucketRun("4 buckets", (67, 112, 158, 198), Measured(500, 15.0), None)
    assert choose([one, exact, two, four], budget_ms=20.0) is two
    # nothing meets the budget: the one that served the most, still never the one-length run
    slow = [one, BucketRun("exact lengths", (), Measured(300, 90.0, False), None), four]
    assert choose(slow, budget_ms=10.0) is four


def test_perf_analyzer_input_data_carries_each_request_length(tmp_path: Path) -> None:
    import json

    from perf.measure.analyzer import SHAPED_REQUESTS, write_input_data

    spec = model(shapes={"lengths": [20, 150]})
    target = target_from_spec(spec, "127.0.0.1:1", rows=2, seed=3, buckets=(64, 200))
    plan = target.shapes
    written = write_input_data(target, tmp_path / "inputs.json")
    data = json.loads(written.read_text())["data"]
    expected = [[sent, 16] for _, sent in plan.requests[:SHAPED_REQUESTS]]
    assert [entry["frames"]["shape"] for entry in data] == expected
    assert {entry["frames"]["shape"][0] for entry in data} == {64, 200}  # padded to the buckets


def test_the_chosen_buckets_go_into_the_tuned_spec_and_are_validated(tmp_path: Path) -> None:
    import yaml

    from perf.model.batcher import BatcherConfig
    from perf.spec_overlay import write_overlay

    base_path = tmp_path / "models.yaml"
    base_path.write_text(yaml.safe_dump({"models": [{**SEQUENCE, "buckets": [100, 200]}]}))
    config = BatcherConfig(8, 1000)
    tuned = write_overlay(base_path, model(buckets=[100, 200]), config, tmp_path, "test", buckets=(64, 200))
    assert tuned.model("seq").buckets == (64, 200)
    assert write_overlay(base_path, model(), config, tmp_path, "test", buckets=()).model("seq").buckets == ()
    kept = write_overlay(base_path, model(), config, tmp_path, "test")  # nothing chosen: the spec's stay
    assert kept.model("seq").buckets == (100, 200)
    with pytest.raises(SpecError, match=r"models\[0\]\.buckets\[0\]: 300 exceeds"):
        write_overlay(base_path, model(), config, tmp_path, "test", buckets=(300,))


def test_a_static_batch_takes_the_traffic_as_it_arrives_padded_to_its_longest() -> None:
    from perf.measure.target import Caller
    from perf.studies.analysis import padding

    spec = model()
    static = Caller(target_from_spec(spec, "unused", collect=32, rows=32), 0.0)
    requests = static.target.shapes.requests
    for start in (0, 32):  # each batch of 32 takes the next 32 arrivals' lengths
        tensors, _, length, sent = static._request_inputs(32)
        arrivals = requests[start : start + 32]
        assert sent == max(n for n, _ in arrivals) and length == round(np.mean([n for n, _ in arrivals]))
        assert tensors[0].shape() == [32, sent, 16]
    bucketed = Caller(target_from_spec(spec, "unused", collect=32, rows=32, buckets=(120, 200)), 0.0)
    assert bucketed._request_inputs(32)[3] in (120, 200)  # the longest arrival's bucket
    dynamic = Caller(target_from_spec(spec, "unused", rows=4), 0.0)
    assert [dynamic._request_inputs(1)[2] for _ in range(3)] == [
        n for n, _ in dynamic.target.shapes.requests[:3]
    ]
    # the padding the report shows: positions computed that are padding, from the records' lengths
    records = [Record("m", 0.1, 0.2, 32, 0, 0, True, length=50, sent_length=200),
               Record("m", 0.3, 0.4, 32, 0, 0, True, length=100, sent_length=200)]  # fmt: skip
    measured = types.SimpleNamespace(measured_records=lambda: records)
    assert padding(measured) == pytest.approx((1 - 150 / 400, 400 / 150))
    assert padding(types.SimpleNamespace(measured_records=lambda: [Record("m", 0, 1, 1, 0, 0, True)])) is None
