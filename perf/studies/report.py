"""The batching study on the framework and its report folder (the console gets summary tables: the report
is too long to print). Imported only when the study runs: it loads matplotlib."""

from __future__ import annotations

import math
import os
import platform
import shutil
from pathlib import Path

import yaml

from perf.markdown import UNMEASURED, error_percent, fit_text, number, percent, ratio, table, why_unmeasured
from perf.markdown import write_report as write_report_file
from perf.measure.records import write_csv, write_json
from perf.studies import analysis
from perf.studies.framework import StudyContext, StudyReport, SummaryTable
from perf.studies.goals import Goal, goals_table
from perf.studies.plots import all_plots
from perf.studies.profiles import Profile
from perf.studies.study import FamilyResult, StudyResult, StudyRunner, count_steps
from perf.studies.study_spec import MODES, study_entries

ARTICLE_QPS, ARTICLE_P99 = 0.12, 0.23  # static 32 vs dynamic 50 ms in the source article
REGIME_COMPUTE_BOUND = "mostly compute-bound: batching saves per-request overhead, not compute"
BATCHING_PAYS = 0.25  # Δt below this share of T: a batch costs little more than one request
# A closed-loop run "waited out its delay": a delay this long, and a batch of nearly all in flight.
DELAY_BOUND_MS, DELAY_BOUND_FILL = 2.0, 0.9


def mode_table(rows: list[analysis.Row]) -> str:
    """Each mode's figures and their ratios to no batching (and padding, for variable lengths)."""
    padded = any(not math.isnan(r.padded_share) for r in rows)
    header = ["mode", "load", "QPS", "p50 ms", "p90 ms", "p99 ms", "mean batch", "failed/sent",
              "QPS ×none", "p50 ×none", "p90 ×none", "p99 ×none", *["padding"] * padded, "note"]  # fmt: skip
    body = []
    for r in rows:
        notes = [n for n, on in (("client-bound", r.client_bound), ("not stable", not r.stable)) if on]
        body.append([
            MODES[r.mode].title, r.load, number(r.throughput, 0), number(r.p50_ms), number(r.p90_ms),
            number(r.p99_ms), number(r.mean_batch), f"{r.failed}/{r.sent}",
            *(ratio(r.ratios.get(k, float("nan"))) for k in ("throughput", "p50_ms", "p90_ms", "p99_ms")),
            *[padding_cell(r)] * padded, ", ".join(notes),
        ])  # fmt: skip
    return table(header, body) + (PADDING_NOTE if padded else "")


PADDING_NOTE = (
    "\n\n_padding: the share of the positions computed that are padding, and the positions computed per "
    "position the requests hold. Every mode sends the same traffic (the same lengths in the same order); "
    "static batching sends each batch of 32 arrivals padded to its longest (to its bucket, with "
    "`buckets:`), the other modes each request at its own length (or its bucket)._"
)


def padding_cell(row: analysis.Row) -> str:
    if math.isnan(row.padded_share):
        return "–"
    return f"{row.padded_share:.0%} ({ratio(row.padded_compute)} computed)"


def server_table(rows: list[analysis.Row], raw: FamilyResult) -> str:
    header = ["mode", "load", "queue ms/req", "compute ms/req", "outside server ms", "send lag p99 ms",
              "mean batch", "server cores", "client cores", "server CPU s/1k inf",
              "raw CPU s/1k inf (same batch)"]  # fmt: skip
    body = [
        [MODES[r.mode].title, r.load, number(r.queue_ms, 2), number(r.compute_ms, 2),
         number(r.outside_server_ms, 2), number(r.send_lag_p99_ms, 2), number(r.mean_batch),
         number(r.server_cores, 2), number(r.client_cores, 2), number(r.server_cpu_per_1000, 3),
         number(analysis.raw_at(raw.raw, max(r.mean_batch, 1), "cpu_s_per_1000"), 3) if raw.raw else "–"]
        for r in rows
    ]  # fmt: skip
    return table(header, body) + (
        "\n_outside server ms: the client's mean latency minus the server's queue and compute per request._\n"
    )


