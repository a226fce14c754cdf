"""Every run is evidence: ``make tune``'s answer is the best point any of its runs (probe, search,
verification) held the budget at, by the one search's rule; a single noisy miss does not demote it, a
later run that misses there (the shapes step, a re-measure) reopens it; "nothing meets" (exit 3) only
where no point holds, naming the closest run over the budget. On a scripted server (each family of
configurations holds the budget up to a known rate), so what is asserted is what the tuner must do with
the runs it got."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from rich.console import Console

from perf.cli import PerfSetup, main
from perf.errors import EXIT_NOTHING_MEETS, NothingMeetsError
from perf.markdown import number
from perf.measure.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.session.probe import ProbePlan
from perf.session.search import RULE, Evidence, Verdict, at_rung, decide, rung
from perf.tune import tuner
from perf.tune.cli import TuneSetup, print_summary
from perf.tune.report import headline, held_up_to, prediction_sentence
from perf.tune.result import document
from perf.tune.tuner import TuneRequest, tune
from tests.unit.perf.scripted_server import OVER, ScriptedServer
from tests.unit.perf.tune.test_tuner import BUDGET_MS, GRID, LINEAR

FAMILIES = {(2, 8): 2000.0, (1, 8): 1500.0, (2, 32): 1200.0, (1, 32): 1000.0}


def by_family(config: BatcherConfig) -> float:
    """What each family holds the budget up to; no batching 300/s."""
    return FAMILIES.get((config.instances, config.max_batch_size), 300.0)


def highest_rung_within(capacity: float) -> float:
    return at_rung(int(rung(capacity)))


def tuned(server: ScriptedServer, rate: float | None = None, recheck=None, **request):
    return tune(
        server, TuneRequest(BUDGET_MS, rate=rate, grid=GRID, predict_s=2.0, **request), ProbePlan(max_runs=5),
        recheck=recheck,
    )  # fmt: skip


@pytest.fixture(scope="module")
def unhindered():
    return tuned(ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1))


def test_the_answer_is_the_best_point_measured(unhindered) -> None:
    chosen = unhindered.chosen
    assert (chosen.instances, chosen.max_batch_size) == (2, 8)
    assert unhindered.measured_rate == unhindered.operating_rate == pytest.approx(highest_rung_within(2000))
    assert unhindered.evidence.best() == (chosen, unhindered.measured_rate)
    operating = unhindered.operating_point
    assert operating.verdict is Verdict.HOLDS and operating.measured.meets(BUDGET_MS)


def remeasured(server: ScriptedServer, how: str):
    """A recheck (what the shapes step is) whose run of the first answer misses by a little: once
    (``noisy``: the re-measure meets), or every time (``always``); its run joins the evidence and the
    point is decided again, as the shapes step's run as searched does."""
    answers: list[tuple[BatcherConfig, float]] = []

    def recheck(config: BatcherConfig, rate: float, evidence: Evidence[BatcherConfig]) -> None:
        answers.append((config, rate))
        if len(answers) == 1:
            if how == "noisy":
                server.noisy.append((config, rate))
            else:
                server.always_missing.add((config, rate))
        server.prepare(config)
        evidence.add(config, rate, server.measure(poisson(rate, 0), f"shapes {config.label} @ {rate:.0f}/s"))
        decide(server, evidence, config, rate, lambda r: poisson(r, 0), f"re-measure {config.label}")

    return recheck, answers


def test_a_single_noisy_miss_of_the_answer_does_not_demote_it(unhindered) -> None:
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    recheck, answers = remeasured(server, "noisy")
    result = tuned(server, recheck=recheck)
    assert answers == [(unhindered.chosen, unhindered.measured_rate)]
    assert (result.chosen, result.measured_rate) == (unhindered.chosen, unhindered.measured_rate)
    assert not result.demoted
    point = result.operating_point
    assert point.runs == 3 and point.verdict is Verdict.HOLDS  # met, the noisy miss, the re-measure


def test_a_later_run_that_misses_the_answer_reopens_it(unhindered) -> None:
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    recheck, answers = remeasured(server, "always")
    result = tuned(server, recheck=recheck)
    first = (unhindered.chosen, unhindered.measured_rate)
    assert answers[0] == first and len(answers) == 2  # the next answer was checked again too
    assert [(p.config, p.rate) for p in result.demoted] == [first]
    assert result.demoted[0].verdict is Verdict.MISSES and result.demoted[0].runs == 3
    assert (result.chosen, result.operating_rate) == answers[1] != first
    assert result.evidence.verdict(result.chosen, result.operating_rate) is Verdict.HOLDS
    assert result.evidence.best(prefer=[result.chosen]) == answers[1]  # the best point left


