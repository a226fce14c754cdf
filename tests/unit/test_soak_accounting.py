"""make soak's accounting: a failure is excused only inside an outage of a model it depends on, with
the error that outage explains; everything else sent before the drain is lost."""

from __future__ import annotations

from server.watchdog import HealEvent
from soak.faults import match_heal_events
from soak.mixed_load import Outcome
from soak.report import Outage, SoakReport, account

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
    assert report.lost[0].startswith("http recommender (answered in 1.0 s, sent 5.0 s after 'stub stopped'")
    assert report.lost[1].startswith("http trivial (answered in 0.1 s, no outage of its models before it)")
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
