"""``make plan``'s answer is what was measured: of the architectures its CPU verification served, the
one measured to hold the budget at the highest rate is the pick; one that held it at no rate tried is
demoted; where nothing measured (or, with nothing measured, nothing predicted) meets the budget the
verdict is one line with the closest figure, no ``spec.planned.yaml``, exit status 3. A profile of
fixed figures stands in for a measured one, and a scripted session for the server."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest
from rich.console import Console
from test_plan_placement import NARROW, profile

from perf.errors import EXIT_NOTHING_MEETS, NothingMeetsError
from perf.plan import cli as plan_cli
from perf.plan import verify as plan_verify
from perf.plan.document import VerificationRow
from perf.plan.planner import NoStrategyError, Plan, PlanRequest, plan
from perf.plan.report import top_architectures
from perf.plan.strategy import Space
from perf.plan.topology import cpu_topology
from perf.plan.verify import settle

BUDGET_MS = 10.0


def planned(space: Space = NARROW) -> Plan:
    return plan(profile(), cpu_topology(), PlanRequest(BUDGET_MS, space=space, predict_s=0.5))


def row(judged, fraction: float, p99_ms: float, sustained: bool = True) -> VerificationRow:
    rate = fraction * judged.rate
    return VerificationRow(
        strategy=judged.strategy.label, fraction=fraction, rate=rate, predicted_p99_ms=5.0,
        measured_p99_ms=p99_ms, predicted_throughput=rate,
        measured_throughput=rate if sustained else 0.3 * rate, sustained=sustained,
        met=sustained and p99_ms <= BUDGET_MS,
    )  # fmt: skip


def test_a_verified_pick_that_held_the_budget_nowhere_is_demoted_for_the_next() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    assert result.chosen is first
    rows = [row(first, f, BUDGET_MS + 0.2) for f in (0.7, 1.0, 0.42, 0.252)]  # 10.2 ms: a miss
    rows += [row(second, 0.7, 6.0), row(second, 1.0, 12.0)]
    settled, rate = settle(result, rows)
    assert settled.chosen is second and settled.chosen.reason == ""
    assert rate == pytest.approx(0.7 * second.rate)  # a rate a run held the budget at, not the prediction
    assert first.reason.startswith("demoted: measured over the budget at every rate tried (p99 10.2 ms")


def test_the_pick_is_the_architecture_measured_to_hold_the_most() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    rows = [row(first, 0.7, 6.0), row(first, 1.0, 30.0), row(second, 0.7, 6.0), row(second, 1.0, 8.0)]
    settled, rate = settle(result, rows)
    expected = first if 0.7 * first.rate > second.rate else second
    assert settled.chosen is expected
    assert rate == pytest.approx(max(0.7 * first.rate, second.rate))


def test_where_no_verified_architecture_holds_the_budget_the_verdict_names_the_closest() -> None:
    result = planned()
    first, second = top_architectures(result, 2)
    rows = [row(first, 0.7, 40.0), row(first, 1.0, 90.0), row(second, 0.7, 10.2), row(second, 1.0, 55.0)]
    with pytest.raises(NothingMeetsError) as caught:
        settle(result, rows)
    assert str(caught.value) == (
        f"nothing meets p99 <= 10 ms here: the closest measured was {second.strategy.label} at "
        f"{0.7 * second.rate:,.0f}/s with p99 10.2 ms"
    )


class ScriptedSession:
    """Stands in for the tuner's session in the verification: holds the budget up to ``capacity``/s."""

    capacity = 0.0
    serves = float("inf")  # the most it answers per second, whatever is offered
    rates: ClassVar[list[float]] = []

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self) -> ScriptedSession:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def prepare(self, config) -> None:
        pass

    def measure(self, load, label: str) -> SimpleNamespace:
        self.rates.append(load.rate)
        held = load.rate <= self.capacity
        p99 = 5.0 if held else 50.0
        served = min(load.rate, self.serves)
        return SimpleNamespace(
            p99_ms=p99,
            throughput=served,
            sustained=served >= 0.95 * load.rate,
            meets=lambda budget: p99 <= budget,
        )


