"""``python -m perf plan`` (``make plan MODEL=… P99_MS=… [TOPOLOGY=…] [ACCURACY=…]``): the run.

Topology (``--topology`` folder or shipped name, else this host's GPUs, else its CPU) → profile (the
variants built and measured; on the CPU with the tuner's probe on the real server) → every strategy
placed and predicted → the pick → on the CPU, the top architectures measured on the real server, the
answer the one measured to hold the budget at the highest rate (``perf.plan.verify.settle``) → for a
model with a variable axis, its formed batches per length and length buckets at that rate
(``perf.plan.shapes``) →
``reports/<timestamp>-plan/``: ``plan.json``, ``report.md``, ``p99_vs_rate.png``, ``overlay.yaml``
and ``spec.planned.yaml``. Where nothing meets the budget (every strategy predicted over it, or every
verified one measured over it): one line with the closest figure, no overlay, exit status 3.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import time
from pathlib import Path

from exporters.resolve import load_spec
from perf.errors import NothingMeetsError
from perf.markdown import number
from perf.measure.engine import OurEngine
from perf.plan.document import PlanDocument, plan_document
from perf.plan.graph_memory import too_big_to_build
from perf.plan.overlay import plan_overlay, server_flags, write_plan_overlay
from perf.plan.placement import PlacementError
from perf.plan.planner import Judged, NoStrategyError, PlanRequest, plan
from perf.plan.profile import measure_profile, plan_target
from perf.plan.report import plot, render
from perf.plan.shapes import plan_shapes
from perf.plan.strategy import Space
from perf.plan.topology import Topology, cpu_topology, live_topology, topology_folder
from perf.plan.verify import settle, verify
from perf.report_folder import report_folder
from perf.saved import save_document
from perf.session.model import TUNE_WINDOWS, ModelSession
from perf.session.probe import ProbePlan, ProbeResult, probe
from perf.spec_overlay import base_document
from server.ports import add_port_base_option

log = logging.getLogger(__name__)
WORKDIR = Path(".run/plan")


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
    p.add_argument(
        "--seconds", type=float, default=3 * TUNE_WINDOWS.window_s, help="measured seconds per run"
    )
    p.add_argument("--predict-s", type=float, default=3.0, help="seconds of arrivals per prediction")
    p.add_argument("--reports", type=Path, default=Path("reports"))
    p.add_argument("--workdir", type=Path, default=WORKDIR, help="where the variants are built and served")
    add_port_base_option(p)


def usage_errors(args: argparse.Namespace) -> str | None:
    if args.p99_ms <= 0:
        return f"--p99-ms must be > 0, got {args.p99_ms}"
    if args.accuracy is not None and args.accuracy < 0:
        return f"--accuracy must be >= 0, got {args.accuracy}"
    if args.seconds <= 0 or args.predict_s <= 0:
        return "--seconds and --predict-s must be > 0"
    if args.probe_runs < 0 or args.verify < 0:
        return "--probe-runs and --verify must be >= 0"
    return None


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise PlacementError(f"{option} {text!r}: {error}") from error
    if not values or min(values) < 0:
        raise PlacementError(f"{option} {text!r}: needs non-negative integers")
    return values


def _topology(args: argparse.Namespace) -> tuple[Topology, bool]:
    """The machine planned for, and whether this host runs it (a live GPU or the CPU here)."""
    if args.topology:
        return topology_folder(args.topology), False
    live = live_topology()
    return (live, True) if live is not None else (cpu_topology(), True)


def command_plan(args: argparse.Namespace, console) -> int:
    started = time.perf_counter()
    spec = load_spec(args.spec)
    spec, model = plan_target(spec, args.model)  # a model or a pipeline; a clear error before building
    too_big = too_big_to_build(spec.model(model))
    topology, here = _topology(args)
    space = Space(
        _ints(args.instances, "--instances"), _ints(args.delays_us, "--delays-us"), split=not args.no_split
    )
    folder = report_folder(args.reports, "plan", "plan.log")  # once the options and the spec are read
    request = PlanRequest(args.p99_ms, args.accuracy, space, args.predict_s)
    console.print(
        f"planning [bold]{args.model}[/bold] for p99 ≤ {args.p99_ms:g} ms on {topology.name} → {folder}"
    )
    for warning in topology.warnings:
        console.print(f"  [yellow]warning[/yellow]: {warning}")
    settings = dataclasses.replace(TUNE_WINDOWS, window_s=args.seconds / TUNE_WINDOWS.stable_windows)
    engine = OurEngine()
    probed = None
    if too_big and here and not topology.on_gpu:
        console.print(f"  no probe or verification on the server: {too_big}")
    if not topology.on_gpu and args.probe_runs > 0 and not too_big:
        console.print("  probing the whole model on the real server (the tuner's probe)")
        largest = spec.model(model).max_batch_size
        with ModelSession(spec, model, largest, args.workdir / "probe", engine, settings) as session:
            probed = probe(
                session, space.instances, session.largest_batch, ProbePlan(max_runs=args.probe_runs)
            )
    console.print(
        "  building and measuring the variants (whole model per precision, split per boundary dtype)"
    )
    live_gpu = here and topology.on_gpu
    providers = ("CUDAExecutionProvider",) if live_gpu else ("CPUExecutionProvider",)
    device = "this host's GPU (CUDA provider)" if live_gpu else "this host's CPU"
    profile = measure_profile(
        spec, model, args.workdir / "repository", not args.no_split, probed, providers, device
    )
    try:
        chosen = plan(profile, topology, request, lambda text: console.print(f"  {text}"))
    except NoStrategyError as error:
        if not over_budget_everywhere(error.judged):
            raise
        raise predicted_verdict(args.p99_ms, model, topology, probed) from None
    verification = []
    if here and not topology.on_gpu and args.verify > 0 and not too_big:
        verification = verify(
            spec, model, chosen, args.verify, engine, settings, args.workdir,
            lambda text: console.print(f"  {text}"),
        )  # fmt: skip
    measured_rate = None
    if verification:
        try:
            chosen, measured_rate = settle(chosen, verification)
        except NothingMeetsError as verdict:
            saved = plan_document(
                chosen, (), verification, time.perf_counter() - started, verdict=verdict.verdict,
                asked=args.model,
            )  # fmt: skip
            save_document(folder / "plan.json", saved)
            plot(chosen, folder / "p99_vs_rate.png")
            verdict.hint = f"no answer written; what was measured (not an answer): {render(folder, saved)}"
            raise
    assert chosen.chosen.placement is not None
    shapes = None
    if measured_rate:  # a variable-length model: formed batches per length and buckets at the measured rate
        shapes = plan_shapes(
            spec.model(model), chosen, measured_rate, engine, settings, args.workdir,
            lambda text: console.print(f"  {text}"),
        )  # fmt: skip
    if chosen.chosen.strategy.kind == "sharded":
        console.print(
            "  no spec overlay: a spec cannot yet place a model's tables on other GPUs than its dense "
            "part; plan.json and report.md hold the table placement"
        )
    else:
        overlay = plan_overlay(
            base_document(args.spec), spec, model, chosen.chosen.strategy, chosen.chosen.placement,
            topology.on_gpu, shapes.buckets if shapes else None,
        )  # fmt: skip
        note = (
            f"python -m perf plan --model {args.model} --p99-ms {args.p99_ms:g} on {topology.name}: "
            f"{chosen.chosen.strategy.label}"
        )
        write_plan_overlay(args.spec, overlay, folder, note)
    flags = server_flags(chosen.chosen.placement)
    saved = plan_document(
        chosen, flags, verification, time.perf_counter() - started,
        measured_rate=measured_rate, overlay_written=chosen.chosen.strategy.kind != "sharded", shapes=shapes,
        asked=args.model,
    )  # fmt: skip
    save_document(folder / "plan.json", saved)
    plot(chosen, folder / "p99_vs_rate.png")
    report = render(folder, saved)
    print_summary(saved, report, console)
    return 0


def over_budget_everywhere(judged: list[Judged]) -> bool:
    """No strategy is feasible, and some that fit the machine lost only on the budget: a verdict about
    the budget on this machine, not a plan that cannot be placed."""
    return any(j.placement is not None and j.reason.startswith("over budget") for j in judged)


def predicted_verdict(
    budget_ms: float, model: str, topology: Topology, probed: ProbeResult | None
) -> NothingMeetsError:
    """Every strategy predicted over the budget: the closest figure the probe measured on this host's
    server, or, with nothing measured (a recorded topology, no probe), the prediction's verdict."""
    runs = [(config, run) for config, run in probed.runs if math.isfinite(run.p99_ms)] if probed else []
    if not runs:
        return NothingMeetsError(
            f"nothing meets p99 <= {budget_ms:g} ms on {topology.name}: every strategy that fits is "
            "predicted over the budget at every rate (nothing was measured)"
        )
    config, run = min(runs, key=lambda pair: pair[1].p99_ms)
    behind = None if run.sustained else run.throughput
    note = (
        "a probe run; no strategy is predicted within the budget at any rate" if run.meets(budget_ms) else ""
    )
    return NothingMeetsError.closest(
        budget_ms, f"{model} {config.label}", run.load.rate, run.p99_ms, behind, note=note
    )


