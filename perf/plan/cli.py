"""``python -m perf plan`` (``make plan``): topology → profile → every strategy placed and predicted → on
the CPU, the best searched on the real server → ``reports/<timestamp>-plan/`` (docs/PLAN.md). Exit
status 3 where nothing meets the budget, 1 where a server died (its log kept)."""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from exporters.resolve import load_spec
from perf.errors import NothingMeetsError, OptionError, comma_list
from perf.markdown import number, report_folder
from perf.measure.engine import MeasureSettings, OurEngine
from perf.plan.compute_profile import ComputeProfile, compute_origin, read_compute_profile
from perf.plan.document import PlanDocument, plan_document, plot, rate_sentence, render
from perf.plan.graph_memory import count
from perf.plan.overlay import plan_overlay, server_flags, write_plan_overlay
from perf.plan.placement import PlacementError
from perf.plan.planner import Judged, NoStrategyError, Plan, PlanRequest, plan
from perf.plan.profile import measure_profile, plan_target
from perf.plan.strategy import ModelProfile, Space
from perf.plan.topology import Topology, cpu_topology, live_topology, topology_folder
from perf.plan.verify import Serve, measure_plan, plan_shapes, probe_evidence, real_server, verification_rows
from perf.saved import save_document
from perf.session.model import (
    TUNE_WINDOWS,
    ModelSession,
    add_window_options,
    bound_error,
    keep_dead_server_log,
    run_windows,
    window_usage_error,
)
from perf.session.probe import ProbePlan, probe
from perf.session.search import Evidence
from perf.session.shapes_section import ShapesFigures
from perf.spec_overlay import base_document
from server.ports import add_port_base_option

WORKDIR = Path(".run/plan")


@dataclasses.dataclass(frozen=True)
class PlanSetup:
    """What a ``make plan`` run is built from beyond its options (a test hands in its own)."""

    windows: MeasureSettings = TUNE_WINDOWS
    live_topology: Callable[[], Topology | None] = live_topology
    measure_profile: Callable[..., ModelProfile] = measure_profile
    real_server: Callable[..., Serve] = real_server


THE_SETUP = PlanSetup()  # what make plan runs with


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "plan", help="choose the serving strategy (data/pipeline/hybrid, precision, placement)"
    )
    p.add_argument("--model", required=True, help="a model of the spec (e.g. recommender)")
    p.add_argument("--spec", type=Path, default=Path("models.yaml"))
    p.add_argument("--p99-ms", type=float, required=True, help="the latency budget (p99, milliseconds)")
    p.add_argument("--topology", default=None, help="a folder with topo.txt and gpus.csv, or a shipped name")
    p.add_argument("--accuracy", type=float, default=None, help="max relative error vs fp32 (default: any)")
    p.add_argument("--instances", default="1,2", help="instances per GPU or stage to consider")
    p.add_argument("--delays-us", default="0,1000", help="first-stage queue delays to consider (µs)")
    p.add_argument("--no-split", action="store_true", help="the whole model only (no pipeline strategies)")
    p.add_argument("--verify", type=int, default=2, help="on the CPU: architectures measured on the server")
    p.add_argument(
        "--probe-runs", type=int, default=6,
        help="on the CPU: runs per ramp of the tuner's probe (0: none: compute alone, a quick plan)",
    )  # fmt: skip
    add_window_options(p)
    p.add_argument("--predict-s", type=float, default=3.0, help="seconds of arrivals per prediction")
    p.add_argument("--reports", type=Path, default=Path("reports"))
    p.add_argument("--workdir", type=Path, default=WORKDIR, help="where the variants are built and served")
    p.add_argument(
        "--compute-profile", default=None,
        help="a GPU's recorded compute (the GPU check's figures JSON): a GPU topology's rates from it",
    )  # fmt: skip
    add_port_base_option(p)


def usage_errors(args: argparse.Namespace) -> str | None:
    bounds = (
        ("--p99-ms", args.p99_ms, ">", 0),
        ("--accuracy", args.accuracy, ">=", 0),
        ("--predict-s", args.predict_s, ">", 0),
    )
    error = bound_error(*bounds) or window_usage_error(args)
    if error is None and (args.probe_runs < 0 or args.verify < 0):
        return "--probe-runs and --verify must be >= 0"
    return error


