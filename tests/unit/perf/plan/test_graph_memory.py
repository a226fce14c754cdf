"""Planning from the graph, not from a build: memory counted on the meta device (exact parameters,
fp16's credit at any size), the CUDA context per GPU, embedding tables packed over GPUs with their
exchange in the prediction, generic link figures for a GPU the table does not name, and ``MODEL=``
naming a pipeline."""

from __future__ import annotations

import dataclasses
import io
import resource
from pathlib import Path

import pytest
from rich.console import Console

from exporters.repository import build_repository
from exporters.resolve import load_spec
from exporters.schema.models import Spec
from exporters.sources.load import build_torch_model
from perf.cli import parser
from perf.errors import OptionError
from perf.model.links import GENERIC_NVLINK_GBS, PCIE_GBS, link_for
from perf.model.memory import GENERIC_CONTEXT_MIB, MIB, context_bytes
from perf.plan import graph_memory as graph
from perf.plan import placement as placement_module
from perf.plan.cli import command_plan
from perf.plan.document import PlanDocument
from perf.plan.graph_memory import (
    FLOAT_BYTES,
    Table,
    compute_proxy,
    graph_memory,
    onnx_instance_bytes,
    too_big_to_build,
)
from perf.plan.placement import PlacementError, exchange, pack_tables, place
from perf.plan.planner import PlanRequest, Predictor, plan
from perf.plan.profile import plan_target
from perf.plan.strategy import (
    ModelProfile,
    Space,
    StageCost,
    Strategy,
    precision_variant,
    split_variants,
    strategies,
)
from perf.plan.topology import cpu_topology, topology_folder
from perf.saved import load_document

ROOT = Path(__file__).resolve().parents[4]
SPEC = load_spec(ROOT / "models.yaml")
BIG_SPEC = ROOT / "examples" / "plan" / "recommender_40gb.yaml"
NARROW = Space(instances=(1,), delays_us=(0,), split=False)
GB = 10**9


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["recommender", "image_classifier"])
def test_the_graph_counts_exactly_the_parameters_of_the_built_model(name: str) -> None:
    spec = SPEC.model(name)
    memory = graph_memory(spec)
    counted = memory.weights + memory.other + sum(t.rows * t.dim for t in memory.tables)
    built = build_torch_model(spec)
    buffers = sum(b.numel() for b in built.buffers() if b.is_floating_point())
    assert counted == _parameters(built) + buffers
    assert memory.parameter_bytes("fp32") == 4 * counted


def test_an_exported_onnx_file_is_counted_as_the_torch_graph_counts_it(tmp_path: Path) -> None:
    """Two independent counts agree: the export's initializers and shape inference (what a source
    without a torch module gets) and the meta-device module, in fp32 and fp16."""

    base = SPEC.model("recommender")
    models = tuple(precision_variant(base, p) for p in ("fp32", "fp16"))
    built = {b.spec.precision: b.artifact.path for b in build_repository(Spec(models=models), tmp_path, 0)}
    memory = graph_memory(base)
    for precision, path in built.items():
        counted = onnx_instance_bytes(path, base.max_batch_size)
        assert counted == pytest.approx(memory.instance_bytes(precision), rel=0.03), precision
    assert onnx_instance_bytes(built["fp16"], 64) < 0.55 * onnx_instance_bytes(built["fp32"], 64)


def test_fp16_halves_every_float_byte_even_for_a_tiny_model() -> None:
    memory = graph_memory(SPEC.model("recommender"))
    fixed = memory.fixed_bytes
    assert memory.instance_bytes("fp16") - fixed == (memory.instance_bytes("fp32") - fixed) // 2
    # int8 quantizes the weighted ops' weights only: the tables keep 4 bytes an element
    assert memory.parameter_bytes("int8") == memory.weights + 4 * (memory.other + sum(
        t.rows * t.dim for t in memory.tables))  # fmt: skip


