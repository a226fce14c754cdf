"""The batching study on the framework: ``study`` measures, ``report`` writes, ``batching_goals`` judges;
the console gets each model's modes under the same arrivals (the report is too long to print)."""

from __future__ import annotations

import math

from perf.markdown import number, ratio
from perf.studies import analysis
from perf.studies.batching_goals import all_goals
from perf.studies.framework import StudyContext, StudyReport, SummaryTable
from perf.studies.profiles import Profile
from perf.studies.study import StudyResult, StudyRunner, count_steps
from perf.studies.study_spec import MODES

SUMMARY_HEADER = ("mode", "QPS", "p50 ms", "p90 ms", "p99 ms", "mean batch", "failed/sent", "QPS ×none",
                  "p99 ×none")  # fmt: skip


class BatchingStudy:
    # The report folder's main report: report.md, its figures in figures.json (docs/PERF.md).
    name = "report"
    title = "batching study (every batching mode of each model under the same load)"
    serves_spec = False  # models of --spec (--models) are read into the profile before anything runs

    def steps(self, profile: Profile) -> int:
        return count_steps(profile)

    def run(self, context: StudyContext) -> StudyReport:
        """Measure every mode on one server (stopped whatever happens), then write the report folder."""
        from perf.studies.report import write_report  # matplotlib only when a report is written

        context.folder.mkdir(parents=True, exist_ok=True)
        result = StudyRunner(context).run()
        path = write_report(result, context.folder)
        return StudyReport(self.name, self.title, path, all_goals(result), summary_tables(result))


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