def test_a_prediction_that_nothing_fits_does_not_override_a_probe_run_that_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No candidate predicted within the budget (the prediction's CPU term ruled them out), while the
    probe's runs met it: the configurations a probe run held it with are searched, and answer."""
    monkeypatch.setattr(tuner, "max_rate", lambda *args, **kwargs: None)
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    result = tuned(server)
    assert all(r.best is None for r in result.ranking)
    probe_configs = {config for config, _ in result.probe.runs}
    assert result.chosen in probe_configs and result.shortlist[0].config in probe_configs
    assert result.measured_rate == pytest.approx(highest_rung_within(by_family(result.chosen)))


def test_with_a_target_rate_the_answer_holds_there(unhindered) -> None:
    result = tuned(ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1), rate=1700.0)
    assert (result.chosen.instances, result.chosen.max_batch_size) == (2, 8)
    assert result.operating_rate == 1700.0 and result.operating_point.verdict is Verdict.HOLDS
    assert result.measured_rate >= 1700.0


def test_where_no_point_holds_the_verdict_is_one_line_naming_the_closest_run_over_the_budget() -> None:
    server = ScriptedServer(LINEAR, BUDGET_MS, lambda config: 0.5, seed=1)
    with pytest.raises(NothingMeetsError) as caught:
        tuned(server)
    verdict = str(caught.value)
    assert "\n" not in verdict
    assert re.match(
        r"^nothing meets p99 <= 10 ms here: the closest measured was .+ at [\d,]+/s with p99 ", verdict
    )
    p99 = float(re.search(r"with p99 ([\d.,]+) ms", verdict).group(1).replace(",", ""))
    assert p99 == pytest.approx(OVER * BUDGET_MS, rel=0.01) and p99 > BUDGET_MS
    assert len(server.made) <= 20  # every run misses by far: no ramp goes on, no miss is measured again


