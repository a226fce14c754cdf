"""perf_analyzer: detection (the Python placeholder tritonclient installs is no tool; the 2.41.0 binary
answers ``--version`` and rejects ``--help``), and the engine around the project's one command line,
driven against a stand-in binary that writes the files a real 2.41.0 run wrote (tests/data)."""

from __future__ import annotations

import dataclasses
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from perf.errors import StudyError
from perf.measure.analyzer import WINDOW_STRETCH, PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import KEPT_CAP_S, MeasureSettings
from perf.measure.loads import arrival_times, closed_loop, poisson
from perf.measure.measurement import measure
from perf.measure.target import MAX_IN_FLIGHT, Target
from perf.studies.report import cross_check_section

DATA = Path(__file__).resolve().parents[3] / "data"
VERSION = 'if [ "$1" = --version ]; then echo "Perf Analyzer Version 2.41.0"; exit 0; fi'
UNSTABLE = (
    "Failed to obtain stable measurement within 5 measurement windows for concurrency 4. Please try to "
    "increase the --measurement-interval."
)
EMPTY = "No valid requests recorded within time interval. Please use a larger time window."
SETTINGS = MeasureSettings(warmup_s=0.2, window_s=0.6, stable_windows=3, max_windows=5, tolerance=0.25)


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_fake_or_broken_binaries_are_not_trusted(tmp_path, monkeypatch):
    fake = _script(tmp_path / "perf_analyzer", "echo hello\nexit 0")
    monkeypatch.setenv("PERF_ANALYZER", str(fake))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_perf_analyzer(prefix=tmp_path / "no-venv") is None  # none installed there either


def test_a_binary_that_rejects_help_but_answers_version_is_found(tmp_path, monkeypatch):
    tool = _script(tmp_path / "perf_analyzer", VERSION + "\necho \"unrecognized option '$1'\"; exit 1")
    monkeypatch.setenv("PERF_ANALYZER", str(tool))
    assert find_perf_analyzer() == tool


def stand_in(
    tmp_path: Path, stable_from_ms: int = 0, rate_mode_unstable: bool = False, says: str = UNSTABLE
) -> Path:
    """A perf_analyzer that records its arguments and writes a real 2.41.0 run's CSV and export where
    asked; with windows shorter than ``stable_from_ms`` it says ``says`` (by default that its windows
    disagreed) and fails (a closed loop: exit 2 and no files, as 2.41.0 does; ``rate_mode_unstable``:
    exit 0, the export, no CSV)."""
    shutil.copy(DATA / "perf_analyzer_2.41.0_closed_c2.csv", tmp_path / "run.csv")
    shutil.copy(DATA / "perf_analyzer_2.41.0_closed_c2.json", tmp_path / "run.json")
    keep = 'cp "$intervals" ' + str(tmp_path / "intervals.txt") + " 2>/dev/null"
    return _script(
        tmp_path / "perf_analyzer",
        f'{VERSION}\necho "$@" >> {tmp_path}/argv\n'
        'while [ $# -gt 0 ]; do case "$1" in -f) shift; out="$1";; --profile-export-file) shift; exp="$1";; '
        '--measurement-interval) shift; w="$1";; --request-intervals) shift; intervals="$1";; esac; '
        "shift; done\n"
        f"{keep}\n"
        f'if [ "$w" -lt {stable_from_ms} ]; then echo "{says}"; '
        + (f'cp {tmp_path}/run.json "$exp"; exit 0; fi\n' if rate_mode_unstable else "exit 2; fi\n")
        + f'cp {tmp_path}/run.csv "$out"; cp {tmp_path}/run.json "$exp"',
    )


def argv(tmp_path: Path) -> list[list[str]]:
    return [line.split() for line in (tmp_path / "argv").read_text().splitlines()]


def value(line: list[str], option: str) -> str:
    return line[line.index(option) + 1]


@pytest.fixture
def target() -> Target:
    inputs = {"dense": np.zeros((4, 16), np.float32), "sparse_ids": np.zeros((4, 8), np.int64)}
    return Target("recommender", "127.0.0.1:1", inputs, {"score": 4})


