"""The tuner report's probe sections: what the prediction was built from, the CPU contention term
included, so a reader can check every input of the simulation against the runs that produced it."""

from __future__ import annotations

from perf.markdown import number, table
from perf.tune.probe import ProbeResult
from perf.tune.steal import p99_with_steal, stolen_pct


def _fit_table(probe: ProbeResult) -> str:
    return table(
        [
            "instances",
            "T (ms)",
            "Δt (ms)",
            "R²",
            "per-execution + per-request cost when saturated (ms)",
            "served at saturation (/s)",
            "latency overhead outside the server (ms)",
        ],
        [
            [
                n,
                number(f.t_ms, 3),
                number(f.dt_ms, 3),
                number(f.r2, 3),
                f"{number(probe.per_batch_ms, 3)} + {number(probe.per_request_ms[n], 3)}",
                number(probe.saturation[n].throughput, 0),
                number(probe.overhead_ms, 3),
            ]
            for n, f in probe.fits.items()
        ],
    )


def _runs_table(probe: ProbeResult) -> str:
    runs = [run for _, _, run in probe.points] + list(probe.saturation.values())
    runs += [probe.unbatched] if probe.unbatched else []
    return table(
        [
            "probe run",
            "inf/s",
            "mean batch",
            "p99 ms",
            "server queue ms/req",
            "CPU busy (cores)",
            "formed batches (size: executions)",
        ],
        [
            [
                run.label,
                number(run.throughput, 0),
                number(run.stats.mean_batch),
                number(run.p99_ms),
                number(run.stats.queue_ms_per_request, 2),
                number(run.cpu_load()[2], 2),
                ", ".join(f"{s}: {c}" for s, c in run.batch_histogram().items()),
            ]
            for run in runs
        ],
    )


def _raw_table(probe: ProbeResult) -> str:
    return table(
        ["batch", "raw ms", "served fit ms (1 instance)", "served / raw"],
        [
            [
                p.batch,
                number(p.batch_ms, 3),
                number(probe.fits[1].batch_ms(p.batch), 3),
                number(probe.fits[1].batch_ms(p.batch) / p.batch_ms, 2),
            ]
            for p in probe.raw
        ],
    )


def _slices(probe: ProbeResult) -> str:
    return ", ".join(
        f"**{number(1e3 * cpu.slice_s, 3)} ms** with {n} instance{'s' if n > 1 else ''}"
        for n, cpu in sorted(probe.cpu.items())
    )


def _contention_lines(probe: ProbeResult) -> list[str]:
    if not probe.cpu:
        return []
    cpu = next(iter(probe.cpu.values()))  # one busy-core fit; the slices differ per instance count
    rows = [
        [
            c.config.label,
            number(c.measured.offered, 0),
            ", ".join(p99_with_steal(run) for run in c.repeats),
            number(c.simulated_p99_ms),
            number(c.predicted_p99_ms),
            f"{number(c.utilization * cpu.cores, 2)} / {number(c.measured.cpu_load()[2], 2)}",
        ]
        for c in probe.calibration
    ]
    return [
        "",
        "### CPU contention (`perf/tune/cpu.py`)",
        "",
        "The machine's busy cores (`/proc/stat`, every process: the client's too) over the open-loop "
        f"calibration runs below (loads the server kept up with), fitted: **{number(cpu.idle_cores, 2)} "
        f"cores idle + {number(1e6 * cpu.per_request_s, 0)} µs per request + "
        f"{number(1e6 * cpu.per_execution_s, 0)} µs per execution**, on {cpu.cores} cores. Each simulated "
        "request then waits for one of them as in an M/M/c queue at the utilization its candidate puts "
        f"on them, with a slice of {_slices(probe)}: the median of what that instance count's busier "
        "runs below ask for (measured p99 = simulated p99; how long a request waits for a core depends "
        "on how many instances' thread pools compete for them). Without it the simulation leaves out "
        "the cores the server, its frontend and the client share. A run the hypervisor took CPU from "
        "(marked *stolen*) counts only where every busier run of its instance count was, and then on "
        "the cores the steal left (`perf.tune.steal.unstolen_first`).",
        "",
        table(
            [
                "calibration run",
                "rate /s",
                "measured p99 (each repeat)",
                "simulated p99 without the wait",
                "with it",
                "CPU busy predicted / measured (cores)",
            ],
            rows,
        ),
    ]


def probe_sections(probe: ProbeResult) -> list[str]:
    return [
        _fit_table(probe),
        "",
        _runs_table(probe),
        *_contention_lines(probe),
        "",
        "Raw backend (same ONNX file in-process, same threads) next to the served fit:",
        "",
        _raw_table(probe),
        "",
    ]


def cpu_figures(probe: ProbeResult) -> dict:
    """The contention term's numbers for ``figures.json``."""
    if not probe.cpu:
        return {}
    cpu = next(iter(probe.cpu.values()))
    return {
        "cpu_model": {
            "idle_cores": cpu.idle_cores,
            "per_request_us": 1e6 * cpu.per_request_s,
            "per_execution_us": 1e6 * cpu.per_execution_s,
            "cores": cpu.cores,
            "slice_ms": {str(n): 1e3 * model.slice_s for n, model in probe.cpu.items()},
        },
        "calibration": [
            {
                "config": c.config.label,
                "rate": c.measured.offered,
                "measured_p99_ms": [run.p99_ms for run in c.repeats],
                "stolen_pct": stolen_pct(c.repeats),
                "simulated_p99_ms": c.simulated_p99_ms,
                "predicted_p99_ms": c.predicted_p99_ms,
                "cpu_cores_predicted": c.utilization * cpu.cores,
                "cpu_cores_measured": c.measured.cpu_load()[2],
            }
            for c in probe.calibration
        ],
    }
