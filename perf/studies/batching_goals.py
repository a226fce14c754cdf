"""The batching study's goals against one ``StudyResult``; a miss says by how much and what limits it."""

from __future__ import annotations

import dataclasses

from perf.markdown import fit_text, number, percent, ratio, why_unmeasured
from perf.studies import analysis
from perf.studies.goals import GOALS, Goal
from perf.studies.study import FamilyResult, StudyResult
from perf.studies.study_spec import MODES

GOAL_FAMILY = "recommender"
OVERHEAD_NOTE = (
    "the model counts compute only; per-request serving overhead (client, gRPC, Python-backend IPC) and "
    "the batcher's waiting are paid whatever the batch, so they shrink the measured gain"
)


# Where a missed goal's explanation starts pointing at a limit (diagnoses, not goals).
CORES_BUSY = 0.85  # server + client CPU at this share of the machine's cores: the cores limit
SLOW_BACKEND = 0.9  # raw / server compute time below this: the Python backend's execution limits
LATE_MS = 1.0  # client lateness or time outside the server above this many ms is worth naming


def limits_of(row: analysis.Row, efficiency: analysis.Efficiency | None = None) -> str:
    notes = []
    if row.client_bound:
        notes.append(
            f"client-bound ({row.requests_per_s:.0f} req/s is within {analysis.CLIENT_BOUND:.0%} of the "
            "harness ceiling)"
        )
    cores = row.server_cores + row.client_cores
    if cores >= CORES_BUSY * analysis.CORES:
        notes.append(
            f"cores: server {row.server_cores:.2f} + client {row.client_cores:.2f} of {analysis.CORES} busy"
        )
    measured = efficiency is not None and why_unmeasured(efficiency.compute_ratio) is None
    if measured and 0 < efficiency.compute_ratio < SLOW_BACKEND:
        notes.append(
            f"Python-backend execution: server compute is {ratio(1 / efficiency.compute_ratio)} raw "
            f"onnxruntime's at the same batch sizes (IPC, concatenation, thread contention)"
        )
    if row.send_lag_p99_ms > LATE_MS:
        notes.append(f"client lateness: p99 {row.send_lag_p99_ms:.1f} ms from arrival to send")
    if row.outside_server_ms > LATE_MS:
        notes.append(
            f"outside the server: {row.outside_server_ms:.1f} ms of the mean latency is neither queue nor "
            "compute (client, gRPC, response path)"
        )
    if row.queue_ms > row.compute_ms:
        notes.append(f"queueing: {row.queue_ms:.1f} ms queue vs {row.compute_ms:.1f} ms compute per request")
    return "; ".join(notes) or "no single limit stands out"


def dynamic_vs_none(result: StudyResult, family: FamilyResult) -> Goal:
    concurrency = result.profile.goal_concurrency
    qps, p99 = GOALS["dynamic QPS"], GOALS["dynamic p99"]
    rows = analysis.closed_loop_rows(result, family, concurrency)
    dynamic = [r for r in rows if MODES[r.mode].max_queue_delay_ms is not None and r.ratios]
    target = f"{qps.target()}, {p99.target()} (concurrency {concurrency})"
    if not dynamic:
        return Goal("dynamic vs none", target, "not measured", None)
    best = max(dynamic, key=lambda r: (bool(p99.met(r.ratios["p99_ms"])), r.ratios["throughput"]))
    text = ", ".join(
        f"{r.mode}: {ratio(r.ratios['throughput'])} QPS, p99 {ratio(r.ratios['p99_ms'])}" for r in dynamic
    )
    met = bool(qps.met(best.ratios["throughput"])) and bool(p99.met(best.ratios["p99_ms"]))
    effs = {e.mode: e for e in analysis.efficiencies(family, concurrency)}
    share = qps.share(best.ratios["throughput"])
    limits = (
        ""
        if met
        else f"best {best.mode} is {share:.0%} of the target; {limits_of(best, effs.get(best.mode))}"
    )
    return Goal("dynamic vs none", target, text, met, limits)


