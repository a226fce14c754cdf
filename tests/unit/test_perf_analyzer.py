"""perf_analyzer detection: the Python placeholder that tritonclient installs is not a working tool;
the 2.41.0 binary is probed with ``--version`` (it rejects ``--help``)."""

import stat

from perf.analyzer import find_perf_analyzer


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
