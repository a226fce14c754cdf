"""``make plan``'s answer is what was measured: every point its runs made (the probe's of a whole-model
strategy, the search's) is evidence, and the strategy with the best point that holds the budget by the
one search's rule is the pick; one that held it at no rate tried is demoted; a probe run that held it
answers even where every strategy is predicted over it; where no point holds (or, with nothing measured,
nothing is predicted within the budget) the verdict is one line with the closest run over the budget,
no ``spec.planned.yaml``, exit status 3. A profile of fixed figures stands in for a measured one, and a
scripted session for the server."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_NOTHING_MEETS, NothingMeetsError
from perf.measure.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.plan import cli as plan_cli
from perf.plan.document import VerificationRow, plan_document, top_architectures
from perf.plan.planner import NoStrategyError, Plan, PlanRequest, plan
from perf.plan.strategy import Space
from perf.plan.topology import cpu_topology
from perf.plan.verify import measure_plan, probe_evidence, settle, verification_rows
from perf.session.search import RULE, Evidence, Verdict, at_rung, decide, rung
from tests.unit.perf.plan.test_placement import NARROW, profile

BUDGET_MS = 10.0


def planned(space: Space = NARROW) -> Plan:
    return plan(profile(), cpu_topology(), PlanRequest(BUDGET_MS, space=space, predict_s=0.5))


def row(judged, fraction: float, p99_ms: float, sustained: bool = True) -> VerificationRow:
    rate = fraction * judged.rate
    return VerificationRow(
        strategy=judged.strategy.label, rate=rate, predicted_p99_ms=5.0, measured_p99_ms=p99_ms,
        measured_throughput=rate if sustained else 0.3 * rate, met=sustained and p99_ms <= BUDGET_MS,
    )  # fmt: skip


def run(p99_ms: float, served: float, rate: float | None = None) -> SimpleNamespace:
    """A run (as the search reads it) that served ``served``/s of ``rate`` (default: all of it)."""
    sustained = rate is None or served >= 0.95 * rate
    return SimpleNamespace(
        label="run", p99_ms=p99_ms, throughput=served, sustained=sustained, samples=1000, too_few=False,
        failed=0, load=SimpleNamespace(rate=rate or served),
        meets=lambda budget: sustained and p99_ms <= budget,
    )  # fmt: skip


def test_a_measured_pick_that_held_the_budget_nowhere_is_demoted_for_the_next() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    assert result.chosen is first
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    for rate in (0.7 * first.rate, 0.4 * first.rate):
        evidence.add(first.strategy.label, rate, run(BUDGET_MS + 0.2, rate))  # 10.2 ms: a miss, twice
        evidence.add(first.strategy.label, rate, run(BUDGET_MS + 0.3, rate))
    evidence.add(second.strategy.label, 0.7 * second.rate, run(6.0, 0.7 * second.rate))
    settled, rate = settle(result, evidence)
    assert settled.chosen is second and settled.chosen.reason == ""
    assert rate == pytest.approx(0.7 * second.rate)  # a rate a run held the budget at, not the prediction
    assert first.reason.startswith("demoted: measured over the budget at every rate tried (p99 10.2 ms")


def test_where_measurement_overturns_the_predicted_pick_an_unmeasured_strategy_says_it_was_not_measured() -> (
    None
):
    result = planned()
    first, second = top_architectures(result, 2)
    unmeasured = [j for j in result.judged if j.feasible and j not in (first, second)]
    assert unmeasured, "the narrow space predicts more than two strategies within the budget"
    kept = {j.strategy.label: j.reason for j in result.judged if not j.feasible}
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add(
        first.strategy.label, first.rate, run(30.0, first.rate)
    )  # far over: the prediction's pick lost
    evidence.add(second.strategy.label, 500.0, run(6.0, 500.0))
    settled, rate = settle(result, evidence)
    assert settled.chosen is second and rate == 500.0
    for judged in unmeasured:
        assert judged.reason.startswith(
            f"not measured: predicted {judged.rate:,.0f}/s, the pick measured within the budget up to 500/s"
        )
    assert {j.strategy.label: j.reason for j in result.judged if not j.feasible} == kept


def test_the_pick_is_the_strategy_with_the_best_point_that_holds() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add(first.strategy.label, 700.0, run(6.0, 700.0))
    evidence.add(first.strategy.label, 900.0, run(30.0, 900.0))
    evidence.add(second.strategy.label, 800.0, run(8.0, 800.0))
    evidence.add(second.strategy.label, 1000.0, run(10.4, 1000.0))  # one miss alone: open, not held
    settled, rate = settle(result, evidence)
    assert settled.chosen is second and rate == 800.0
    assert first.reason == "lower measured rate: 700/s against 800/s"


def test_where_no_point_holds_the_verdict_names_the_closest_run_over_the_budget() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add(first.strategy.label, 100.0, run(9.0, 40.0, rate=100.0))  # behind, p99 within it
    evidence.add(first.strategy.label, 200.0, run(90.0, 200.0))
    evidence.add(second.strategy.label, 300.0, run(10.5, 300.0))
    evidence.add(second.strategy.label, 300.0, run(10.4, 300.0))
    with pytest.raises(NothingMeetsError) as caught:
        settle(result, evidence)
    assert str(caught.value) == (
        f"nothing meets p99 <= 10 ms here: the closest measured was {second.strategy.label} at 300/s with "
        "p99 10.4 ms, 0.4 ms over the budget"
    )


class ScriptedSession:
    """Stands in for a served strategy: holds the budget up to ``capacity``/s; beyond it answers at most
    ``serves``/s at a p99 of 60 ms. Every run's rate kept in ``rates``."""

    def __init__(self, capacity: float, serves: float = float("inf")) -> None:
        self.capacity, self.serves = capacity, serves
        self.rates: list[float] = []

    def __enter__(self) -> ScriptedSession:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def prepare(self, config) -> None:
        pass

    def measure(self, load, label: str) -> SimpleNamespace:
        self.rates.append(load.rate)
        if load.rate <= self.capacity:
            return run(5.0, load.rate, rate=load.rate)
        return run(60.0, min(load.rate, self.serves), rate=load.rate)


