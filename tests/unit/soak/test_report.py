"""make soak's accounting: a failure is excused only inside an outage of a model it depends on, with
the error that outage explains; everything else sent before the drain is lost."""

from __future__ import annotations

from server.watchdog import HealEvent
from soak.faults import match_heal_events
from soak.invariant_fuzz import InvariantReport
from soak.mixed_load import MixedLoad, Outcome
from soak.report import (
    SERVER_KILLED,
    Outage,
    SoakReport,
    account,
    close_by_restarts,
    exit_lines,
    own_restarts,
)

UNHEALTHY = "[500] Stub process 'recommender_0_0' is not healthy."
SERVED_BY = {"recommender": {"recommender"}, "trivial": {"trivial"}}


def _report() -> SoakReport:
    report = SoakReport(duration_s=60)
    report.outages.append(Outage("stub stopped", "recommender", at=10.0, epoch=0.0, symptom="is not healthy"))
    report.outages[0].recovered_at = 13.0
    return report


def test_failures_inside_the_outage_of_their_model_are_excused_and_nothing_else() -> None:
    report = _report()
    outcomes = [
        Outcome("grpc", "recommender", 9.0, 9.1, ""),
        Outcome("grpc", "recommender", 10.5, 11.5, UNHEALTHY),  # inside
        Outcome("http", "recommender", 13.8, 14.9, UNHEALTHY),  # inside the grace after recovery
        Outcome("http", "recommender", 15.0, 16.0, UNHEALTHY),  # after it: lost
        Outcome("http", "trivial", 11.0, 11.1, UNHEALTHY.replace("recommender", "trivial")),  # other model
        Outcome("grpc", "recommender", 11.0, 11.2, "[StatusCode.INTERNAL] something else"),  # other error
    ]
    account(report, outcomes, (100.0, 101.0), SERVED_BY)
    assert (report.sent, report.ok, report.excused, len(report.lost)) == (6, 1, 2, 3)
    assert report.lost[0].startswith(
        "answered wrongly: http recommender (answered in 1.0 s, sent 5.0 s after 'stub stopped'"
    )
    assert report.lost[1].startswith(
        "answered wrongly: http trivial (answered in 0.1 s, no outage of its models before it)"
    )
    assert not report.passed


def test_a_caller_still_waiting_after_the_drain_is_lost_unanswered() -> None:
    """Its request never got an outcome: without ``waiting`` the run below would pass on one good answer."""
    report = _report()
    load = MixedLoad("127.0.0.1:1", "127.0.0.1:2", ["trivial"])
    assert [caller.name for caller in load.callers] == ["http trivial", "grpc trivial"]
    account(report, [Outcome("http", "trivial", 1.0, 1.1, "")], (100.0, 101.0), SERVED_BY, ["grpc trivial"])
    assert (report.ok, report.lost_unanswered) == (1, 1)
    assert report.lost == ["unanswered: grpc trivial: its request had no answer after the drain"]
    assert not report.passed


def test_an_outage_that_never_recovered_fails_the_run() -> None:
    report = _report()
    report.outages[0].recovered_at = None
    account(report, [Outcome("grpc", "recommender", 50.0, 51.0, UNHEALTHY)], (100.0, 101.0), SERVED_BY)
    assert report.excused == 1 and not report.lost
    assert not report.passed


def test_a_model_whose_reload_a_second_fault_broke_recovers_with_the_next_reload() -> None:
    """A stub killed, its reload failed because a stop landed on the new stub; the watchdog's next
    reload healed the model: both faults recovered then, each detected by its own event."""
    killed = Outage("stub killed", "embedding", at=100.0, epoch=1000.0, symptom="is not healthy")
    stopped = Outage("stub stopped", "embedding", at=136.0, epoch=1036.0, symptom="is not healthy")
    other = Outage("stub killed", "trivial", at=110.0, epoch=1010.0, symptom="is not healthy")
    events = [
        HealEvent("embedding", "embedding_0_0", 1, detected_at=1000.25, error="load failed"),
        HealEvent("trivial", "trivial_0_0", 2, detected_at=1010.5, healed_at=1014.0),
        HealEvent("embedding", "embedding_0_0", 3, detected_at=1036.25, healed_at=1068.0),
    ]
    match_heal_events([stopped, killed, other], events, offset=-900.0)
    assert (killed.detected_at, killed.recovered_at) == (100.25, 168.0)
    assert (stopped.detected_at, stopped.recovered_at) == (136.25, 168.0)
    assert (other.detected_at, other.recovered_at) == (110.5, 114.0)


