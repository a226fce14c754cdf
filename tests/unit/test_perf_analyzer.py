"""perf_analyzer detection: the Python placeholder that tritonclient installs is not a working tool."""

import stat

from perf.analyzer import find_perf_analyzer


def test_fake_or_broken_binaries_are_not_trusted(tmp_path, monkeypatch):
    fake = tmp_path / "perf_analyzer"
    fake.write_text("#!/bin/sh\necho hello\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PERF_ANALYZER", str(fake))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_perf_analyzer() is None


def test_a_binary_that_answers_like_perf_analyzer_is_found(tmp_path, monkeypatch):
    tool = tmp_path / "perf_analyzer"
    tool.write_text("#!/bin/sh\necho '  --concurrency-range <start:end:step>'\nexit 0\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PERF_ANALYZER", str(tool))
    assert find_perf_analyzer() == tool