@pytest.mark.parametrize(
    ("capacity_share", "serves_share", "fractions"),
    [
        (0.0, float("inf"), [0.7, 1.0, 0.42, 0.252]),  # never holds: two runs past the usual two
        (0.5, float("inf"), [0.7, 1.0, 0.42]),  # holds at 42%: no further
        (0.1, 0.15, [0.7, 1.0, 0.12, 0.072]),  # served 15% of the prediction: searched from there
    ],
)
def test_the_verification_searches_down_from_the_prediction_until_the_budget_holds(
    capacity_share: float,
    serves_share: float,
    fractions: list[float],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A prediction too high is measured further down, ×0.6 a run, or from 80% of the most the server
    served where that is lower (a prediction twenty times too high), two runs past the usual two, and
    no further once a run holds the budget."""
    result = planned(dataclasses.replace(NARROW, split=False))
    judged = result.chosen
    assert judged.strategy.kind == "data"
    ScriptedSession.capacity, ScriptedSession.rates = capacity_share * judged.rate, []
    ScriptedSession.serves = serves_share * judged.rate
    monkeypatch.setattr(plan_verify, "ModelSession", ScriptedSession)
    spec = plan_cli.load_spec(Path(__file__).resolve().parents[2] / "models.yaml")
    rows = plan_verify.verify(spec, "recommender", result, 1, None, None, tmp_path, lambda text: None)
    assert ScriptedSession.rates == pytest.approx([f * judged.rate for f in fractions])
    assert [r.met for r in rows] == [r.rate <= ScriptedSession.capacity for r in rows]


def test_every_strategy_predicted_over_the_budget_is_a_verdict_not_a_placement_error() -> None:
    with pytest.raises(NoStrategyError) as caught:
        plan(profile(), cpu_topology(), PlanRequest(0.01, space=NARROW, predict_s=0.5))
    assert plan_cli.over_budget_everywhere(caught.value.judged)
    verdict = plan_cli.predicted_verdict(0.01, "recommender", cpu_topology(), None)
    assert str(verdict).startswith(
        "nothing meets p99 <= 0.01 ms on cpu: every strategy that fits is predicted"
    )


@pytest.mark.parametrize("where", ["predicted", "verified"])
def test_make_plan_exits_3_and_writes_no_planned_spec_when_nothing_meets(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``python -m perf plan`` as ``make plan`` runs it on this CPU, the profile and the server's
    verification replaced by fixed figures: exit 3, the one line, no overlay or planned spec."""
    monkeypatch.setattr(plan_cli, "measure_profile", lambda *args, **kwargs: profile())
    monkeypatch.setattr(plan_cli, "_topology", lambda args: (cpu_topology(), True))
    budget = "0.01" if where == "predicted" else "10"

    def every_run_missed(spec, model, result, count, *args):
        return [row(j, f, 50.0) for j in top_architectures(result, count) for f in (0.7, 1.0)]

    monkeypatch.setattr(plan_cli, "verify", every_run_missed)
    monkeypatch.setattr("perf.cli.console", Console(width=300))
    reports = tmp_path / "reports"
    code = plan_cli_main(["--p99-ms", budget, "--reports", str(reports), "--workdir", str(tmp_path / "w")])
    assert code == EXIT_NOTHING_MEETS == 3
    printed = capsys.readouterr().out
    assert f"nothing meets p99 <= {budget} ms" in printed
    (folder,) = reports.iterdir()
    assert not (folder / "spec.planned.yaml").exists() and not (folder / "overlay.yaml").exists()
    if where == "verified":
        assert "**No answer: nothing meets p99 <= 10 ms here" in (folder / "report.md").read_text()


def plan_cli_main(extra: list[str]) -> int:
    from perf.cli import main

    return main(["plan", "--model", "recommender", "--probe-runs", "0", "--verify", "2", *extra])


def test_a_probe_run_within_the_budget_is_named_with_why_it_is_no_answer() -> None:
    """A busy host: every strategy predicted over the budget, though the probe's lowest rate held it."""
    from perf.model.batcher import BatcherConfig

    def run(rate: float, p99: float) -> SimpleNamespace:
        return SimpleNamespace(
            p99_ms=p99, sustained=True, throughput=rate, load=SimpleNamespace(rate=rate),
            meets=lambda budget: p99 <= budget,
        )  # fmt: skip

    config = BatcherConfig(64, 0)
    probed = SimpleNamespace(runs=[(config, run(50.0, 8.6)), (config, run(80.0, 14.0))])
    verdict = str(plan_cli.predicted_verdict(10.0, "recommender", cpu_topology(), probed))
    assert verdict == (
        "nothing meets p99 <= 10 ms here: the closest measured was recommender max 64, 0 ms ×1 at 50/s "
        "with p99 8.6 ms (a probe run; no strategy is predicted within the budget at any rate)"
    )
    probed.runs = [(config, run(80.0, 14.0))]
    assert str(plan_cli.predicted_verdict(10.0, "recommender", cpu_topology(), probed)).endswith(
        "p99 14.0 ms"
    )
