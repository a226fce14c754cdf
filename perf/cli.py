"""``python -m perf``: ``run`` (``make perf``), ``analyzer`` (``make perf-analyzer``), and where the
exit status of ``tune``, ``plan`` and ``witness`` is decided; options default to ``PERF_*`` variables."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from exporters.errors import SpecError
from perf import errors
from perf.bench import witness
from perf.markdown import report_folder
from perf.measure.analyzer import HOW_TO_GET_IT, find_perf_analyzer, glibc_version
from perf.plan import cli as plan_cli
from perf.plan.placement import PlacementError
from perf.studies.framework import Study, StudyContext, StudyReport
from perf.studies.goals import Goal
from perf.studies.profiles import PROFILES, Profile, get_profile
from perf.studies.study_spec import FAMILIES, MODES, spec_families
from perf.tune import cli as tune_cli
from server.ports import add_port_base_option, use_port_base

WORKDIR = Path(".run/perf")


def studies() -> list[Study]:
    """Every study of ``make perf``, in order (imported when asked for: they pull in torch)."""
    from perf.studies.pipeline_study import PipelineStudy
    from perf.studies.queue_policy_study import QueuePolicyStudy
    from perf.studies.report import BatchingStudy
    from perf.studies.shape_study import ShapeStudy
    from perf.studies.text_study import TextStudy

    return [BatchingStudy(), PipelineStudy(), TextStudy(), QueuePolicyStudy(), ShapeStudy()]


@dataclasses.dataclass(frozen=True)
class PerfSetup:
    """What ``python -m perf`` is built from beyond its options (a test hands in its own)."""

    console: Console = dataclasses.field(
        default_factory=lambda: Console(width=max(shutil.get_terminal_size((150, 40)).columns, 100))
    )
    studies: Callable[[], Sequence[Study]] = studies
    tune: tune_cli.TuneSetup = tune_cli.THE_SETUP
    plan: plan_cli.PlanSetup = plan_cli.THE_SETUP


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    top = argparse.ArgumentParser(prog="python -m perf", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run every study and write reports/<timestamp>/")
    run.add_argument("--profile", default="default", choices=sorted(PROFILES))
    run.add_argument("--models", default=env("PERF_MODELS"),
                     help=f"comma list of {', '.join(FAMILIES)} (the zoo) or models of --spec")  # fmt: skip
    run.add_argument("--modes", default=env("PERF_MODES"), help=f"comma list of {', '.join(MODES)}")
    run.add_argument("--concurrency", default=env("PERF_CONCURRENCY"), help="comma list, e.g. 1,4,16")
    run.add_argument("--goal-concurrency", type=int, default=env("PERF_GOAL_CONCURRENCY"),
                     help="closed loop of the goals and the pipeline study's saturation "
                          f"({Profile.goal_concurrency})")  # fmt: skip
    run.add_argument("--protocol", default=env("PERF_PROTOCOL"), choices=["grpc", "http", None])
    run.add_argument("--shm", action="store_true", default=env("PERF_SHM") in ("1", "true", "yes"),
                     help="send inputs and receive outputs through system shared memory")  # fmt: skip
    run.add_argument("--window", type=float, default=env("PERF_WINDOW"), help="seconds per window")
    run.add_argument("--warmup", type=float, help="warm-up seconds")
    run.add_argument("--max-windows", type=int)
    run.add_argument("--rate-fraction", type=float,
                     help=f"open-loop rate / capacity ({Profile.poisson_fraction})")  # fmt: skip
    run.add_argument("--trace", default=env("PERF_TRACE"), help="file of inter-arrival times (s) to replay")
    run.add_argument("--seed", type=int)
    run.add_argument("--reports", type=Path, default=Path("reports"), help="parent folder of the report")
    run.add_argument("--spec", type=Path, default=Path(env("PERF_SPEC", "models.yaml")),
                     help="the spec whose pipelines the pipeline study serves, and where --models that "
                          "are not zoo families are found (models.yaml)")  # fmt: skip
    add_port_base_option(run)
    commands.add_parser("analyzer", help="cross-check with perf_analyzer where a working binary exists")
    tune_cli.add_parser(commands)
    plan_cli.add_parser(commands)
    witness.add_parser(commands)
    return top


def profile_from(args: argparse.Namespace) -> Profile:
    overrides = {
        "families": errors.comma_list(args.models), "modes": errors.comma_list(args.modes),
        "concurrencies": errors.comma_list(args.concurrency, int, "--concurrency"), "protocol": args.protocol,
        "goal_concurrency": args.goal_concurrency, "window_s": args.window,
        "warmup_s": args.warmup,
        "max_windows": args.max_windows, "poisson_fraction": args.rate_fraction, "trace": args.trace,
        "seed": args.seed, "shared_memory": args.shm or None,
    }  # fmt: skip
    own = [name for name in overrides["families"] or () if name not in FAMILIES]
    if own:
        overrides["spec_families"] = spec_families(args.spec, own)
        if len(own) == len(overrides["families"]):  # the zoo's other studies measure zoo models only
            overrides.update(text_modes=(), queue_policy_s=0.0)
    return get_profile(args.profile, **{k: v for k, v in overrides.items() if v is not None})


def _stop_on_sigterm() -> None:
    """SIGTERM and SIGINT unwind as KeyboardInterrupt, so the server's context manager stops it."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A shell that starts us in the background hands us SIGINT ignored; Ctrl-C must still stop us.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.unraisablehook = _redeliver_lost_interrupts(sys.unraisablehook)


