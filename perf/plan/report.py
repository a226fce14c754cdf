"""The plan's ``report.md``, rendered from ``plan.json`` alone, and ``p99_vs_rate.png``."""

from __future__ import annotations

from pathlib import Path

from perf.markdown import number, table, write_report
from perf.plan.document import PlanDocument
from perf.plan.planner import Judged, Plan, curve
from perf.studies.plots import plt, save_figure

TOP = 3


def top_architectures(plan: Plan, count: int = TOP) -> list[Judged]:
    """The best feasible strategy of each architecture (kind, precision, instances, replicas)."""
    best: dict[tuple, Judged] = {}
    for judged in filter(lambda j: j.feasible, plan.judged):
        s = judged.strategy
        best.setdefault((s.kind, s.precision, s.instances, s.replicas), judged)
    return list(best.values())[:count]


def plot(plan: Plan, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for judged in top_architectures(plan):
        points = curve(judged, plan.profile, plan.request)
        axes.plot(
            [p.rate for p in points], [p.p99_ms for p in points], marker="o", label=judged.strategy.label
        )
    axes.axhline(plan.request.budget_ms, color="grey", linestyle="--", label="p99 budget")
    axes.set(xlabel="requests/s (predicted)", ylabel="p99 ms (predicted)", yscale="log")
    return save_figure(figure, path, axes)


def rate_sentence(saved: PlanDocument) -> str:
    """The plan's rate and, in the same sentence, whether it was measured or predicted, and from what."""
    chosen = saved.chosen
    origin = saved.compute_origin or f"from {saved.compute_source}"
    predicted = (
        f"predicted {number(chosen.rate, 0)} requests/s {origin} (a prediction)"
        if chosen.rate
        else f"the prediction put it over the budget at every rate {origin} (a prediction; a run held it)"
    )
    if saved.measured_rate:
        return (
            f"measured within the budget up to **{number(saved.measured_rate, 0)} requests/s** on this "
            f"machine (the highest rate a point held it at, by the search's rule); {predicted}"
        )
    return (
        f"up to {number(chosen.rate, 0)} requests/s predicted {origin} (p99 {number(chosen.p99_ms)} ms "
        "there, predicted; not measured)"
    )


def answer(saved: PlanDocument) -> list[str]:
    """The headline: the pick with its rate, or the verdict and that nothing here is an answer."""
    chosen = saved.chosen
    if saved.verdict:
        return [
            f"**No answer: {saved.verdict}.** Nothing below is an answer: no `overlay.yaml` or "
            f"`spec.planned.yaml` was written. The prediction's pick was {chosen.label} "
            f"({number(chosen.rate, 0)} requests/s predicted within the budget {saved.compute_origin}); "
            "no point the server measured held the budget (the table below).",
        ]
    return [
        f"Chosen: **{chosen.label}**: {rate_sentence(saved)}.",
        "",
        f"Requests reach it: {saved.routing}. "
        f"Server flags: `{' '.join(saved.server_flags) or 'none'}`. "
        "The spec overlay is `overlay.yaml` (merged: `spec.planned.yaml`)."
        if saved.overlay_written
        else "No spec overlay was written: a spec cannot yet place a model's tables on other GPUs than its "
        "dense part; the table placement is below and in `plan.json`.",
    ]


def render(folder: Path, saved: PlanDocument) -> Path:
    """``report.md`` from the plan's document alone (the one built, or ``plan.json`` read back)."""
    title = saved.model  # as ``MODEL=`` gave it: a pipeline's says which model it splits
    if saved.asked and saved.asked != saved.model:
        title = f"{saved.asked} (a pipeline splitting {saved.model})"
    chosen = "chosen"
    if saved.measured_rate:
        chosen = f"chosen (measured within the budget up to {number(saved.measured_rate, 0)}/s)"
    lines = [
        f"# Plan: {title}, p99 ≤ {saved.budget_ms:g} ms on {saved.topology.name}",
        "",
        *answer(saved),
        "",
        f"Compute figures: {saved.compute_source}.",
        *([f"\nMemory figures: {saved.memory_source}."] if saved.memory_source else []),
        *(f"\n**Warning**: {w}" for w in saved.topology.warnings),
        "",
        "## Placement",
        "",
        table(["model", "replica", "stage", "GPUs", "instances"],
              [[a.model, a.replica, a.stage, ", ".join(map(str, a.gpus)) or "CPU", a.instances]
               for a in saved.placement]),
        "",
        "## Every strategy",
        "",
        "Rates and p99s here are the prediction's (none: no rate predicted within the budget); a reason "
        "that names a measurement (demoted, a lower measured rate) is the server's, the others the "
        "prediction's.",
        "",
        table(["strategy", "predicted rate/s", "predicted p99 ms", "memory per device (MiB)", "links",
               "why it lost"],
              [[s.label, number(s.rate, 0) if s.rate else "none", number(s.p99_ms) if s.p99_ms else "–",
                ", ".join(f"{d} {number(m)}" for d, m in s.memory_mib.items()),
                "; ".join(" ".join(links) for links in s.links if links) or "–", s.reason or chosen]
               for s in saved.strategies]),
        "",
        "![predicted p99 vs rate](p99_vs_rate.png)",
    ]  # fmt: skip
    if saved.verification:
        lines += [
            "",
            "## Predicted vs measured on this machine",
            "",
            "Every point the server measured (the probe's runs of a strategy, the search's, the shapes "
            "step's re-measure): the last run's figures, how many runs the point had and what the search's "
            "rule made of them (a miss alone stays open; a point holds when more of its runs met the budget "
            "than missed; a run whose p99 rests on too few requests, marked so, counts as a miss); where a "
            "point's runs disagree, each run's p99 in the order measured.",
            "",
            table(["strategy", "rate/s", "p99 predicted", "p99 measured", "served/s", "runs", "point"],
                  [[v.strategy, number(v.rate, 0), number(v.predicted_p99_ms), v.measured_p99_text,
                    number(v.measured_throughput, 0), v.runs, v.point_text]
                   for v in saved.verification]),
        ]  # fmt: skip
    if saved.shapes:
        lines += ["", *saved.shapes.section]
    return write_report(folder / "report.md", lines)
