"""``python -m perf tune --follow``: a rate step, a fixed configuration vs one that follows the rate.

Both runs replay the same arrivals (low rate, high rate, low rate) from the same start: the
configuration a static tuning would pick for the peak. The fixed run keeps it; the following run lets
``Follower`` reload the model with the delay the simulation prefers at each observed rate. The report
shows p99 per second for both, every reload, and the failed requests of each run (the client's count
and the server's), which must be zero.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from exporters.resolve import load_spec
from perf.markdown import number, table
from perf.records import write_csv
from perf.tune.engine import engine_from_args
from perf.tune.follow import FollowRun, delay_policy, follow_run, p99_over_time, step_arrivals
from perf.tune.probe import ProbePlan, probe, served_capacity
from perf.tune.report import finish_p99_plot
from perf.tune.session import TuneSession

DELAYS_US = (0, 500, 1000, 2000, 5000, 10000)
MAX_BATCH = 32


def plot_follow(runs: list[FollowRun], budget_ms: float, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    for index, run in enumerate(runs):
        series = p99_over_time(run.observed.records)
        axes.plot([s[0] for s in series], [s[1] for s in series], "o-", color=f"C{index}", label=run.label)
        for reload in run.reloads:
            axes.axvline(reload.at_s, color=f"C{index}", alpha=0.4, linestyle=":")
    title = "rate step: fixed configuration vs following the rate (dotted: reloads)"
    return finish_p99_plot(figure, axes, budget_ms, "arrival time (s)", title, path)


def run_follow_demo(args: argparse.Namespace, folder: Path, console) -> int:
    model = args.model or "recommender"
    budget = args.p99_ms or 10.0
    spec = load_spec(args.spec)
    engine = engine_from_args(args)
    console.print(f"--follow on {model}: rate step, fixed vs following → {folder}")
    with engine, TuneSession(spec, model, MAX_BATCH, Path(".run/tune"), engine) as session:
        console.print("  probing the service model")
        measured = probe(session, (1,), MAX_BATCH, ProbePlan(concurrencies=(1, 16, 48), seconds=2.0))
        capacity = served_capacity(measured)
        # Well inside capacity: the probe's capacity is an upper bound on a machine shared with other work,
        # and an overloaded run sheds requests whatever the configuration.
        low, high = 0.1 * capacity, 0.4 * capacity
        ladder = tuple(capacity * f for f in (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6))
        delays = tuple(d for d in DELAYS_US if d / 1000 < budget)
        policy = delay_policy(measured.services[1], MAX_BATCH, 1, delays, ladder, budget)
        phases = [(low, args.seconds), (high, args.seconds), (low, args.seconds)]
        arrivals = step_arrivals(phases, args.seed)
        peak = policy(high)
        console.print(f"  fixed at {peak.label} (the peak's pick), then following")
        runs = [
            follow_run(session, arrivals, peak, None, f"fixed: {peak.label}"),
            follow_run(session, arrivals, peak, policy, "following the rate"),
        ]
    plot = plot_follow(runs, budget, folder / "follow.png")
    rows = []
    for run in runs:
        series = p99_over_time(run.observed.records)
        phase_p99 = []
        for k in range(len(phases)):
            start, end = k * args.seconds, (k + 1) * args.seconds
            values = [p for t, p, _ in series if start <= t < end]
            phase_p99.append(number(max(values)) if values else "–")
        rows.append(
            [
                run.label,
                *phase_p99,
                number(run.observed.p99_ms),
                f"{run.observed.failed}/{len(run.observed.records)}",
                run.server_failed,
                len(run.reloads),
                number(run.observed.stats.mean_batch),
            ]
        )
    reloads = [
        [number(r.at_s, 1), number(r.rate, 0), r.config, number(r.seconds, 2)] for r in runs[1].reloads
    ]
    lines = [
        f"# --follow: {model}, p99 budget {budget:g} ms",
        "",
        f"Arrivals: Poisson {number(low, 0)}/s for {args.seconds:g} s, {number(high, 0)}/s, then "
        f"{number(low, 0)}/s again (the same times in both runs); engine: {engine.name}.",
        "",
        "Policy (rate → the longest delay predicted to keep p99 within 80% of the budget): "
        + "; ".join(f"{number(rate, 0)}/s: {config.label}" for rate, config in policy.table),
        "",
        f"![p99 over time]({plot.name})",
        "",
        table(
            [
                "run",
                "worst p99/s low",
                "worst p99/s high",
                "worst p99/s low again",
                "p99 overall",
                "failed/sent (client)",
                "failed (server)",
                "reloads",
                "mean formed batch",
            ],
            rows,
        ),
        "",
        "Reloads of the following run:",
        "",
        table(["at (s)", "observed rate /s", "loaded", "took (s)"], reloads) if reloads else "none",
        "",
        "With no reload both runs served the same configuration: any difference between them is the "
        "shared machine, not the tuner."
        if not reloads
        else "",
    ]
    for run, name in zip(runs, ("fixed", "following"), strict=True):
        write_csv(run.observed.records, folder / f"follow_{name}.csv")
        reasons = Counter(r.status.split(":")[0] for r in run.observed.records if not r.ok)
        if reasons:
            why = ", ".join(f"{reason} ×{count}" for reason, count in reasons.most_common())
            lines += [
                "",
                f"{run.label}: failed requests by reason: {why} (`shed`: more than 256 requests in "
                "flight in one client process, i.e. the server fell behind).",
            ]
    report = folder / "follow.md"
    report.write_text("\n".join(lines) + "\n")
    console.print(report.read_text(), highlight=False, markup=False)
    following = runs[1]  # the contract: reloading loses nothing
    return 0 if following.observed.failed == 0 and following.server_failed == 0 else 1