def test_a_model_never_healed_has_no_recovery() -> None:
    killed = Outage("stub killed", "embedding", at=100.0, epoch=1000.0, symptom="is not healthy")
    match_heal_events([killed], [HealEvent("embedding", "e", 1, detected_at=1000.25)], offset=-900.0)
    assert killed.detected_at == 100.25 and killed.recovered_at is None


GAP = ("tritonserver is not reachable", "tritonserver did not answer", "StatusCode.UNAVAILABLE")
NOT_REACHABLE = "[503] tritonserver is not reachable (starting, restarting or down): connect failed"


def _killed_at(at: float, recovered_at: float) -> list[Outage]:
    outages = [Outage(SERVER_KILLED, m, at=at, epoch=0.0, symptom=GAP) for m in ("recommender", "trivial")]
    for outage in outages:
        outage.recovered_at = recovered_at
    return outages


def test_a_restart_gap_the_soak_caused_excuses_the_fronts_answers_in_it_and_nothing_else() -> None:
    """The fronts answer 503/502 JSON and gRPC UNAVAILABLE while the server the soak killed restarts:
    expected there, and for a request still in flight at the kill; the same answers before the kill or
    after the restart are lost (answered wrongly: the front quoting a reset is still an answer), and a
    refused connection is lost as unanswered (the fronts must stay up)."""
    report = SoakReport(duration_s=60)
    report.outages.extend(_killed_at(20.0, 40.0))
    in_flight = "[502] tritonserver did not answer the request (it may have crashed): ServerDisconnectedError"
    reset = (
        "[StatusCode.UNAVAILABLE] tritonserver is not reachable: Stream removed (Connection reset by peer)"
    )
    outcomes = [
        Outcome("http", "trivial", 21.0, 21.1, NOT_REACHABLE),
        Outcome("grpc", "recommender", 22.0, 22.1, "[StatusCode.UNAVAILABLE] tritonserver is not reachable"),
        Outcome("http", "recommender", 13.0, 20.2, in_flight),  # sent 7 s before the kill, answered at it
        Outcome("http", "trivial", 13.0, 19.0, in_flight),  # answered before the kill: wrong
        Outcome("grpc", "trivial", 45.0, 45.1, reset),  # after the restart: wrong
        Outcome("http", "trivial", 25.0, 25.1, "[Errno 111] Connection refused"),  # no front: unanswered
    ]
    account(report, outcomes, (100.0, 101.0), SERVED_BY)
    assert (report.excused, report.excused_by) == (3, {SERVER_KILLED: 3})
    assert len(report.lost) == 3 and report.lost_unanswered == 1
    assert [lost.split(":")[0] for lost in report.lost] == ["answered wrongly"] * 2 + ["unanswered"]
    assert "lost 3 (unanswered 1, answered wrongly 2)" in report.text()


def test_only_deaths_the_soak_did_not_cause_fail_the_run() -> None:
    report = SoakReport(duration_s=60)
    report.server_kills = [111]
    history = [{"pid": 111, "cause": "killed by signal 9 (SIGKILL)"}]
    own_restarts(report, history)
    assert report.server_restarts == [] and report.passed
    own_restarts(report, [*history, {"pid": 222, "cause": "killed by signal 7 (SIGBUS)"}])
    assert report.server_restarts == ["killed by signal 7 (SIGBUS)"] and not report.passed


# the end of the log of a server that drained after a stub died under load (Triton 2.51)
EXIT_TIMEOUT_LOG = """Signal (15) received.
I1206 server.cc:336] "All models are stopped, unloading models"
I1206 server.cc:345] "Timeout 5: Found 2 live models and 0 in-flight non-inference requests"
I1206 server.cc:345] "Timeout 0: Found 2 live models and 0 in-flight non-inference requests"
E1206 main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
"""


def _stub_fault(fault: str, at: float) -> Outage:
    outage = Outage(fault, "recommender", at=at, epoch=0.0, symptom="is not healthy")
    outage.recovered_at = at + 4.0
    return outage