def print_summary(saved: PlanDocument, report: Path, console) -> None:
    chosen, measured = saved.chosen, saved.measured_rate
    held = f"; measured within it up to {number(measured, 0)}/s here" if measured else ""
    console.print(
        f"chosen: [bold]{chosen.label}[/bold]: predicted {number(chosen.rate, 0)}/s within "
        f"{saved.budget_ms:g} ms (p99 {number(chosen.p99_ms)} ms){held}"
    )
    for entry in saved.placement:
        where = ", ".join(f"GPU{g}" for g in entry.gpus) or "CPU"
        console.print(
            f"  {entry.model}: replica {entry.replica}, stage {entry.stage}, {entry.instances}× on {where}"
        )
    if saved.server_flags:
        console.print(f"  server flags: {' '.join(saved.server_flags)}")
    for row in saved.verification:
        console.print(
            f"  verified {row.strategy} @ {row.rate:.0f}/s: p99 predicted {number(row.predicted_p99_ms)} ms, "
            f"measured {number(row.measured_p99_ms)} ms, served {row.measured_throughput:.0f}/s "
            f"({'within' if row.met else 'over'} budget)"
        )
    shapes = saved.shapes
    if shapes:
        buckets = shapes.buckets
        choice = "the spec's stay (no way met the budget)" if buckets is None else f"buckets: {list(buckets)}"
        console.print(f"  shapes as served (formed batches per length in the report): {choice}")
    console.print(f"report {report}")
