"""The tools beside the tuner, reached through ``python -m perf tune`` as before and as their own
``python -m perf`` subcommands.

``--scenario`` (``scenarios``: the article's two) and ``--follow`` (``follow``: a rate step followed
with reloads) run instead of the tuner; ``--witness`` runs with it: ``perf_analyzer`` adds the side
by side of perf_analyzer and our client on the tuned server (``witness``), ``model-analyzer`` measures
Model Analyzer's pick beside ours with one yardstick once the tuner's server stopped (``versus``).
The tuner imports none of them: they reach it as ``Beside`` hooks (``perf.tune.cli``).
``python -m perf witness`` and ``python -m perf steal-check`` run ``witness.witness_alone`` and
``steal_check.run_steal_check`` alone, with the options parsed here.

Each tool takes a frozen options dataclass (``ScenarioOptions``, ``FollowOptions``, ``BesideOptions``,
``WitnessOptions``, ``StealCheckOptions``), never the command line's namespace: ``options_from_args``,
the one place where parsed options become them, so a value a tool cannot run with is refused (an
``OptionError`` naming the option, exit status 2) before any server starts or report folder is made.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from pathlib import Path
from typing import TypeVar

from perf.bench import steal_check
from perf.bench.follow import FollowOptions, run_follow
from perf.bench.scenarios import ScenarioOptions, run_scenario
from perf.bench.steal_check import StealCheckOptions, run_steal_check
from perf.bench.versus import run_witness, search_space
from perf.bench.versus_report import witnessed
from perf.bench.witness import WitnessOptions, witness_alone, witness_section
from perf.errors import OptionError
from perf.report_folder import report_folder
from perf.tune import cli as tune_cli
from perf.tune.cli import ENGINES, THE_SETUP, WITNESSES, Beside, TunedRun, TuneSetup
from perf.tune.result import TuneDocument

Options = TypeVar("Options")


@dataclasses.dataclass(frozen=True)
class BesideOptions:
    """``--witness`` (None: no tool beside the tuner) and ``--witness-smoke``; that the smoke run goes
    with ``model-analyzer`` alone is the tune parser's check (``perf.tune.cli.usage_errors``)."""

    witness: str | None = None
    witness_smoke: bool = False

    def __post_init__(self) -> None:
        if self.witness is not None and self.witness not in WITNESSES:
            raise OptionError(f"--witness must be one of {', '.join(WITNESSES)}, got {self.witness!r}")


def options_from_args(kind: type[Options], args: argparse.Namespace) -> Options:
    """``kind`` (an options dataclass) from the parsed options of its fields' names; one not given
    (None) keeps ``kind``'s default."""
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(kind)}
    return kind(**{name: value for name, value in given.items() if value is not None})


def _versus(run: TunedRun, smoke: bool) -> TuneDocument:
    """Model Analyzer's search and both picks measured with one yardstick: the saved result with its
    figures, and its section joining the report."""
    space = search_space(run.largest_batch, run.instances, smoke=smoke)
    saved = run.saved
    witness = run_witness(
        run.spec, run.model, saved.budget_ms, saved.measured_max_rate or saved.predicted_max_rate,
        saved.seconds, run.chosen, space, run.new_session, run.folder, run.progress, rounds=1 if smoke else 3,
    )  # fmt: skip
    return witnessed(run.saved, witness)


def beside_the_tuner(options: BesideOptions) -> Beside:
    """The hooks ``--witness`` asks for (none without it)."""
    if options.witness == "perf_analyzer":
        return Beside(on_server=witness_section)
    if options.witness == "model-analyzer":
        return Beside(after=functools.partial(_versus, smoke=options.witness_smoke))
    return Beside()


def command_tune(args: argparse.Namespace, console, setup: TuneSetup = THE_SETUP) -> int:
    """``python -m perf tune``: a scenario or the follow run where asked, the tuner otherwise."""
    if args.scenario:
        scenario = options_from_args(ScenarioOptions, args)
        folder = report_folder(args.reports, "tune", "tune.log")
        engine = tune_cli.engine_from_args(args, folder)
        return run_scenario(scenario, folder, console, engine, tune_cli.windows_from_args(args))
    if args.follow:
        follow = options_from_args(FollowOptions, args)
        return run_follow(follow, report_folder(args.reports, "tune", "tune.log"), console)
    beside = beside_the_tuner(options_from_args(BesideOptions, args))
    return tune_cli.command_tune(args, console, beside, setup)


def witness_parser() -> argparse.ArgumentParser:
    """``python -m perf witness``'s options; their defaults are ``WitnessOptions``'."""
    defaults = WitnessOptions()
    options = argparse.ArgumentParser(prog="python -m perf witness", description=command_witness.__doc__)
    options.add_argument("--model", default=defaults.model)
    options.add_argument("--spec", type=Path, default=defaults.spec)
    options.add_argument("--max-batch", type=int, default=defaults.max_batch)
    options.add_argument("--delay-us", type=int, default=defaults.delay_us)
    options.add_argument("--instances", type=int, default=defaults.instances)
    options.add_argument("--concurrency", type=int, default=defaults.concurrency)
    options.add_argument("--workdir", type=Path, default=defaults.workdir)
    return options


def command_witness(argv: list[str] | None = None) -> int:
    """``python -m perf witness``: the side by side alone, on one configuration (no tuning)."""
    parser = witness_parser()
    try:
        options = options_from_args(WitnessOptions, parser.parse_args(argv))
    except OptionError as error:
        parser.error(str(error))
    return witness_alone(options)


def steal_check_parser() -> argparse.ArgumentParser:
    """``python -m perf steal-check``'s options; their defaults are ``StealCheckOptions``', and
    ``--engine`` the tuner's."""
    defaults = StealCheckOptions()
    options = argparse.ArgumentParser(prog="python -m perf steal-check", description=steal_check.__doc__)
    options.add_argument("--model", default=defaults.model)
    options.add_argument("--spec", type=Path, default=defaults.spec)
    options.add_argument("--rate", type=float, default=defaults.rate, help="Poisson arrivals per second")
    options.add_argument("--runs", type=int, default=defaults.runs)
    options.add_argument("--max-batch", type=int, default=defaults.max_batch)
    options.add_argument("--delay-us", type=int, default=defaults.delay_us)
    options.add_argument("--instances", type=int, default=defaults.instances)
    options.add_argument("--p99-ms", type=float, default=defaults.p99_ms,
                         help="the budget misses are counted against")  # fmt: skip
    options.add_argument("--engine", choices=ENGINES, default="auto")
    return options


def command_steal_check(argv: list[str] | None = None) -> int:
    """``python -m perf steal-check``: one configuration at one rate, run after run."""
    parser = steal_check_parser()
    args = parser.parse_args(argv)
    try:
        options = options_from_args(StealCheckOptions, args)
    except OptionError as error:
        parser.error(str(error))
    return run_steal_check(options, tune_cli.engine_from_args(args))