def article_section(family: FamilyResult) -> str:
    """Static 32 vs dynamic 50 ms: our numbers next to the article's +12% QPS / +23% p99, and why."""
    if "static32" not in family.open_loop or "dyn50ms" not in family.open_loop:
        return "_Static 32 or dynamic 50 ms was not in this run; no comparison with the article._"
    static_run, dynamic_run = family.open_loop["static32"], family.open_loop["dyn50ms"]
    static, dynamic = static_run.summary(), dynamic_run.summary()
    cap_static = max((m.summary().throughput for m in family.sweep.get("static32", [])), default=0.0)
    cap_dynamic = max((m.summary().throughput for m in family.sweep.get("dyn50ms", [])), default=0.0)
    qps = error_percent(static.throughput, dynamic.throughput)
    p99 = error_percent(static.p99_ms, dynamic.p99_ms)
    capacity = error_percent(cap_static, cap_dynamic)
    fill_ms = 1000 * 31 / family.open_load.rate
    formed = dynamic_run.server.stats.mean_batch if dynamic_run.server else 0
    comparable = not (why_unmeasured(capacity, signed=True) or why_unmeasured(p99, signed=True))
    agree = comparable and capacity > 0 and p99 > 0
    static_cpu, dynamic_cpu = (run.server.server_cpu_s_per_1000 if run.server else math.nan
                               for run in (static_run, dynamic_run))  # fmt: skip
    lines = [
        f"Static 32 vs dynamic 50 ms, same arrivals ({family.open_load.name}): "
        f"QPS {percent(qps)}, p99 {percent(p99)}; at capacity (best closed loop): QPS {percent(capacity)}. "
        f"The article reports +{ARTICLE_QPS:.0%} QPS and +{ARTICLE_P99:.0%} p99.",
        "",
        f"**{'Agrees in direction' if agree else 'Does not agree' if comparable else 'Cannot be compared'}** "
        "with the article's trade-off. Why:",
        "- Under an open loop that both modes keep up with, both deliver the offered rate, so QPS can only "
        "differ at capacity (closed loop, best throughput of the sweep).",
        "- Static batching always runs full batches of 32, the cheapest per sample, but every sample first "
        f"waits for the batch to fill: the first of 32 waits ~{number(fill_ms)} ms at this rate. That wait "
        "is its p99 cost, and it grows as traffic thins.",
        "- Dynamic batching with a 50 ms bound runs whatever has arrived once the batch is full (32) or the "
        f"oldest request has waited 50 ms (mean formed batch here {number(formed)}): when the rate fills 32 "
        "well within 50 ms it forms the same batches as static and the two converge; at low rates it trades "
        "batch size for a bounded wait. The article's +12% QPS is the capacity gap of always-full batches; "
        "its +23% p99 is the fill wait.",
        "- Here static batching also sends one request per 32 samples, while dynamic batching sends 32: "
        f"server CPU per 1,000 inferences {number(static_cpu, 3)} s vs {number(dynamic_cpu, 3)} s under "
        "these arrivals. Where per-request overhead (Python client, gRPC, Python-backend IPC on shared "
        "cores) is large against compute, that, not batch size, sets the capacity gap, which is why "
        "ours is far larger than the article's GPU figure.",
    ]
    padded = analysis.padding(static_run)
    if padded is not None:
        lines.append(
            f"- This model takes requests of many lengths, and both modes sent the same ones in the same "
            f"order: static batching padded each batch of 32 arrivals to its longest, so {padded[0]:.0%} of "
            f"the positions it computed were padding ({ratio(padded[1])} the positions the requests hold), "
            "while dynamic batching merged only requests of equal length."
        )
    return "\n".join(lines)