@pytest.mark.parametrize(("capacity_share", "serves_share"), [(0.5, float("inf")), (0.05, 0.06), (0.0, 0.0)])
def test_the_verification_searches_from_the_prediction_to_where_the_budget_holds(
    capacity_share: float, serves_share: float
) -> None:
    """A prediction too high is searched down (at once to what the server served, where it fell far
    behind: a prediction twenty times too high), and the answer is the highest rate a point held."""
    result = planned(dataclasses.replace(NARROW, split=False))
    judged = result.chosen
    session = ScriptedSession(capacity_share * judged.rate, serves_share * judged.rate)
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    serve = lambda strategy: (session, None)  # noqa: E731
    if capacity_share == 0.0:
        with pytest.raises(NothingMeetsError):
            measure_plan(result, evidence, 1, serve, lambda text: None)
        return
    settled, rate = measure_plan(result, evidence, 1, serve, lambda text: None)
    assert settled.chosen is judged and 0.8 * session.capacity < rate <= session.capacity
    if serves_share < 1:
        assert session.rates[1] <= 0.8 * session.serves  # from what it served, not ×0.7 of the prediction
    rows = verification_rows(settled, evidence)
    assert [r.rate for r in rows] == session.rates and all(r.verdict for r in rows)
    assert [r.verdict == "holds" for r in rows] == [r <= session.capacity for r in session.rates]


@pytest.mark.parametrize("how", ["noisy", "always"])
def test_a_later_run_that_misses_the_answer_reopens_it_where_its_point_no_longer_holds(how: str) -> None:
    """A recheck (what the shapes step is) whose run of the first answer misses: decided again by the
    rule, once (``noisy``: the re-measure meets, the answer stands) or every time (``always``: the point
    misses, the answer is reopened and the next best point answers, checked in turn)."""
    result = planned(dataclasses.replace(NARROW, split=False))
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    sessions: dict[str, ScriptedSession] = {}

    def serve(strategy):
        judged = next(j for j in result.judged if j.strategy == strategy)
        return sessions.setdefault(strategy.label, ScriptedSession(0.6 * judged.rate)), None

    checked: list[tuple[str, float]] = []
    steps: list[str] = []

    def recheck(settled: Plan, rate: float) -> None:
        label = settled.chosen.strategy.label
        checked.append((label, rate))
        if len(checked) == 1:
            evidence.add(label, rate, run(BUDGET_MS + 2.0, rate, rate=rate))
            sessions[label].capacity = rate / 2 if how == "always" else rate
        decide(sessions[label], evidence, label, rate, lambda r: poisson(r, 0), f"re-measure {label}")

    settled, rate = measure_plan(result, evidence, 2, serve, steps.append, recheck)
    first = checked[0]
    reopened = [s for s in steps if s.endswith("the answer is reopened")]
    if how == "noisy":
        assert checked == [(settled.chosen.strategy.label, rate)] and not reopened
        assert len(evidence.of(*first)) == 3 and evidence.verdict(*first) is Verdict.HOLDS
    else:
        assert len(checked) == 2 and checked[1] == (settled.chosen.strategy.label, rate) != first
        assert evidence.verdict(*first) is Verdict.MISSES
        assert reopened == [
            f"{first[0]} at {first[1]:,.0f}/s: a later run missed the budget there; the answer is reopened"
        ]


