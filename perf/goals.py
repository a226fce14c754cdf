"""The issue's goals, checked against one run, each with the measurement that explains a miss.

A goal that is missed says by how much and what limits it: the client (result near the harness
ceiling), the cores (server + client CPU near the machine's cores), or the Python backend's IPC
(server compute time per batch well above raw onnxruntime's at the same batch size).
"""

from __future__ import annotations

from dataclasses import dataclass

from perf import analysis
from perf.study import FamilyResult, StudyResult
from perf.study_spec import MODES

GOAL_FAMILY = "recommender"
OVERHEAD_NOTE = (
    "the model counts compute only; per-request serving overhead (client, gRPC, Python-backend IPC) and "
    "the batcher's waiting are paid whatever the batch, so they shrink the measured gain"
)


@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    limits: str = ""


def limits_of(row: analysis.Row, efficiency: analysis.Efficiency | None = None) -> str:
    notes = []
    if row.client_bound:
        notes.append(f"client-bound ({row.requests_per_s:.0f} req/s is within 80% of the harness ceiling)")
    cores = row.server_cores + row.client_cores
    if cores >= 0.85 * analysis.CORES:
        notes.append(
            f"cores: server {row.server_cores:.2f} + client {row.client_cores:.2f} of {analysis.CORES} busy"
        )
    if efficiency is not None and efficiency.compute_ratio < 0.9:
        notes.append(
            f"Python-backend execution: server compute is {1 / efficiency.compute_ratio:.2f}× raw "
            f"onnxruntime's at the same batch sizes (IPC, concatenation, thread contention)"
        )
    if row.send_lag_p99_ms > 1.0:
        notes.append(f"client lateness: p99 {row.send_lag_p99_ms:.1f} ms from arrival to send")
    if row.outside_server_ms > 1.0:
        notes.append(
            f"outside the server: {row.outside_server_ms:.1f} ms of the mean latency is neither queue nor "
            "compute (client, gRPC, response path)"
        )
    if row.queue_ms > row.compute_ms:
        notes.append(f"queueing: {row.queue_ms:.1f} ms queue vs {row.compute_ms:.1f} ms compute per request")
    return "; ".join(notes) or "no single limit stands out"


def dynamic_vs_none(result: StudyResult, family: FamilyResult) -> Goal:
    concurrency = result.profile.goal_concurrency
    rows = analysis.closed_loop_rows(result, family, concurrency)
    dynamic = [r for r in rows if MODES[r.mode].max_queue_delay_ms is not None and r.ratios]
    target = f"throughput ≥ 4× none, p99 ≤ none's (concurrency {concurrency})"
    if not dynamic:
        return Goal("dynamic vs none", target, "not measured", None)
    best = max(dynamic, key=lambda r: (r.ratios["p99_ms"] <= 1.0, r.ratios["throughput"]))
    text = ", ".join(
        f"{r.mode}: {r.ratios['throughput']:.2f}× QPS, p99 {r.ratios['p99_ms']:.2f}×" for r in dynamic
    )
    met = best.ratios["throughput"] >= 4.0 and best.ratios["p99_ms"] <= 1.0
    effs = {e.mode: e for e in analysis.efficiencies(family, concurrency)}
    limits = "" if met else f"best {best.mode} is {best.ratios['throughput'] / 4:.0%} of the 4× target; "
    limits += "" if met else limits_of(best, effs.get(best.mode))
    return Goal("dynamic vs none", target, text, met, limits)


