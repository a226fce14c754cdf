"""The tuner's report: what was measured, what was predicted, what was chosen, and how it held up.

Every figure names the engine that produced it (our generator with N processes, or perf_analyzer).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from perf.markdown import number, table
from perf.plots import _save
from perf.tune.batcher_sim import BatcherConfig
from perf.tune.measured import SHORTLIST_POINT_S, SHORTLIST_REPEAT_WITHIN, SweepEntry
from perf.tune.operating import CONFIRM_STEPS, OPERATING_SHARE, Confirmation
from perf.tune.report_probe import cpu_figures, probe_sections
from perf.tune.rules import MAJORITY_OF, OVERLOADED
from perf.tune.session import Observed
from perf.tune.steal import counted_stolen, p99_with_steal, stolen_pct
from perf.tune.tuner import (
    HEADROOM,
    P99_GOAL,
    Ranked,
    TuneResult,
    feasible,
    relative_error,
    repeat_spread,
)

Rematch = dict[BatcherConfig, list[SweepEntry]]


def plot_p99_vs_rate(result: TuneResult, path: Path) -> Path:
    """Predicted (lines) and measured (markers) p99 against offered rate, chosen config and neighbours."""
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    configs = [
        result.chosen,
        *[c for c in dict.fromkeys(p.config for p in result.points) if c != result.chosen],
    ]
    for index, config in enumerate(configs):
        points = result.points_of(config)
        label = config.label + (" (chosen)" if config == result.chosen else "")
        measured = [p for p in points if p.measured]
        for kind, chosen, style in (("predicted", points, "-"), ("measured", measured, "o")):
            values = [p.predicted.p99_ms if kind == "predicted" else p.measured.p99_ms for p in chosen]
            axes.plot([p.rate for p in chosen], values, style, color=f"C{index}", label=f"{label}: {kind}")
    title = "p99 vs rate: batcher simulation vs the real server"
    return finish_p99_plot(figure, axes, result.request.budget_ms, "offered rate (requests / s)", title, path)


def finish_p99_plot(
    figure: plt.Figure, axes: plt.Axes, budget_ms: float, xlabel: str, title: str, path: Path
) -> Path:
    """The budget line, log p99 axis and labels every tuner plot shares."""
    axes.axhline(budget_ms, color="k", linestyle="--", label=f"budget {budget_ms:g} ms")
    axes.set(xlabel=xlabel, ylabel="p99 latency (ms)", yscale="log", title=title)
    return _save(figure, path, axes, grid="both")


def _points_rows(result: TuneResult, engine: str) -> list[list[str]]:
    rows = []
    for config in dict.fromkeys(p.config for p in result.points):
        for p in result.points_of(config):
            m = p.measured
            rows.append(
                [
                    config.label + (" **chosen**" if config == result.chosen else ""),
                    number(p.rate, 0),
                    number(p.predicted.p99_ms),
                    number(p.probe_model.p99_ms) if p.probe_model else "–",
                    number(p.with_tail.p99_ms) if p.with_tail else "–",
                    number(m.p99_ms),
                    f"{100 * relative_error(p.predicted.p99_ms, m.p99_ms):+.0f}%",
                    number(m.throughput, 0),
                    number(p.predicted.mean_batch),
                    number(m.stats.mean_batch),
                    f"{m.failed}/{len(m.records)}",
                    _cpu_cores(result, p.predicted.cpu_utilization, m.cpu_load()[2]),
                    ", ".join(p99_with_steal(r) for r in p.repeats),
                    engine,
                ]
            )
    return rows


def _cpu_cores(result: TuneResult, utilization: float, measured: float) -> str:
    cores = next((cpu.cores for cpu in result.probe.cpu.values()), 0)
    return f"{number(utilization * cores, 2)} / {number(measured, 2)}"


def rematch_figures(result: TuneResult, sweep: list[SweepEntry], rematch: Rematch) -> dict:
    """The head-to-head of the sweep's best and the tuner's pick: each one's least disturbed round (the
    highest rate it sustained), and whether the pick is within 10% of the best (the issue's goal). When
    the sweep's best sustained under half its sweep figure in every round, the machine was disturbed
    throughout (measured: 94 and 0/s after 1,498/s in the sweep) and the ratio means nothing."""
    best, chosen = sweep[0].config, result.chosen
    rates = {config.label: [e.rate for e in entries] for config, entries in rematch.items()}
    best_rate = max(rates.get(best.label, [0.0]))
    chosen_rate = max(rates.get(chosen.label, [0.0]))
    return {
        "rates": rates,
        "best_rate": best_rate,
        "chosen_rate": chosen_rate,
        "chosen_over_best": chosen_rate / best_rate if best_rate else float("nan"),
        "disturbed": best_rate < 0.5 * sweep[0].rate,
        "seconds": sum(e.seconds for entries in rematch.values() for e in entries),
    }


def brute_force_figures(result: TuneResult, sweep: list[SweepEntry], sweep_stolen_s: float) -> dict:
    """The sweep's best next to the tuner's pick, and the time each took. The time goal (the tuner in
    at most a fifth of the brute force's time) leaves out, on both sides, the runs measured again
    while the hypervisor took CPU from them (``perf.tune.steal``): a stretch of steal lands on one or
    the other by chance, and the tuner's few minutes weigh it five times as much."""
    best = sweep[0]
    mine = next((e for e in sweep if e.config == result.chosen), None)
    seconds = sum(e.seconds for e in sweep)
    return {
        "best": best.config.label,
        "best_rate": best.rate,
        "chosen_rate_measured_by_sweep": mine.rate if mine else None,
        "seconds": seconds,
        "tuner_seconds": result.tuner_s,
        "stolen_s": sweep_stolen_s,
        "tuner_stolen_s": result.stolen_s,
        "net_ratio": (result.tuner_s - result.stolen_s) / (seconds - sweep_stolen_s),
    }


def figures(
    result: TuneResult,
    sweep: list[SweepEntry] | None,
    extra: dict,
    rematch: Rematch | None = None,
    sweep_stolen_s: float = 0.0,
) -> dict:
    """The report's numbers as JSON (what the README and the closing note quote)."""
    operating = result.operating_point
    chosen_rate = next(r for r in result.ranking if r.config == result.chosen).rate
    out = {
        "budget_ms": result.request.budget_ms,
        "chosen": result.chosen.label,
        "operating_rate": operating.rate,
        "predicted_p99_ms": operating.predicted.p99_ms,
        "measured_p99_ms": operating.median_p99_ms,  # the median of its runs
        "p99_error": relative_error(operating.predicted.p99_ms, operating.median_p99_ms),
        "predicted_max_rate": chosen_rate,
        "measured_max_rate": result.measured_rate.get(result.chosen, 0.0),
        "probe_s": result.probe.seconds,
        "predict_s": result.predict_s,
        "shortlist_s": result.shortlist_s,
        "confirm_s": result.confirm_s,
        "tuner_s": result.tuner_s,
        "model_pick": result.model_pick.label,
        "sits_on_budget": [r.config.label for r in _on_budget(result)],
        "shortlist": [
            {
                "config": e.config.label,
                "predicted_rate": _predicted(result, e.config),
                "measured_rate": e.rate,
                "missed_at": e.missed_at,
                "points": len(e.points),
                "seconds": e.seconds,
            }
            for e in result.shortlist
        ],
        "confirmation": _confirmation_figures(result.confirmation),
        "verify_s": result.verify_s,
        "fit": {n: {"t_ms": f.t_ms, "dt_ms": f.dt_ms, "r2": f.r2} for n, f in result.probe.fits.items()},
        "overhead_ms": result.probe.overhead_ms,
        "floor_p99_ms": result.probe.floor_p99_ms,
        "predicted_p99_with_tail_ms": operating.with_tail.p99_ms if operating.with_tail else None,
        "predicted_p99_probe_slice_ms": operating.probe_model.p99_ms if operating.probe_model else None,
        "recalibration": dataclasses.asdict(result.recalibration) if result.recalibration else None,
        "measured_p99_each_repeat_ms": [r.p99_ms for r in operating.repeats],
        "measured_stolen_pct_each_repeat": stolen_pct(operating.repeats),
        "repeat_spread": dataclasses.asdict(spread)
        if (spread := repeat_spread(result.points, result.passes))
        else None,
        "per_request_ms": result.probe.per_request_ms,
        "per_batch_ms": result.probe.per_batch_ms,
        "served_unbatched_at_saturation": result.probe.unbatched.throughput
        if result.probe.unbatched
        else None,
        **cpu_figures(result.probe),
        **extra,
    }
    if sweep:
        out["brute_force"] = brute_force_figures(result, sweep, sweep_stolen_s)
        if rematch:
            out["brute_force"]["rematch"] = rematch_figures(result, sweep, rematch)
    return out


def write_report(
    result: TuneResult,
    folder: Path,
    model: str,
    engine: str,
    sweep: list[SweepEntry] | None = None,
    extra_sections: list[str] | None = None,
    extra_figures: dict | None = None,
    rematch: Rematch | None = None,
    sweep_stolen_s: float = 0.0,
) -> Path:
    plot = plot_p99_vs_rate(result, folder / "p99_vs_rate.png")
    numbers = figures(result, sweep, extra_figures or {}, rematch, sweep_stolen_s)
    (folder / "figures.json").write_text(json.dumps(numbers, indent=1, default=str))
    probe = result.probe
    lines = [
        f"# Tuning {model} for p99 ≤ {result.request.budget_ms:g} ms",
        "",
        f"Chosen: **{result.chosen.label}**{_how_chosen(result)} "
        "(overlay in `overlay.yaml`, merged spec in `spec.tuned.yaml`). "
        f"Operating point {number(numbers['operating_rate'], 0)} requests/s: predicted p99 "
        f"{number(numbers['predicted_p99_ms'])} ms, measured {number(numbers['measured_p99_ms'])} ms "
        f"(median of its {len(numbers['measured_p99_each_repeat_ms'])} runs; "
        f"{100 * numbers['p99_error']:+.0f}%). Highest rate within the budget: predicted "
        f"{number(numbers['predicted_max_rate'], 0)}/s, "
        f"measured {number(numbers['measured_max_rate'], 0)}/s. "
        f"Load engine for every server figure: {engine}.",
        "",
        _repeat_spread_line(numbers, result.operating_point.repeats),
        "",
        _recalibration_line(result),
        "",
        f"One request in flight already has p99 {number(probe.floor_p99_ms)} ms here (client, frontend and "
        "the OS scheduling other work on the shared cores): the column *pred p99 + machine tail* adds that "
        "measured per-request tail to the simulation; candidates are ranked without it.",
        "",
        "## What the prediction was built from (probe)",
        "",
        f"Probe time {probe.seconds:.1f} s (reloads included); "
        f"prediction of {len(result.ranking)} candidates "
        f"took {result.predict_s:.1f} s of CPU; shortlist {result.shortlist_s:.1f} s; "
        f"confirmation {result.confirm_s:.1f} s; "
        f"verification {result.verify_s:.1f} s.",
        "",
        *probe_sections(probe),
        "## Every candidate, predicted",
        "",
        *_on_budget_lines(result),
        table(
            [
                "candidate",
                "predicted max rate (/s)",
                "p99 there (ms)",
                "mean batch there",
                "CPU utilization there",
                "p99 at a trickle (ms)",
                *(["p99 at target rate (ms)"] if result.request.rate else []),
            ],
            [
                [
                    r.config.label,
                    number(r.rate, 0),
                    number(r.best.p99_ms) if r.best else "–",
                    number(r.best.mean_batch) if r.best else "–",
                    f"{100 * r.best.cpu_utilization:.0f}%" if r.best else "–",
                    _trickle_cell(r, result.request.budget_ms),
                    *([number(r.at_rate.p99_ms)] if r.at_rate else []),
                ]
                for r in result.ranking
            ],
        ),
        *_shortlist_lines(result),
        "",
        "## Predicted vs measured (same arrival times)",
        "",
        f"![p99 vs rate]({plot.name})",
        "",
        table(
            [
                "config",
                "rate /s",
                "pred p99",
                "pred p99, probe's slice",
                "pred p99 + machine tail",
                "meas p99",
                "error",
                "meas inf/s",
                "pred batch",
                "meas batch",
                "failed/sent",
                "CPU busy pred / meas (cores)",
                "p99 of each repeat",
                "engine",
            ],
            _points_rows(result, engine),
        ),
    ]
    if sweep:
        bf = numbers["brute_force"]
        lines += [
            "",
            "## Brute force (every candidate measured, no prediction)",
            "",
            f"Best measured: **{bf['best']}** at {number(bf['best_rate'], 0)}/s; "
            "the tuner's pick measured by "
            f"the same sweep: {number(bf['chosen_rate_measured_by_sweep'] or 0, 0)}/s. Time: brute force "
            f"{bf['seconds']:.0f} s vs tuner {bf['tuner_seconds']:.0f} s "
            f"({bf['tuner_seconds'] / bf['seconds']:.2f} of it); of those, {bf['stolen_s']:.0f} and "
            f"{bf['tuner_stolen_s']:.0f} s measured runs again that the hypervisor took CPU from (a "
            "stretch of steal lands on either by chance), without them "
            f"**{bf['net_ratio']:.3f}** (the goal: ≤ 0.2).",
            "",
            table(
                ["candidate", "measured max rate /s", "tuner predicted /s", "points", "seconds"],
                [
                    [
                        e.config.label,
                        number(e.rate, 0),
                        number(_predicted(result, e.config), 0),
                        len(e.points),
                        number(e.seconds, 0),
                    ]
                    for e in sweep
                ],
            ),
            *_rematch_lines(bf.get("rematch")),
        ]
    lines += extra_sections or []
    path = folder / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _repeat_spread_line(numbers: dict, repeats: list[Observed]) -> str:
    """The operating point's runs and the measurement's own reproducibility next to the prediction's
    error (``repeat_spread``). Runs that counted although the hypervisor took CPU from them are marked
    and counted: their p99 holds the host's other guests, and a reader comparing it with the prediction
    must know that first."""
    spread = numbers["repeat_spread"]
    runs = (
        f"At the operating point the runs measured {', '.join(p99_with_steal(run) for run in repeats)} ms "
        "(their median counts)"
    )
    if taken := counted_stolen(repeats):
        runs += f"; {taken} (section *Runs the hypervisor took CPU from*)"
    if spread is None:
        return (
            f"{runs}; no verification point was measured in two passes with both runs keeping up: "
            "no repeat spread."
        )
    verdict = (
        f": one run is no yardstick for p99 within {100 * P99_GOAL:.0f}% on this machine"
        if spread["median_ratio"] > 1 + P99_GOAL
        else ""
    )
    return (
        f"{runs}. How reproducible one run is: over the {spread['points']} verification points "
        "measured in two passes (a pass apart, same arrivals, both keeping up), the higher p99 of their "
        f"first runs was {spread['median_ratio']:.2f}× the lower (median), more than "
        f"{1 + P99_GOAL:.1f}× in {100 * spread['beyond_goal']:.0f}% of them{verdict}."
    )


def _recalibration_line(result: TuneResult) -> str:
    found = result.recalibration
    if found is None:
        return (
            "The predictions below use the probe's CPU-wait slices (the shortlist did not measure the "
            "pick sustaining a rate to recalibrate on)."
        )
    runs = ", ".join(
        f"{number(run.p99_ms)} ms at {number(run.rate, 0)}/s → {number(1e3 * run.slice_s, 3)} ms"
        for run in found.runs
    )
    return (
        f"The predictions below use a CPU-wait slice for ×{found.instances} recalibrated on the "
        f"tuner's {len(found.runs)} runs of the pick that kept up (shortlist, then confirmation; the "
        f"shortlist measured it to sustain {number(found.rate, 0)}/s): each run's p99 gives the slice "
        f"with which the simulation reproduces it on the same arrivals ({runs}; 0 where the "
        "simulation alone already reaches it, a run left out), and the median of the others, "
        f"{number(1e3 * found.slice_s, 3)} ms, is the slice; the probe's runs (no delay, 10/40/70% of "
        f"saturation) gave {number(1e3 * found.probe_slice_s, 3)} ms; the column *pred p99, probe's "
        "slice* keeps the probe's (`perf.tune.tuner.recalibrate`)."
    )


def _rematch_lines(rematch: dict | None) -> list[str]:
    if not rematch:
        return []
    ratio = rematch["chosen_over_best"]
    verdict = "met" if ratio >= 0.9 else "missed"
    if rematch.get("disturbed"):
        verdict = "no verdict: the sweep's best sustained under half its sweep figure in every round"
    return [
        "",
        "Head to head (`perf.tune.measured.rematch`: the sweep's bisection, each rate judged by a majority "
        f"of up to {MAJORITY_OF} runs, both configurations measured in each round, the least disturbed "
        "round counting): "
        + "; ".join(
            f"{label}: {', '.join(number(r, 0) for r in rates)}/s"
            for label, rates in rematch["rates"].items()
        )
        + f". The pick sustains {100 * ratio:.0f}% of the best (goal ≥ 90%: **{verdict}**); "
        f"{rematch['seconds']:.0f} s.",
    ]


def _how_chosen(result: TuneResult) -> str:
    if not result.shortlist:
        return ", by prediction alone"
    return f", the most sustained of the {len(result.shortlist)} shortlisted"


def _on_budget(result: TuneResult) -> list[Ranked]:
    """The feasible candidates that sit on the budget at every rate (``Ranked.sits_on_budget``)."""
    request = result.request
    return [r for r in result.ranking if feasible(r, request) and r.sits_on_budget(request.budget_ms)]


def _on_budget_lines(result: TuneResult) -> list[str]:
    on_budget = _on_budget(result)
    if not on_budget:
        return []
    every = len(on_budget) == sum(feasible(r, result.request) for r in result.ranking)
    fate = "Measured anyway, since every feasible candidate is one" if every else "Not measured"
    return [
        f"{fate}: "
        f"{', '.join(r.config.label for r in on_budget)}. Even at a trickle their predicted p99 is within "
        f"×{HEADROOM:g} of the budget because of their delay (without it, not): the delay fills the budget, "
        "so a run meets it by chance at any rate and where a bisection on them stops is a coin flip "
        "(`tuner.HEADROOM`).",
        "",
    ]


def _trickle_cell(entry: Ranked, budget_ms: float) -> str:
    if entry.trickle is None or entry.trickle_without_delay is None:
        return "–"
    cell = number(entry.trickle.p99_ms)
    if entry.config.max_queue_delay_us:
        cell += f" ({number(entry.trickle_without_delay.p99_ms)} without the delay)"
    return cell + (", on the budget" if entry.sits_on_budget(budget_ms) else "")


def _shortlist_lines(result: TuneResult) -> list[str]:
    if not result.shortlist:
        return ["", f"Chosen by prediction alone (no shortlist measured): {result.model_pick.label}."]
    return [
        "",
        "## The shortlist, measured (`perf.tune.measured`)",
        "",
        "The best predicted candidate of each family (instances, max batch size), then the shortest delay "
        f"of the first {result.request.baselines} families where the model preferred a longer one (its "
        "costs favour delay), measured in that order with the brute force's own rule "
        f"({SHORTLIST_POINT_S:g} s points; a miss measured twice unless the server served under "
        f"{OVERLOADED:.0%} of the offered rate or its p99 was beyond {SHORTLIST_REPEAT_WITHIN:g}× the "
        "budget): the first in a bracket of 0.6–1.5× its predicted rate, "
        "first at the prediction (until one meets the budget, a candidate that missed its whole bracket "
        "scales the later brackets down by its lowest miss over its prediction); each later one first "
        "at the leader's rate, where a miss ends "
        f"it (*< rate*) and a pass goes on above: {result.shortlist_s:.0f} s. The prediction alone ranks "
        f"**{result.model_pick.label}** first; the one that sustained the most is chosen: "
        f"**{result.chosen.label}**.",
        "",
        table(
            ["candidate", "predicted max rate /s", "measured max rate /s", "points", "seconds"],
            [
                [
                    e.config.label,
                    number(_predicted(result, e.config), 0),
                    f"< {number(e.missed_at, 0)}" if e.missed_at else number(e.rate, 0),
                    len(e.points),
                    number(e.seconds, 0),
                ]
                for e in result.shortlist
            ],
        ),
        *_confirmation_lines(result.confirmation),
    ]


def _confirmation_figures(confirmation: Confirmation | None) -> dict | None:
    if confirmation is None:
        return None
    return {
        "rate": confirmation.rate,
        "confirmed": confirmation.confirmed,
        "runs": [
            {"rate": rate, "p99_ms": run.p99_ms, "served": run.throughput, "failed": run.failed}
            for rate, run in zip(confirmation.rates, confirmation.runs, strict=True)
        ],
        "seconds": confirmation.seconds,
    }


def _confirmation_lines(confirmation: Confirmation | None) -> list[str]:
    if confirmation is None:
        return []
    runs = "; ".join(
        f"{number(rate, 0)}/s: {number(run.p99_ms)} ms"
        for rate, run in zip(confirmation.rates, confirmation.runs, strict=True)
    )
    verdict = (
        f"the tuner operates at {number(confirmation.rate, 0)}/s"
        if confirmation.confirmed
        else f"no rate tried met it: the tuner operates at the last, {number(confirmation.rate, 0)}/s, "
        "unconfirmed"
    )
    return [
        "",
        "The operating point, confirmed (`perf.tune.operating`): the pick measured at "
        f"{OPERATING_SHARE:.0%} of the rate it sustained, two runs and a third where they disagreed (a "
        f"majority of {MAJORITY_OF} decides), {OPERATING_SHARE:.0%} of that again while the majority "
        f"missed the budget (at most {CONFIRM_STEPS} steps down): {runs}; {verdict} "
        f"({confirmation.seconds:.0f} s, counted in the tuner's time). These runs count in the "
        "recalibration too: the only ones measured at the rate the prediction is judged at.",
    ]


def _predicted(result: TuneResult, config: BatcherConfig) -> float:
    return next((r.rate for r in result.ranking if r.config == config), float("nan"))