class MissesAt(ScriptedSession):
    """A ``ScriptedSession`` whose runs at ``rate`` miss the budget by a little, whatever its capacity."""

    def __init__(self, capacity: float, rate: float) -> None:
        super().__init__(capacity)
        self.missing = rate

    def measure(self, load, label: str) -> SimpleNamespace:
        if load.rate == self.missing:
            self.rates.append(load.rate)
            return run(BUDGET_MS + 0.5, load.rate, rate=load.rate)
        return super().measure(load, label)


def test_a_miss_below_the_answer_is_decided_before_the_answer_stands() -> None:
    """The first strategy's search holds the budget up to its capacity, but a probe run of it at a lower
    rate missed it. Measured again (the rule measures any miss again), it misses again: the strategy holds
    the budget "up to" no rate above that miss, so it is not the answer, and its reason says why."""
    result = planned(dataclasses.replace(NARROW, split=False))
    first, second = top_architectures(result, 2)
    low = at_rung(round(rung(0.3 * first.rate)))
    sessions = {
        first.strategy.label: MissesAt(0.6 * first.rate, low),
        second.strategy.label: ScriptedSession(0.6 * second.rate),
    }
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    evidence.add(first.strategy.label, low, run(BUDGET_MS + 0.5, low, rate=low))  # the probe's run
    settled, rate = measure_plan(
        result, evidence, 2, lambda strategy: (sessions[strategy.label], None), lambda text: None
    )
    assert evidence.verdict(first.strategy.label, low) is Verdict.MISSES
    assert len(evidence.of(first.strategy.label, low)) == 2
    assert settled.chosen is second and evidence.verdict(second.strategy.label, rate) is Verdict.HOLDS
    assert first.reason.startswith(f"demoted: missed the budget at {low:,.0f}/s (p99 10.5 ms), below rates")


def test_a_point_whose_runs_disagree_is_reported_with_each_run_and_the_rule() -> None:
    """A point that missed once and then met twice holds by the rule; its row gives every run's p99 in
    order and which met, not the last run's alone; a point whose runs agree says its verdict only."""
    result = planned()
    label = result.chosen.strategy.label
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    for p99 in (12.5, 6.0, 7.0):
        evidence.add(label, 500.0, run(p99, 500.0))
    evidence.add(label, 400.0, run(5.0, 400.0))
    disagreeing, agreeing = verification_rows(result, evidence)
    assert (
        disagreeing.point_text == f"holds: its runs disagree: 12.5 ms missed, 6.0 ms met, 7.0 ms met; {RULE}"
    )
    assert agreeing.point_text == "holds"