def _redeliver_lost_interrupts(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    """Send SIGTERM again, from a timer thread, when a KeyboardInterrupt raised inside a garbage-collector
    or weakref callback was dropped ("Exception ignored in ..."): else the run would go on."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
            return
        previous(unraisable)

    return hook


@contextlib.contextmanager
def progress_bar(total: int, console: Console) -> Iterator[Callable[[str], None]]:
    """A bar of ``total`` steps; yields the callback a study calls as each step starts."""
    with Progress(
        TextColumn("[bold]{task.description:<60}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    ) as progress:  # fmt: skip
        task = progress.add_task("starting", total=total)
        calls = itertools.count()

        def step(description: str) -> None:  # a step starts: the one before it is done
            progress.update(task, advance=1 if next(calls) else 0, description=description[:60])

        yield step
        progress.update(task, completed=total, description="done")


def run_studies(
    listed: Sequence[Study], profile: Profile, folder: Path, spec_path: Path, console: Console
) -> None:
    """Every study of ``make perf`` in order, each with a progress bar of its steps."""
    for study in listed:
        if not study.steps(profile):
            console.print(f"{study.title}: not in profile {profile.name}; skipped")
            continue
        console.print(f"{study.title} …")
        with progress_bar(study.steps(profile), console) as step:
            report = study.run(StudyContext(profile, folder, WORKDIR, spec_path, step))
        print_report(report, console)


def print_report(report: StudyReport, console: Console) -> None:
    """A study's summary tables and goals where it has tables (its report is too long), else its report."""
    if not report.summary:
        console.print(report.path.read_text(), highlight=False, markup=False)
        return
    for summary in report.summary:
        table = Table(title=summary.title)
        for index, column in enumerate(summary.header):
            table.add_column(column, justify="right" if index else "left")
        for row in summary.rows:
            table.add_row(*row)
        console.print(table)
    print_goals(report.goals, console)
    console.print(f"report: [bold]{report.path}[/bold]")


def print_goals(goals: list[Goal], console: Console) -> None:
    """The goals' verdicts, with the model each judged where a study judges several."""
    per_model = any(g.model for g in goals)
    table = Table(*("model",) * per_model, "goal", "measured", "verdict", title="goals")
    for g in goals:
        table.add_row(*(g.model,) * per_model, g.name, g.measured, g.verdict)
    console.print(table)


def command_analyzer(console: Console) -> int:
    from perf.studies.report import BatchingStudy  # matplotlib only when a report is written

    if find_perf_analyzer() is None:
        console.print(HOW_TO_GET_IT.format(glibc=glibc_version()), highlight=False)
        return 0
    profile = get_profile("quick", modes=("none", "dyn1ms"), concurrencies=(1, 16))
    folder = report_folder(Path("reports"), "perf-analyzer")
    run_studies([BatchingStudy()], profile, folder, Path("models.yaml"), console)
    return 0


def main(argv: list[str] | None = None, setup: PerfSetup | None = None) -> int:
    """Every ``python -m perf`` command, and the one place where what went wrong becomes the exit status
    (README): usage 2, nothing meets 3, a runtime failure 1, Ctrl-C or SIGTERM 130."""
    top = parser()
    args = top.parse_args(argv)
    setup = setup or PerfSetup()
    console = setup.console
    use_port_base(getattr(args, "port_base", None))  # every server this run starts (server.ports)
    try:
        return run_command(top, args, setup)
    except KeyboardInterrupt:
        console.print("[red]interrupted; the server was stopped[/red]")
        return errors.EXIT_INTERRUPTED
    except errors.NothingMeetsError as verdict:
        console.print(verdict.verdict, highlight=False, markup=False)
        _print_hint(verdict, console)
        return errors.EXIT_NOTHING_MEETS
    except (errors.OptionError, SpecError, PlacementError) as error:  # the options or spec given
        console.print(f"[red]{args.command} failed[/red]: {error}", highlight=False)
        return errors.EXIT_USAGE
    except errors.PerfError as error:
        console.print(f"[red]{args.command} failed[/red]: {error}", highlight=False)
        _print_hint(error, console)
        return errors.EXIT_RUNTIME


def _print_hint(error: errors.PerfError, console: Console) -> None:
    if error.hint:
        console.print(f"  {error.hint}", highlight=False, markup=False)


def run_command(top: argparse.ArgumentParser, args: argparse.Namespace, setup: PerfSetup) -> int:
    """Check the options (a usage error exits 2 before any report folder is made), then run."""
    if args.command == "plan" and (error := plan_cli.usage_errors(args)):
        top.error(error)
    if args.command == "tune" and (error := tune_cli.usage_errors(args, setup.tune)):
        top.error(error)
    if args.command == "run":
        try:
            profile = profile_from(args)
        except errors.OptionError as error:  # before any folder is made or minutes are measured
            top.error(str(error))
        if not args.spec.is_file() and any(s.serves_spec and s.steps(profile) for s in setup.studies()):
            top.error(f"--spec {args.spec}: no such file (the pipeline study serves its pipelines)")
    _stop_on_sigterm()  # a killed command must not leave its tritonserver running
    if args.command == "plan":
        return plan_cli.command_plan(args, setup.console, setup.plan)
    if args.command == "tune":
        return tune_cli.command_tune(args, setup.console, setup.tune)
    if args.command == "analyzer":
        return command_analyzer(setup.console)
    if args.command == "witness":
        return witness.command_witness(args)
    folder = report_folder(args.reports, log_name="perf.log")
    setup.console.print(f"profile [bold]{profile.name}[/bold] → {folder}")
    run_studies(setup.studies(), profile, folder, args.spec, setup.console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
