"""The report's plots (PNG); tune, plan and the GPU check take ``plt`` and ``save_figure`` from here, so
the backend is chosen once, before pyplot loads."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from perf.markdown import fit_text
from perf.studies import analysis
from perf.studies.study import FamilyResult, StudyResult
from perf.studies.study_spec import MODES


def save_figure(figure: plt.Figure, path: Path, axes: plt.Axes | None = None, grid: str = "") -> Path:
    """Finish a plot the one way every plot here is finished: grid, legend, tight layout, PNG."""
    if axes is not None:
        if grid:
            axes.grid(True, which=grid, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:  # a plot of nothing measured has no legend to draw
            axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def throughput_vs_concurrency(result: StudyResult, family: FamilyResult, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for mode, runs in family.sweep.items():
        x = [m.load.concurrency for m in runs]
        axes.plot(x, [m.summary().throughput for m in runs], marker="o", label=MODES[mode].title)
    if result.ceiling:
        x = [m.load.concurrency for m in result.ceiling]
        axes.plot(
            x, [m.summary().throughput for m in result.ceiling], "k--", label="harness ceiling (trivial)"
        )
    axes.set(xscale="log", yscale="log", xlabel="samples in flight (closed loop)", ylabel="inferences / s",
             title=f"{family.family}: throughput vs concurrency")  # fmt: skip
    return save_figure(figure, path, axes, grid="both")


def latency_vs_throughput(family: FamilyResult, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for mode, runs in family.sweep.items():
        summaries = [m.summary() for m in runs]
        axes.plot([s.throughput for s in summaries], [s.p99_ms for s in summaries], marker="o",
                  label=MODES[mode].title)  # fmt: skip
    for mode, measurement in family.open_loop.items():
        summary = measurement.summary()
        axes.scatter([summary.throughput], [summary.p99_ms], marker="x", color="k")
        axes.annotate(mode, (summary.throughput, summary.p99_ms), fontsize=7)
    axes.set(yscale="log", xlabel="inferences / s", ylabel="p99 latency (ms)",
             title=f"{family.family}: p99 latency vs throughput (x: open loop)")  # fmt: skip
    return save_figure(figure, path, axes, grid="both")


def formed_batch_histogram(family: FamilyResult, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    formed = {mode: h for mode, run in family.open_loop.items() if (h := analysis.formed_histogram(run))}
    width = 0.8 / max(len(formed), 1)
    for index, (mode, histogram) in enumerate(formed.items()):
        sizes = np.array(sorted(histogram))
        axes.bar(sizes + (index - len(formed) / 2) * width, [histogram[s] for s in sizes], width,
                 label=MODES[mode].title)  # fmt: skip
    load = family.open_load.name if family.open_load else ""
    axes.set(xlabel="batch size formed by the server", ylabel="executions",
             title=f"{family.family}: formed batch sizes under {load}")  # fmt: skip
    return save_figure(figure, path, axes)


def latency_model_fit(family: FamilyResult, path: Path) -> Path | None:
    fit = analysis.fit_served(family)
    if fit is None:
        return None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    sizes = np.array(sorted(fit.points))
    axes.scatter(sizes, [fit.points[s] for s in sizes], label="server compute (batch_stats)")
    line = np.linspace(1, sizes.max(), 50)
    axes.plot(line, [fit.batch_ms(n) for n in line], "C0-", label=f"fit {fit_text(fit, 2)}")
    raw_fit = analysis.fit_raw(family.raw)
    if raw_fit is not None:
        axes.scatter([p.batch for p in family.raw], [p.batch_ms for p in family.raw], marker="s", color="C1",
                     label="raw onnxruntime")  # fmt: skip
        axes.plot(line, [raw_fit.batch_ms(n) for n in line], "C1--", label=f"raw fit {fit_text(raw_fit, 2)}")
    axes.set(xlabel="batch size N", ylabel="T_batch(N) (ms)",
             title=f"{family.family}: T_batch(N) = T + (N-1)·Δt")  # fmt: skip
    return save_figure(figure, path, axes, grid="major")


def all_plots(result: StudyResult, folder: Path) -> dict[str, list[Path]]:
    """Every plot of every family, written into ``folder``; returns family -> paths."""
    plots: dict[str, list[Path]] = {}
    for name, family in result.families.items():
        paths = [
            throughput_vs_concurrency(result, family, folder / f"{name}_throughput_vs_concurrency.png"),
            latency_vs_throughput(family, folder / f"{name}_p99_vs_throughput.png"),
            formed_batch_histogram(family, folder / f"{name}_formed_batches.png"),
            latency_model_fit(family, folder / f"{name}_latency_model.png"),
        ]
        plots[name] = [p for p in paths if p is not None]
    return plots
