"""perf_analyzer's own open loop on a tuned configuration: an independent check of the p99s the tuner's
verification measured with our generator (README, "Rerun on a quiet machine").

Serves ``<report>/repository`` (what ``make tune`` built) on the embedded tritonserver and runs
perf_analyzer at each rate with Poisson arrivals, asynchronously (its default synchronous request-rate
mode cannot offer more than ~800/s here), ids from the tune report's input-data file. Prints inf/s, p50
and p99 per round. Not a test: a measurement.

    .venv/bin/python scripts/tune_open_loop_witness.py reports/<timestamp>-tune 1289 2191 2577
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import tempfile
from pathlib import Path

from perf.analyzer import NOISY_MACHINE, find_perf_analyzer
from server import ServerOptions, TritonServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("report", type=Path, help="a make tune report folder")
    parser.add_argument("rates", type=int, nargs="+", help="offered requests per second")
    parser.add_argument("--model", default="recommender")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-ms", type=int, default=3000)
    args = parser.parse_args()
    binary = find_perf_analyzer()
    if binary is None:
        raise SystemExit("perf_analyzer is not installed here: make perf-analyzer")
    data = args.report / f"perf_analyzer_{args.model}_inputs.json"
    with (
        TritonServer(ServerOptions(repository=args.report / "repository")) as server,
        tempfile.TemporaryDirectory() as out,
    ):
        for round_index in range(args.rounds):
            for rate in args.rates:
                csv_path = Path(out) / f"{rate}_{round_index}.csv"
                command = [
                    str(binary), "-m", args.model, "-u", server.grpc_url, "-i", "grpc",
                    "--request-rate-range", f"{rate}:{rate}:1", "--request-distribution", "poisson",
                    "--async", "--max-threads", "16", "--input-data", str(data),
                    "--measurement-interval", str(args.window_ms), *NOISY_MACHINE,
                    "--percentile", "99", "-f", str(csv_path),
                ]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, timeout=600)
                if done.returncode:
                    print(f"round {round_index} rate {rate}: perf_analyzer failed: {done.stderr[-300:]}")
                    continue
                row = next(csv.DictReader(io.StringIO(csv_path.read_text())))
                p50, p99 = (float(row[f"{p} latency"]) / 1e3 for p in ("p50", "p99"))
                throughput = float(row["Inferences/Second"])
                figures = f"{throughput:,.0f} inf/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms"
                print(f"round {round_index} rate {rate}/s: {figures}")


if __name__ == "__main__":
    main()
