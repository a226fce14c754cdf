"""The drained server's exit after stubs died under load, as ``make soak`` judges it.

Triton 2.51 keeps, for good, the old version of each model the watchdog reloaded after its stub died
with requests in flight: the Python backend never deletes those requests' response factories, and each
holds that version. The drain unloads every model, yet at SIGTERM tritonserver counts the versions it
still holds, waits its whole exit timeout and exits 1 (docs/SERVING.md, Triton 2.51's own limits). No
kill of tritonserver is needed: a first-start server does it. The soak accepts that exit only when
Triton held no more versions than the reloads of the drained server's own watchdog, which also kills and
reloads on its own (a stub hung on a saturated host), so it may hold more than the stubs killed here. A
Triton that unloads the old versions exits 0 and fails this test: the docs' row is then stale.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from resilience_fixtures import HANG_GUARD_S, MixedLoad, build_small_repository, explicit_options, wait_for

from server import TritonServer
from server.triton_exit import exit_timeout_expired, exit_timeout_explained
from soak.faults import Soak, kill_stub, recover
from soak.report import SoakReport, record_exit

pytestmark = pytest.mark.integration

KILLS = 2


def test_each_stub_killed_under_load_leaves_one_version_the_drained_server_exits_holding(
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
        events = server.watchdog.state.events
        for kill in range(1, KILLS + 1):
            kill_stub(soak)
            assert len(report.outages) == kill, "no stub of trivial to kill"
            wait_for(lambda kill=kill: sum(1 for e in events if e.healed_at) == kill, "the watchdog's reload")
            load.wait_for(len(load.ok()) + 20)  # serving again, under load before the next kill
        recover(soak)  # each outage ends at its reload, as in the soak
        server.stop()
        load.stop()
    finally:
        server.stop()
    log_tail = server.log_tail(60)
    record_exit(report, server)  # as the soak reads the drained server
    assert report.exit_code == 1 and exit_timeout_expired(log_tail), log_tail
    held = report.versions_held
    assert report.drained and held is not None, report.text()
    # one per stub killed under load, and no more than the watchdog's reloads (these kills and its own)
    assert KILLS <= held <= report.watchdog_reloads, report.text()
    assert f"expired with {held} model version(s)" in (exit_timeout_explained(log_tail) or "")  # `make stop`
    assert report.exit_expected and report.passed, report.text()
    assert f"watchdog reloads on it {report.watchdog_reloads}" in report.text()
    report.watchdog_reloads = held - 1  # one version held more than the reloads that explain them
    assert not report.exit_expected and "(UNEXPECTED)" in report.text()
    report.watchdog_reloads = 0
    assert not report.exit_expected