def test_the_drained_servers_exit_code_decides_the_run_with_the_exit_its_watchdogs_reloads_explain() -> None:
    """0 passes. Triton 2.51 exits 1 past its exit timeout when models reloaded after their stubs died
    under load left old versions it never unloads, one per reload at most: expected only when the
    versions it held after a complete drain are no more than the reloads of the drained server's own
    watchdog (``Watchdog.reloads``; the soak's own stub faults neither add to them nor stand in for
    them), and only with Triton's exit-timeout line; any other exit code fails the run, and the report
    says how each server ended."""
    report = SoakReport(duration_s=60, exit_code=0, server_pids=[111, 222])
    assert report.passed and "111 killed by SIGKILL" not in report.text()
    report.server_kills = [111]
    own_restarts(report, [{"pid": 111, "cause": "killed by SIGKILL"}])
    assert report.passed
    assert "how each tritonserver ended: 111 killed by SIGKILL; 222 exit code 0 at the drain (expected)" in (
        report.text()
    )
    report.exit_code, report.exit_log = 1, exit_lines(EXIT_TIMEOUT_LOG)
    assert report.exit_log == [line.strip() for line in EXIT_TIMEOUT_LOG.splitlines()[3:]], "the last count"
    assert not report.passed, "no reload: nothing explains it"
    report.outages.extend([_stub_fault("stub killed", 50.0), _stub_fault("stub stopped", 60.0)])
    assert not report.passed, "the soak's stub faults are no reloads the watchdog recorded"
    report.outages.clear()
    report.watchdog_reloads = 1
    assert report.versions_held == 2
    assert not report.passed, "one version held more than the watchdog's reloads on the drained server"
    report.watchdog_reloads = 2
    assert report.passed, "reloads the watchdog made on its own (a hung stub, no fault of the soak's)"
    ended = "222 exit code 1 at the drain (expected); model versions held at exit 2, watchdog reloads on it 2"
    assert f"{ended}\n    I1206" in report.text()
    report.drained = False
    assert not report.passed and "the drain was incomplete" in report.text(), "live versions counted too"
    report.drained = True
    report.exit_log = [line for line in report.exit_log if "live models" not in line]
    assert not report.passed, "exit timeout without Triton's count of what it held"
    report.exit_log = exit_lines(EXIT_TIMEOUT_LOG.replace("Found 2", "Found 0"))
    assert not report.passed, "the exit timeout held by something else than model versions"
    report.exit_log = []
    assert not report.passed and "(UNEXPECTED)" in report.text(), "exit 1 without Triton's reason"
    report.exit_code, report.exit_log = -11, exit_lines(EXIT_TIMEOUT_LOG)
    assert not report.passed, "a crash at the drain"


def test_a_stub_outage_the_server_kill_cut_short_recovers_with_the_restart() -> None:
    """A stub killed, then the whole server before the watchdog healed it: no heal event will come;
    the model serves again when the restarted server does. The kill's own outages take no heal event."""
    stub = Outage("stub killed", "recommender", at=10.0, epoch=1000.0, symptom="is not healthy")
    killed = _killed_at(12.0, 30.0)
    events = [HealEvent("recommender", "recommender_0_0", 1, detected_at=1000.5, error="reload failed")]
    match_heal_events([stub, *killed], events, offset=-990.0)
    assert stub.detected_at == 10.5 and stub.recovered_at is None
    assert all(k.recovered_at == 30.0 and k.detected_at is None for k in killed)
    close_by_restarts([stub, *killed])
    assert stub.recovered_at == 30.0
    late = Outage("stub killed", "trivial", at=50.0, epoch=0.0, symptom="is not healthy")
    close_by_restarts([late, *killed])  # a kill before it heals nothing
    assert late.recovered_at is None


def test_a_broken_invariant_fails_the_soak_and_each_invariant_is_accounted() -> None:
    """``make soak``'s first phase (the invariant fuzz) decides the run as its faults do: its report is
    one line per invariant, and a violation of any of them fails the soak."""
    report = SoakReport(duration_s=60)
    assert report.passed and "invariant fuzz: not run" in report.text()
    report.invariants = InvariantReport(models=["trivial"], seeds=[0], examples=20)
    assert report.passed
    assert [line.split(":")[0].strip() for line in report.text().splitlines() if line.startswith("  (")] == [
        "(a) answered",
        "(b) isolated",
        "(c) kept",
    ]
    report.invariants.isolated.append("case 3: canary of client B in client A's answer")
    assert not report.passed and "invariant fuzz: FAILED" in report.text()