def test_perf_analyzer_keeps_its_stability_check_with_our_windows(tmp_path, target):
    engine = PerfAnalyzerEngine(stand_in(tmp_path), log_folder=tmp_path)
    assert engine.name == "perf_analyzer 2.41.0"
    run = measure(target, closed_loop(4), SETTINGS, engine=engine)
    (line,) = argv(tmp_path)
    assert value(line, "--stability-percentage") == "25"  # the settings' tolerance, not switched off
    assert value(line, "--concurrency-range") == "4"
    assert (
        value(line, "--max-trials") == "10"
    )  # a closed loop gets perf_analyzer's default: no agreement, no file
    assert int(value(line, "--measurement-interval")) == round(600 / WINDOW_STRETCH)  # windows of 0.6 s
    assert "--percentile" not in line  # it judges mean latency, as our windows do
    assert run.stable and run.engine == "perf_analyzer 2.41.0" and run.own is not None
    assert run.used == (0, 3) and len(run.windows) == 3 and run.attempts == len(run.records)
    assert run.summary().throughput == pytest.approx(run.own.throughput, rel=0.03)  # one run, two accounts
    assert "perf_analyzer --version" not in (tmp_path / "perf_analyzer.log").read_text()
    assert "(exit 0)" in (tmp_path / "perf_analyzer.log").read_text()


def test_a_closed_loop_whose_windows_disagree_is_measured_once_more_twice_as_long(tmp_path, target):
    engine = PerfAnalyzerEngine(stand_in(tmp_path, stable_from_ms=800))
    run = measure(target, closed_loop(4), SETTINGS, engine=engine)
    windows = [int(value(line, "--measurement-interval")) for line in argv(tmp_path)]
    assert windows == [500, 1000] and run.stable
    assert run.own.settings[run.own.settings.index("--measurement-interval") + 1] == "1000"
    (tmp_path / "never").mkdir()
    never = PerfAnalyzerEngine(stand_in(tmp_path / "never", stable_from_ms=10**6))
    with pytest.raises(StudyError, match="Failed to obtain stable measurement"):
        measure(target, closed_loop(4), SETTINGS, engine=never)
    assert len(argv(tmp_path / "never")) == 2  # once more, not again and again


def test_other_failures_are_errors_that_say_why_and_are_not_run_again(tmp_path, target):
    broken = _script(
        tmp_path / "broken", f'{VERSION}\necho "$@" >> {tmp_path}/calls\necho "no such model" >&2; exit 1'
    )
    with pytest.raises(StudyError, match="no such model"):
        measure(target, closed_loop(4), SETTINGS, engine=PerfAnalyzerEngine(broken))
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_a_run_killed_by_a_signal_says_so_where_its_output_does_not(tmp_path, target):
    """The kernel's out-of-memory killer ends perf_analyzer mid-run: its output is the settings it
    printed first, so only the exit can name the problem."""
    killed = _script(tmp_path / "killed", f'{VERSION}\necho "*** Measurement Settings ***"; kill -9 $$')
    with pytest.raises(StudyError) as raised:
        measure(target, poisson(300.0, seed=3), SETTINGS, engine=PerfAnalyzerEngine(killed))
    said = str(raised.value)
    assert "killed by SIGKILL" in said and "out-of-memory killer" in said and "Measurement Settings" in said
    exits = _script(tmp_path / "exits", f'{VERSION}\necho "no such model" >&2; exit 3')
    with pytest.raises(StudyError, match="exited with status 3: no such model"):
        measure(target, closed_loop(4), SETTINGS, engine=PerfAnalyzerEngine(exits))


