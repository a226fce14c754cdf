"""A server that dies during a run is reported as such: ``ServerDiedError`` naming how it died (as the
supervisor says it: the signal and the log line that explains it), whatever the run raised of it (a
reset connection) or even where the run returned; the command keeps its log in the report folder and
exits 1, never 3 ("nothing meets"). The dying process here is a real one, killed by SIGSEGV."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from exporters.resolve import load_spec
from perf.cli import PerfSetup, main
from perf.errors import EXIT_RUNTIME, ServerDiedError
from perf.measure.engine import OurEngine
from perf.measure.loads import poisson
from perf.model.batcher import BatcherConfig
from perf.session.model import ModelSession, keep_dead_server_log
from perf.tune.cli import TuneSetup
from tests.unit.perf.simulated_server import SimulatedServer

SPEC = Path(__file__).resolve().parents[4] / "models.yaml"
CRASH_LINE = "Signal (11) received."


class DyingServer:
    """What the session reads of its ``TritonServer``: a real process, killed by SIGSEGV, and its log."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        log_path.write_text(f"I0101 model loaded\n{CRASH_LINE}\n 0# 0x00 in libtriton_python.so\n")
        self.process = subprocess.Popen(["sleep", "60"])

    def die(self) -> None:
        self.process.send_signal(signal.SIGSEGV)
        self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        return self.log_path.read_text()


@pytest.fixture
def session(tmp_path: Path):
    running = ModelSession(load_spec(SPEC), "trivial", 8, tmp_path / "work", OurEngine())
    running.server = DyingServer(tmp_path / "server.log")
    yield running
    if running.server.process.poll() is None:
        running.server.process.kill()
        running.server.process.wait()


@pytest.mark.parametrize("how", ["raises", "returns"])
def test_a_server_that_died_during_a_run_is_named_with_its_cause(session: ModelSession, how: str) -> None:
    def run_that_dies(*args, **kwargs):
        session.server.die()
        if how == "raises":
            raise ConnectionResetError("Connection reset by peer")
        return object()  # a run of failed requests, as a dead server leaves it

    session._measure_once = run_that_dies
    with pytest.raises(ServerDiedError) as caught:
        session.measure(poisson(100.0, 0), "probe max 8, 0 ms ×1 @ 100/s")
    died = caught.value
    assert str(died) == (
        f"tritonserver died during probe max 8, 0 ms ×1 @ 100/s: killed by SIGSEGV: {CRASH_LINE}"
    )
    assert died.cause == f"killed by SIGSEGV: {CRASH_LINE}" and died.log_path == str(session.server.log_path)
    assert isinstance(died.__cause__, ConnectionResetError) == (how == "raises")


def test_a_reload_the_server_died_in_is_named_too(session: ModelSession) -> None:
    def reload_that_dies(config):
        session.server.die()
        raise ConnectionRefusedError("connection refused")

    session._overrides = reload_that_dies
    with pytest.raises(ServerDiedError, match=r"died during the reload of max 8, 1 ms ×1: killed by SIGSEGV"):
        session.prepare(BatcherConfig(8, 1000))


def test_a_run_that_fails_while_the_server_lives_is_its_own_error(session: ModelSession) -> None:
    def failing(*args, **kwargs):
        raise ConnectionResetError("a proxy in the way")

    session._measure_once = failing
    with pytest.raises(ConnectionResetError):
        session.measure(poisson(100.0, 0), "run")


def test_make_tune_exits_1_saying_the_server_died_and_keeps_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    log = tmp_path / "work" / "server.log"
    log.parent.mkdir()
    log.write_text(f"{CRASH_LINE}\n")

    def dies(*args: object, **kwargs: object) -> None:
        raise ServerDiedError("tritonserver died during probe max 8, 0 ms ×1 @ 50/s: killed by SIGSEGV",
                              "killed by SIGSEGV", str(log))  # fmt: skip

    setup = TuneSetup(session=SimulatedServer({}).as_session(), tuner=dies)
    reports = tmp_path / "reports"
    argv = ["tune", "--model", "recommender", "--p99-ms", "1", "--engine", "ours", "--reports", str(reports)]
    assert main(argv, PerfSetup(Console(width=300), tune=setup)) == EXIT_RUNTIME == 1
    (folder,) = reports.iterdir()
    printed = capsys.readouterr().out
    assert "tritonserver died during probe" in printed and "killed by SIGSEGV" in printed
    assert f"its log is kept in {folder / 'server.log'}" in printed.replace("\n", "")
    assert (folder / "server.log").read_text() == f"{CRASH_LINE}\n"
    assert "nothing meets" not in printed


def test_the_log_is_copied_once(tmp_path: Path) -> None:
    log = tmp_path / "work" / "server.log"
    log.parent.mkdir()
    log.write_text("x\n")
    error = ServerDiedError("died", "killed by SIGSEGV", str(log))
    with (
        pytest.raises(ServerDiedError),
        keep_dead_server_log(tmp_path / "outer"),
        keep_dead_server_log(tmp_path),
    ):
        raise error
    assert error.kept == str(tmp_path / "server.log") and str(error).count("its log is kept") == 1