def references_section(result: StudyResult, family: FamilyResult) -> str:
    concurrency = result.profile.goal_concurrency
    parts = []
    if result.ceiling:
        parts.append("Harness ceiling (the load generator against `trivial`; results within "
                     f"{analysis.CLIENT_BOUND:.0%} of it at the same requests in flight are flagged "
                     "client-bound):\n")  # fmt: skip
        parts.append(table(
            ["concurrency", "req/s", "p50 ms", "p99 ms", "client cores", "server cores"],
            [[m.load.concurrency, number(m.summary().requests / m.summary().seconds, 0),
              number(m.summary().p50_ms, 2), number(m.summary().p99_ms, 2),
              number(m.server.client_cpu_s / m.server.seconds, 2) if m.server else "–",
              number(m.server.server_cpu_s / m.server.seconds, 2) if m.server else "–"]
             for m in result.ceiling],
        ))  # fmt: skip
    if family.raw:
        parts.append("\n\nRaw onnxruntime in-process (same ONNX file, same threads):\n")
        parts.append(table(
            ["batch", "ms / batch", "inferences / s", "CPU s / 1k inf"],
            [[p.batch, number(p.batch_ms, 3), number(p.throughput, 0), number(p.cpu_s_per_1000, 3)]
             for p in family.raw],
        ))  # fmt: skip
        effs = analysis.efficiencies(family, concurrency)
        parts.append(f"\n\nServing efficiency at concurrency {concurrency} (served / raw at the mean formed "
                     "batch; compute = raw time / server compute time for the batches the server ran; "
                     "2-instance modes are compared with one raw thread; static 32: its best run, "
                     "one or two batches in flight):\n")  # fmt: skip
        parts.append(table(
            ["mode", "mean batch", "served inf/s", "raw inf/s", "served/raw", "compute raw/served",
             "overhead ms / execution", "server CPU s/1k", "raw CPU s/1k"],
            [[MODES[e.mode].title, number(e.mean_batch), number(e.served, 0), number(e.raw, 0),
              ratio(e.ratio), ratio(e.compute_ratio), analysis.overhead_cell(e.overhead),
              number(e.server_cpu_per_1000, 3), number(e.raw_cpu_per_1000, 3)]
             for e in effs],
        ))  # fmt: skip
        parts.append(overhead_section(family))
    return "".join(parts)


def overhead_section(family: FamilyResult) -> str:
    """Serving's cost per execution at each raw batch size the server formed."""
    sizes = analysis.at_raw_sizes(analysis.served_batches(family), family.raw)
    note = (
        "\n\n_overhead ms / execution: the server's compute per execution (`batch_stats`: input + infer + "
        "output) minus raw onnxruntime's time for the same batch sizes (interpolated between the raw "
        "sizes), over the executions that row's run formed. What serving adds to every execution, "
        "whatever the batch: the stub's IPC, Triton's request handling, the backend's Python._\n\n"
        "Overhead per execution at the raw batch sizes the server formed (single-instance modes, sizes "
        f"seen ≥ {analysis.MIN_EXECUTIONS} times):\n\n"
    )
    if not sizes:
        return note + f"_{UNMEASURED}: no raw batch size was formed often enough._"
    rows = [
        [f"{o.batch:g}", o.executions, number(o.served_ms, 3), number(o.raw_ms, 3), analysis.overhead_cell(o),
         ratio(o.ratio) if not o.why else "–"]
        for o in sizes
    ]  # fmt: skip
    return note + table(
        ["batch", "executions", "served compute ms", "raw ms", "overhead ms", "served/raw"], rows
    )


