"""The tuner's report, rendered from its saved result alone (``python -m perf.tune.report <folder>``
renders it again from ``<folder>/result.json``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from perf.errors import EXIT_USAGE, OptionError
from perf.markdown import error_percent, number, percent, table, write_report
from perf.measure.measurement import too_few_note
from perf.session.search import disagreement
from perf.studies.goals import GOALS, goals_table
from perf.studies.plots import plt, save_figure
from perf.tune.result import CpuFigures, PointFigures, RunFigures, ShortlistFigures, TuneDocument, load

NOISE_MARK = "†"  # beside a figure whose run the hypervisor took CPU from (``perf.measure.noise``)


def plot_verification(saved: TuneDocument, path: Path) -> Path:
    """Predicted (lines) and measured (markers) p99 against the offered rate, per configuration."""
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    configs = list(dict.fromkeys([saved.chosen, *(p.config for p in saved.verification)]))
    for index, config in enumerate(configs):
        points = sorted((p for p in saved.verification if p.config == config), key=lambda p: p.rate)
        label = config + (" (chosen)" if config == saved.chosen else "")
        for kind, style in (("predicted", "-"), ("measured", "o")):
            figures = [getattr(p, kind) for p in points]
            shown = [(p.rate, f.p99_ms) for p, f in zip(points, figures, strict=True) if f and f.p99_ms]
            if shown:
                rates, p99s = zip(*shown, strict=True)
                axes.plot(rates, p99s, style, color=f"C{index}", label=f"{label}: {kind}")
    axes.axhline(saved.budget_ms, color="k", linestyle="--", label=f"budget {saved.budget_ms:g} ms")
    title = "p99 vs rate: simulation vs the server"
    axes.set(xlabel="offered rate (requests / s)", ylabel="p99 latency (ms)", yscale="log", title=title)
    return save_figure(figure, path, axes, grid="both")


def section(title: str, *blocks: str) -> list[str]:
    """A report section: its heading, then each block after a blank line."""
    return ["", f"## {title}", *(line for block in blocks for line in ("", block))]


def columns_table(columns: dict[str, Callable[[Any], object]], items: Iterable[Any]) -> str:
    """A table with one column per entry of ``columns`` (its header, and the cell of an item)."""
    return table(list(columns), [[cell(item) for cell in columns.values()] for item in items])


def p99(run: RunFigures | None, unit: str = "") -> str:
    """A measured p99, marked where it holds the host's noise or rests on too few requests."""
    if not run:
        return "–"
    mark = NOISE_MARK if run.host_noise else ""
    return number(run.p99_ms) + mark + unit + too_few_note(run.samples, run.too_few)


def _error(point: PointFigures) -> float:
    return error_percent(point.predicted.p99_ms, point.measured.p99_ms if point.measured else None)


def headline(saved: TuneDocument) -> list[str]:
    operating, seconds, up_to = saved.operating, saved.seconds, number(saved.measured_max_rate, 0)
    goal, error = GOALS["tuner p99 prediction"], _error(saved.operating)
    held = (
        f"holds p99 ≤ {saved.budget_ms:g} ms at the target, {number(saved.target_rate, 0)} requests/s, "
        f"measured (and up to {up_to}/s)"
        if saved.target_rate
        else f"holds p99 ≤ {saved.budget_ms:g} ms up to **{up_to} requests/s**, measured (the highest rate a "
        "point held the budget at, by the search's rule)"
    )
    return [
        f"# Tuning {saved.model} for p99 ≤ {saved.budget_ms:g} ms",
        "",
        f"Chosen: **{saved.chosen}**: {held}; overlay in `overlay.yaml`, the merged spec in "
        "`spec.tuned.yaml`.",
        "",
        f"At {number(saved.operating_rate, 0)} requests/s: measured p99 {p99(operating.measured, ' ms')} "
        f"({runs_text(operating)}); the batcher simulation predicted {number(operating.predicted.p99_ms)} ms "
        f"there. {prediction_sentence(saved)}",
        *demotions(saved),
        "",
        f"Time: probe {seconds.probe:.0f} s, prediction {seconds.predict:.1f} s, shortlist "
        f"{seconds.shortlist:.0f} s (the search: {seconds.tuner:.0f} s), answer and verification "
        f"{seconds.verify:.0f} s. Load engine for every server figure: {saved.engine}.",
        *section("Goals", goals_table([goal.outcome(percent(error), goal.met(abs(error)))])),
    ]


