"""Topology parsing, placement and headroom on every shipped topology, the planner's pick and its
reasons, and the overlay: validated by the spec's own parser and turned into Triton configs. A
profile of fixed figures stands in for a measured one (the rules, not a measurement, are tested)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest

from exporters.configs.models import build_model_config
from exporters.pipelines.configs import stage_placement
from exporters.resolve import load_spec
from perf.errors import OptionError
from perf.model.memory import MIB
from perf.plan.overlay import merge, plan_overlay, server_flags, write_plan_overlay
from perf.plan.placement import PlacementError, place
from perf.plan.planner import PlanRequest, plan
from perf.plan.strategy import ModelProfile, Space, StageCost, Strategy, strategies, whole_variants
from perf.plan.topology import FIXTURES, cpu_topology, parse_gpus, parse_topo, topology_folder
from perf.spec_overlay import base_document

SPEC = Path(__file__).resolve().parents[4] / "models.yaml"
FIXTURE_NAMES = ("dgx-a100", "dgx1-v100", "l4x4-pcie", "hgx-h200", "a6000x4-pcie")
GPUS = {"dgx-a100": 8, "dgx1-v100": 8, "l4x4-pcie": 4, "hgx-h200": 8, "a6000x4-pcie": 4}
STAGES = ("recommender_pipeline_fp32_embedding", "recommender_pipeline_fp32_dense")
SPLIT = ("recommender_pipeline", ("_embedding", "_dense"))
NARROW = Space(instances=(1,), delays_us=(0,))


def profile(memory_mib: float = 25, boundary: int = 1024) -> ModelProfile:
    """The recommender as a planner sees it, with round figures: 0.4 ms + 0.02 ms per extra sample."""
    memory = int(memory_mib * MIB)
    return ModelProfile(
        "recommender", 32,
        whole={"fp32": StageCost("recommender", 4e-4, 2e-5, memory),
               "fp16": StageCost("recommender_fp16", 3e-4, 1e-5, memory // 2)},
        stages={p: (StageCost(STAGES[0].replace("fp32", p), 2e-4, 1e-5, memory // 2,
                              boundary // (2 if p == "fp16" else 1)),
                    StageCost(STAGES[1].replace("fp32", p), 2e-4, 1e-5, memory // 2))
                for p in ("fp32", "fp16")},
        accuracy={"whole/fp16": 4e-4, "split/fp16": 6e-6},
        split_name="recommender_pipeline",
    )  # fmt: skip


def costs(p: ModelProfile, s: Strategy) -> tuple[StageCost, ...]:
    return p.costs(s)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_shipped_topology_parses_with_its_gpus_memory_and_links(name: str) -> None:
    topology = topology_folder(name)
    assert len(topology.gpus) == GPUS[name] and all(
        g.memory.total_bytes > 16 * 1024 * MIB for g in topology.gpus
    )
    for a, b in itertools.permutations(topology.indices, 2):
        assert topology.link(a, b).gbs > 0
        assert topology.levels[(a, b)] == topology.levels[(b, a)]


def test_the_dgx1_mesh_has_two_nv2_and_two_nv1_peers_per_gpu_and_sys_elsewhere() -> None:
    topology = topology_folder("dgx1-v100")
    for gpu in topology.indices:
        levels = sorted(topology.levels[(gpu, other)] for other in topology.indices if other != gpu)
        assert levels == ["NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]


def test_bad_nvidia_smi_outputs_are_refused_with_the_reason() -> None:
    with pytest.raises(OptionError, match="header"):
        parse_gpus("index, name\n0, NVIDIA L4\n")
    with pytest.raises(OptionError, match="is not '<n> MiB'"):
        parse_gpus("index, name, memory.total [MiB], memory.used [MiB]\n0, NVIDIA L4, lots, 0 MiB\n")
    with pytest.raises(OptionError, match="names no GPU column"):
        parse_topo("\tCPU Affinity\nGPU0\t0-3\n")
    with pytest.raises(OptionError, match="no such folder, nor a shipped topology"):
        topology_folder("no-such-machine")


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_on_the_dgx1_every_replica_boundary_is_an_nvlink_pair_never_sys(replicas: int) -> None:
    topology, p = topology_folder("dgx1-v100"), profile()
    strategy = Strategy("hybrid" if replicas > 1 else "pipeline", "fp32", (1, 1), replicas)
    placement = place(strategy, costs(p, strategy), topology, SPLIT)
    levels = [link.level for links in placement.links for link in links]
    assert len(levels) == replicas and all(level in ("NV1", "NV2") for level in levels), levels
    if replicas <= 4:  # the mesh has four disjoint NV2 pairs: every replica gets one
        assert set(levels) == {"NV2"}
    gpus = [a.gpus[0] for a in placement.assignments]
    assert len(gpus) == len(set(gpus)) == 2 * replicas  # one stage per GPU: replicas spread evenly
    names = {a.model for a in placement.assignments}
    assert len(names) == 2 * replicas  # each replica its own stage models, pinned to its pair


def test_on_the_l4_server_the_boundaries_take_pix_then_phb_before_sys() -> None:
    topology, p = topology_folder("l4x4-pcie"), profile()
    one = place(Strategy("pipeline", "fp32", (1, 1)), costs(p, Strategy("pipeline", "fp32", (1, 1))),
                topology, SPLIT)  # fmt: skip
    assert [lk.level for lk in one.links[0]] == ["PIX"]
    two = Strategy("hybrid", "fp32", (1, 1), 2)
    placed = place(two, costs(p, two), topology, SPLIT)
    assert sorted(lk.level for links in placed.links for lk in links) == ["PHB", "PIX"]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_headroom_one_instance_fits_below_80_percent_and_one_more_does_not(name: str) -> None:
    """Memory per instance of 45% of the GPU: one instance stays within 80%, two do not."""
    topology = topology_folder(name)
    per_instance = 0.45 * topology.gpus[0].memory.total_bytes / MIB
    p = profile(memory_mib=per_instance)
    one = Strategy("data", "fp32", (1,), len(topology.gpus))
    placed = place(one, costs(p, one), topology, SPLIT)
    for device, planned in placed.memory.items():
        memory = topology.gpu(device).memory
        assert (memory.used_bytes + planned) / memory.total_bytes <= 0.80
    assert server_flags(placed) == [f"--model-load-gpu-limit={g}:0.80" for g in topology.indices]
    with pytest.raises(PlacementError, match=r"over memory: GPU0 needs .* MiB within 80%"):
        two = Strategy("data", "fp32", (2,), 1)
        place(two, costs(p, two), topology, SPLIT)


def test_memory_already_in_use_counts_against_the_headroom() -> None:
    topology = topology_folder("hgx-h200")
    busy = dataclasses.replace(topology.gpus[0], memory=dataclasses.replace(topology.gpus[0].memory,
                               used_bytes=int(0.5 * topology.gpus[0].memory.total_bytes)))  # fmt: skip
    topology = dataclasses.replace(topology, gpus=(busy, *topology.gpus[1:]))
    p = profile(memory_mib=0.45 * busy.memory.total_bytes / MIB)
    strategy = Strategy("data", "fp32", (1,), 7)
    placed = place(strategy, costs(p, strategy), topology, SPLIT)
    assert 0 not in placed.assignments[0].gpus  # the busy GPU is the one left out
    with pytest.raises(PlacementError, match="GPU0 needs"):
        place(Strategy("data", "fp32", (1,), 8), costs(p, strategy), topology, SPLIT)


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_the_planner_picks_a_placed_strategy_on_every_fixture_and_says_why_the_others_lost(name: str) -> None:
    topology = topology_folder(name)
    result = plan(profile(), topology, PlanRequest(10.0, space=NARROW, predict_s=0.5))
    chosen = result.chosen
    assert chosen.feasible and chosen.placement is not None and chosen.reason == ""
    assert chosen.rate == max(j.rate for j in result.judged if j.feasible)
    assert all(j.reason for j in result.judged[1:])
    used = {g for a in chosen.placement.assignments for g in a.gpus}
    assert used <= set(topology.indices)
    for judged in result.judged:
        if judged.placement is not None:
            for device, planned in judged.placement.memory.items():
                assert topology.gpu(device).memory.fits(planned)


def test_the_accuracy_tolerance_removes_the_fp16_variants() -> None:
    result = plan(profile(), topology_folder("l4x4-pcie"), PlanRequest(10.0, 1e-6, NARROW, 0.5))
    refused = [j for j in result.judged if j.strategy.precision == "fp16"]
    assert refused and all("over the accuracy tolerance" in j.reason for j in refused)
    assert result.chosen.strategy.precision == "fp32"


def with_int8(p: ModelProfile, max_rel: float) -> ModelProfile:
    """``p`` with an int8 whole model twice as fast as fp32, measured at ``max_rel`` against fp32."""
    int8 = StageCost("recommender_int8", 2e-4, 1e-5, p.whole["fp32"].memory_bytes // 4)
    return dataclasses.replace(
        p, whole={**p.whole, "int8": int8}, accuracy={**p.accuracy, "whole/int8": max_rel}
    )


def test_int8_is_planned_only_where_the_spec_serves_the_model_in_int8() -> None:
    spec = load_spec(SPEC)
    whole = whole_variants(spec, spec.model("recommender"))  # models.yaml has recommender_int8
    assert set(whole) == {"fp32", "fp16", "int8"}
    int8 = whole["int8"]
    assert int8.name == "recommender_int8" and int8.precision == "int8"
    assert {t.dtype for t in int8.inputs + int8.outputs} == {"fp32", "int64"}  # int8 keeps fp32 tensors
    assert set(whole_variants(spec, spec.model("trivial"))) == {"fp32", "fp16"}  # no trivial_int8


def test_int8_is_a_data_parallel_precision_and_wins_within_the_tolerance() -> None:
    p = with_int8(profile(), max_rel=0.02)
    assert p.precisions("data") == ("fp32", "fp16", "int8") and p.precisions("pipeline") == ("fp32", "fp16")
    assert {s.precision for s in strategies(p, 0, NARROW) if s.kind == "data"} == {"fp32", "fp16", "int8"}
    topology = cpu_topology()
    assert plan(p, topology, PlanRequest(10.0, None, NARROW, 0.5)).chosen.strategy.precision == "int8"
    strict = plan(p, topology, PlanRequest(10.0, 1e-3, NARROW, 0.5))
    refused = [j for j in strict.judged if j.strategy.precision == "int8"]
    assert refused and all("over the accuracy tolerance" in j.reason for j in refused)
    assert strict.chosen.strategy.precision in ("fp32", "fp16")


def test_a_slow_link_makes_a_split_link_bound() -> None:
    """256 KiB per sample over SYS (7.9 GB/s on a V100) carries fewer samples than the stages compute."""
    p = profile(boundary=256 * 1024)
    topology = topology_folder("dgx1-v100")
    two = Strategy("pipeline", "fp32", (1, 1))
    placed = place(two, costs(p, two), topology, SPLIT)
    sys_link = dataclasses.replace(placed, links=((topology.link(0, 5),),))
    from perf.plan.planner import Predictor

    assert "link-bound" in Predictor(two, p, sys_link, PlanRequest(10.0)).link_bound()
    assert Predictor(two, p, placed, PlanRequest(10.0)).link_bound() == ""  # its NV2 pair carries it


def test_nothing_fits_is_a_clear_error() -> None:
    with pytest.raises(PlacementError, match="no strategy fits within p99 10 ms on l4x4-pcie: over memory"):
        plan(profile(memory_mib=64 * 1024), topology_folder("l4x4-pcie"), PlanRequest(10.0, space=NARROW))


@pytest.mark.parametrize("kind", ["data", "hybrid"])
def test_the_overlay_validates_and_builds_the_placed_configs(kind: str, tmp_path: Path) -> None:
    topology = topology_folder("dgx1-v100")
    spec, p = load_spec(SPEC), profile()
    strategy = (
        Strategy("data", "fp16", (2,), 4, 1000)
        if kind == "data"
        else Strategy("hybrid", "fp16", (1, 2), 2, 1000)
    )
    placed = place(strategy, costs(p, strategy), topology, SPLIT)
    overlay = plan_overlay(base_document(SPEC), spec, "recommender", strategy, placed, on_gpu=True)
    planned = write_plan_overlay(SPEC, overlay, tmp_path, "test")
    assert (tmp_path / "overlay.yaml").is_file() and (tmp_path / "spec.planned.yaml").is_file()
    if kind == "data":
        model = planned.model("recommender_fp16")
        assert [a.model for a in placed.assignments] == [model.name]  # placement names what is served
        on_cpu = place(strategy, costs(p, strategy), cpu_topology(), SPLIT)
        assert [a.model for a in on_cpu.assignments] == [model.name]
        config = build_model_config(model, num_gpus=8)
        assert [(g.count, list(g.gpus)) for g in config.instance_group] == [
            (2, [g]) for g in placed.assignments[0].gpus
        ]
        assert config.dynamic_batching.max_queue_delay_microseconds == 1000
        return
    for replica in range(2):
        pipeline = planned.pipeline(f"recommender_pipeline_r{replica}")
        assert pipeline.boundary_dtype == "fp16" and pipeline.replicas == (1, 2)
        groups = [stage_placement(pipeline, planned.model("recommender"), k, 8)[0] for k in range(2)]
        expected = [a for a in placed.assignments if a.replica == replica]
        assert [a.model for a in expected] == list(pipeline.stage_names)  # placement names what is served
        assert [(g.count, list(g.gpus)) for g in groups] == [(a.instances, list(a.gpus)) for a in expected]
        assert topology.levels[tuple(pipeline.gpus)] == "NV2"


def test_an_overlay_model_the_base_lacks_joins_it() -> None:
    merged = merge({"models": [{"name": "a"}]}, {"models": [{"name": "a", "x": 1}, {"name": "b"}]})
    assert merged["models"] == [{"name": "a", "x": 1}, {"name": "b"}]


def test_the_fixtures_folder_holds_the_shipped_machines() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(FIXTURE_NAMES)
