"""What ``make soak`` found, and the rule that sorts every request into ok, excused or lost.

A failure is *excused* only when a fault took the model it depends on out of service on purpose
(an ``Outage``), the request was sent inside that outage's window, and its error says why (the
outage's ``symptom``); any other failure of a request sent before the final drain is *lost*. Requests
sent during the drain must be answered or refused cleanly (``soak.mixed_load.refused_cleanly``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from soak.mixed_load import Outcome, refused_cleanly

RECOVERY_GRACE_S = 1.0  # a request sent just before the reload finished may still meet the old stub


@dataclass
class Outage:
    """A model taken out of service by a fault, from ``at`` until the server says it recovered."""

    fault: str
    model: str
    at: float  # time.monotonic(), like the load's outcomes
    epoch: float  # time.time(), like the watchdog's record
    symptom: str  # text every failure it causes carries
    detected_at: float | None = None  # monotonic, when the watchdog saw it (None: not recorded)
    recovered_at: float | None = None  # monotonic

    def excuses(self, outcome: Outcome) -> bool:
        end = self.recovered_at if self.recovered_at is not None else float("inf")
        return self.at - 0.1 <= outcome.sent <= end + RECOVERY_GRACE_S and self.symptom in outcome.error


@dataclass
class Check:
    """Faults that must each get one exact answer (a 400, an acknowledgement): how many, how many right."""

    injected: int = 0
    right: int = 0

    def record(self, answered_right: bool) -> None:
        self.injected += 1
        self.right += answered_right


@dataclass
class SoakReport:
    duration_s: float
    sent: int = 0
    ok: int = 0
    answered_during_drain: int = 0
    excused: int = 0
    lost: list[str] = field(default_factory=list)
    refused_after_drain: int = 0
    outages: list[Outage] = field(default_factory=list)
    checks: dict[str, Check] = field(default_factory=dict)  # what each answered fault must get
    server_restarts: list[str] = field(default_factory=list)  # the supervisor's: why each server died
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0
    leaked_stubs: list[int] = field(default_factory=list)
    leaked_regions: list[str] = field(default_factory=list)
    exit_code: int | None = None

    def check(self, what: str) -> Check:
        return self.checks.setdefault(what, Check())

    @property
    def passed(self) -> bool:
        return (
            not self.lost
            and all(o.recovered_at is not None for o in self.outages)
            and all(c.right == c.injected for c in self.checks.values())
            and not self.leaked_stubs
            and not self.leaked_regions
            and not self.server_restarts
        )

    def outage_lines(self) -> list[str]:
        lines = []
        for fault in sorted({o.fault for o in self.outages}):
            outages = [o for o in self.outages if o.fault == fault]
            recoveries = [o.recovered_at - o.at for o in outages if o.recovered_at is not None]
            detections = [o.detected_at - o.at for o in outages if o.detected_at is not None]
            lines.append(
                f"  {fault}: {len(outages)} ({Counter(o.model for o in outages)}); "
                f"all recovered: {len(recoveries) == len(outages)}; fault to detected {_spread(detections)}; "
                f"fault to recovered {_spread(recoveries)}"
            )
        return lines

    def text(self) -> str:
        lost = f"{len(self.lost)}" + "".join(f"\n    lost: {text}" for text in self.lost[:5])
        return "\n".join(
            [
                f"soak {self.duration_s:.0f} s: {'PASSED' if self.passed else 'FAILED'}",
                f"  requests sent before the drain: {self.sent}; ok {self.ok}; "
                f"failed inside a fault's outage window {self.excused}; lost {lost}",
                f"  sent during the final drain: answered {self.answered_during_drain}, "
                f"refused cleanly {self.refused_after_drain}",
                *self.outage_lines(),
                f"  tritonserver restarts by the supervisor: {len(self.server_restarts)}"
                + "".join(f"; {cause}" for cause in self.server_restarts),
                *(f"  {what}: {c.injected}, answered right: {c.right}" for what, c in self.checks.items()),
                f"  server RSS: {self.rss_start_mib:.0f} MiB at start, {self.rss_end_mib:.0f} MiB at the end",
                f"  after stop: stubs left {self.leaked_stubs}, /dev/shm regions left {self.leaked_regions}, "
                f"server exit code {self.exit_code}",
            ]
        )


def _spread(seconds: list[float]) -> str:
    """Median and slowest of a list of durations, for the summary."""
    if not seconds:
        return "n/a"
    ordered = sorted(seconds)
    return f"median {ordered[len(ordered) // 2]:.1f} s, slowest {ordered[-1]:.1f} s"


def _when(outcome: Outcome, outages: list[Outage], served_by: dict[str, set[str]]) -> str:
    """A lost request, placed in time against the latest outage of a model it depends on."""
    where = f"{outcome.protocol} {outcome.model} (answered in {outcome.received - outcome.sent:.1f} s"
    before = [o for o in outages if o.model in served_by[outcome.model] and o.at <= outcome.sent]
    if not before:
        return where + ", no outage of its models before it)"
    last = max(before, key=lambda o: o.at)
    recovered = f"{last.recovered_at - last.at:.1f} s" if last.recovered_at is not None else "never"
    return where + (
        f", sent {outcome.sent - last.at:.1f} s after '{last.fault}' of {last.model}, which recovered after "
        f"{recovered})"
    )


def account(
    report: SoakReport,
    outcomes: list[Outcome],
    drain: tuple[float, float | None],
    served_by: dict[str, set[str]],
) -> None:
    """Sort every request into ok / excused / lost / refused after the drain (``drain``: when it
    started, and when it had unloaded every model; ``served_by``: the stub-backed models each loaded
    model depends on, since an ensemble fails when one of its stages does)."""
    drain_at, drain_finished_at = drain
    for outcome in outcomes:
        if outcome.sent >= drain_at:
            if outcome.error and not refused_cleanly(outcome, drain_finished_at):
                where = f"{outcome.protocol} {outcome.model} during the drain"
                report.lost.append(f"{where}: {outcome.error[:200]}")
            report.refused_after_drain += bool(outcome.error)
            report.answered_during_drain += not outcome.error
            continue
        report.sent += 1
        if not outcome.error:
            report.ok += 1
        elif any(o.model in served_by[outcome.model] and o.excuses(outcome) for o in report.outages):
            report.excused += 1
        else:
            report.lost.append(f"{_when(outcome, report.outages, served_by)}: {outcome.error[:200]}")