def _ints(text: str, option: str) -> tuple[int, ...]:
    values = comma_list(text, int, option)
    if not values or min(values) < 0:
        raise PlacementError(f"{option} {text!r}: needs non-negative integers")
    return values


def command_plan(args: argparse.Namespace, console, setup: PlanSetup = THE_SETUP) -> int:
    started = time.perf_counter()
    spec, model = plan_target(load_spec(args.spec), args.model)  # a model or a pipeline, before building
    base = spec.model(model)
    memory, too_big = count(base)  # the graph's memory, once: whether the server measures, and the profile
    here = not args.topology  # this host runs the plan: a live GPU or this CPU
    topology = topology_folder(args.topology) if args.topology else setup.live_topology() or cpu_topology()
    instances, delays = _ints(args.instances, "--instances"), _ints(args.delays_us, "--delays-us")
    space = Space(instances, delays, split=not args.no_split)
    recorded = recorded_profile(args, topology, model)
    folder = report_folder(args.reports, "plan", "plan.log")  # once the options and the spec are read
    request = PlanRequest(args.p99_ms, args.accuracy, space, args.predict_s)
    console.print(
        f"planning [bold]{args.model}[/bold] for p99 ≤ {args.p99_ms:g} ms on {topology.name} → {folder}"
    )
    for warning in topology.warnings:
        console.print(f"  [yellow]warning[/yellow]: {warning}")

    def step(text: str) -> None:
        console.print(f"  {text}")

    settings = run_windows(setup.windows, args)
    engine = OurEngine()
    measuring = here and not topology.on_gpu and not too_big  # this CPU: the server measures
    if too_big and here and not topology.on_gpu:
        step(f"no probe or verification on the server: {too_big}")
    evidence: Evidence[str] = Evidence(args.p99_ms)
    rechecked: list[ShapesFigures | None] = []  # the shapes step of each answer, the last one's the answer's

    def record(planned: Plan, flags: Sequence[str], **outcome: Any) -> PlanDocument:
        """``plan.json`` and the plot of ``planned`` with what was measured, written; its document."""
        saved = plan_document(
            planned, flags, verification_rows(planned, evidence), time.perf_counter() - started,
            compute_origin=origin, asked=args.model, **outcome,
        )  # fmt: skip
        save_document(folder / "plan.json", saved)
        plot(planned, folder / "p99_vs_rate.png")
        return saved

    def recheck(settled: Plan, rate: float) -> None:
        """The shapes step on the answer at its rate (``perf.plan.verify.plan_shapes``), its runs evidence."""
        rechecked.append(plan_shapes(base, settled, rate, engine, settings, args.workdir, step, evidence))

    with keep_dead_server_log(folder):
        probed = None
        if measuring and args.probe_runs > 0:
            step("probing the whole model on the real server (the tuner's probe)")
            largest, workdir = base.max_batch_size, args.workdir / "probe"
            with ModelSession(spec, model, largest, workdir, engine, settings) as session:
                ramps = ProbePlan(max_runs=args.probe_runs)
                probed = probe(session, space.instances, session.largest_batch, ramps, args.p99_ms)
        step("building and measuring the variants (whole model per precision, split per boundary dtype)")
        live_gpu = here and topology.on_gpu
        providers = ("CUDAExecutionProvider",) if live_gpu else ("CPUExecutionProvider",)
        device = "this host's GPU (CUDA provider)" if live_gpu else "this host's CPU"
        profile = setup.measure_profile(
            spec, model, args.workdir / "repository", not args.no_split, probed, providers, device, recorded,
            counted=(memory, too_big),
        )  # fmt: skip
        measured_on = recorded.device if recorded else device
        origin = compute_origin(measured_on, recorded is not None, [g.name for g in topology.gpus], here)
        try:
            planned = plan(profile, topology, request, step)
        except NoStrategyError as error:
            if not over_budget_everywhere(error.judged):
                raise
            planned = Plan(request, profile, topology, error.judged, error.judged[0])
        if probed is not None:
            probe_evidence(evidence, planned, probed, base.precision, model)
        measured_rate = None
        if measuring and (args.verify > 0 or not planned.chosen.feasible):
            serve = setup.real_server(spec, model, engine, settings, args.workdir)
            try:
                planned, measured_rate = measure_plan(planned, evidence, args.verify, serve, step, recheck)
            except NothingMeetsError as verdict:
                saved = record(planned, (), verdict=verdict.verdict)
                verdict.hint = (
                    f"no answer written; what was measured (not an answer): {render(folder, saved)}"
                )
                raise
        elif not planned.chosen.feasible:
            raise predicted_verdict(args.p99_ms, topology, evidence)
    assert planned.chosen.placement is not None
    shaped = rechecked[-1] if measured_rate and rechecked else None
    if planned.chosen.strategy.kind == "sharded":
        step(
            "no spec overlay: a spec cannot yet place a model's tables on other GPUs than its dense part; "
            "plan.json and report.md hold the table placement"
        )
    else:
        overlay = plan_overlay(
            base_document(args.spec), spec, model, planned.chosen.strategy, planned.chosen.placement,
            topology.on_gpu, shaped.buckets if shaped else None,
        )  # fmt: skip
        note = (
            f"python -m perf plan --model {args.model} --p99-ms {args.p99_ms:g} on {topology.name}: "
            f"{planned.chosen.strategy.label}"
        )
        write_plan_overlay(args.spec, overlay, folder, note)
    saved = record(
        planned, server_flags(planned.chosen.placement), measured_rate=measured_rate,
        overlay_written=planned.chosen.strategy.kind != "sharded", shapes=shaped,
    )  # fmt: skip
    print_summary(saved, render(folder, saved), console)
    return 0


