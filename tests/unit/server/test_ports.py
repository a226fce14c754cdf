"""``PORT_BASE=`` / ``--port-base``: every server a tool starts takes its ports from the base (HTTP,
gRPC, metrics and Triton's own two behind the fronts), servers one after the other reuse them, one
started beside another takes the next block, and a port already taken is an error naming it. No server
is started here: the ports are chosen when a ``TritonServer`` is made and checked before it launches."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

import soak.__main__ as soak_main
from perf import cli as perf_cli
from perf.bench import witness
from perf.errors import EXIT_RUNTIME, StudyError
from perf.plan.cli import PlanSetup
from perf.tune.cli import TuneSetup
from server import ports
from server.install import ServerError
from server.launcher import ServerOptions, TritonServer


@pytest.fixture
def base(port_base_finder: Callable[[int], int]) -> Iterator[int]:
    chosen = port_base_finder(2 * ports.PORTS_PER_SERVER)
    ports.use_port_base(chosen)
    yield chosen
    ports.use_port_base(None)
    ports._held.clear()


def fronted(tmp_path: Path) -> TritonServer:
    """A server with both fronts, as ``make serve`` and the soak run it: all five ports in use."""
    return TritonServer(ServerOptions(repository=tmp_path, http_front=True, grpc_front=True))


def used(server: TritonServer) -> list[int]:
    return [
        server.http_port,
        server.grpc_port,
        server.metrics_port,
        server.triton_http_port,
        server.triton_grpc_port,
    ]


def test_every_port_of_a_server_comes_from_the_base(base: int, tmp_path: Path) -> None:
    first = fronted(tmp_path)
    assert used(first) == [base, base + 1, base + 2, base + 3, base + 4]
    beside = fronted(tmp_path)  # made while the first still holds its block: the next block
    assert used(beside) == [base + 5, base + 6, base + 7, base + 8, base + 9]
    first.terminate()  # stopped (never started here): its block is free again
    after = TritonServer(ServerOptions(repository=tmp_path))  # no fronts: Triton's own ports are public
    assert (after.http_port, after.grpc_port, after.metrics_port) == (base, base + 1, base + 2)
    assert (after.triton_http_port, after.triton_grpc_port) == (base, base + 1)
    beside.terminate()
    after.terminate()


def test_ports_given_explicitly_still_win_over_the_base(base: int, tmp_path: Path) -> None:
    server = TritonServer(ServerOptions(repository=tmp_path, http_port=base + 40))
    assert (server.http_port, server.grpc_port, server.metrics_port) == (base + 40, base + 1, base + 2)
    server.terminate()


def test_a_port_of_the_base_already_taken_is_an_error_naming_it(base: int, tmp_path: Path) -> None:
    server = fronted(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        with pytest.raises(
            ServerError, match=rf"port {base + 1} \(PORT_BASE {base} \+ 1, gRPC\) on 127\.0\.0\.1 is in use"
        ):
            server._launch()
    assert server.process is None  # refused before anything was started
    server.terminate()


def test_the_base_is_checked_where_it_is_given() -> None:
    assert ports.port_base_argument("9000") == 9000
    for wrong in ("80", "65530", "nine"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"outside 1024|not a port number"):
            ports.port_base_argument(wrong)
    with pytest.raises(SystemExit):
        perf_cli.parser().parse_args(["tune", "--port-base", "80"])


class PortProbe:
    """Where a tool would start its first server: the port base in force then, recorded; then it stops
    the tool (``StudyError``: exit status 1) before anything is built or served."""

    name, title, serves_spec = "probe", "probe study", False

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        self.seen.append(ports._base)
        raise StudyError("stopped where the first server would start")

    def steps(self, profile: object) -> int:
        return 1

    def run(self, context: object) -> NoReturn:
        self(context)


@pytest.mark.parametrize("command", ["run", "tune", "plan", "witness", "soak"])
def test_each_tool_hands_its_port_base_to_the_servers_it_starts(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m perf run|tune|plan|witness`` and ``python -m soak`` with ``--port-base``: the base is in
    force when the tool starts its first server (its setup's first step, or the witness's session,
    replaced by a probe of the setting)."""
    probe = PortProbe()
    setup = perf_cli.PerfSetup(
        studies=lambda: [probe], tune=TuneSetup(session=probe), plan=PlanSetup(measure_profile=probe)
    )
    monkeypatch.setattr(witness, "ModelSession", probe)
    try:
        if command == "soak":
            with pytest.raises(StudyError):
                soak_main.main(["--duration", "1", "--port-base", "9450"], run=probe)
        elif command == "witness":
            argv = [command, "--port-base", "9450", "--workdir", str(tmp_path)]
            assert perf_cli.main(argv, setup) == EXIT_RUNTIME
        else:
            required = {"run": [], "tune": ["--model", "recommender", "--p99-ms", "10", "--engine", "ours"]}
            required["plan"] = ["--model", "recommender", "--p99-ms", "10", "--probe-runs", "0"]
            argv = [command, *required[command], "--port-base", "9450", "--reports", str(tmp_path)]
            assert perf_cli.main(argv, setup) == EXIT_RUNTIME
        assert probe.seen == [9450]
    finally:
        ports.use_port_base(None)