def served_vs_raw(result: StudyResult, family: FamilyResult) -> Goal:
    effs = [
        e
        for e in analysis.efficiencies(family, result.profile.goal_concurrency)
        if MODES[e.mode].instances == 1
    ]
    target = "served / raw onnxruntime at the same batch size ≥ 0.9×"
    if not effs:
        return Goal("served vs raw", target, "not measured", None)
    text = ", ".join(f"{e.mode} (batch {e.mean_batch:.1f}): {e.ratio:.2f}×" for e in effs)
    best = max(effs, key=lambda e: e.ratio)
    met = best.ratio >= 0.9
    limits = ""
    if not met:
        rows = {r.mode: r for r in analysis.closed_loop_rows(result, family, result.profile.goal_concurrency)}
        limits = f"best {best.mode} reaches {best.ratio / 0.9:.0%} of the target; " + limits_of(
            rows[best.mode], best
        )
        limits += (
            f"; CPU per 1,000 inferences: server {best.server_cpu_per_1000:.2f} s vs raw "
            f"{best.raw_cpu_per_1000:.2f} s"
        )
    short = [e for e in effs if e.ratio < 0.9]
    if met and short:
        # Honest about the spread: the goal is met by the best batching, not by every mode.
        below = ", ".join(f"{e.mode} {e.ratio:.2f}×" for e in short)
        limits = (
            f"met by {best.mode} only; below 0.9×: {below}: per-request overhead (client, gRPC, "
            "Python-backend IPC) weighs on small batches, and a batcher that waits out its delay idles"
        )
    return Goal("served vs raw", target, text, met, limits)


def latency_model(result: StudyResult, family: FamilyResult) -> list[Goal]:
    fit = analysis.fit_served(family)
    if fit is None:
        return [Goal("latency-model fit", "R² ≥ 0.97", "too few batch sizes formed", None)]
    measured = f"R² = {fit.r2:.3f} (T = {fit.t_ms:.2f} ms, Δt = {fit.dt_ms:.3f} ms, {len(fit.points)} sizes)"
    scatter = "" if fit.r2 >= 0.97 else "compute times per batch size scatter (shared cores)"
    goals = [Goal("latency-model fit", "R² ≥ 0.97", measured, fit.r2 >= 0.97, scatter)]
    checks = analysis.gain_checks(family, fit, result.profile.goal_concurrency)
    if checks:
        text = ", ".join(
            f"{c.mode}: predicted {c.predicted:.2f}× vs measured {c.measured:.2f}× ({c.error_pct:+.0f}%)"
            for c in checks
        )
        met = all(abs(c.error_pct) <= 15 for c in checks)
        limits = "" if met else OVERHEAD_NOTE
        goals.append(Goal("predicted gain", "within 15% of the measured gain", text, met, limits))
    return goals


def poisson_bound(result: StudyResult, family: FamilyResult) -> Goal:
    target = "p99 ≤ max_queue_delay + compute at the largest formed batch + 2 ms"
    parts, met, limits = [], True, []
    rows = {r.mode: r for r in analysis.open_loop_rows(result, family)}
    for mode, measurement in family.open_loop.items():
        delay = MODES[mode].max_queue_delay_ms
        if delay is None or measurement.server is None or not measurement.server.stats.batches:
            continue
        largest = max(measurement.server.stats.batches)
        bound = delay + measurement.server.stats.compute_ms_at(largest) + 2.0
        p99 = rows[mode].p99_ms
        ok = p99 <= bound
        met &= ok
        parts.append(f"{mode}: p99 {p99:.1f} ms vs bound {bound:.1f} ms")
        if not ok:
            note = f"{mode} over by {p99 - bound:.1f} ms: " + limits_of(rows[mode])
            if rows[mode].queue_ms > delay:
                note += (
                    f"; queue {rows[mode].queue_ms:.1f} ms/request > the {delay:.0f} ms delay: at this load "
                    "a request often arrives while a batch is running and waits for it too, a second "
                    "compute the bound does not count"
                )
            limits.append(note)
    if not parts:
        return Goal("Poisson p99 bound", target, "not measured", None)
    load = family.open_load.name if family.open_load else ""
    return Goal(f"Poisson p99 bound ({load})", target, ", ".join(parts), met, "; ".join(limits))


def all_goals(result: StudyResult) -> list[Goal]:
    family = result.families.get(GOAL_FAMILY) or next(iter(result.families.values()), None)
    if family is None:
        return []
    return [
        dynamic_vs_none(result, family), served_vs_raw(result, family),
        *latency_model(result, family), poisson_bound(result, family),
    ]  # fmt: skip