def prediction_sentence(saved: TuneDocument) -> str:
    """The prediction's figures, labelled as such."""
    ranked = saved.predicted_max_rate is not None
    first = f"; the prediction alone ranks {saved.model_pick} first" if ranked else ""
    return f"Prediction (not a measurement): {prediction_figure(saved)}{first}."


def prediction_figure(saved: TuneDocument) -> str:
    """What the prediction said, in words that never contradict the answer measured: its rate for the answer
    where it ranked it, else its own first and that first's rate, else that it put nothing within the
    budget."""
    if saved.predicted_max_rate is not None:
        return f"{number(saved.predicted_max_rate, 0)}/s within the budget"
    first = next((c for c in saved.candidates if c.feasible and c.best), None)
    if first is not None:
        return (
            f"the answer is no candidate it ranked (a probe run held the budget with it, and its search "
            f"measured the rest); its first, {first.config}, {number(first.best.rate, 0)}/s within the budget"
        )
    return "no candidate within the budget (the rate measured above is the answer)"


def runs_text(point: PointFigures) -> str:
    """A point's runs and the search's rule on them; where they disagree, each run's p99."""
    runs = f"{point.runs} run{'s' if point.runs != 1 else ''}"
    text = f"{runs}, {point.verdict}" if point.verdict else runs
    disagree = disagreement(point.runs_p99_ms, point.runs_met)
    return f"{text}: {disagree}" if disagree else text


def demotions(saved: TuneDocument) -> list[str]:
    """The answers a later run refuted: each missed the budget at its rate or below, so it is none."""
    if not saved.demoted:
        return []
    misses = "; ".join(
        f"{p.config} at {number(p.rate, 0)}/s: p99 {p99(p.measured, ' ms')}, served "
        f"{number(p.measured.served, 0)}/s ({runs_text(p)})"
        for p in saved.demoted
        if p.measured
    )
    return [
        "",
        f"Reopened (a later run missed the budget at the answer's rate or below it, so these are not "
        f"answers): {misses}.",
    ]


def noise_section(saved: TuneDocument) -> list[str]:
    noise = saved.noise
    points = [p for c in saved.shortlist for p in c.points] + list(saved.verification)
    runs = [run for run in (*saved.probe.runs, *(p.measured for p in points)) if run]
    noisy = [run for run in runs if run.host_noise]
    policy = (
        f"A run with {100 * noise.stolen_limit:.1f}% or more of the CPUs' time stolen by the hypervisor "
        "(steal in `/proc/stat`) measures the host's other guests as well as the configuration: it is "
        "measured once more and the less stolen of the two counts. "
        f"{len(noise.remeasured)} of {noise.runs} runs were measured again ({noise.remeasured_s:.0f} s)."
    )
    noisy_labels = ", ".join(f"{run.label} ({number(run.stolen_pct)}%)" for run in noisy)
    still = f"{len(noisy)} of the {len(runs)} figures below still hold the host's noise (marked {NOISE_MARK})"
    held = f"{still}: {noisy_labels}." if noisy else "No figure below holds the host's noise."
    return section("Host noise (`perf.measure.noise`)", policy, held)


