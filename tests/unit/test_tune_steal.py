"""Runs the hypervisor took CPU from: the steal reading, the rule that measures such a run again (at
most ``STOLEN_WAIT_S`` of runs), the session applying it to every run but ``--follow``'s trace, and the
report's figures on what was measured again."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporters.resolve import load_spec
from perf.records import Record
from perf.tune.cpu import CpuTimes, busy_cores, stolen_share
from perf.tune.session import TuneSession
from perf.tune.steal import (
    STOLEN_LIMIT,
    STOLEN_STREAK,
    STOLEN_STREAK_S,
    STOLEN_WAIT_S,
    Rerun,
    stolen,
    stolen_figures,
    stolen_paragraph,
    stolen_summary,
    unstolen,
)

SPEC = Path(__file__).resolve().parents[2] / "models.yaml"


@dataclass
class Run:
    stolen_share: float
    label: str = "run"
    wall_s: float = 3.0
    p99_ms: float = 8.0
    offered: float = 0.0
    throughput: float = 0.0


def test_proc_stat_steal_is_read_apart_from_the_busy_time(tmp_path: Path, monkeypatch) -> None:
    """user nice system idle iowait irq softirq steal: steal is neither idle nor this machine's work."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 20 0 10 40 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    monkeypatch.setattr("perf.tune.cpu.PROC_STAT", stat)
    assert CpuTimes.now() == CpuTimes(busy=160, total=1020, stolen=40)
    before, after = CpuTimes(100, 1000, 10), CpuTimes(400, 2000, 30)
    assert stolen_share(before, after) == pytest.approx(0.02)
    assert math.isnan(stolen_share(None, after)) and math.isnan(stolen_share(after, after))
    assert busy_cores(before, after, cores=2) <= 2


def test_a_stolen_run_is_measured_again_until_one_is_not_for_at_most_the_wait() -> None:
    shares = iter([0.03, STOLEN_LIMIT, 0.001, 0.5])
    heard: list[tuple[float, int]] = []  # each run set aside, as it is, before the next is measured

    def discarding(run: Run, so_far: list[Run]) -> None:
        heard.append((run.stolen_share, len(so_far)))

    counted, again = unstolen(lambda: Run(next(shares)), discarding=discarding)
    assert counted.stolen_share == 0.001 and [r.stolen_share for r in again] == [0.03, STOLEN_LIMIT]
    assert heard == [(0.03, 1), (STOLEN_LIMIT, 2)]

    always = iter([0.1] * 10)  # 3 s runs: after four measured again (12 s >= 10 s) the fifth counts
    counted, again = unstolen(lambda: Run(next(always)), wait_s=10.0)
    assert len(again) == 4 and stolen(counted)
    assert unstolen(lambda: Run(0.1), wait_s=0.0)[1] == []  # no wait: never measured again
    assert not stolen(Run(float("nan")))  # no steal counter: nothing measured again


def test_a_run_the_server_fell_behind_on_beyond_what_steal_explains_is_not_measured_again() -> None:
    """Served 85% with 10% stolen: steal may explain it. Served 27% with 10.6% stolen: overloaded anyway."""
    explained = iter(
        [Run(0.1, offered=2000.0, throughput=1700.0), Run(0.0, offered=2000.0, throughput=2000.0)]
    )
    counted, again = unstolen(lambda: next(explained))
    assert len(again) == 1 and counted.stolen_share == 0.0
    beyond = Run(0.106, offered=3666.0, throughput=1000.0)
    counted, again = unstolen(lambda: beyond)
    assert counted is beyond and again == []


class CountingEngine:
    name = "fake"

    def __init__(self) -> None:
        self.runs = 0

    def open_loop(self, target, arrivals_s, label: str) -> list[Record]:
        self.runs += 1
        return []


def offline_session(tmp_path: Path, engine: CountingEngine, shares: list[float], monkeypatch) -> TuneSession:
    """A session whose server counters and CPU readings are stand-ins: the rerun rule alone."""
    session = TuneSession(load_spec(SPEC), "recommender", 8, tmp_path, engine)
    session._target = object()
    monkeypatch.setattr(session, "_stats", lambda: 0)
    monkeypatch.setattr("perf.tune.session.time.sleep", lambda s: None)
    readings = iter(shares)
    monkeypatch.setattr("perf.tune.session.stolen_share", lambda before, after: next(readings))
    return session