def latency_model_section(result: StudyResult, family: FamilyResult) -> str:
    fit, raw_fit = analysis.fit_served(family), analysis.fit_raw(family.raw)
    if fit is None:
        return "_Too few batch sizes were formed to fit the model._"
    regime = ""
    if not fit.flaw:
        pays = "batching pays" if fit.dt_ms < BATCHING_PAYS * fit.t_ms else REGIME_COMPUTE_BOUND
        regime = f" (T/Δt = {number(fit.t_ms / fit.dt_ms) if fit.dt_ms > 0 else '∞'}: {pays})"
    lines = [
        f"Fitted to the server's compute time per formed batch size (`batch_stats`, sizes seen ≥ "
        f"{analysis.MIN_EXECUTIONS} times, single-instance modes, weighted by executions): "
        f"**{fit_text(fit)}** over {len(fit.points)} batch sizes{regime}.",
    ]
    if raw_fit is not None:
        lines.append(f"Raw onnxruntime: {fit_text(raw_fit)}.")
    if fit.flaw:
        lines.append(f"\nNo prediction from this fit: {fit.flaw}.")
        return "\n".join(lines)
    lines.append("\nPredicted throughput of one instance, N / T_batch(N), against measurements:\n")
    served = {}
    for mode, runs in family.sweep.items():
        for m in runs:
            fixed = MODES[mode].max_queue_delay_ms is None and MODES[mode].instances == 1  # none, static
            if m.server and fixed and len(m.server.stats.batches) == 1:
                size = next(iter(m.server.stats.batches))
                served[size] = max(served.get(size, 0.0), m.summary().throughput)
    rows = []
    for p in family.raw:
        predicted = fit.throughput(p.batch)
        measured_served = served.get(p.batch)
        raw_error, served_error = (percent(error_percent(predicted, measured)) if measured else "–"
                                   for measured in (p.throughput, measured_served))  # fmt: skip
        rows.append([p.batch, number(predicted, 0), number(p.throughput, 0), raw_error,
                     number(measured_served, 0) if measured_served else "–", served_error])  # fmt: skip
    lines.append(table(["batch", "predicted inf/s", "raw inf/s", "error vs raw", "served inf/s (fixed batch)",
                        "error vs served"], rows))  # fmt: skip
    checks = analysis.gain_checks(family, fit, result.profile.goal_concurrency)
    if checks:
        concurrency = result.profile.goal_concurrency
        lines.append(f"\nGain of dynamic batching over none at concurrency {concurrency}, "
                     "predicted from the fit: back-to-back batches of the sizes the server formed, or, "
                     "where the delay outlasts a batch, one batch of everything in flight per delay + "
                     "T_batch:\n")  # fmt: skip
        lines.append(table(["mode", "predicted gain", "measured gain", "error"],
                           [[MODES[c.mode].title, ratio(c.predicted), ratio(c.measured),
                             percent(c.error_pct)] for c in checks]))  # fmt: skip
    return "\n".join(lines)


def accounting_section(result: StudyResult) -> str:
    measurements = all_measurements(result)
    sent = sum(m.attempts for m in measurements)
    ok = sum(r.ok for m in measurements for r in m.records)
    failed = sum(not r.ok for m in measurements for r in m.records)
    server_ok = sum(m.server_total.requests for m in measurements if m.server_total)
    if failed:  # Triton 2.51 counts a Python-backend error response as a success: not comparable
        check = "not comparable while requests failed: Triton 2.51 counts Python-backend errors as successes"
    else:
        check = "matches" if server_ok == ok else "**differs from** the client's count"
    return (
        f"{len(measurements)} measurements; requests sent (incl. warm-up, drain, shed arrivals) {sent:,} = "
        f"succeeded {ok:,} + failed {failed:,}: {'holds' if sent == ok + failed else '**does not hold**'} "
        "(source: the client's record of each request). "
        f"The server's own counter says {server_ok:,} successful requests ({check})."
    )


def delay_bound_notes(closed_rows: list[analysis.Row], concurrency: int) -> str:
    """Explain closed-loop runs where the batcher waited out its whole delay on every batch."""
    notes = []
    for r in closed_rows:
        delay = MODES[r.mode].max_queue_delay_ms
        full = DELAY_BOUND_FILL * concurrency / MODES[r.mode].instances
        if delay is None or delay < DELAY_BOUND_MS or r.mean_batch < full:
            continue
        cycle_ms = concurrency / r.throughput * 1000 if r.throughput else float("nan")
        notes.append(
            f"- {MODES[r.mode].title}: all {concurrency} requests in flight ride in one batch (mean "
            f"{number(r.mean_batch)}), which never reaches the maximum of 32, so every batch waits out "
            f"the full {delay:.0f} ms delay: a cycle takes {number(cycle_ms)} ms (queue "
            f"{number(r.queue_ms)} ms + compute {number(r.compute_ms)} ms per request). A closed loop below "
            "the maximum batch turns the delay into latency *and* lost throughput; an open loop does not."
        )
    return ("\nWhy the longer delays lose in a closed loop:\n" + "\n".join(notes)) if notes else ""


