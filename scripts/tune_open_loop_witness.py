"""perf_analyzer's own open loop on a tuned configuration: an independent check of the p99s the tuner's
verification measured (docs/TUNE.md, "Tools beside the tuner").

Serves ``<report>/repository`` (what ``make tune`` built) on the embedded tritonserver and measures each
rate with Poisson arrivals through ``perf.measure.analyzer.PerfAnalyzerEngine`` (the project's one
perf_analyzer command line, its stability check on), inputs drawn from the report's ``spec.tuned.yaml``.
Prints inf/s, p50 and p99 per round, and whether perf_analyzer's windows agreed. Not a test: a
measurement.

    .venv/bin/python scripts/tune_open_loop_witness.py reports/<timestamp>-tune 1289 2191 2577
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exporters.resolve import load_spec
from perf.measure.analyzer import PerfAnalyzerEngine
from perf.measure.engine import MeasureSettings
from perf.measure.loads import poisson
from perf.measure.measurement import measure
from perf.measure.server_view import ServerEndpoints
from perf.measure.target import target_from_spec
from server import ServerOptions, TritonServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("report", type=Path, help="a make tune report folder")
    parser.add_argument("rates", type=float, nargs="+", help="offered requests per second")
    parser.add_argument("--model", default="recommender")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=1.0, help="seconds per measurement window")
    args = parser.parse_args()
    spec = load_spec(args.report / "spec.tuned.yaml").model(args.model)
    settings = MeasureSettings(warmup_s=0.0, window_s=args.window_s, stable_windows=3, max_windows=6)
    engine = PerfAnalyzerEngine()
    with TritonServer(ServerOptions(repository=args.report / "repository")) as server:
        target = target_from_spec(spec, server.grpc_url, rows=16)
        for round_index in range(args.rounds):
            for rate in args.rates:
                run = measure(
                    target, poisson(rate, round_index), settings, ServerEndpoints.of(server), engine=engine
                )
                summary = run.summary()
                agreed = "windows agreed" if run.stable else "windows did not agree"
                print(
                    f"round {round_index} rate {rate:.0f}/s: {summary.throughput:,.0f} inf/s, "
                    f"p50 {summary.p50_ms:.2f} ms, p99 {summary.p99_ms:.2f} ms ({engine.name}, {agreed})"
                )


if __name__ == "__main__":
    main()