def probe_section(saved: TuneDocument) -> list[str]:
    probe = saved.probe
    fits = columns_table(
        {
            "instances": lambda n: n,
            "T (ms)": lambda n: number(probe.fits[n].t_ms, 3),
            "Δt (ms)": lambda n: number(probe.fits[n].dt_ms, 3),
            "R²": lambda n: number(probe.fits[n].r2, 3),
            "per execution + per request beyond compute (ms)": lambda n: (
                f"{number(probe.per_batch_ms, 3)} + {number(probe.per_request_ms[n], 3)}"
            ),
        },
        probe.fits,
    )
    contention = cpu_sentence(probe.cpu) if probe.cpu else "No CPU term (no CPU readings)."
    runs = columns_table(
        {
            "probe run": lambda run: run.label,
            "served /s": lambda run: number(run.served, 0),
            "mean batch": lambda run: number(run.mean_batch),
            "p99 ms": p99,
            "CPU busy (cores)": lambda run: number(run.cpu_cores, 2),
            "windows agreed": lambda run: "yes" if run.stable else "no",
            "formed batches (size: executions)": lambda run: ", ".join(
                f"{s}: {c}" for s, c in run.batches.items()
            ),
        },
        probe.runs,
    )
    outside = (
        f"Latency outside the server at the lowest rate: {number(probe.overhead_ms, 3)} ms; p99 there "
        f"{number(probe.floor_p99_ms)} ms."
    )
    return section("What the prediction was built from (probe)", outside, fits, contention, runs)


def cpu_sentence(cpu: CpuFigures) -> str:
    fit = (
        f"**{number(cpu.idle_cores, 2)} idle + {number(cpu.per_request_us, 0)} µs per request + "
        f"{number(cpu.per_execution_us, 0)} µs per execution** on {cpu.cores} cores"
    )
    slices = ", ".join(f"{number(ms, 3)} ms with {n} instance(s)" for n, ms in cpu.slice_ms.items())
    return (
        f"CPU term: the machine's busy cores over the runs that kept up, fitted: {fit}; each request waits "
        f"for a core as in an M/M/c queue with a slice of {slices} (the median of what that count's busier "
        "runs ask for)."
    )


def candidates_section(saved: TuneDocument) -> list[str]:
    target = saved.target_rate
    columns: dict[str, Callable[[Any], object]] = {
        "candidate": lambda c: c.config + ("" if c.feasible else " (infeasible)"),
        "predicted max rate /s": lambda c: number(c.best.rate, 0) if c.best else "–",
        "p99 there (ms)": lambda c: number(c.best.p99_ms) if c.best else "–",
        "mean batch there": lambda c: number(c.best.mean_batch) if c.best else "–",
        "CPU busy there (cores)": lambda c: number(c.best.cpu_cores, 2) if c.best else "–",
    }
    if target:
        columns[f"p99 at {target:g}/s (ms)"] = lambda c: number(c.at_rate.p99_ms)
    return section("Every candidate, predicted", columns_table(columns, saved.candidates))


def shortlist_section(saved: TuneDocument) -> list[str]:
    if not saved.shortlist:
        return ["", f"No shortlist was measured: the prediction alone picked {saved.chosen}."]
    rows = columns_table(
        {
            "candidate": lambda c: c.config + (" **chosen**" if c.config == saved.chosen else ""),
            "predicted max rate /s": lambda c: number(c.predicted_rate, 0) if c.predicted_rate else "–",
            "measured max rate /s": held_up_to,
            "points (p99, runs)": lambda c: "; ".join(
                f"{number(p.rate, 0)}/s: {p99(p.measured, ' ms')} ({runs_text(p)})" for p in c.points
            ),
            "seconds": lambda c: number(c.seconds, 0),
        },
        saved.shortlist,
    )
    return section(
        "The shortlist, measured",
        "The best predicted candidate of each family (instances, max batch size), searched on the server "
        "by the one measured search (`perf.session.search`): rates on one ladder, up after a point that held "
        "the budget, down after one that missed, then between until they are neighbouring rungs; a point "
        "holds when more of its runs met the budget than missed it (a miss alone is measured again); a run "
        "whose p99 rests on too few requests to judge it by is marked so and counts as a miss.",
        rows,
    )