def test_an_open_loop_replays_the_loads_arrivals_and_keeps_a_run_whose_windows_disagreed(tmp_path, target):
    engine = PerfAnalyzerEngine(stand_in(tmp_path, stable_from_ms=10**6, rate_mode_unstable=True))
    load = poisson(300.0, seed=3)
    run = measure(target, load, SETTINGS, engine=engine)
    (line,) = argv(tmp_path)
    assert value(line, "--max-trials") == "5"  # an open loop keeps what it measured: the settings' own
    # its synchronous mode, one request in flight per thread, as many as ours keeps: never --async, whose
    # late requests pile up without bound while the server falls behind
    assert "--async" not in line and "--concurrency-range" not in line
    assert value(line, "--max-threads") == str(target.max_in_flight) == str(MAX_IN_FLIGHT)
    gaps = np.loadtxt(tmp_path / "intervals.txt") / 1e6
    seconds = SETTINGS.max_windows * SETTINGS.window_s * WINDOW_STRETCH + 1.0  # every window it may measure
    expected = arrival_times(load, seconds)
    assert np.cumsum(gaps) == pytest.approx(expected, abs=1e-5 * len(expected))
    assert not run.stable and run.own is None and run.records  # kept, marked: no CSV to hold it to


def test_an_open_loop_keeps_the_targets_in_flight_cap_and_a_rate_it_fell_behind_is_not_sustained(
    tmp_path, target
):
    """The cap is the target's, the one our engine sheds beyond; a run served far below its rate (the
    recorded export answered a closed loop of two) is judged not kept up with, so a tune's ramp ends."""
    capped = dataclasses.replace(target, max_in_flight=8)
    run = measure(capped, poisson(20000.0, seed=3), SETTINGS, engine=PerfAnalyzerEngine(stand_in(tmp_path)))
    (line,) = argv(tmp_path)
    assert value(line, "--max-threads") == "8" and "--async" not in line
    assert run.throughput < 0.5 * run.offered and not run.sustained


def test_a_low_rates_windows_hold_a_p99s_requests_and_one_left_empty_is_measured_once_more(tmp_path, target):
    """At 4/s the settings' three 0.6 s windows expect 7 requests, whose p99 is their largest latency:
    the three perf_analyzer judges last 35 s together (140 arrivals expected, so a run has the 100 a p99
    is judged on all but once in 3,000), the arrivals cover every window it may measure, and a run that
    still had an empty window is measured again with windows twice as long."""
    engine = PerfAnalyzerEngine(stand_in(tmp_path, stable_from_ms=15000, says=EMPTY))
    load = poisson(4.0, seed=5)
    run = measure(target, load, SETTINGS, engine=engine)
    windows = [int(value(line, "--measurement-interval")) for line in argv(tmp_path)]
    window_ms = 35000 / 3
    assert windows == [round(longer * window_ms / WINDOW_STRETCH) for longer in (1, 2)] and run.records
    gaps = np.loadtxt(tmp_path / "intervals.txt") / 1e6  # the second run's
    assert np.sum(gaps) > SETTINGS.max_windows * 2 * window_ms / 1e3  # all of its windows covered
    (tmp_path / "never").mkdir()
    never = PerfAnalyzerEngine(stand_in(tmp_path / "never", stable_from_ms=10**6, says=EMPTY))
    with pytest.raises(StudyError, match="No valid requests recorded"):
        measure(target, load, SETTINGS, engine=never)
    assert len(argv(tmp_path / "never")) == 2


def test_a_rate_too_low_for_a_p99_within_the_cap_is_measured_in_capped_windows(tmp_path, target):
    """At 0.5/s a p99's requests take almost five minutes: the three windows that count last
    ``KEPT_CAP_S`` together (the stand-in's recorded export decides nothing about the count here)."""
    measure(target, poisson(0.5, seed=5), SETTINGS, engine=PerfAnalyzerEngine(stand_in(tmp_path)))
    (line,) = argv(tmp_path)
    assert int(value(line, "--measurement-interval")) == round(KEPT_CAP_S / 3 * 1000 / WINDOW_STRETCH)


def test_the_study_report_says_which_settings_perf_analyzer_used(tmp_path, target):
    theirs = measure(target, closed_loop(2), SETTINGS, engine=PerfAnalyzerEngine(stand_in(tmp_path)))
    summary = SimpleNamespace(throughput=1000.0, p50_ms=2.0, p99_ms=5.0)
    ours = SimpleNamespace(model="m", load=closed_loop(2), summary=lambda: summary)
    text = cross_check_section(SimpleNamespace(cross_check=[(theirs, ours)], analyzer_note=""))
    assert "`--measurement-interval 500 --max-trials 10 --stability-percentage 25`" in text
