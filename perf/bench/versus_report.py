"""The report's section for ``--witness model-analyzer`` (``perf.bench.versus``), rendered from the saved
figures alone (``result.json``: ``model_analyzer``, a ``WitnessFigures``), every figure named with the
tool behind it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from perf.bench.model_analyzer import Measured
from perf.bench.yardstick import Plan, RampFigures
from perf.markdown import number, table
from perf.studies.goals import GOALS, Goal, goals_table
from perf.tune.result import TuneDocument

HEADING = "## Model Analyzer beside the tuner (`--witness model-analyzer`)"
OURS, THEIRS, SPEC = "make tune", "Model Analyzer", "models.yaml"


@dataclass(frozen=True)
class SearchFigures:
    """Model Analyzer's brute search: what it ran, what it picked, its own figure for the pick."""

    seconds: float
    pick: str | None  # the pick as the tuner's candidate label (None: nothing within the budget)
    pick_variant: str | None
    pick_row: Measured | None
    variants: tuple[str, ...]
    profiled: tuple[tuple[str, int], ...]  # every perf_analyzer run it made: (variant, concurrency)
    rows: tuple[Measured, ...]
    config: str  # the configuration file written for it
    smoke: bool


@dataclass(frozen=True)
class OursFigures:
    """What the tuner took: the whole ``make tune`` and the probe and shortlist alone."""

    seconds: float
    tuner_s: float


@dataclass(frozen=True)
class YardstickFigures:
    engine: str
    plan: Plan
    ramps: tuple[RampFigures, ...]


@dataclass(frozen=True)
class WitnessFigures:
    """What ``--witness model-analyzer`` adds to the saved result (``perf.bench.versus.run_witness``)."""

    version: str
    budget_ms: float
    configs: dict[str, str]  # OURS, THEIRS (where it picked), SPEC -> the configuration's label
    search: SearchFigures
    ours: OursFigures
    yardstick: YardstickFigures


@dataclass(frozen=True)
class WitnessedTuneDocument(TuneDocument):
    """A tune's ``result.json`` with Model Analyzer's figures beside it (its section among ``sections``)."""

    model_analyzer: WitnessFigures | None = None


def witnessed(saved: TuneDocument, witness: WitnessFigures) -> WitnessedTuneDocument:
    """``saved`` with the witness's figures and the section rendered from them."""
    return WitnessedTuneDocument(**vars(saved), model_analyzer=witness).with_section(section(witness))


def _ramps(witness: WitnessFigures, name: str, kind: str) -> list[RampFigures]:
    return [r for r in witness.yardstick.ramps if r.name == name and r.kind == kind]


def held_values(witness: WitnessFigures, name: str, kind: str) -> list[float]:
    """Each round's highest load within the budget (0 where the first step missed)."""
    return [r.held.load if r.held else 0.0 for r in _ramps(witness, name, kind)]


def _rounds_text(witness: WitnessFigures, name: str, kind: str, unit: str) -> str:
    cells = []
    for ramp in _ramps(witness, name, kind):
        held = ramp.held
        noise = "†" if held and held.host_noise else ""
        if held is None:
            cells.append("none")
        elif kind == "open":
            cells.append(f"{number(held.load, 0)}{unit} (p99 {number(held.p99_ms)}{noise})")
        else:
            cells.append(
                f"c={held.load:.0f}: {number(held.throughput, 0)}/s (p99 {number(held.p99_ms)}{noise})"
            )
    return "; ".join(cells) or "–"


def goals(witness: WitnessFigures) -> list[Goal]:
    """The tuner's pick against Model Analyzer's on the yardstick's open loop, and the time each took."""
    if THEIRS not in witness.configs:
        return []
    pick, took = GOALS["tuner pick"], GOALS["tuner time"]
    ours = statistics.median(held_values(witness, OURS, "open"))
    theirs = statistics.median(held_values(witness, THEIRS, "open"))
    share = ours / theirs if theirs else float("nan")
    mine_s, their_s = witness.ours.seconds, witness.search.seconds
    return [
        Goal(
            pick.name,
            pick.target(),
            f"{number(ours, 0)}/s vs {number(theirs, 0)}/s: {share:.2f}×",
            pick.met(share),
        ),
        Goal(
            took.name,
            took.target(),
            f"{mine_s:.0f} s vs {their_s:.0f} s: {mine_s / their_s:.2f}×",
            took.met(mine_s / their_s),
        ),
    ]


def section(witness: WitnessFigures) -> list[str]:
    """The report's section, from the saved figures alone."""
    search, engine = witness.search, witness.yardstick.engine
    plan = witness.yardstick.plan
    budget = witness.budget_ms
    row = search.pick_row
    runs = len(search.profiled)
    their_own = (
        f"{number(row.throughput, 0)}/s at p99 {number(row.p99_ms)} ms, "
        f"concurrency {row.concurrency} "
        f"(`{search.pick_variant}`)"
        if row
        else "no measurement within the budget"
    )
    lines = [
        HEADING,
        "",
        f"Model Analyzer {witness.version} ran its brute search (objective throughput, constraint p99 ≤ "
        f"{budget:g} ms, local launch with this project's server; configuration: `{search.config}`)"
        + (" in its smoke setting: the base configuration alone, one concurrency" if search.smoke else "")
        + ".",
        "",
        table(
            ["", OURS, THEIRS],
            [
                ["pick", witness.configs[OURS], search.pick or "none within the budget"],
                [
                    "search time",
                    f"{witness.ours.seconds:.0f} s (probe + shortlist: {witness.ours.tuner_s:.0f} s)",
                    f"{search.seconds:.0f} s",
                ],
                [
                    "what it measured",
                    "Poisson arrivals (open loop), perf_analyzer",
                    f"{len(search.variants)} configurations, {runs} perf_analyzer runs (closed loop)",
                ],
                [
                    "its own figure for its pick",
                    "see the headline above (the tuner's verification)",
                    f"{their_own} (Model Analyzer)",
                ],
            ],
        ),
        "",
        f"**One yardstick** ({engine}, one server, {plan.rounds} rounds, configurations interleaved): "
        "the highest Poisson rate within the budget by the one measured search of `make tune` and `make "
        f"plan` (`perf.session.search`), from {plan.start:.0f}/s, and the p99 there; then the closed loop "
        f"Model Analyzer reports, concurrency {plan.first_concurrency}, {2 * plan.first_concurrency}, … "
        "until one misses (each point decided by the search's rule: a miss alone is measured again; a "
        "run whose windows never agreed is skipped). Every figure below is perf_analyzer's, driven by this "
        f"project ({engine}); † marks a run that holds the host's noise. The spec's configuration is "
        "measured without its queue policy (Triton 2.51's stall).",
        "",
        table(
            [
                "configuration",
                "",
                "highest Poisson rate within the budget, per round",
                "median /s",
                "closed loop: highest concurrency within the budget, per round",
            ],
            [
                [
                    name,
                    label,
                    _rounds_text(witness, name, "open", "/s"),
                    number(statistics.median(held_values(witness, name, "open")), 0),
                    _rounds_text(witness, name, "closed", ""),
                ]
                for name, label in witness.configs.items()
            ],
        ),
    ]
    judged = goals(witness)
    if judged:
        lines += ["", goals_table(judged)]
    return lines
