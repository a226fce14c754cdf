"""``python -m soak``: the CLI behind ``make soak`` (see ``soak.run``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import soak.run
from server.ports import add_port_base_option, use_port_base
from soak.report import SoakReport
from soak.run import run_soak


def main(argv: list[str] | None = None, run: Callable[..., SoakReport] = run_soak) -> int:
    """``make soak``; ``run``: the soak itself (a test hands in one that starts nothing)."""
    parser = argparse.ArgumentParser(
        prog="python -m soak",
        description=soak.run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--fault-every", type=float, default=20.0, help="mean seconds between faults")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fuzz-cases", type=int, default=100, help="mutated HTTP requests per fuzz burst")
    parser.add_argument(
        "--invariant-s",
        type=float,
        default=None,
        help="seconds of the invariant fuzz before the faults (default: half of --duration; 0: none)",
    )
    add_port_base_option(parser)
    args = parser.parse_args(argv)
    use_port_base(args.port_base)  # the soak's server (server.ports)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    report = run(
        args.repository, args.duration, args.seed, args.fault_every, args.fuzz_cases, args.invariant_s
    )
    print(report.text())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