def test_the_session_measures_a_stolen_run_again_and_keeps_what_it_discarded(tmp_path, monkeypatch) -> None:
    engine = CountingEngine()
    session = offline_session(tmp_path, engine, [0.02, 0.04, 0.0, 0.3], monkeypatch)
    told: list[str] = []
    session.notify = told.append
    run = session.open_loop([0.0], "point")  # one arrival: no offered rate to fall behind on
    assert run.stolen_share == 0.0 and engine.runs == 3 and session.measurements == 1
    # the console hears when the measuring again starts and how it ended, not of every run
    assert len(told) == 2 and told[0].startswith("point: the hypervisor took 2.0% of the CPUs' time")
    assert "measuring again, for up to 120 s" in told[0]
    assert told[1].startswith("point: 2 runs (0 s) measured again, counted a run not stolen")
    (rerun,) = session.stolen_reruns
    assert [r.stolen_share for r in rerun.discarded] == [0.02, 0.04] and rerun.counted is run
    # --follow's trace is one replay with its reloads in it: never measured again
    assert session.open_loop([0.0], "trace", wait_s=0).stolen_share == 0.3
    assert len(told) == 2  # nothing measured again, nothing told
    assert engine.runs == 4 and session.measurements == 2 and len(session.stolen_reruns) == 1
    figures = session.stolen_figures()  # the session's wait, not the default, is what the report says
    assert figures["measurements"] == 2 and figures["runs_discarded"] == 2
    session.stolen_wait_s = 30.0
    assert session.stolen_figures()["wait_s"] == 30.0
    assert session.stolen_s == sum(r.wall_s for r in rerun.discarded)


def test_the_reports_figures_add_up_over_the_runs_measured_again() -> None:
    reruns = [
        Rerun((Run(0.02, p99_ms=30.0), Run(0.01, p99_ms=20.0)), Run(0.0, p99_ms=8.0)),
        Rerun(tuple(Run(0.1, p99_ms=50.0) for _ in range(40)), Run(0.2, p99_ms=60.0)),
    ]
    figures = stolen_figures(reruns, runs=40)
    assert figures["measured_again"] == 2 and figures["runs_discarded"] == 42
    assert figures["seconds"] == 3.0 * 42 and figures["counted_stolen"] == 1
    assert figures["wait_s"] == STOLEN_WAIT_S
    assert figures["p99_ms_counted"] == [8.0, 60.0]
    text = stolen_paragraph(figures)
    assert text.startswith("2 of 40 measurements") and "1 counted although still stolen" in text
    assert f"for at most {STOLEN_WAIT_S:.0f} s each" in text
    assert stolen_paragraph(stolen_figures([], runs=12)).startswith("None of the 12 measurements")
    # the console's line: the counted stolen ones include those counted without a wait
    assert stolen_summary({**figures, "counted_stolen_unwaited": 2}).startswith(
        "steal: 2 of 40 measurements measured again (126 s of runs discarded), 3 counted still stolen"
    )
    assert stolen_summary(stolen_figures([], runs=12)) == ""


@dataclass
class Checked(Run):
    met: bool = True

    def meets(self, budget_ms: float) -> bool:
        return self.met


def test_the_steal_check_sets_the_stolen_runs_apart_from_the_others() -> None:
    from perf.tune.steal_check import summary

    runs = [
        Checked(0.02, p99_ms=30.0, met=False),
        Checked(0.0, p99_ms=7.0),
        Checked(0.001, p99_ms=12.0, met=False),
    ]
    assert summary(runs, 10.0) == [
        [f"stolen ≥ {100 * STOLEN_LIMIT:.1f}%", "1", "1", "30.0-30.0", "30.0"],
        ["the others", "2", "1", "7.0-12.0", "9.5"],
    ]