def test_the_recommender_tables_are_found_with_their_lookups_per_request() -> None:
    memory = graph_memory(SPEC.model("recommender"))
    assert [t.rows for t in memory.tables] == [10_000, 5_000, 2_000, 1_000, 500, 100, 50, 10]
    assert all(t.dim == 32 and t.lookups == 1.0 for t in memory.tables)
    assert not memory.tables_dominate  # 0.6 M table elements against 1.9 M dense weights


def test_a_40_gb_recommender_is_counted_without_allocating_it() -> None:
    big = load_spec(BIG_SPEC).model("recommender_40gb")
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    memory = graph_memory(big)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert memory.table_bytes("fp32") == 40 * GB
    assert memory.tables_dominate
    assert grown_kib < 1024 * 1024  # well below a GiB: nothing of the 40 GB was materialised
    assert "too big to build here" in too_big_to_build(big, memory)
    proxy = compute_proxy(big)
    assert proxy is not None and max(proxy.options["table_sizes"]) <= 10_000
    assert too_big_to_build(proxy, graph_memory(proxy)) == ""


def test_tables_pack_largest_first_onto_the_gpu_with_most_room() -> None:
    tables = tuple(Table(f"t{k}", rows, 1) for k, rows in enumerate([10, 7, 6, 3, 2]))  # 4 bytes a row
    packed = pack_tables(tables, {0: 60, 1: 60}, "fp32")
    # t0 (40) → GPU0; t1 (28) and t2 (24) → GPU1 (more room); t3, t4 → the GPU with more room then
    assert {g: [t.name for t in ts] for g, ts in packed.items()} == {0: ["t0", "t3", "t4"], 1: ["t1", "t2"]}
    with pytest.raises(PlacementError, match=r"table t0 .* fits no GPU's room"):
        pack_tables(tables, {0: 36, 1: 36}, "fp32")


def test_the_exchange_is_the_remote_rows_over_the_slowest_link() -> None:
    topology = topology_folder("l4x4-pcie")
    tables = {0: (Table("a", 100, 128, 1.0),), 1: (Table("b", 100, 128, 2.0),), 2: (), 3: ()}
    found = exchange(tables, topology.link, "fp16")
    # GPU2 and GPU3 receive both tables' rows (3 rows of 128 fp16) across the sockets (SYS)
    assert found.bytes_per_sample == 3 * 128 * FLOAT_BYTES["fp16"]
    assert found.link.level == "SYS"