def cross_check_section(result: StudyResult) -> str:
    if not result.cross_check:
        return f"\n## perf_analyzer cross-check\n\n{result.analyzer_note or 'Not run.'}"
    rows = []
    for theirs, ours in result.cross_check:
        own, mine = theirs.own, ours.summary()
        rows.append([
            ours.model, ours.load.concurrency, number(own.throughput, 0) if own else "–",
            number(theirs.mean_window_rate(), 0), number(mine.throughput, 0),
            number(own.p50_ms) if own else "–", number(mine.p50_ms), number(own.p99_ms) if own else "–",
            number(mine.p99_ms),
        ])  # fmt: skip
    header = ["model", "concurrency", "perf_analyzer inf/s (its CSV)", "perf_analyzer inf/s (its export)",
              "ours inf/s", "perf_analyzer p50 ms", "ours p50 ms", "perf_analyzer p99 ms",
              "ours p99 ms"]  # fmt: skip
    settings = sorted({" ".join(theirs.own.settings) for theirs, _ in result.cross_check if theirs.own})
    used = "; ".join(f"`{text}`" for text in settings) or "its defaults"
    return (
        "\n## perf_analyzer cross-check (same server, same model, back to back)\n\n" + table(header, rows)
        + f"\n\nperf_analyzer ran with {used}: the windows and stability percentage of this profile, "
        "the rule our windows follow too (the last three within it on throughput and mean latency)."
    )  # fmt: skip


def family_section(result: StudyResult, name: str, family: FamilyResult, plots: list[Path]) -> str:
    concurrency = result.profile.goal_concurrency
    open_rows = analysis.open_loop_rows(result, family)
    closed_rows = analysis.closed_loop_rows(result, family, concurrency)
    load = family.open_load.name if family.open_load else "open loop"
    parts = [
        f"## {name}",
        f"\n### Same arrivals for every mode: {load} "
        f"({result.profile.poisson_fraction:.0%} of the best dynamic-batching throughput, "
        f"{number(family.capacity, 0)} inf/s; seed {result.profile.seed})\n",
        family.open_loop_note or mode_table(open_rows),
        "\n" + article_section(family),
        f"\n### Closed loop at concurrency {concurrency} (static: one batch of 32 in flight)\n",
        mode_table(closed_rows),
        delay_bound_notes(closed_rows, concurrency),
        "\n### Server-side view (same windows)\n",
        server_table(closed_rows + open_rows, family),
        "\n### References\n",
        references_section(result, family),
        "\n### Latency model\n",
        latency_model_section(result, family),
        "\n### Plots\n",
        *(f"![{p.stem}]({p.name})" for p in plots),
    ]
    return "\n".join(parts)


def header(result: StudyResult) -> str:
    p = result.profile
    took = (result.finished - result.started).total_seconds() if result.finished else float("nan")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join([
        f"# Batching study, {result.started:%Y-%m-%d %H:%M:%S}",
        "",
        f"Profile `{p.name}` · models {', '.join(p.families)} · modes {', '.join(p.modes)} · "
        f"protocol {p.protocol}{' + system shared memory' if p.shared_memory else ''} · "
        f"concurrencies {list(p.concurrencies)} · windows {p.settings.window_s} s (warm-up "
        f"{p.settings.warmup_s} s, {p.settings.stable_windows} within {p.settings.tolerance:.0%}, "
        f"at most {p.settings.max_windows}) · took {took:.0f} s",
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, load average at the "
        f"end {load}. Client, server and stub processes share these cores; absolute numbers are noisy, the "
        "ratios within this run are the result.",
    ])  # fmt: skip


