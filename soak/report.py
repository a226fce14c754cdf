"""What ``make soak`` found. A failure is excused only inside an ``Outage`` of a model it depends on, with
an error the outage explains; any other failure before the drain is lost (unanswered or answered
wrongly). Requests sent during the drain must be answered or refused cleanly."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median_high
from typing import TYPE_CHECKING

from server.triton_exit import exit_timeout_expired, versions_held
from soak.invariant_fuzz import InvariantReport
from soak.mixed_load import Outcome, refused_cleanly

if TYPE_CHECKING:
    from server.launcher import TritonServer

RECOVERY_GRACE_S = 1.0  # a request sent just before the reload finished may still meet the old stub
SERVER_KILLED = "server killed"  # the soak's own kill -9 of tritonserver (soak.attacks.kill_server)
# errors that mean no answer came back, unless a front's answer quotes them from upstream
FRONT_ANSWERS = ("tritonserver is not reachable", "tritonserver did not answer")
EXIT_LINES = ("live models", "failed to stop server", "terminate called", "what():")
UNANSWERED = (
    "Connection refused", "failed to connect", "connection closed", "Connection reset", "RemoteDisconnected",
    "timed out", "DEADLINE_EXCEEDED",
)  # fmt: skip


@dataclass
class Outage:
    """A model taken out of service by a fault, from ``at`` until the server says it recovered."""

    fault: str
    model: str
    at: float  # time.monotonic(), like the load's outcomes
    epoch: float  # time.time(), like the watchdog's record
    symptom: str | tuple[str, ...]  # text every failure it causes carries (one of them)
    detected_at: float | None = None  # monotonic, when the watchdog saw it (None: not recorded)
    recovered_at: float | None = None  # monotonic

    def excuses(self, outcome: Outcome) -> bool:
        end = self.recovered_at if self.recovered_at is not None else float("inf")
        symptoms = (self.symptom,) if isinstance(self.symptom, str) else self.symptom
        # sent inside the outage, or still in flight when the fault struck (a busy server answers late)
        inside = outcome.received >= self.at - 0.1 and outcome.sent <= end + RECOVERY_GRACE_S
        return inside and any(symptom in outcome.error for symptom in symptoms)


@dataclass
class Check:
    """Faults that must each get one exact answer: how many, how many right."""

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
    excused_by: Counter = field(default_factory=Counter)  # the fault whose outage excused each failure
    lost: list[str] = field(default_factory=list)
    lost_unanswered: int = 0  # of the lost: no answer at all (refused, reset, timed out)
    refused_after_drain: int = 0
    outages: list[Outage] = field(default_factory=list)
    checks: dict[str, Check] = field(default_factory=dict)  # what each answered fault must get
    # a share attack's check: the most of its requests Triton had waiting at once, that share, and the
    # shape of its requests (rows, tokens)
    most_waiting: dict[str, tuple[float, int, list[int]]] = field(default_factory=dict)
    server_restarts: list[str] = field(default_factory=list)  # deaths the soak did not cause: why each
    server_deaths: list[str] = field(default_factory=list)  # "<pid> <cause>" of every server that died
    server_kills: list[int] = field(default_factory=list)  # pids of the servers the soak killed itself
    server_pids: list[int] = field(default_factory=list)  # every tritonserver pid of the run, in order
    rss_start_mib: float = 0.0
    rss_end_mib: float = 0.0
    leaked_stubs: list[int] = field(default_factory=list)
    leaked_regions: list[str] = field(default_factory=list)
    exit_code: int | None = None  # the drained server's (None: no drain, as in a report a test builds)
    drained: bool = True  # the drain unloaded every model before SIGTERM: Triton then held no live version
    exit_log: list[str] = field(default_factory=list)  # the drained server's log lines that explain it
    watchdog_reloads: int = 0  # the heal events of the drained server's own watchdog (Watchdog.reloads)
    invariants: InvariantReport | None = None  # the invariant fuzz's phase (None: not run)

    def check(self, what: str) -> Check:
        return self.checks.setdefault(what, Check())

    def waited(self, what: str, most: float, share: int, shape: list[int]) -> None:
        """Keep the most of ``what``'s requests (each of ``shape``) Triton had waiting at once, over all
        its runs."""
        self.most_waiting[what] = (max(most, self.most_waiting.get(what, (0.0,))[0]), share, shape)

    @property
    def passed(self) -> bool:
        return (
            not self.lost
            and all(o.recovered_at is not None for o in self.outages)
            and all(c.right == c.injected for c in self.checks.values())
            and not self.leaked_stubs
            and not self.leaked_regions
            and not self.server_restarts
            and self.exit_expected
            and (self.invariants is None or self.invariants.passed)
        )

    @property
    def versions_held(self) -> int | None:
        """The model versions Triton still held past the drain (its last count while exiting)."""
        return versions_held("\n".join(self.exit_log))

    @property
    def exit_expected(self) -> bool:
        """The drained server exits 0; or 1 past its exit timeout holding no more model versions than its
        watchdog's reloads on it: Triton 2.51 keeps, for good, the old version of each model the watchdog
        reloaded after its stub died under load, one per reload at most (docs/SERVING.md, Triton 2.51's
        own limits). The watchdog's record, not the soak's faults: it also kills and reloads on its own (a
        stub hung or stuck on a saturated host). Held versions are counted only after a complete drain,
        which leaves none live. Any other exit fails the run, one stranded version more than the reloads
        included."""
        if self.exit_code in (0, None):
            return True
        held = self.versions_held
        timed_out = exit_timeout_expired("\n".join(self.exit_log))
        return self.exit_code == 1 and self.drained and timed_out and 0 < (held or 0) <= self.watchdog_reloads

    def text(self) -> str:
        wrong = len(self.lost) - self.lost_unanswered
        lost = f"{len(self.lost)} (unanswered {self.lost_unanswered}, answered wrongly {wrong})"
        lost += "".join(f"\n    lost: {text}" for text in self.lost[:5])
        excused = ", ".join(f"{fault} {n}" for fault, n in sorted(self.excused_by.items()))
        outage_lines = []
        for fault in sorted({o.fault for o in self.outages}):
            outages = [o for o in self.outages if o.fault == fault]
            recoveries = [o.recovered_at - o.at for o in outages if o.recovered_at is not None]
            detections = [o.detected_at - o.at for o in outages if o.detected_at is not None]
            outage_lines.append(
                f"  {fault}: {len({o.at for o in outages})} ({Counter(o.model for o in outages)}); "
                f"all recovered: {len(recoveries) == len(outages)}; fault to detected {_spread(detections)}; "
                f"fault to recovered {_spread(recoveries)}"
            )
        waiting = {
            what: f"; most of them waiting in tritonserver at once {most:g} (their share {share}; each "
            f"request {shape[0]} × {shape[1]} tokens)"
            for what, (most, share, shape) in self.most_waiting.items()
        }
        drained_pid = self.server_pids[-1] if self.server_pids else "?"
        verdict = "expected" if self.exit_expected else "UNEXPECTED"
        ending = f"{drained_pid} exit code {self.exit_code} at the drain ({verdict})"
        if self.exit_code not in (0, None):
            held = "?" if self.versions_held is None else self.versions_held
            ending += f"; model versions held at exit {held}, watchdog reloads on it {self.watchdog_reloads}"
            ending += "" if self.drained else " (the drain was incomplete: some may be live ones)"
        ends = [*self.server_deaths, ending]
        ended = "; ".join(ends) + "".join(f"\n    {line}" for line in self.exit_log if self.exit_code)
        return "\n".join(
            [
                f"soak {self.duration_s:.0f} s: {'PASSED' if self.passed else 'FAILED'}",
                f"  requests sent before the drain: {self.sent}; ok {self.ok}; "
                f"failed inside a fault's outage window {self.excused} ({excused or 'none'}); lost {lost}",
                f"  sent during the final drain: answered {self.answered_during_drain}, "
                f"refused cleanly {self.refused_after_drain}",
                *outage_lines,
                f"  tritonserver killed by the soak: {len(self.server_kills)}; pids "
                + " -> ".join(str(pid) for pid in self.server_pids),
                f"  tritonserver deaths the soak did not cause: {len(self.server_restarts)}"
                + "".join(f"; {cause}" for cause in self.server_restarts),
                *(
                    f"  {what}: {c.injected}, answered right: {c.right}{waiting.get(what, '')}"
                    for what, c in self.checks.items()
                ),
                f"  server RSS: {self.rss_start_mib:.0f} MiB at start, {self.rss_end_mib:.0f} MiB at the end",
                f"  after stop: stubs left {self.leaked_stubs}, /dev/shm regions left {self.leaked_regions}",
                f"  how each tritonserver ended: {ended}",
                self.invariants.text() if self.invariants is not None else "invariant fuzz: not run",
            ]
        )


def _spread(seconds: list[float]) -> str:
    return f"median {median_high(seconds):.1f} s, slowest {max(seconds):.1f} s" if seconds else "n/a"


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
    waiting: Sequence[str] = (),
) -> None:
    """Sort every request into ok / excused / lost / refused after the drain (``served_by``: the
    stub-backed models each model depends on). ``waiting``: the callers still without an answer once the
    load stopped; their requests have no outcome, and each is lost, unanswered."""
    drain_at, drain_finished_at = drain
    for caller in waiting:
        report.lost_unanswered += 1
        report.lost.append(f"unanswered: {caller}: its request had no answer after the drain")
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
            continue
        excusing = [o for o in report.outages if o.model in served_by[outcome.model] and o.excuses(outcome)]
        if excusing:
            report.excused += 1
            report.excused_by[excusing[0].fault] += 1
            continue
        unanswered = any(t in outcome.error for t in UNANSWERED) and not any(
            t in outcome.error for t in FRONT_ANSWERS
        )
        report.lost_unanswered += unanswered
        how = "unanswered" if unanswered else "answered wrongly"
        report.lost.append(f"{how}: {_when(outcome, report.outages, served_by)}: {outcome.error[:200]}")


def close_by_restarts(outages: list[Outage]) -> None:
    """A stub outage the soak's own server kill overtook ends when that server serves again."""
    kills = [o for o in outages if o.fault == SERVER_KILLED and o.recovered_at is not None]
    for outage in outages:
        if outage.recovered_at is not None:
            continue
        later = [k for k in kills if k.model == outage.model and k.at >= outage.at]
        if later:
            outage.recovered_at = min(later, key=lambda k: k.at).recovered_at


def own_restarts(report: SoakReport, history: list[dict]) -> None:
    """A server the soak killed was meant to die; any other death fails the run."""
    report.server_deaths = [f"{d.get('pid')} {d['cause']}" for d in history]
    report.server_restarts = [d["cause"] for d in history if d.get("pid") not in report.server_kills]


def record_exit(report: SoakReport, server: TritonServer) -> None:
    """How the drained ``server`` ended, for ``exit_expected``: its exit code, whether the drain
    completed, the log lines that explain the exit, and its own watchdog's reloads."""
    report.exit_code = server.process.returncode if server.process else None
    report.drained = server.drain_finished_at is not None
    report.exit_log = exit_lines(server.log_tail(60))
    report.watchdog_reloads = server.watchdog.reloads if server.watchdog is not None else 0


def exit_lines(log_tail: str) -> list[str]:
    """The lines of a server's last log that say why it exited as it did (Triton's last count of live
    models, its own error, a C++ abort), trimmed."""
    lines = [line.strip()[:200] for line in log_tail.splitlines() if any(m in line for m in EXIT_LINES)]
    counts = [line for line in lines if "live models" in line]
    return [line for line in lines if "live models" not in line or line == counts[-1]]
