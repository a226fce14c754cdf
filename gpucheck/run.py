"""``python -m gpucheck run --out DIR``: the whole check in one process, most important first. A step that
fails is recorded and the next runs; past the grid's deadline the rest are skipped; the report is always
written, and the exit status says whether everything was measured."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from exporters.resolve import load_spec
from gpucheck import machine, report, studies
from gpucheck.grid import GRIDS
from gpucheck.raw import raw_curve
from gpucheck.repository import build, check_models
from gpucheck.studies import Session
from perf.markdown import LOG_FORMAT

log = logging.getLogger("gpucheck")
LOG_NAME = "gpu-check.log"
SERVER_LOG_LINES = 200


class Recorder:
    """Runs each step, keeping its figures or failure; skips it past the deadline or without its needs."""

    def __init__(self, deadline_s: float) -> None:
        self.started = time.monotonic()
        self.deadline_s = deadline_s
        self.sections: dict[str, dict[str, Any]] = {}

    def run(self, name: str, step: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()) -> dict | None:
        elapsed = time.monotonic() - self.started
        missing = [n for n in needs if self.sections.get(n, {}).get("status") != "ok"]
        reason = f"needs {', '.join(missing)}, which did not run" if missing else ""
        if not missing and elapsed > self.deadline_s:
            reason = f"out of time ({elapsed:.0f} s of the {self.deadline_s:.0f} s the grid allows)"
        if reason:
            self.sections[name] = {"status": "skipped", "reason": reason}
            log.warning("%s skipped: %s", name, reason)
            return None
        log.info("== %s", name)
        began = time.monotonic()
        try:
            figures = step()
        except Exception as error:
            log.error("%s failed: %s\n%s", name, error, traceback.format_exc())
            self.sections[name] = {
                "status": "failed",
                "error": f"{type(error).__name__}: {error}"[:4000],
                "seconds": time.monotonic() - began,
            }
            return None
        self.sections[name] = {"status": "ok", "seconds": time.monotonic() - began, **figures}
        return figures


def check(out: Path, grid_name: str, spec_path: Path, carried: Path) -> int:
    grid = GRIDS[grid_name]
    out.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout), logging.FileHandler(out / LOG_NAME)]
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers)
    for noisy in ("torch", "onnxruntime", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="gpucheck-"))
    recorder = Recorder(grid.deadline_s)
    facts = machine.facts()
    device = torch.device("cuda", 0) if facts.cuda_available else torch.device("cpu")
    on_gpu = device.type == "cuda"
    log.info("%s on %s: torch %s, Python %s", grid.name, facts.device, facts.torch, facts.python)
    spec = load_spec(spec_path)
    models = {m.spec.name: m for m in check_models(spec, grid)}
    raw: dict[tuple[str, str], Any] = {}

    def raw_step() -> dict[str, Any]:
        for name in studies.latency_group(grid):
            model = models[name]
            raw[(model.base, model.precision)] = raw_curve(model, grid, device)
        return {"curves": sorted(f"{base} {precision}" for base, precision in raw)}

    def libpython_step() -> dict[str, Any]:
        facts.libpython = machine.stub_libpython(carried / "libpython", work / "libpython")
        return {"libpython": facts.libpython}

    recorder.run("raw", raw_step)
    recorder.run("stub", libpython_step)
    holder: dict[str, Any] = {}

    def build_step() -> dict[str, Any]:
        holder["repository"] = repository = build(spec, grid, work / "repository", "gpu" if on_gpu else "cpu")
        return {
            "models": {
                name: {"precision": b.model.precision, "instances": b.model.instances,
                       "max_rel_error": b.parity.max_rel_error}
                for name, b in repository.models.items()
            },
            "pipelines": {
                name: {"stages": list(p.spec.stage_names), "boundary_dtype": p.spec.boundary_dtype,
                       "max_rel_error": p.record.artifact_max_rel_error}
                for name, p in repository.pipelines.items()
            },
        }  # fmt: skip

    recorder.run("build", build_step)
    session = None
    if "repository" in holder:
        repository = holder["repository"]
        session = Session(repository.path, on_gpu, work / "server")
        if recorder.run("server", session.start, needs=("stub",)) is not None:
            try:
                _studies(recorder, studies.Context(grid, repository, session, raw, facts.device))
            finally:
                session.close()
    document = report.figures(grid, facts, recorder.sections, raw, time.monotonic() - recorder.started)
    report.write(out, document)
    if session is not None:
        log.info(
            "server log (last %d lines):\n%s", SERVER_LOG_LINES, session.server.log_tail(SERVER_LOG_LINES)
        )
    shutil.rmtree(work, ignore_errors=True)
    print(report.summary(document))
    return 0 if all(s["status"] == "ok" for s in recorder.sections.values()) else 1


def _studies(recorder: Recorder, context: studies.Context) -> None:
    session, repository, grid = context.session, context.repository, context.grid

    def with_models(names: list[str], study: Callable[[studies.Context], dict]) -> Callable[[], dict]:
        def step() -> dict[str, Any]:
            session.require(names)
            return study(context)

        return step

    group = studies.latency_group(grid)
    recorder.run("latency", with_models(group, studies.latency))
    recorder.run("parity", with_models(group, studies.parity))
    recorder.run("memory", with_models(group, studies.memory), needs=("latency",))
    batching = [studies.BATCHING_MODEL, f"{studies.BATCHING_MODEL}_dynamic"]
    recorder.run("batching", with_models(batching, studies.batching))
    recorder.run("instances", with_models(studies.instance_names(grid), studies.instances))
    served = [name for p in grid.pipelines for name in (*repository.pipelines[p].spec.stage_names, p)]
    recorder.run("pipeline", with_models([studies.INSTANCE_MODEL, *served], studies.pipeline))
    payload = [n for n, b in repository.models.items() if b.model.base == "trivial"]
    recorder.run("shared_memory", with_models(payload, studies.shared_memory))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucheck run", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the folder the report and figures go to")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="gpu")
    parser.add_argument("--spec", type=Path, default=Path("models.yaml"))
    parser.add_argument(
        "--carried", type=Path, default=Path(".gpu-carry"), help="the carried folder (libpython)"
    )
    args = parser.parse_args(argv)
    return check(args.out, args.grid, args.spec, args.carried)