def test_a_probe_run_within_the_budget_answers_where_every_strategy_is_predicted_over_it() -> None:
    """A busy host: every strategy predicted over the budget, though the probe's lowest rate held it
    (the whole model, one instance, no delay): that strategy is searched and is the answer."""
    with pytest.raises(NoStrategyError) as caught:
        plan(profile(), cpu_topology(), PlanRequest(0.01, space=NARROW, predict_s=0.5))
    assert plan_cli.over_budget_everywhere(caught.value.judged)
    judged = caught.value.judged
    result = Plan(PlanRequest(10.0, space=NARROW), profile(), cpu_topology(), judged, judged[0])
    config = BatcherConfig(32, 0)
    probed = SimpleNamespace(runs=[(config, run(8.6, 50.0, rate=50.0)), (config, run(40.0, 80.0, rate=80.0)),
                                   (BatcherConfig(1), run(9.0, 50.0, rate=50.0))])  # fmt: skip
    evidence: Evidence[str] = Evidence(10.0)
    probe_evidence(evidence, result, probed, "fp32", "recommender")
    session = ScriptedSession(60.0)
    settled, rate = measure_plan(result, evidence, 2, lambda strategy: (session, config), lambda text: None)
    chosen = settled.chosen.strategy
    assert (chosen.kind, chosen.precision, chosen.instances, chosen.delay_us) == ("data", "fp32", (1,), 0)
    assert 50.0 <= rate <= 60.0 and session.rates  # searched up from the probe's run
    assert evidence.verdict("recommender no batching ×1", 50.0) is Verdict.HOLDS  # evidence, no answer
    assert settled.chosen.strategy.label != "recommender no batching ×1"


def test_every_strategy_predicted_over_the_budget_with_nothing_measured_is_the_predictions_verdict() -> None:
    verdict = plan_cli.predicted_verdict(0.01, cpu_topology(), Evidence(0.01))
    assert str(verdict).startswith(
        "nothing meets p99 <= 0.01 ms on cpu: every strategy that fits is predicted"
    )


