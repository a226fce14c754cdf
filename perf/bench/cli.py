"""The tools beside the tuner, reached through ``python -m perf tune`` as before and as their own
``python -m perf`` subcommands.

``--scenario`` (``scenarios``: the article's two) and ``--follow`` (``follow``: a rate step followed
with reloads) run instead of the tuner; ``--witness`` runs with it: ``perf_analyzer`` adds the side
by side of perf_analyzer and our client on the tuned server (``witness``), ``model-analyzer`` measures
Model Analyzer's pick beside ours with one yardstick once the tuner's server stopped (``versus``).
The tuner imports none of them: they reach it as ``Beside`` hooks (``perf.tune.cli``).
``python -m perf witness`` and ``python -m perf steal-check`` run ``witness.main`` and
``steal_check.main`` alone.
"""

from __future__ import annotations

import argparse
import functools

from perf.bench.follow import run_follow
from perf.bench.scenarios import run_scenario
from perf.bench.versus import run_witness, search_space
from perf.bench.versus_report import witnessed
from perf.bench.witness import witness_section
from perf.report_folder import report_folder
from perf.tune import cli as tune_cli
from perf.tune.cli import THE_SETUP, Beside, TunedRun, TuneSetup
from perf.tune.result import TuneDocument


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


def beside_the_tuner(args: argparse.Namespace) -> Beside:
    """The hooks ``--witness`` asks for (none without it)."""
    if args.witness == "perf_analyzer":
        return Beside(on_server=witness_section)
    if args.witness == "model-analyzer":
        return Beside(after=functools.partial(_versus, smoke=args.witness_smoke))
    return Beside()


def command_tune(args: argparse.Namespace, console, setup: TuneSetup = THE_SETUP) -> int:
    """``python -m perf tune``: a scenario or the follow run where asked, the tuner otherwise."""
    if args.scenario or args.follow:
        folder = report_folder(args.reports, "tune", "tune.log")
        if args.scenario:
            engine = tune_cli.engine_from_args(args, folder)
            return run_scenario(args, folder, console, engine, tune_cli.windows_from_args(args))
        return run_follow(args, folder, console)
    return tune_cli.command_tune(args, console, beside_the_tuner(args), setup)