def write_report(result: StudyResult, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    plots = all_plots(result, folder)
    goals = analysis.all_goals(result)
    sections = [header(result), "\n## Goals\n", goals_table(goals), "\n" + accounting_section(result)]
    for name, family in result.families.items():
        sections.append("\n" + family_section(result, name, family, plots.get(name, [])))
    sections.append(cross_check_section(result))
    sections.append(
        "\n## Files\n\n`records.csv` / `records.json`: one row per request (send/receive time, batch, bytes, "
        "status, arrivals); `figures.json`: every table's numbers; `study.yaml` and `configs/`: the exact "
        "spec and `config.pbtxt` files served; `server.log`: the server's log."
    )
    write_raw(result, folder)
    return write_report_file(folder / "report.md", sections, figures(result, goals), folder / "figures.json")


def all_measurements(result: StudyResult) -> list:
    out = list(result.ceiling)
    for family in result.families.values():
        out += [m for runs in family.sweep.values() for m in runs] + list(family.open_loop.values())
    return out


def figures(result: StudyResult, goals: list[Goal]) -> dict:
    """Every table's numbers (``figures.json``)."""
    return {
        "goals": goals,
        "measurements": [
            {"label": m.label, "model": m.model, "load": m.load.name, "stable": m.stable,
             "attempts": m.attempts, "windows": m.windows, "used": m.used, "summary": m.summary(),
             "server": m.server}
            for m in all_measurements(result)
        ],
        "raw": {name: f.raw for name, f in result.families.items()},
    }  # fmt: skip


def write_raw(result: StudyResult, folder: Path) -> None:
    """The records, the spec and the configs served, the server's log."""
    records = [r for m in all_measurements(result) for r in m.records]
    write_csv(records, folder / "records.csv")
    write_json(records, folder / "records.json")
    profile = result.profile
    entries = study_entries(list(profile.families), list(profile.modes), profile.seed, profile.family_table)
    (folder / "study.yaml").write_text(yaml.safe_dump({"models": entries}, sort_keys=False))
    for config in result.repository.glob("*/config.pbtxt"):
        target = folder / "configs" / config.parent.name / "config.pbtxt"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(config, target)
    if result.server_log and result.server_log.exists() and result.server_log.parent != folder:
        shutil.copy2(result.server_log, folder / "server.log")


class BatchingStudy:
    name = "report"
    title = "batching study (every batching mode of each model under the same load)"
    serves_spec = False  # models of --spec (--models) are read into the profile before anything runs

    def steps(self, profile: Profile) -> int:
        return count_steps(profile)

    def run(self, context: StudyContext) -> StudyReport:
        """Measure every mode on one server (stopped whatever happens), then write the report folder."""
        context.folder.mkdir(parents=True, exist_ok=True)
        result = StudyRunner(context).run()
        path = write_report(result, context.folder)
        return StudyReport(self.name, self.title, path, analysis.all_goals(result), summary_tables(result))


SUMMARY_HEADER = ("mode", "QPS", "p50 ms", "p90 ms", "p99 ms", "mean batch", "failed/sent", "QPS ×none",
                  "p99 ×none")  # fmt: skip


def summary_tables(result: StudyResult) -> tuple[SummaryTable, ...]:
    """Per model, every mode under the same arrivals, each against no batching."""
    tables = []
    for name, family in result.families.items():
        load = family.open_load.name if family.open_load else ""
        rows = tuple(
            (MODES[r.mode].title, number(r.throughput, 0), number(r.p50_ms), number(r.p90_ms),
             number(r.p99_ms), number(r.mean_batch), f"{r.failed}/{r.sent}",
             ratio(r.ratios.get("throughput", math.nan)), ratio(r.ratios.get("p99_ms", math.nan)))
            for r in analysis.open_loop_rows(result, family)
        )  # fmt: skip
        tables.append(
            SummaryTable(f"{name}: every mode under the same arrivals ({load})", SUMMARY_HEADER, rows)
        )
    return tuple(tables)
