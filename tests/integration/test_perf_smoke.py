"""A smoke batching study against the real server: tiny durations, checks that the report is complete
and that its numbers add up. No speed is asserted: the machine is shared and the windows are short.
"""

import json
import math

import numpy as np
import pytest

from perf.studies.analysis import at_concurrency, efficiencies, open_loop_rows
from perf.studies.framework import StudyContext
from perf.studies.profiles import get_profile
from perf.studies.report import all_measurements, write_report
from perf.studies.study import StudyRunner
from perf.studies.study_spec import MODES
from tests.records_csv import read_csv

# A hang guard, not a speed check: over three times the slowest test here on a loaded two-core host
# (two busy loops beside three workers).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("perf-smoke")
    profile = get_profile("smoke", perf_analyzer=False)
    result = StudyRunner(StudyContext(profile, folder, folder / "work")).run()
    return result, folder, write_report(result, folder)


def test_report_has_every_part(study):
    _, folder, report = study
    text = report.read_text()
    for heading in ("## Goals", "## recommender", "### Same arrivals for every mode", "### Server-side view",
                    "### References", "### Latency model", "### Plots"):  # fmt: skip
        assert heading in text, heading
    for name in ("throughput_vs_concurrency", "p99_vs_throughput", "formed_batches", "latency_model"):
        png = folder / f"recommender_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"]({png.name})" in text
    for model in ("recommender_none", "recommender_static32", "recommender_dyn1ms", "trivial"):
        assert (folder / "configs" / model / "config.pbtxt").is_file()
    assert "recommender_dyn1ms" in (folder / "study.yaml").read_text()
    assert (folder / "server.log").stat().st_size > 0


def test_no_request_is_lost(study):
    result, folder, _ = study
    all_runs = all_measurements(result)
    for m in all_runs:
        # Every request the caller started or shed ended as exactly one record.
        assert m.attempts == len(m.records), m.label
        ok = sum(r.ok for r in m.records)
        # The server saw exactly the requests the client says succeeded (shed arrivals never left).
        assert m.server_total.requests == ok, m.label
    on_disk = read_csv(folder / "records.csv")
    assert len(on_disk) == sum(m.attempts for m in all_runs)


def test_percentiles_are_ordered_and_static_batches_are_whole(study):
    result, _, _ = study
    for m in all_measurements(result):
        s = m.summary()
        if s.samples:
            assert s.p50_ms <= s.p90_ms <= s.p99_ms, m.label
    static = result.families["recommender"].open_loop["static32"]
    assert all(r.batch == 32 and len(r.arrivals) == 32 for r in static.records if r.ok)
    assert set(static.server.stats.batches) <= {32}


def test_table_ratios_follow_from_the_records(study):
    """Recompute each mode's QPS and p99 from records.csv and the saved windows, independently. A
    mode with no answer in its window (a loaded host's short window) has no p99, and no ratio to it."""
    result, folder, _ = study
    figures = {m["label"]: m for m in json.loads((folder / "figures.json").read_text())["measurements"]}
    records = read_csv(folder / "records.csv")
    family = result.families["recommender"]
    recomputed = {}
    for mode, m in family.open_loop.items():
        saved = figures[m.label]
        start, end = saved["windows"][saved["used"][0]][0], saved["windows"][saved["used"][1] - 1][1]
        mine = [r for r in records if r.label == m.label and r.ok and start <= r.recv_s < end]
        # Per sample, from its own arrival (a static request carries 32 arrival times).
        latencies = [r.recv_s - np.broadcast_to(r.arrivals, (r.batch,)) for r in mine]
        p99 = np.percentile(np.concatenate(latencies) * 1e3, 99) if latencies else math.nan
        recomputed[mode] = (sum(r.batch for r in mine) / (end - start), p99)
    rows = {r.mode: r for r in open_loop_rows(result, family)}
    base_qps, base_p99 = recomputed["none"]
    for mode, (qps, p99) in recomputed.items():
        assert rows[mode].throughput == pytest.approx(qps, rel=1e-3)
        assert rows[mode].ratios["throughput"] == pytest.approx(qps / base_qps if base_qps else math.nan,
                                                                rel=1e-3, nan_ok=True)  # fmt: skip
        assert rows[mode].ratios["p99_ms"] == pytest.approx(p99 / base_p99, rel=1e-2, nan_ok=True)


def _measurement_of(family, mode: str, concurrency: int):
    """The run the serving-efficiency table shows for ``mode``: at ``concurrency``, or a fixed batch's
    best run."""
    if MODES[mode].collect > 1:
        return max(family.sweep[mode], key=lambda m: m.summary().throughput)
    return at_concurrency(family, mode, concurrency)


def _table_rows(text: str, column: str) -> dict[str, str]:
    """The rows of the first markdown table with ``column`` in its header, by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| ") and f"| {column} |" in line)
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows[line.split(" | ")[0].removeprefix("| ")] = line
    return rows


def test_overhead_column_adds_up_from_the_saved_figures(study):
    """Recompute each mode's overhead per execution from figures.json alone (the server's batch
    statistics of that run, raw onnxruntime's points) and find it, or why it could not be measured, in
    the report's row."""
    result, folder, report = study
    saved = json.loads((folder / "figures.json").read_text())
    by_label = {m["label"]: m for m in saved["measurements"]}
    raw = sorted(saved["raw"]["recommender"], key=lambda p: p["batch"])
    family, concurrency = result.families["recommender"], result.profile.goal_concurrency
    rows = _table_rows(report.read_text(), "overhead ms / execution")
    effs = efficiencies(family, concurrency)
    assert {e.mode for e in effs} == {"none", "static32", "dyn1ms"}
    for eff in effs:
        buckets = by_label[_measurement_of(family, eff.mode, concurrency).label]["server"]["stats"]["batches"]
        executions = sum(b["executions"] for b in buckets.values())
        served = sum(b["compute_ns"] for b in buckets.values()) / 1e6 / executions
        raw_ms = (
            sum(
                np.interp(int(size), [p["batch"] for p in raw], [p["batch_ms"] for p in raw])
                * b["executions"]
                for size, b in buckets.items()
            )
            / executions
        )
        assert eff.overhead.ms == pytest.approx(served - raw_ms, rel=1e-6, abs=1e-9), eff.mode
        row = rows[MODES[eff.mode].title]
        if served - raw_ms >= 0:
            assert f"| {served - raw_ms:.3f} |" in row, row
        else:  # timed at different moments on shared cores: said so, never shown as a number
            assert "could not be measured (served compute" in row and f"{served - raw_ms:.3f}" not in row
    assert "Overhead per execution at the raw batch sizes the server formed" in report.read_text()