def served_vs_raw(result: StudyResult, family: FamilyResult) -> Goal:
    goal, concurrency = GOALS["served vs raw"], result.profile.goal_concurrency
    effs = [e for e in analysis.efficiencies(family, concurrency) if MODES[e.mode].instances == 1]
    if not effs:
        return goal.outcome()
    text = ", ".join(f"{e.mode} (batch {number(e.mean_batch)}): {ratio(e.ratio)}" for e in effs)
    best = max(effs, key=lambda e: e.ratio)
    met = goal.met(best.ratio)
    limits = ""
    if not met:
        rows = {r.mode: r for r in analysis.closed_loop_rows(result, family, concurrency)}
        limits = (
            f"best {best.mode} reaches {goal.share(best.ratio):.0%} of the target; "
            f"{limits_of(rows[best.mode], best)}; CPU per 1,000 inferences: server "
            f"{best.server_cpu_per_1000:.2f} s vs raw {best.raw_cpu_per_1000:.2f} s"
        )
    short = [e for e in effs if not goal.met(e.ratio)]
    if met and short:
        below = ", ".join(f"{e.mode} {e.ratio:.2f}×" for e in short)
        limits = (
            f"met by {best.mode} only; below {goal.limit:g}×: {below}: per-request overhead (client, gRPC, "
            "Python-backend IPC) weighs on small batches, and a batcher that waits out its delay idles"
        )
    return goal.outcome(text, met, limits)


def latency_model(result: StudyResult, family: FamilyResult) -> list[Goal]:
    fit_goal, gain_goal = GOALS["latency-model fit"], GOALS["predicted gain"]
    fit = analysis.fit_served(family)
    if fit is None:
        return [fit_goal.outcome("too few batch sizes formed")]
    measured = f"{fit_text(fit)} ({len(fit.points)} sizes)"
    if fit.flaw:  # a fit no batch follows: not a model, however well it matches the points
        return [fit_goal.outcome(measured, False, fit.flaw)]
    met = fit_goal.met(fit.r2)
    scatter = "" if met else "compute times per batch size scatter (shared cores)"
    goals = [fit_goal.outcome(measured, met, scatter)]
    checks = analysis.gain_checks(family, fit, result.profile.goal_concurrency)
    if checks:
        text = ", ".join(
            f"{c.mode}: predicted {ratio(c.predicted)} vs measured {ratio(c.measured)} "
            f"({percent(c.error_pct)})"
            for c in checks
        )
        met = all(gain_goal.met(abs(c.error_pct)) for c in checks)
        limits = "" if met else OVERHEAD_NOTE
        goals.append(gain_goal.outcome(text, met, limits))
    return goals


def poisson_bound(result: StudyResult, family: FamilyResult) -> Goal:
    goal = GOALS["Poisson p99 bound"]
    parts, met, limits = [], True, []
    rows = {r.mode: r for r in analysis.open_loop_rows(result, family)}
    for mode, measurement in family.open_loop.items():
        delay = MODES[mode].max_queue_delay_ms
        if delay is None or measurement.server is None or not measurement.server.stats.batches:
            continue
        largest = max(measurement.server.stats.batches)
        waited = delay + measurement.server.stats.compute_ms_at(largest)  # the bound without its slack
        bound = waited + goal.limit
        p99 = rows[mode].p99_ms
        ok = goal.met(p99 - waited)
        met &= ok
        parts.append(f"{mode}: p99 {number(p99)} ms vs bound {number(bound)} ms")
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
        return goal.outcome()
    load = family.open_load.name if family.open_load else ""
    return Goal(f"{goal.name} ({load})", goal.target(), ", ".join(parts), met, "; ".join(limits))


RECOMMENDER_ONLY_NOTE = (
    "not applicable: the {limit} target is the recommender's, an overhead-bound model where batching "
    "amortizes per-request cost; {model}'s gain is what its compute per row leaves to share (the latency "
    "model's predicted gain below says what to expect)"
)


def for_model(goal: Goal, model: str) -> Goal:
    """``goal`` named with ``model``; ``dynamic vs none``'s 4× is the recommender's, "n/a" for others
    (a compute-bound model would read MISSED however well it is served)."""
    if model == GOAL_FAMILY or goal.name != "dynamic vs none":
        return dataclasses.replace(goal, model=model)
    note = RECOMMENDER_ONLY_NOTE.format(limit=GOALS["dynamic QPS"].target(), model=model)
    return Goal(goal.name, goal.target, goal.measured, None, note, model)


def all_goals(result: StudyResult) -> list[Goal]:
    """Every model's goals, in the order the models were measured (``MODELS=a,b``)."""
    goals = []
    for model, family in result.families.items():
        judged = [
            dynamic_vs_none(result, family), served_vs_raw(result, family),
            *latency_model(result, family), poisson_bound(result, family),
        ]  # fmt: skip
        goals += [for_model(goal, model) for goal in judged]
    return goals