def recorded_profile(args: argparse.Namespace, topology: Topology, model: str) -> ComputeProfile | None:
    """``--compute-profile``, read and checked before anything is built."""
    if not args.compute_profile:
        return None
    if not topology.on_gpu:
        raise OptionError(
            "--compute-profile gives a GPU's compute: plan for a GPU topology with it (TOPOLOGY=…), not "
            "for this host's CPU"
        )
    try:
        recorded = read_compute_profile(Path(args.compute_profile))
    except OptionError as error:  # the file the README's example names is one only a GPU host writes
        raise OptionError(
            f"--compute-profile {error}; a compute profile is the figures JSON `make gpu-check` writes on "
            "a GPU host (docs/GPU.md)"
        ) from error
    recorded.of(model, f"--compute-profile {args.compute_profile}")
    return recorded


def over_budget_everywhere(judged: list[Judged]) -> bool:
    """Some strategy fit the machine and lost only on the budget: a verdict, not a placement error."""
    return any(j.placement is not None and j.reason.startswith("over budget") for j in judged)


def predicted_verdict(budget_ms: float, topology: Topology, evidence: Evidence[str]) -> NothingMeetsError:
    """The closest run over the budget, or with nothing measured the prediction's verdict."""
    if not evidence.runs:
        return NothingMeetsError(
            f"nothing meets p99 <= {budget_ms:g} ms on {topology.name}: every strategy that fits is "
            "predicted over the budget at every rate (nothing was measured)"
        )
    return evidence.nothing_meets(str)


def print_summary(saved: PlanDocument, report: Path, console) -> None:
    console.print(f"chosen: [bold]{saved.chosen.label}[/bold]: {rate_sentence(saved).replace('**', '')}")
    for entry in saved.placement:
        where = ", ".join(f"GPU{g}" for g in entry.gpus) or "CPU"
        console.print(
            f"  {entry.model}: replica {entry.replica}, stage {entry.stage}, {entry.instances}× on {where}"
        )
    if saved.server_flags:
        console.print(f"  server flags: {' '.join(saved.server_flags)}")
    for row in saved.verification:
        console.print(
            f"  measured {row.strategy} @ {row.rate:.0f}/s: p99 {row.measured_p99_text} ms (predicted "
            f"{number(row.predicted_p99_ms)} ms), served {row.measured_throughput:.0f}/s; {row.runs} run(s), "
            f"{row.point_text}"
        )
    if saved.shapes:
        buckets = saved.shapes.buckets
        choice = "the spec's stay (no way met the budget)" if buckets is None else f"buckets: {list(buckets)}"
        console.print(f"  shapes as served (formed batches per length in the report): {choice}")
    console.print(f"report {report}")
