"""A GPU plan says where its figures come from: without a recorded GPU compute profile its rates are
predicted from this host's CPU compute, and its headline says so in the same sentence as the rate; with
one (``--compute-profile``, the GPU check's figures file or the profile alone) the named model's compute
is the recorded one. A profile with a wrong field is refused in one line naming it (exit status 2)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_USAGE, OptionError
from perf.plan.cli import THE_SETUP, PlanSetup
from perf.plan.compute_profile import compute_origin, read_compute_profile
from perf.plan.document import PlanDocument
from perf.plan.profile import with_recorded
from perf.plan.topology import Topology
from perf.saved import load_document
from tests.unit.perf.plan.test_placement import profile

FIXTURES = Path(__file__).resolve().parents[3] / "data" / "compute_profile"
WHOLE_FILE, PROFILE_ONLY = FIXTURES / "gpu_check_figures.json", FIXTURES / "profile_only.json"


def test_the_gpu_checks_figures_file_and_the_profile_alone_read_the_same() -> None:
    whole, alone = read_compute_profile(WHOLE_FILE), read_compute_profile(PROFILE_ONLY)
    assert whole == alone and whole.device == "NVIDIA H200"
    fp32 = whole.of("recommender", "here")["fp32"]
    assert (fp32.T_ms, fp32.dt_ms, fp32.batches[64]) == (0.12, 0.002, 0.246)
    with pytest.raises(OptionError, match=r"no figures for model 'vit' \(it has: recommender\)"):
        whole.of("vit", "--compute-profile x.json")


def test_the_figures_file_the_gpu_check_writes_is_read_as_its_profile(tmp_path: Path) -> None:
    """The GPU check's own writer (not a fixture shaped like it): what ``make gpu-check`` leaves is what
    ``--compute-profile`` reads, each precision's fit and batches as the check recorded them."""
    from gpucheck import report
    from gpucheck.grid import GPU
    from gpucheck.machine import MachineFacts
    from gpucheck.raw import RawCurve
    from perf.model.latency import fit_latency

    points = {"fp32": {1: 0.2, 8: 0.27, 64: 0.83}, "fp16": {1: 0.1, 8: 0.135, 64: 0.415}}
    raw = {
        ("recommender", precision): RawCurve(
            "recommender", precision, "cuda:0", batches, fit_latency(batches)
        )
        for precision, batches in points.items()
    }
    facts = MachineFacts(
        "3.12", "2.13.0", "13.0", "2.5", "1.30", ["CUDAExecutionProvider"], "NVIDIA H200", True
    )
    report.write(tmp_path, report.figures(GPU, facts, {"raw": {"status": "ok", "seconds": 1.0}}, raw, 1.0))
    recorded = read_compute_profile(tmp_path / report.FIGURES).of("recommender", "here")
    assert set(recorded) == {"fp32", "fp16"}
    for precision, batches in points.items():
        fit = raw["recommender", precision].fit
        assert recorded[precision].batches == batches
        assert (recorded[precision].T_ms, recorded[precision].dt_ms) == pytest.approx((fit.t_ms, fit.dt_ms))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            lambda p: p["models"]["recommender"]["fp32"].update(T_ms="fast"),
            r"models\.recommender\.fp32\.T_ms",
        ),
        (lambda p: p["models"]["recommender"]["fp32"].update(Tms=0.1), r"models\.recommender\.fp32\.Tms"),
        (lambda p: p["models"]["recommender"].update(fp64=p["models"]["recommender"]["fp32"]), r"fp64"),
        (lambda p: p["models"]["recommender"]["fp16"].update(T_ms=-1), r"T_ms must be > 0, got -1"),
        (lambda p: p.pop("device"), r"device: Field required"),
    ],
)
def test_a_profile_with_a_wrong_field_is_refused_naming_it(change, named: str, tmp_path: Path) -> None:
    data = json.loads(WHOLE_FILE.read_text())
    change(data["compute_profile"])
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(data))
    with pytest.raises(OptionError, match=named) as caught:
        read_compute_profile(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_the_recorded_compute_replaces_this_hosts_and_a_missing_precision_is_scaled() -> None:
    recorded = read_compute_profile(PROFILE_ONLY)
    figures = recorded.of("recommender", "here")
    del figures["fp16"]  # only fp32 recorded: fp16 follows this host's fp16/fp32 ratio
    here = profile().whole
    whole, source = with_recorded(here, figures, recorded)
    assert whole["fp32"].t_s == pytest.approx(0.12e-3) and whole["fp32"].dt_s == pytest.approx(0.002e-3)
    assert whole["fp16"].t_s == pytest.approx(here["fp16"].t_s * 0.12e-3 / here["fp32"].t_s)
    assert whole["fp32"].memory_bytes == here["fp32"].memory_bytes  # memory is the graph's, not timed
    assert source.startswith("the compute profile recorded on NVIDIA H200 (test fixture")
    assert "fp16 scaled from its fp32 by this host's ratio" in source


def test_the_origin_names_where_the_compute_was_measured_against_the_gpus_planned_for() -> None:
    a6000s = ["NVIDIA RTX A6000"] * 4
    assert compute_origin("this host's CPU", False, a6000s, here=False) == (
        "from compute measured on this host's CPU, not on the 4× NVIDIA RTX A6000 named"
    )
    h200s = ["NVIDIA H200"] * 8
    assert compute_origin("NVIDIA H200", True, h200s, here=False) == (
        "from the compute profile recorded on NVIDIA H200"
    )
    assert compute_origin("NVIDIA H200", True, a6000s, here=False).endswith(
        "not on the 4× NVIDIA RTX A6000 named"
    )
    assert (
        compute_origin("this host's CPU", False, [], here=True) == "from compute measured on this host's CPU"
    )


def planned(
    tmp_path: Path, *extra: str, live_topology: Callable[[], Topology | None] = THE_SETUP.live_topology
) -> tuple[int, PlanDocument | None]:
    """``make plan`` on a recorded topology, the variants' build and timing replaced by fixed figures
    (the recorded profile applied to them as the real profile does)."""

    def measured(spec, model, repository, split, probed, providers, device, recorded=None, counted=None):
        fixed = profile()
        if recorded is None:
            return dataclasses.replace(fixed, compute_source=f"onnxruntime in-process on {device}")
        whole, source = with_recorded(fixed.whole, recorded.of(model, "--compute-profile"), recorded)
        return dataclasses.replace(fixed, whole=whole, compute_source=source)

    setup = PlanSetup(live_topology=live_topology, measure_profile=measured)
    reports = tmp_path / "reports"
    argv = ["plan", "--model", "recommender", "--p99-ms", "10", "--no-split", "--instances", "1",
            "--delays-us", "0", "--predict-s", "0.5", "--reports", str(reports), *extra]  # fmt: skip
    code = main(argv, PerfSetup(Console(width=300), plan=setup))
    folders = list(reports.glob("*-plan")) if reports.exists() else []
    return code, load_document(folders[0] / "plan.json", PlanDocument) if folders and code == 0 else None


def test_a_gpu_plan_without_a_profile_says_its_rate_comes_from_this_hosts_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, saved = planned(tmp_path, "--topology", "a6000x4-pcie")
    assert code == 0 and saved is not None and saved.measured_rate is None
    report = (next((tmp_path / "reports").glob("*-plan")) / "report.md").read_text()
    headline = next(line for line in report.splitlines() if line.startswith("Chosen: "))
    rate = re.search(r"up to ([\d,]+) requests/s predicted from compute measured on this host's CPU, not on "
                     r"the 4× NVIDIA RTX A6000 named", headline)  # fmt: skip
    assert rate and float(rate[1].replace(",", "")) == pytest.approx(saved.chosen.rate, abs=1)
    printed = capsys.readouterr().out
    assert (
        "predicted from compute measured on this host's CPU, not on the 4× NVIDIA RTX A6000 named" in printed
    )


def test_a_gpu_plan_with_a_recorded_profile_predicts_from_it_and_says_so(tmp_path: Path) -> None:
    _, cpu = planned(tmp_path / "cpu", "--topology", "hgx-h200")
    code, gpu = planned(tmp_path / "gpu", "--topology", "hgx-h200", "--compute-profile", str(WHOLE_FILE))
    assert code == 0 and gpu is not None and cpu is not None
    assert gpu.compute_origin == "from the compute profile recorded on NVIDIA H200"
    assert gpu.compute_source.startswith("the compute profile recorded on NVIDIA H200")
    assert gpu.chosen.rate != cpu.chosen.rate  # the recorded compute, not this host's, behind the rate
    report = (next((tmp_path / "gpu" / "reports").glob("*-plan")) / "report.md").read_text()
    assert re.search(r"requests/s predicted from the compute profile recorded on NVIDIA H200 \(p99", report)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            ["--topology", "hgx-h200", "--compute-profile", "missing.json"],
            "missing.json: no such file; a compute profile is the figures JSON `make gpu-check` writes",
        ),
        ([], "--compute-profile gives a GPU's compute: plan for a GPU topology"),
    ],
)
def test_a_profile_that_cannot_be_used_is_a_usage_error_before_any_report_folder(
    extra: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    here = THE_SETUP.live_topology
    if not extra:  # this host's CPU (no GPU here), with a GPU's profile
        extra, here = ["--compute-profile", str(WHOLE_FILE)], lambda: None
    code, _ = planned(tmp_path, *extra, live_topology=here)
    assert code == EXIT_USAGE == 2
    printed = capsys.readouterr()
    assert said in printed.out + printed.err
    assert not (tmp_path / "reports").exists() or not list((tmp_path / "reports").iterdir())