def _table_profile(total_gb: float, dense_mib: float = 200) -> ModelProfile:
    """A recommender whose tables total ``total_gb`` in fp32, its dense part ``dense_mib``."""
    tables = tuple(Table(f"embed.tables.{k}", int(total_gb * GB / 4 / 128 / 8), 128) for k in range(8))
    table_bytes = sum(t.bytes("fp32") for t in tables)
    dense = int(dense_mib * MIB)
    return ModelProfile(
        "recommender_40gb", 64,
        whole={"fp32": StageCost("recommender_40gb", 4e-4, 2e-5, table_bytes + dense),
               "fp16": StageCost("recommender_40gb_fp16", 3e-4, 1e-5, table_bytes // 2 + dense // 2)},
        stages={}, accuracy={}, tables=tables,
    )  # fmt: skip


def test_a_40_gb_model_is_planned_over_the_l4s_with_its_tables_within_80_percent() -> None:
    topology = topology_folder("l4x4-pcie")
    profile = _table_profile(40)
    chosen = plan(profile, topology, PlanRequest(50.0, space=NARROW))
    assert chosen.chosen.strategy.kind == "sharded"
    placement = chosen.chosen.placement
    assert placement is not None and placement.exchange is not None
    placed_tables = [name for names in placement.tables.values() for name in names]
    assert sorted(placed_tables) == sorted(t.name for t in profile.tables)
    for gpu, planned in placement.memory.items():
        memory = topology.gpu(gpu).memory
        assert (memory.used_bytes + planned) / memory.total_bytes <= 0.80
    whole = [j for j in chosen.judged if j.strategy.kind == "data"]
    assert whole and all(j.reason.startswith("over memory") for j in whole)
    # the exchange costs: the same strategy with free links would be predicted faster
    assert chosen.chosen.best is not None


def test_the_exchange_slows_the_prediction() -> None:
    topology = topology_folder("l4x4-pcie")
    profile = _table_profile(40)
    strategy = Strategy("sharded", "fp16", (1,), 4, 0, 64)

    placement = place(strategy, profile.costs(strategy), topology, ("", ()), profile.tables)
    with_links = Predictor(strategy, profile, placement, PlanRequest(50.0))
    free = Predictor(strategy, profile, dataclasses.replace(placement, exchange=None), PlanRequest(50.0))
    assert with_links.bound < free.bound


def test_the_cuda_context_is_counted_once_per_gpu_used() -> None:
    topology = topology_folder("hgx-h200")
    cost = StageCost("m", 1e-3, 1e-5, 100 * MIB)
    placed = place(Strategy("data", "fp32", (2,), 2), (cost,), topology)
    assert set(placed.memory.values()) == {2 * 100 * MIB + context_bytes("NVIDIA H200")}
    assert context_bytes("NVIDIA H200") > 0
    assert context_bytes("NVIDIA RTX A6000") == GENERIC_CONTEXT_MIB * MIB


def test_tables_too_big_for_every_gpu_together_are_over_memory() -> None:
    with pytest.raises(PlacementError, match="over memory"):
        plan(_table_profile(200), topology_folder("l4x4-pcie"), PlanRequest(50.0, space=NARROW))


def test_an_unknown_gpu_takes_the_generic_figures_of_its_link_type() -> None:
    assert link_for("PIX", "Radeon").gbs == PCIE_GBS["gen4"] and link_for("PIX", "Radeon").generic
    assert link_for("NV4", "NVIDIA RTX A6000").gbs == 4 * GENERIC_NVLINK_GBS
    assert link_for("SYS", "NVIDIA T4").gbs == PCIE_GBS["gen4"] / 2
    assert not link_for("PIX", "NVIDIA L4").generic
    with pytest.raises(OptionError, match="unknown link level"):
        link_for("NVx", "NVIDIA RTX A6000")


def test_a_topology_of_rtx_a6000s_plans_and_says_its_figures_are_generic() -> None:
    topology = topology_folder("a6000x4-pcie")
    assert [g.memory.total_bytes for g in topology.gpus] == [49140 * MIB] * 4
    assert any("generic" in w and "RTX A6000" in w for w in topology.warnings)
    assert topology.link(0, 1).label == "PIX (31.5 GB/s, generic)"
    chosen = plan(_table_profile(40), topology, PlanRequest(50.0, space=NARROW))
    assert chosen.chosen.feasible


def test_model_accepts_a_pipeline_name() -> None:
    assert plan_target(SPEC, "recommender") == (SPEC, "recommender")
    assert plan_target(SPEC, "recommender_pipeline")[1] == "recommender"
    spec, model = plan_target(SPEC, "image_classifier_pipeline_fp16")  # the model's second pipeline
    assert model == "image_classifier"
    assert next(p.name for p in spec.pipelines if p.model == model) == "image_classifier_pipeline_fp16"
    assert {p.name for p in split_variants(spec, model).values()} == {
        "image_classifier_pipeline_fp16_fp32",
        "image_classifier_pipeline_fp16_fp16",
    }
    with pytest.raises(OptionError, match="no model or pipeline named 'nope'"):
        plan_target(SPEC, "nope")


def test_sharded_strategies_appear_only_with_tables_and_several_gpus() -> None:
    profile = _table_profile(40)
    assert any(s.kind == "sharded" for s in strategies(profile, 4, NARROW))
    assert not any(s.kind == "sharded" for s in strategies(profile, 1, NARROW))
    no_tables = dataclasses.replace(profile, tables=())
    assert not any(s.kind == "sharded" for s in strategies(no_tables, 4, NARROW))


HOST_24_GIB = 24 * 1024 * MIB


@pytest.fixture
def small_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host as the project's 24 GiB machine, whatever runs the test."""
    monkeypatch.setattr(graph, "host_memory_bytes", lambda: HOST_24_GIB)
    monkeypatch.setattr(placement_module, "host_memory_bytes", lambda: HOST_24_GIB)


def test_a_cpu_plan_bigger_than_the_host_is_over_memory(small_host: None) -> None:
    with pytest.raises(PlacementError, match="over memory: the CPU needs"):
        plan(_table_profile(60), cpu_topology(), PlanRequest(50.0, space=NARROW))  # fp16: 30 GB
    fits = plan(_table_profile(30), cpu_topology(), PlanRequest(50.0, space=NARROW))  # fp16: 15 GB
    assert fits.chosen.strategy.precision == "fp16"


def _run_plan(tmp_path: Path, *options: str) -> tuple[int, str]:
    folders = ["--reports", str(tmp_path / "reports"), "--workdir", str(tmp_path / "work")]
    small = ["--no-split", "--instances", "1", "--delays-us", "0", "--predict-s", "1"]
    argv = ["plan", "--spec", str(BIG_SPEC), "--model", "recommender_40gb", "--p99-ms", "50"]
    argv += [*small, *folders, *options]
    out = io.StringIO()
    code = command_plan(parser().parse_args(argv), Console(file=out, width=300))
    return code, out.getvalue()


def test_make_plan_places_the_40_gb_recommender_over_the_l4s_without_building_it(
    tmp_path: Path, small_host: None
) -> None:
    code, printed = _run_plan(tmp_path, "--topology", "l4x4-pcie")
    assert code == 0, printed
    (folder,) = (tmp_path / "reports").glob("*-plan")
    saved = load_document(folder / "plan.json", PlanDocument)
    assert saved.chosen.kind == "sharded" and not saved.overlay_written
    placed = [a.model for a in saved.placement if a.stage == 1]
    assert sorted(name for entry in placed for name in entry.removeprefix("tables ").split(", ")) == sorted(
        f"embed.tables.{k}" for k in range(8)
    )
    totals = {g.index: g.memory_mib for g in saved.topology.gpus}
    for device, mib in saved.chosen.memory_mib.items():
        assert mib <= 0.80 * totals[int(device.removeprefix("GPU"))]
    assert "too big to build here" in saved.compute_source
    assert "counted from the graph" in saved.memory_source
    assert not (folder / "spec.planned.yaml").exists()  # the spec cannot serve tables apart yet
    report = (folder / "report.md").read_text()
    assert "No spec overlay was written" in report and "`overlay.yaml`" not in report
    # the proxy was built, the 40 GB model never: its largest export is a few MiB
    exported = [p.stat().st_size for p in (tmp_path / "work").rglob("*.onnx")]
    assert exported and max(exported) < 64 * MIB


def test_make_plan_counts_the_model_s_graph_once(
    tmp_path: Path, small_host: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the model is too big to build (which decides if the server measures) and the profile's
    memory per instance come from one count of its graph, not one each."""
    counted: list[str] = []

    def counting(spec):
        counted.append(spec.name)
        return graph_memory(spec)

    monkeypatch.setattr(graph, "graph_memory", counting)
    code, printed = _run_plan(tmp_path, "--topology", "l4x4-pcie")
    assert code == 0, printed
    assert counted == ["recommender_40gb"]


def test_make_plan_on_this_cpu_skips_the_server_runs_of_a_model_too_big_to_build(
    tmp_path: Path, small_host: None
) -> None:
    code, printed = _run_plan(tmp_path, "--verify", "1")
    assert "no probe or verification on the server" in printed and "too big to build here" in printed
    assert code == 0, printed
    (folder,) = (tmp_path / "reports").glob("*-plan")
    saved = load_document(folder / "plan.json", PlanDocument)
    assert saved.verification == ()
    assert saved.chosen.precision == "fp16"  # fp32's 40 GB is over 80% of the host; fp16's 20 GB is not
