"""Your own models from ``exporters init`` through ``make serve`` and ``make perf``, each command run as a
user runs it, in a project folder of its own (its own ``.run/``):

* the Conv1d+GRU factory: ``init``, ``build``, ``server start --spec`` (as ``make serve`` runs it);
  ``client stats`` before any request shows no traffic (the warm-up Triton ran at load is subtracted,
  counts and times), ``client infer`` without ``--spec`` finds the spec ``make serve`` recorded and
  matches the factory, ``client stats`` then counts exactly that request, and ``client health`` into a
  reader that has gone (``| head``) ends quietly instead of reading as an unreachable server;
* ``make perf`` of two models at once (``MODELS=conv_gru,unet``: the GRU and a UNet-shaped ONNX file
  whose sides must be multiples of 32, written by ``init``): every model's goals, named by model in
  the report and on the console; static batching of the GRU's variable lengths pads each batch to its
  longest and says so; no bucket set is offered for the GRU (padding moves its state) and the shapes
  report says why; no figure of any report is NaN or negative.

Short settings; no figure is judged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from perf.cli import main as perf_main
from tests.faults.harness import start_arguments

# A hang guard, not a speed check: many times the slowest test here (make perf of two own models) on a
# loaded two-core host.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
FACTORIES = ROOT / "tests" / "data" / "own_factories"
COMMAND_TIMEOUT_S = 600  # a hang guard for one command on a busy machine, not a bound
NEGATIVE_FIGURE = re.compile(r"(?<![\w.\-−])-\d+(\.\d+)?(?![\d%])")


def _environment() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m <args>`` in ``folder``, importing this tree's code."""
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=folder, env=_environment(), capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip


def _init(folder: Path, *args: str) -> dict:
    done = _run(folder, "exporters", "init", "--max-batch-size", "8", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    (entry,) = yaml.safe_load(done.stdout)["models"]
    return entry


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: a UNet-shaped ONNX file, ``own.yaml`` written by ``exporters init`` from it and
    from the GRU factory."""
    folder = tmp_path_factory.mktemp("own_flow")
    sys.path.insert(0, str(FACTORIES))
    from factories import tiny_unet

    torch.manual_seed(0)
    axes = {0: "batch", 2: "height", 3: "width"}
    torch.onnx.export(
        tiny_unet().eval(), (torch.randn(1, 3, 64, 64),), str(folder / "unet.onnx"), input_names=["image"],
        output_names=["mask"], dynamic_axes={"image": axes, "mask": axes}, opset_version=17, dynamo=False,
    )  # fmt: skip
    gru = _init(
        folder, "--python", "factories:sequence_gru", "--path", str(FACTORIES), "--sample",
        "factories:sequence_sample", "--max-length", "200", "--name", "conv_gru",
    )  # fmt: skip
    unet = _init(folder, "--onnx", "unet.onnx", "--max-length", "80")
    assert unet["lengths"] == [32, 64] and unet["inputs"][0]["max_shape"] == [3, 64, 64]  # tried by init
    (folder / "own.yaml").write_text(yaml.safe_dump({"models": [gru, unet]}, sort_keys=False))
    return folder


def _stats_line(folder: Path) -> str:
    done = _run(folder, "client", "stats", "--model", "conv_gru")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()[0]


def test_a_factory_from_init_through_serve_with_its_own_statistics(project: Path) -> None:
    built = _run(project, "exporters", "build", "--spec", "own.yaml", "--repository", "own_repository",
                 "--models", "conv_gru")  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    ports = start_arguments()
    started = _run(project, "server", "start", "--repository", "own_repository", "--spec", "own.yaml", *ports)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        state = json.loads((project / ".run" / "server.json").read_text())
        assert state["spec"] == str(project / "own.yaml") and "conv_gru" in state["warmup"]
        before = _stats_line(project)  # nothing sent yet: the warm-up is not traffic
        assert before.startswith("conv_gru v1: 0 inferences in 0 executions"), before
        assert "without the warm-up Triton ran at load (1 inferences, subtracted)" in before
        assert "compute 0.000 ms/req" in before
        checked = _run(project, "client", "infer", "--model", "conv_gru", "--batch", "3", "--check")
        assert checked.returncode == 0 and "match: max abs error" in checked.stdout, (
            checked.stdout + checked.stderr
        )
        after = _stats_line(project)
        assert after.startswith("conv_gru v1: 3 inferences in 1 executions (mean batch 3.00)"), after

        health = subprocess.Popen(
            [sys.executable, "-m", "client", "health", "conv_gru"], cwd=project, env=_environment(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        health.stdout.close()  # `| head` that has gone before the answer is printed
        _, error = health.communicate(timeout=COMMAND_TIMEOUT_S)
        assert health.returncode == 141 and b"cannot reach the server" not in error, error
    finally:
        stopped = _run(project, "server", "stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def test_make_perf_of_two_own_models(project: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = perf_main([
        "run", "--profile", "smoke", "--spec", str(project / "own.yaml"), "--models", "conv_gru,unet",
        "--reports", str(tmp_path / "reports"),
    ])  # fmt: skip
    console = capsys.readouterr().out
    (folder,) = (tmp_path / "reports").iterdir()
    assert code == 0, console
    report = (folder / "report.md").read_text()
    shapes = (folder / "shapes.md").read_text()
    for text in (report, shapes):
        assert not re.search(r"\bnan\b", text, re.IGNORECASE) and not NEGATIVE_FIGURE.search(text), (
            NEGATIVE_FIGURE.search(text)
        )
    # every model's goals, named by model, in the report and on the console
    goals = report[report.index("## Goals") : report.index("## conv_gru")]
    assert goals.splitlines()[2].startswith("| model | goal |")
    for model in ("conv_gru", "unet"):
        assert f"\n| {model} | dynamic vs none |" in goals and f"## {model}" in report
        assert re.search(rf"│ {model}\s+│ dynamic vs none", console), console
    # static 32 of the GRU: the traffic's lengths as they arrive, each batch padded to its longest
    gru = report[report.index("## conv_gru") : report.index("## unet")]
    padded = [line for line in gru.splitlines() if re.search(r"\| \d+% \(\d+\.\d\d× computed\) \|", line)]
    static = [line for line in padded if line.startswith("| static 32")]
    assert len(static) == 2 and not any("| 0% (1.00× computed)" in line for line in static), (
        static
    )  # open, closed
    assert all("| 0% (1.00× computed)" in line for line in padded if line.startswith("| no batching")), padded
    assert "static batching sends each batch of 32 arrivals padded to its longest" in gru
    # buckets for the GRU: none offered, and why
    gru_shapes = shapes[shapes.index("## conv_gru") : shapes.index("## unet")]
    assert "Not offered, not measured" in gru_shapes and "padding changes the answer: length" in gru_shapes
    assert "| 2 buckets" not in gru_shapes
