"""The witness's CPU split (``perf.tune.witness``): each run's CPU per request, the server's and the rest
of the machine's, and the sentence that says how much of the throughput gap to perf_analyzer the
client's CPU explains. Hand-computed cases; the real split is checked against the kernel's own
accounting of the client in tests/integration/test_pa_engine.py."""

from __future__ import annotations

import math

import pytest

from client.stats import ModelStats
from perf.tune.session import Observed
from perf.tune.witness import cpu_verdict

EXPORTED = "perf_analyzer 2.41.0: our records from its export"


def test_a_runs_cpu_per_request_is_the_servers_and_the_rest_of_the_machines() -> None:
    # 1.5 cores busy over 2 s = 3 CPU seconds, 2 of them the server's, for 2,000 requests
    run = Observed("c16", [], ModelStats(requests=2000), wall_s=2.0, cpu_cores=1.5, server_cpu_s=2.0)
    assert run.cpu_ms_per_request() == pytest.approx((1.0, 0.5))
    nothing = Observed("idle", [], ModelStats(), wall_s=2.0, cpu_cores=0.1, server_cpu_s=0.0)
    assert all(math.isnan(value) for value in nothing.cpu_ms_per_request())


def test_the_verdict_gives_each_clients_cpu_against_perf_analyzers_and_the_gap_it_explains() -> None:
    figures = {
        "perf_analyzer": [[3010.0, 9.0]],
        EXPORTED: [[3000.0, 9.0], [3000.0, 9.5]],
        "ours (2 processes)": [[2100.0, 14.0], [1900.0, 15.0]],
    }
    cpu = {
        EXPORTED: [[0.5, 0.1], [0.5, 0.15]],  # means: server 0.5, client 0.125 ms
        "ours (2 processes)": [[0.45, 0.4], [0.55, 0.35]],  # means: 0.5, 0.375 ms
    }
    text = cpu_verdict(figures, cpu)
    # 0.375 / 0.125 = 3.0×; (0.5 + 0.125) / (0.5 + 0.375) - 1 = -28.6%; 2,000 / 3,000 - 1 = -33%
    assert "ours (2 processes): the client 0.375 ms CPU per request, 3.0× perf_analyzer's 0.125" in text
    assert "-29% throughput if the cores limit both (-33% measured)" in text
    assert EXPORTED + ": the client" not in text  # perf_analyzer is the yardstick, not a row
    without_theirs = cpu_verdict(figures, {"ours (1 process)": [[0.5, 0.3]]})
    assert without_theirs == "No CPU figures for perf_analyzer's run."