def held_up_to(candidate: ShortlistFigures) -> str:
    """The rate a shortlisted configuration held the budget up to, naming a miss that stood below a point
    that held ("holds up to" needs every point below)."""
    refuted = candidate.refuted_rate
    held_above = refuted is not None and any(
        p.verdict == "holds" and p.rate > refuted for p in candidate.points
    )
    why = f"a miss stood at {number(refuted, 0)}/s, below points that held" if held_above else ""
    if candidate.measured_rate:
        return number(candidate.measured_rate, 0) + (f" ({why})" if why else "")
    return f"none: {why}" if why else "none held"


def verification_section(saved: TuneDocument, plot: Path) -> list[str]:
    demoted = {(p.config, p.rate) for p in saved.demoted}

    def config(point: PointFigures) -> str:
        chosen = " **chosen**" if point.config == saved.chosen else ""
        return point.config + chosen + (" (reopened)" if (point.config, point.rate) in demoted else "")

    rows = columns_table(
        {
            "config": config,
            "rate /s": lambda p: number(p.rate, 0),
            "pred p99": lambda p: number(p.predicted.p99_ms),
            "meas p99": lambda p: p99(p.measured),
            "error": lambda p: percent(_error(p)) if p.measured else "–",
            "meas served /s": lambda p: number(p.measured.served, 0) if p.measured else "–",
            "pred batch": lambda p: number(p.predicted.mean_batch),
            "meas batch": lambda p: number(p.measured.mean_batch) if p.measured else "–",
            "CPU busy pred / meas": lambda p: (
                f"{number(p.predicted.cpu_cores, 2)} / {number(p.measured.cpu_cores, 2)}"
                if p.measured
                else "–"
            ),
            "failed/sent": lambda p: f"{p.measured.failed}/{p.measured.sent}" if p.measured else "–",
            "runs, rule": lambda p: runs_text(p) if p.measured else "–",
        },
        saved.verification,
    )
    return section(
        "Predicted vs measured",
        f"![p99 vs rate]({plot.name})",
        "The answer and its neighbours around its measured rate; a point the search measured already is "
        "shown with its runs, the others were measured once here (a miss alone stays open, but the "
        "answer's own below its rate, which are measured until the rule decides them). Each row's p99 is "
        "its last run's; where a point's runs disagree, the last column gives each.",
        rows,
    )


def raw_section(saved: TuneDocument) -> list[str]:
    if not saved.raw:
        return []
    fit = next(iter(saved.probe.fits.values()))
    rows = [
        [p.batch, number(p.batch_ms, 3), number(fit.t_ms + (p.batch - 1) * fit.dt_ms, 3)] for p in saved.raw
    ]
    return [
        "",
        "Raw backend (the same ONNX file in-process, same threads) beside the served compute fit:",
        "",
        table(["batch", "raw ms", "served fit ms"], rows),
    ]


def render(folder: Path, saved: TuneDocument | None = None) -> Path:
    """``report.md`` and its plot in ``folder``, from ``saved`` (None: ``folder/result.json``)."""
    saved = saved or load(folder)
    lines = [
        *headline(saved),
        *noise_section(saved),
        *probe_section(saved),
        *raw_section(saved),
        *candidates_section(saved),
        *shortlist_section(saved),
        *verification_section(saved, plot_verification(saved, folder / "p99_vs_rate.png")),
        *(line for extra in saved.sections for line in ("", *extra)),  # the shapes step's, after the tuner's
    ]
    return write_report(folder / "report.md", lines)


def main(argv: list[str] | None = None) -> int:
    options = argparse.ArgumentParser(prog="python -m perf.tune.report", description=render.__doc__)
    options.add_argument("folder", type=Path, help="a make tune report folder (with result.json)")
    try:
        print(render(options.parse_args(argv).folder))
    except OptionError as error:  # not a tune result: the file and the field it got wrong, one line
        print(f"{options.prog}: {error}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