@pytest.mark.parametrize("where", ["predicted", "verified"])
def test_make_plan_exits_3_and_writes_no_planned_spec_when_nothing_meets(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``python -m perf plan`` as ``make plan`` runs it on this CPU (a host without GPUs), the profile
    and the server replaced by fixed figures and a scripted session over the budget at every rate: exit
    3, the one line, no overlay or planned spec."""
    budget = "0.01" if where == "predicted" else "10"
    session = ScriptedSession(0.0, serves=0.0)
    setup = plan_cli.PlanSetup(
        live_topology=lambda: None,
        measure_profile=lambda *args, **kwargs: profile(),
        real_server=lambda *args: lambda strategy: (session, None),
    )
    reports = tmp_path / "reports"
    argv = ["--p99-ms", budget, "--reports", str(reports), "--workdir", str(tmp_path / "w")]
    code = plan_cli_main(argv, PerfSetup(Console(width=300), plan=setup))
    assert code == EXIT_NOTHING_MEETS == 3
    printed = capsys.readouterr().out
    assert f"nothing meets p99 <= {budget} ms" in printed
    (folder,) = reports.iterdir()
    assert not (folder / "spec.planned.yaml").exists() and not (folder / "overlay.yaml").exists()
    if where == "verified":
        assert "**No answer: nothing meets p99 <= 10 ms here" in (folder / "report.md").read_text()
        assert session.rates  # the search ran on the server before the verdict


def plan_cli_main(extra: list[str], setup: PerfSetup) -> int:
    return main(["plan", "--model", "recommender", "--probe-runs", "0", "--verify", "2", *extra], setup)


class NearlyHolding(ScriptedSession):
    """Holds the budget up to 40/s; above, misses it by a little (p99 12 ms), never by far."""

    def measure(self, load, label: str) -> SimpleNamespace:
        self.rates.append(load.rate)
        return run(5.0 if load.rate <= 40.0 else 12.0, load.rate, rate=load.rate)


def test_where_no_probe_run_held_the_budget_the_closest_is_measured_again_and_searched_down() -> None:
    """Every strategy predicted over the budget and the probe's run a near miss (one run: open): before
    anything is called "nothing meets", that point is measured again and the search goes down from it."""
    with pytest.raises(NoStrategyError) as caught:
        plan(profile(), cpu_topology(), PlanRequest(0.01, space=NARROW, predict_s=0.5))
    judged = caught.value.judged
    result = Plan(PlanRequest(10.0, space=NARROW), profile(), cpu_topology(), judged, judged[0])
    probed = SimpleNamespace(runs=[(BatcherConfig(32, 0), run(12.0, 50.0, rate=50.0))])
    evidence: Evidence[str] = Evidence(10.0)
    probe_evidence(evidence, result, probed, "fp32", "recommender")
    session = NearlyHolding(40.0)
    settled, rate = measure_plan(result, evidence, 2, lambda strategy: (session, None), lambda text: None)
    assert session.rates[0] == 50.0  # the probe's open point, measured again first
    assert rate == pytest.approx(at_rung(31)) and rate <= 40.0 < at_rung(32)  # the highest rung that held
    assert settled.chosen.strategy.label == "whole model ×1, fp32, delay 0 ms"


@pytest.mark.parametrize("pick_holds", [True, False])
def test_every_reason_is_written_against_the_final_answer_not_an_earlier_rounds(pick_holds: bool) -> None:
    """The second architecture holds the budget higher and answers first, so the strategies not measured
    say "not measured … up to" its rate; a recheck (what the shapes step is) then misses it at every
    rate, and the prediction's pick answers (``pick_holds``), or nothing holds. Either way no answer
    overturned the prediction's pick: the others' reasons are the prediction's comparison with it again,
    none names the rate of the answer that fell."""
    result = planned()
    first, second = top_architectures(result, 2)
    unmeasured = [j for j in result.judged if j.feasible and j not in (first, second)]
    assert unmeasured, "the narrow space predicts more than two strategies within the budget"
    predicted = {j.strategy.label: j.reason for j in unmeasured}
    sessions = {first.strategy.label: ScriptedSession(0.3 * first.rate if pick_holds else 0.0),
                second.strategy.label: ScriptedSession(0.6 * second.rate)}  # fmt: skip
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    checked: list[str] = []
    first_round: list[str] = []

    def recheck(settled: Plan, rate: float) -> None:
        label = settled.chosen.strategy.label
        if not checked:
            first_round.extend(j.reason for j in unmeasured)
        checked.append(label)
        if label == second.strategy.label:  # from now on it misses wherever it is measured
            sessions[label].capacity = 0.0
        evidence.add(label, rate, sessions[label].measure(poisson(rate, 0), f"shapes {label}"))
        decide(sessions[label], evidence, label, rate, lambda r: poisson(r, 0), f"re-measure {label}")

    serve = lambda strategy: (sessions[strategy.label], None)  # noqa: E731
    answered = result  # where nothing holds, plan.json is the plan's own with the verdict
    if pick_holds:
        answered, _ = measure_plan(result, evidence, 2, serve, lambda text: None, recheck)
        assert answered.chosen is first
    else:
        with pytest.raises(NothingMeetsError):
            measure_plan(result, evidence, 2, serve, lambda text: None, recheck)
    assert checked[0] == second.strategy.label
    assert first_round and all(reason.startswith("not measured: ") for reason in first_round)
    saved = plan_document(answered, (), verification_rows(answered, evidence), 0.0)  # plan.json, the report
    assert {s.label: s.reason for s in saved.strategies if s.label in predicted} == predicted
    assert second.reason.startswith("demoted: ")


def test_a_strategy_only_a_probe_run_measured_is_searched_before_it_stands_as_the_answer() -> None:
    """The probe's run of the whole model held the budget above every point of the two architectures
    searched: that strategy is the best point, but one run is no search, so it is searched from there on
    its own session (as a searched one: up to where it holds) before it answers, at the rate it held."""
    result = planned()
    first, second = top_architectures(result, 2)
    whole = next(j for j in result.judged if j.strategy.label == "whole model ×1, fp32, delay 0 ms")
    assert whole not in (first, second)
    probed_at = 10_000.0
    sessions = {first.strategy.label: ScriptedSession(0.1 * first.rate),
                second.strategy.label: ScriptedSession(0.1 * second.rate),
                whole.strategy.label: ScriptedSession(2 * probed_at)}  # fmt: skip
    assert all(0.1 * j.rate < probed_at for j in (first, second))
    probed = SimpleNamespace(runs=[(BatcherConfig(32, 0), run(5.0, probed_at, rate=probed_at))])
    evidence: Evidence[str] = Evidence(BUDGET_MS)
    probe_evidence(evidence, result, probed, "fp32", "recommender")
    steps: list[str] = []
    serve = lambda strategy: (sessions[strategy.label], None)  # noqa: E731
    settled, rate = measure_plan(result, evidence, 2, serve, steps.append)
    assert settled.chosen is whole
    assert f"searching {whole.strategy.label} on the real server" in steps
    assert sessions[whole.strategy.label].rates[0] > probed_at  # searched up from the probe's run
    assert probed_at < rate <= 2 * probed_at and evidence.verdict(whole.strategy.label, rate) is Verdict.HOLDS
