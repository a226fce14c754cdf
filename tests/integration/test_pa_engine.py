"""perf_analyzer as a load engine against a real tritonserver: every request it sends is answered and
counted by the server, our records built from its export give the figure its own CSV gives for the
same windows, an open loop replays our arrivals and keeps no more requests in flight than our engine
would, and the witness puts both engines side by side. Skipped, with the reason, where perf_analyzer
is not installed."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from exporters.resolve import load_spec
from perf.bench.witness import CSV_ROW, EXPORT_ROW, witness_section
from perf.measure.analyzer import WINDOWS_JUDGED, PerfAnalyzerEngine, find_perf_analyzer
from perf.measure.engine import MeasureSettings, sized_for
from perf.measure.loads import closed_loop, poisson
from perf.measure.measurement import measure
from perf.measure.noise import NoisePolicy
from perf.measure.records import Record
from perf.measure.target import Target
from perf.model.batcher import BatcherConfig
from perf.perf_analyzer_install import unavailable_reason
from perf.session.model import ModelSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from slow_model import SLOW, slow_model_server

pytestmark = pytest.mark.integration
SPEC = Path(__file__).resolve().parents[2] / "models.yaml"
CONCURRENCY = 16
# perf_analyzer 2.41 calls its last three windows stable when max/min of their throughputs, and of
# their mean latencies, is within 1 + tolerance (its --stability-percentage; its --help), and a closed
# loop unstable twice is an error (perf.measure.analyzer), which a busy host's windows can cause at any
# usual tolerance. At 1e9 no run can be unstable: a window holds at least one request (an empty one is
# its own error) and never a billion, and no latency here is a billion times another. None of these
# tests is about stability (ours: tests/unit/perf/measure), each about what perf_analyzer sent, exported
# and the server counted, which the agreement of its windows does not change.
# p99_samples: a low rate's windows are sized for 40 requests (not 100: seconds, not minutes, a run)
WINDOWS = MeasureSettings(
    warmup_s=0.2, window_s=0.5, stable_windows=3, max_windows=4, tolerance=1e9, p99_samples=40
)
# The open loop's rate: twice the least whose judged windows already expect a p99's requests at
# WINDOWS' length (about 44/s), so they are not stretched as the low rate's are, and far below what
# a loaded host serves: the test is about what was sent, exported and counted, never a rate reached.
OPEN_RATE = 100.0
# The slow model answers one request at a time, each after this long: at most 20 a second on any host
# (a loaded one only answers later), so an open loop of BEYOND_RATE is far past what it serves.
SLOW_ASKS_S = 0.05
BEYOND_RATE = 1000.0
BEYOND_IN_FLIGHT = 4  # the target's cap: --async would have hundreds in flight within the first second


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelSession]:
    if find_perf_analyzer() is None:
        pytest.skip(f"perf_analyzer not installed: {unavailable_reason() or 'run make perf-analyzer'}")
    workdir = tmp_path_factory.mktemp("pa_engine")
    engine = PerfAnalyzerEngine(log_folder=workdir)
    # each run is compared with its own CSV: never measured again
    with ModelSession(
        load_spec(SPEC), "recommender", 8, workdir, engine, WINDOWS, NoisePolicy(remeasure=False)
    ) as running:
        running.prepare(BatcherConfig(8, 2000))
        yield running


def test_closed_loop_records_agree_with_perf_analyzer_and_the_server(session: ModelSession) -> None:
    run = session.measure(closed_loop(CONCURRENCY), "c16")
    assert run.engine.startswith("perf_analyzer 2.") and run.records
    assert run.figures.failed == 0, [r.status for r in run.records if not r.ok][:3]
    if run.own is not None:  # its windows agreed: its CSV is the mean of the same windows' rates
        ours = run.mean_window_rate()
        print(f"c={CONCURRENCY}: records {ours:.0f}/s, perf_analyzer's CSV {run.own.throughput:.0f}/s")
        assert ours == pytest.approx(run.own.throughput, rel=0.10), run.windows
    # the server counted every request perf_analyzer sent (the export holds each one it measured)
    assert run.server is not None and run.server.stats.requests >= len(run.records), run.server.stats
    assert run.server.stats.failed == 0


def test_an_open_loop_is_sent_in_perf_analyzers_windows_and_every_request_answered(
    session: ModelSession,
) -> None:
    """perf_analyzer replays our arrivals at ``OPEN_RATE`` in windows of the settings' length, and
    our records from its export give its own CSV's figure: the counts add up whatever rate the host
    serves, which is asserted nowhere (a loaded host answers later, in the same windows)."""
    load = poisson(OPEN_RATE, seed=11)
    assert sized_for(WINDOWS, load, WINDOWS_JUDGED) == WINDOWS  # not the low rate's stretched windows
    run = session.measure(load, f"open {OPEN_RATE:g}/s")
    assert run.records and all(r.ok for r in run.records)
    assert all(r.recv_s >= r.send_s for r in run.records)
    # the server counted every request the export holds (and the few sent as the last window closed)
    assert run.server is not None and run.server.stats.requests >= len(run.records)
    assert run.server.stats.failed == 0
    first, last = run.used
    assert last == len(run.windows) and last - first == WINDOWS_JUDGED
    # sent at our rate, not at one a unit slip makes (the sends keep to the schedule; the answers may lag)
    start, end = run.span
    sent = sum(start <= r.send_s < end for r in run.records) / (end - start)
    assert OPEN_RATE / 2 < sent < 2 * OPEN_RATE, (sent, run.windows)
    assert run.own is not None, "its windows agree at any tolerance of 1e9"
    assert run.mean_window_rate() == pytest.approx(run.own.throughput, rel=0.10), run.windows


def test_a_low_rate_is_measured_in_windows_that_hold_a_p99s_requests(session: ModelSession) -> None:
    """At 20 requests/s the settings' 0.5 s windows expect 10 arrivals each, 30 for a p99 (and at a
    tuner's low rates one may be empty, which fails a perf_analyzer run): the three it judges are
    stretched to expect the requests a p99 is judged on, here ``WINDOWS.p99_samples`` and four spreads."""
    run = session.measure(poisson(20.0, seed=7), "open 20/s")
    first, last = run.used
    expected_s = (WINDOWS.p99_samples + 4 * WINDOWS.p99_samples**0.5) / 20.0  # together: 3.2 s
    assert last - first == 3 and run.windows[last - 1][1] - run.windows[first][0] >= 0.9 * expected_s
    assert run.records and all(r.ok for r in run.records) and not run.too_few


def test_the_witness_shows_which_engine_produced_each_figure(session: ModelSession) -> None:
    text = "\n".join(witness_section(session))
    print(text)
    assert "perf_analyzer vs our client" in text and f"concurrency {CONCURRENCY}" in text
    assert EXPORT_ROW in text and "| ours |" in text
    assert CSV_ROW in text or "did not" in text  # its own row where its windows agreed


def most_in_flight(records: list[Record]) -> int:
    """The most requests sent and not yet answered at any moment (an answer and a send at the same
    instant: the answer first, as a thread sends its next request after its last is answered)."""
    events = sorted([(r.recv_s, -1) for r in records] + [(r.send_s, 1) for r in records])
    return max(itertools.accumulate(step for _, step in events))


def test_an_open_loop_beyond_what_the_server_serves_keeps_the_cap_in_flight_and_is_not_sustained(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """perf_analyzer's open loop holds at most the target's ``max_in_flight`` requests, as our engine
    does, so its memory stays bounded; the requests it sends late make the run fall behind the rate
    offered, judged not sustained, whatever the host serves (rates are asserted nowhere)."""
    if find_perf_analyzer() is None:
        pytest.skip(f"perf_analyzer not installed: {unavailable_reason() or 'run make perf-analyzer'}")
    # a deadline no request reaches: BEYOND_IN_FLIGHT requests wait at most that many sleeps
    with slow_model_server(spec_data, tmp_path_factory, "pa_beyond", deadline_s=60.0) as running:
        inputs = {"seconds": np.full((1, 1), SLOW_ASKS_S, np.float32)}
        target = Target(SLOW, running.grpc_url, inputs, {"slept": 4}, max_in_flight=BEYOND_IN_FLIGHT)
        run = measure(target, poisson(BEYOND_RATE, seed=5), WINDOWS, engine=PerfAnalyzerEngine())
    assert run.records and all(r.ok for r in run.records)
    assert most_in_flight(run.records) <= BEYOND_IN_FLIGHT
    assert not run.sustained, (run.throughput, run.offered)