def test_the_console_is_told_when_a_run_counts_still_stolen(tmp_path, monkeypatch) -> None:
    """The wait ran out (here after one run) with the host still taking CPU: the user reads that its
    figures hold the host's steal, and which command measures it."""
    session = offline_session(tmp_path, CountingEngine(), [0.3, 0.25, 0.2, 0.3], monkeypatch)
    told: list[str] = []
    session.notify = told.append
    assert session.open_loop([0.0], "point", wait_s=1e-9).stolen_share == 0.25
    assert len(told) == 2 and "measuring again, for up to 0 s" in told[0]
    assert told[1].startswith("point: 1 run (0 s) measured again")
    assert "counted still stolen (25.0%)" in told[1] and "perf.tune.steal_check" in told[1]
    session.open_loop([0.0], "next", wait_s=1e-9)  # the advice once a session, the outcome every time
    assert told[3].endswith("counted still stolen (30.0%)")


def test_on_a_host_stolen_from_throughout_the_session_stops_waiting_until_a_run_is_not_stolen(
    tmp_path, monkeypatch
) -> None:
    """Runs of 65 s: each default wait of 120 s runs out after two stolen runs (130 s). After three such
    measurements (390 s) the next stolen run counts as it is, and the first run not stolen brings the
    wait back."""
    shares = [0.3] * 3 * STOLEN_STREAK + [0.3, 0.0, 0.3, 0.0]
    engine = CountingEngine()
    session = offline_session(tmp_path, engine, shares, monkeypatch)
    clock = itertools.count(step=65.0)  # a run reads it at its start and its end: 65 s each
    monkeypatch.setattr("perf.tune.session.time.perf_counter", lambda: next(clock))
    told: list[str] = []
    session.notify = told.append
    for n in range(STOLEN_STREAK):
        assert stolen(session.open_loop([0.0], f"waited {n}"))
    assert engine.runs == 3 * STOLEN_STREAK
    assert told[-1].startswith(
        f"waited {STOLEN_STREAK - 1}: the whole wait ran out for {STOLEN_STREAK} measurements in a row "
        f"({STOLEN_STREAK * 130} s of runs stolen)"
    )
    assert session.open_loop([0.0], "unwaited").stolen_share == 0.3
    assert engine.runs == 3 * STOLEN_STREAK + 1  # counted as measured, not measured again
    assert session.open_loop([0.0], "quiet").stolen_share == 0.0
    assert told[-1] == "quiet: a run not stolen: stolen runs are measured again from here on"
    assert session.open_loop([0.0], "waited again").stolen_share == 0.0
    assert engine.runs == 3 * STOLEN_STREAK + 4  # the stolen run measured again
    figures = session.stolen_figures()
    assert figures["counted_stolen_unwaited"] == 1 and figures["counted_stolen"] == STOLEN_STREAK
    assert "1 more measurement counted a stolen run without measuring it again" in stolen_paragraph(figures)


def test_short_waits_running_out_are_no_sign_of_a_host_stolen_from_throughout(tmp_path, monkeypatch) -> None:
    """The tests' 5 s waits (here next to none) running out many times in a row: still measured again."""
    measurements = 2 * STOLEN_STREAK
    engine = CountingEngine()
    session = offline_session(tmp_path, engine, [0.3] * 2 * measurements, monkeypatch)
    for _ in range(measurements):
        session.open_loop([0.0], "point", wait_s=1e-9)
    assert engine.runs == 2 * measurements and session.patience.waiting


def test_a_caller_that_never_waits_says_nothing_of_the_host(tmp_path, monkeypatch) -> None:
    """``--follow``'s trace (wait 0) counts its stolen runs as they are and is no streak: after four of
    them, one long wait (400 s of 65 s runs) running out is one measurement, not the fifth in a row."""
    streak = STOLEN_STREAK + 1
    session = offline_session(tmp_path, CountingEngine(), [0.3] * (streak + 8), monkeypatch)
    for _ in range(streak):
        session.open_loop([0.0], "trace", wait_s=0)
    clock = itertools.count(step=65.0)
    monkeypatch.setattr("perf.tune.session.time.perf_counter", lambda: next(clock))
    assert stolen(session.open_loop([0.0], "long wait", wait_s=400.0))
    assert session.patience.streak_s >= STOLEN_STREAK_S  # the seconds alone would stop the wait
    assert session.patience.waiting and session.stolen_figures()["counted_stolen_unwaited"] == 0