def test_make_tune_exits_3_and_writes_no_tuned_spec_when_nothing_meets(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``python -m perf tune`` as ``make tune`` runs it, on the scripted server in place of the real one
    (every configuration over the budget at every rate): exit 3, the one line printed, no spec written
    as answer."""
    server = ScriptedServer(LINEAR, BUDGET_MS, lambda config: 0.5, seed=1)
    setup = TuneSetup(session=server.as_session(), tuner=lambda session, request, **kwargs: tuned(session))
    reports = tmp_path / "reports"
    code = main(
        ["tune", "--model", "recommender", "--p99-ms", "10", "--engine", "ours", "--reports", str(reports)],
        PerfSetup(Console(width=300), tune=setup),
    )
    assert code == EXIT_NOTHING_MEETS == 3
    printed = capsys.readouterr().out
    assert "nothing meets p99 <= 10 ms here: the closest measured was" in printed
    (folder,) = reports.iterdir()
    assert not (folder / "spec.tuned.yaml").exists() and not (folder / "overlay.yaml").exists()
    partial = (folder / "partial.md").read_text()
    assert partial.startswith("# Tuning recommender for p99 ≤ 10 ms: no answer")
    assert "Nothing below is an answer" in partial


def test_make_tune_exits_2_on_a_spec_it_cannot_read(tmp_path: Path) -> None:
    """A usage or spec error (2) is kept apart from a failed run (1) and from "nothing meets" (3)."""
    missing = tmp_path / "missing.yaml"
    args = ["tune", "--spec", str(missing), "--model", "m", "--p99-ms", "10", "--reports", str(tmp_path)]
    assert main(args) == 2


def test_the_result_keeps_each_step_s_time_apart(unhindered) -> None:
    """The saved seconds of each step are what each took (the shortlist's not filed as the prediction's)."""
    assert unhindered.predict_s > 0 and unhindered.shortlist_s > 0 and unhindered.verify_s > 0
    assert unhindered.demoted == []


def test_a_verification_miss_below_the_answer_is_decided_and_refutes_it(unhindered) -> None:
    """The answer's verification point at 71% of its rate misses, and misses again when measured again
    (the rule measures any miss again): the configuration does not hold the budget "up to" the answer's
    rate, so that answer is reopened, named with the point that refuted it, and the answer is one all of
    whose points at or below its rate hold."""
    first, rate = unhindered.chosen, unhindered.measured_rate
    below = at_rung(round(rung(rate)) - 3)
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    server.always_missing.add((first, below))
    result = tuned(server)
    assert [(p.config, p.rate) for p in result.demoted] == [(first, below)]
    assert result.demoted[0].verdict is Verdict.MISSES and result.demoted[0].runs == 2
    assert result.evidence.held_rate(first) < below
    assert (result.chosen, result.operating_rate) != (first, rate)
    evidence = result.evidence
    assert all(
        evidence.verdict(result.chosen, r) is Verdict.HOLDS
        for r in evidence.rates(result.chosen)
        if r <= result.operating_rate
    )


def test_an_answer_the_prediction_did_not_rank_never_reads_as_nothing_predicted(unhindered, tmp_path) -> None:
    """The answer is a configuration the prediction did not rank (a probe run's, whose max batch size the
    bound left out), while the prediction put candidates within the budget: the headline and the console
    say the answer is no candidate it ranked, with its first's rate, never "no candidate within the
    budget", which the report's own table of predicted candidates contradicts."""
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    saved = dataclasses.replace(
        document(unhindered, "m", "ours", server.policy, server.cores), predicted_max_rate=None
    )
    first = saved.candidates[0]
    assert first.feasible and first.best is not None
    console = Console(record=True, width=400)
    print_summary(saved, tmp_path / "report.md", console)
    for text in (prediction_sentence(saved), console.export_text()):
        assert "no candidate within the budget" not in text
        assert f"its first, {first.config}, {number(first.best.rate, 0)}/s within the budget" in text


def test_where_the_runs_of_the_answer_s_point_disagree_the_headline_shows_each_and_the_rule(tmp_path) -> None:
    """The answer's point met the budget, then missed it once (the shapes step), then met it again: the
    headline gives every run's p99 in order, which met, and the rule that decided, not the last run's
    figure alone beside "holds"."""
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    recheck, _ = remeasured(server, "noisy")
    result = tuned(server, recheck=recheck)
    saved = document(result, "m", "ours", server.policy, server.cores)
    assert saved.operating.runs_met == (True, False, True)
    met, missed, again = saved.operating.runs_p99_ms
    text = "\n".join(headline(saved))
    assert (
        f"(3 runs, holds: its runs disagree: {met:,.1f} ms met, {missed:,.1f} ms missed, "
        f"{again:,.1f} ms met; {RULE})" in text
    )
    unanimous = dataclasses.replace(saved.operating, runs_met=(True, True, True))
    assert "disagree" not in "\n".join(headline(dataclasses.replace(saved, operating=unanimous)))


def test_a_shortlisted_configuration_refuted_below_a_point_that_held_says_so(unhindered) -> None:
    """A configuration that held the budget at one rate and missed it (the miss standing) below it holds
    it up to no rate above the miss: its row says where the miss stood, not "none held" (or a rate
    below) beside points whose verdict is "holds" and no word of why."""
    server = ScriptedServer(LINEAR, BUDGET_MS, by_family, seed=1)
    saved = document(unhindered, "m", "ours", server.policy, server.cores)
    searched = saved.shortlist[0]
    assert searched.measured_rate > 0 and any(p.verdict == "holds" for p in searched.points)
    assert searched.refuted_rate > searched.measured_rate  # the miss above it that bounded its search
    assert held_up_to(searched) == number(searched.measured_rate, 0)
    below = min(p.rate for p in searched.points if p.verdict == "holds") / 2
    refuted = dataclasses.replace(searched, measured_rate=0.0, refuted_rate=below)
    assert held_up_to(refuted) == f"none: a miss stood at {number(below, 0)}/s, below points that held"
    capped = dataclasses.replace(searched, refuted_rate=below, measured_rate=below / 2)
    assert held_up_to(capped) == (
        f"{number(below / 2, 0)} (a miss stood at {number(below, 0)}/s, below points that held)"
    )
    missed = dataclasses.replace(
        refuted, points=tuple(dataclasses.replace(p, verdict="misses") for p in searched.points)
    )
    assert held_up_to(missed) == "none held"


def test_a_configuration_only_a_probe_run_measured_is_searched_before_it_stands_as_the_answer() -> None:
    """The shortlist (one family) holds the budget up to 600/s, the probe's run of another configuration
    held it higher: that one is the best point, but a probe run is no search, so it is searched from there
    (as the shortlist is: up to where it holds) before it is verified and answers."""

    def capacity(config: BatcherConfig) -> float:
        return 600.0 if (config.instances, config.max_batch_size) == (2, 8) else by_family(config)

    server = ScriptedServer(LINEAR, BUDGET_MS, capacity, seed=1)
    result = tuned(server, shortlist=1)
    assert [candidate.config.max_batch_size for candidate in result.shortlist[:1]] == [8]
    chosen = result.chosen
    probed = max(
        run.load.rate for config, run in result.probe.runs if config == chosen and run.meets(BUDGET_MS)
    )
    assert chosen.max_batch_size == 32 and probed > 600.0  # a probe run's configuration
    assert chosen in [candidate.config for candidate in result.shortlist]
    assert any(config == chosen and label.startswith("search ") for config, _, label in server.made)
    assert result.operating_rate == pytest.approx(highest_rung_within(capacity(chosen)))
    assert result.operating_rate > probed  # searched up from the probe's run
