"""The drained server's exit after a stub died under load, as ``make soak`` judges it.

Triton 2.51 keeps the old version of a model the watchdog reloaded after its stub died with requests in
flight: the drain unloads every model, yet at SIGTERM tritonserver waits its whole exit timeout for that
version and exits 1 (docs/SERVING.md, Triton 2.51's own limits). No kill of tritonserver is needed: a
first-start server does it. The soak accepts that exit only with a stub fault of its own on the drained
server and Triton's words in its log. A Triton that unloads the old version exits 0 and fails this test:
the docs' row is then stale.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from resilience_fixtures import HANG_GUARD_S, MixedLoad, build_small_repository, explicit_options, wait_for

from server import TritonServer
from soak.faults import Soak, kill_stub, recover
from soak.report import EXIT_TIMEOUT, SoakReport, exit_lines

pytestmark = pytest.mark.integration


def test_a_stub_killed_under_load_ends_the_drained_server_with_the_exit_the_soak_expects(
    spec_data: dict[str, Any], tmp_path: Path
) -> None:
    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    server = TritonServer(explicit_options(repository, tmp_path / "server"))  # its log kept after the stop
    report = SoakReport(duration_s=0.0)
    try:
        server.start()
        load = MixedLoad(server.http_url, server.grpc_url, ["trivial"], callers_per=4, max_s=HANG_GUARD_S)
        load.start().wait_for(20)
        client = httpclient.InferenceServerClient(server.http_url)
        soak = Soak(server, client, random.Random(0), report, ["trivial"], ["trivial"])
        report.server_pids.append(server.pid)
        kill_stub(soak)
        assert report.outages, "no stub of trivial to kill"
        wait_for(lambda: any(e.healed_at for e in server.watchdog.state.events), "the watchdog's reload")
        load.wait_for(len(load.ok()) + 20)  # serving again
        recover(soak)  # the outage ends at the reload, as in the soak
        server.stop()
        load.stop()
    finally:
        server.stop()
    report.exit_code, report.exit_log = server.process.returncode, exit_lines(server.log_tail(60))
    assert report.exit_code == 1 and any(EXIT_TIMEOUT in line for line in report.exit_log), server.log_tail()
    assert report.exit_expected and report.passed, report.text()
    report.outages.clear()  # the same exit with no stub fault to explain it
    assert not report.exit_expected and "(UNEXPECTED)" in report.text()
