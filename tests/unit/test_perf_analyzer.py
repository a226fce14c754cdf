"""perf_analyzer detection: the Python placeholder that tritonclient installs is not a working tool;
the 2.41.0 binary is probed with ``--version`` (it rejects ``--help``)."""

import stat
from types import SimpleNamespace

import numpy as np
import pytest

from perf.analyzer import NOISY_MACHINE, find_perf_analyzer, run_perf_analyzer
from perf.errors import StudyError
from perf.report import cross_check_section


def _script(path, body):
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_fake_or_broken_binaries_are_not_trusted(tmp_path, monkeypatch):
    fake = _script(tmp_path / "perf_analyzer", "echo hello\nexit 0")
    monkeypatch.setenv("PERF_ANALYZER", str(fake))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("perf.perf_analyzer_install.installed_wrapper", lambda: tmp_path / "absent")
    assert find_perf_analyzer() is None


def test_a_binary_that_rejects_help_but_answers_version_is_found(tmp_path, monkeypatch):
    tool = _script(
        tmp_path / "perf_analyzer",
        'if [ "$1" = --version ]; then echo "Perf Analyzer Version 2.41.0 (commit fbb030e)"; exit 0; fi\n'
        "echo \"unrecognized option '$1'\"; exit 1",
    )
    monkeypatch.setenv("PERF_ANALYZER", str(tool))
    assert find_perf_analyzer() == tool


CSV = "Concurrency,Inferences/Second,p50 latency,p90 latency,p99 latency\n4,1234.5,2000,3000,4000\n"


def _recording_tool(tmp_path):
    """A stand-in perf_analyzer that records its arguments and writes the CSV it is asked for."""
    return _script(
        tmp_path / "perf_analyzer",
        f'echo "$@" > {tmp_path}/argv\n'
        'while [ $# -gt 0 ]; do if [ "$1" = -f ]; then shift; out="$1"; fi; shift; done\n'
        f"printf '{CSV}' > \"$out\"",
    )


def _argv(tmp_path):
    return (tmp_path / "argv").read_text().split()


def _value(argv, option):
    return argv[argv.index(option) + 1]


def test_the_default_settings_converge_on_a_shared_two_core_machine(tmp_path):
    """Not perf_analyzer's default 10% stability (it never converges here): 100%, at most 4 windows, our
    window length; the result carries the settings so reports can print them."""
    inputs = {"x": np.zeros((4, 3), dtype=np.float32)}
    result = run_perf_analyzer(
        _recording_tool(tmp_path), "m", "127.0.0.1:1", "grpc", 4, 1250, tmp_path, inputs
    )
    argv = _argv(tmp_path)
    assert _value(argv, "--stability-percentage") == "100" and _value(argv, "--max-trials") == "4"
    assert _value(argv, "--measurement-interval") == "1250" and _value(argv, "--concurrency-range") == "4"
    assert (tmp_path / _value(argv, "--input-data").split("/")[-1]).exists()
    assert result.settings == ("--measurement-interval", "1250", *NOISY_MACHINE)
    assert (result.throughput, result.p99_ms) == (1234.5, 4.0)


def test_explicit_settings_replace_the_defaults(tmp_path):
    inputs = {"x": np.zeros((4, 3), dtype=np.float32)}
    extra = ("--stability-percentage", "50")
    result = run_perf_analyzer(_recording_tool(tmp_path), "m", "u", "grpc", 1, 500, tmp_path, inputs, extra)
    argv = _argv(tmp_path)
    assert _value(argv, "--stability-percentage") == "50" and "--max-trials" not in argv
    assert result.settings_text == "--measurement-interval 500 --stability-percentage 50"


def test_the_study_report_says_which_settings_perf_analyzer_used(tmp_path):
    inputs = {"x": np.zeros((4, 3), dtype=np.float32)}
    theirs = run_perf_analyzer(_recording_tool(tmp_path), "m", "u", "grpc", 4, 1250, tmp_path, inputs)

    summary = SimpleNamespace(throughput=1000.0, p50_ms=2.0, p99_ms=5.0)
    ours = SimpleNamespace(model="m", summary=lambda: summary)
    result = SimpleNamespace(cross_check=[(theirs, ours)], analyzer_note="")
    text = cross_check_section(result)
    assert "`--measurement-interval 1250 --stability-percentage 100 --max-trials 4`" in text


def _unstable_below(tmp_path, window_ms):
    """A stand-in perf_analyzer whose windows disagree (its message, exit 2) when shorter than
    ``window_ms``; otherwise it records its arguments and writes the CSV."""
    return _script(
        tmp_path / "perf_analyzer",
        f'echo "$@" >> {tmp_path}/argv\n'
        'while [ $# -gt 0 ]; do case "$1" in -f) shift; out="$1";; --measurement-interval) shift; w="$1";; '
        "esac; shift; done\n"
        f'if [ "$w" -lt {window_ms} ]; then echo "Failed to obtain stable measurement within 4 measurement '
        'windows for concurrency 4. Please try to increase the --measurement-interval." >&2; exit 2; fi\n'
        f"printf '{CSV}' > \"$out\"",
    )


def test_windows_that_disagree_are_measured_once_more_twice_as_long(tmp_path):
    """perf_analyzer's own advice when its windows disagree (steal on a shared VM): longer windows. The
    result carries the settings of the run that counted; the log keeps both runs."""
    inputs = {"x": np.zeros((4, 3), dtype=np.float32)}
    result = run_perf_analyzer(_unstable_below(tmp_path, 2000), "m", "u", "grpc", 4, 1000, tmp_path, inputs)
    windows = [
        _value(line.split(), "--measurement-interval")
        for line in (tmp_path / "argv").read_text().splitlines()
    ]
    assert windows == ["1000", "2000"] and result.settings[:2] == ("--measurement-interval", "2000")
    assert (result.throughput, result.p99_ms) == (1234.5, 4.0)
    assert (tmp_path / "perf_analyzer_m_c4.log").read_text().count("Failed to obtain stable") == 1


def test_windows_that_disagree_twice_and_other_failures_are_errors_that_say_why(tmp_path):
    inputs = {"x": np.zeros((4, 3), dtype=np.float32)}
    with pytest.raises(StudyError, match="Failed to obtain stable measurement"):
        run_perf_analyzer(_unstable_below(tmp_path, 10**6), "m", "u", "grpc", 4, 1000, tmp_path, inputs)
    assert len((tmp_path / "argv").read_text().splitlines()) == 2  # once more, not again and again
    broken = _script(
        tmp_path / "broken", 'echo "$@" >> ' + f"{tmp_path}/calls" + '\necho "no such model" >&2; exit 1'
    )
    with pytest.raises(StudyError, match="no such model"):
        run_perf_analyzer(broken, "m", "u", "grpc", 4, 1000, tmp_path, inputs)
    assert len((tmp_path / "calls").read_text().splitlines()) == 1  # not a stability failure: no retry
