"""The launcher's decisions that need no running server: where the binary is, what the backend folder
holds, how much shared memory the Python backend gets."""

from __future__ import annotations

import copy
import dataclasses
import http.server
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient

from exporters.configs.model_config import write_config
from exporters.configs.models import build_model_config
from exporters.schema.models import parse_spec
from server import launcher
from server.__main__ import command_parser, supervised_options
from server.cli_options import FRONT_TIMEOUTS
from server.install import ServerError, assemble_backends, find_install
from server.launcher import (
    MIB,
    ServerOptions,
    TritonServer,
    python_shm_bytes,
    remove_shm_regions,
    starved_stub_abort,
)
from server.ports import free_ports, held_by


def test_wheel_server_is_found_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    install = find_install()
    assert install.origin == "wheel" and install.binary.name == "tritonserver" and install.binary.is_file()


def test_env_variable_wins_and_a_bad_one_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRITONSERVER", str(fake))
    install = find_install()
    assert install.origin == "env" and install.backends == tmp_path / "backends"
    monkeypatch.setenv("TRITONSERVER", str(tmp_path / "missing"))
    with pytest.raises(ServerError, match="is not an executable file"):
        find_install()


def test_backend_folder_has_python_backend_stub_and_our_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TRITONSERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    folder = assemble_backends(find_install(), tmp_path / "backends")
    for name in ("libtriton_python.so", "triton_python_backend_utils.py", "triton_python_backend_stub"):
        assert (folder / "python" / name).is_file()
    for name in ("model.py", "batching.py", "runtime_paths.py", "dtypes.py"):
        assert (folder / "onnxruntime" / name).is_file()
    before = _tree(folder)
    (folder / "onnxruntime" / "model.py").write_text("stale")  # a run of older code left this
    assert assemble_backends(find_install(), folder) == folder
    assert _tree(folder) == before  # same files, links and contents: a second call is safe


def _tree(folder: Path) -> dict[str, object]:
    """Every entry under ``folder``: a link's target, a file's bytes, or "dir"."""

    def entry(path: Path) -> object:
        return str(path.readlink()) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"

    return {str(p.relative_to(folder)): entry(p) for p in sorted(folder.rglob("*"))}


def test_native_onnxruntime_backend_is_kept(tmp_path: Path) -> None:
    from server.install import ServerInstall

    native = tmp_path / "native" / "onnxruntime"
    native.mkdir(parents=True)
    (native / "libtriton_onnxruntime.so").write_bytes(b"")
    install = ServerInstall(tmp_path / "bin" / "tritonserver", tmp_path / "native", (), "path")
    folder = assemble_backends(install, tmp_path / "backends")
    assert (folder / "onnxruntime").is_symlink() and not (folder / "onnxruntime" / "model.py").exists()


def test_shared_memory_fits_the_largest_batch(spec_data: dict[str, Any], tmp_path: Path) -> None:
    data = copy.deepcopy(spec_data)
    image = next(m for m in data["models"] if m["name"] == "image_classifier")
    image["max_batch_size"] = 256
    image["batching"] = {"mode": "dynamic"}
    spec = parse_spec(data).model("image_classifier")
    write_config(build_model_config(spec, 0), tmp_path / "image_classifier")
    one_sample = (3 * 64 * 64 + 10) * 4
    assert python_shm_bytes(tmp_path) >= 4 * 256 * one_sample
    assert python_shm_bytes(tmp_path) % MIB == 0
    assert python_shm_bytes(tmp_path / "empty") == 16 * MIB


def test_command_binds_loopback_and_uses_its_own_shm_prefix(tmp_path: Path) -> None:
    servers = [TritonServer(ServerOptions(repository=tmp_path)) for _ in range(2)]
    first, second = (server.command() for server in servers)
    for server in servers:
        server.stop()  # never started: still removes its temporary folder
        assert not server._workdir.exists()
    assert "--http-address=127.0.0.1" in first and "--grpc-address=127.0.0.1" in first
    # explicit control with every model loaded, the admin APIs keyed per server, readiness non-strict
    assert "--model-control-mode=explicit" in first and "--load-model=*" in first
    assert "--strict-readiness=false" in first
    key = servers[0].admin_key
    assert f"--http-restricted-api=model-repository,trace,logging:triton-admin-key={key}" in first
    assert f"--grpc-restricted-protocol=model-repository,trace,logging:triton-admin-key={key}" in first
    assert servers[1].admin_key != key
    prefix = [a for a in first if "shm-region-prefix-name" in a]
    assert prefix and prefix != [a for a in second if "shm-region-prefix-name" in a]


def test_every_server_option_is_read_by_the_launcher() -> None:
    """An option a caller sets must change what TritonServer does: one it never reads lets a caller
    believe it configured the server (a model-control mode, say, while Triton always runs explicit)."""
    source = inspect.getsource(launcher)
    unread = [f.name for f in dataclasses.fields(ServerOptions) if f"options.{f.name}" not in source]
    assert unread == []


def test_a_servers_ports_are_picked_together_all_different_and_apart_from_those_given(tmp_path: Path) -> None:
    """Picked one at a time, two of them could come back equal (a start that fails on a busy host)."""
    (given,) = free_ports(["127.0.0.1"])
    picked = free_ports(["127.0.0.1"] * 40, taken=[given])
    assert len(set(picked)) == 40 and given not in picked
    options = ServerOptions(repository=tmp_path, http_port=given, http_front=True, grpc_front=True)
    server = TritonServer(options)
    server.stop()
    ports = [server.http_port, server.grpc_port, server.metrics_port, server.triton_http_port,
             server.triton_grpc_port]  # fmt: skip
    assert server.http_port == given and len(set(ports)) == 5


def test_missing_repository_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    server = TritonServer(ServerOptions(repository=tmp_path / "nope"))
    with pytest.raises(ServerError, match="does not exist"):
        server.start()
    assert not server._workdir.exists()


def test_port_in_use_is_refused_before_launch(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = TritonServer(ServerOptions(repository=tmp_path, http_port=port))
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is in use"):
            server.start()
    assert server.process is None


@pytest.mark.integration
@pytest.mark.parametrize("fronts", [False, True], ids=["triton", "fronts"])
def test_a_picked_port_another_process_took_first_means_new_ports_not_a_failed_start(
    tmp_path: Path, fronts: bool
) -> None:
    """Between the OS picking a server's ports and the server binding them, another server on the
    host can take one (beside ``make perf``, a test server's HTTP port was answered by another
    Triton's gRPC): the start goes on, on new ports. A port the user gave stays an error (above)."""
    options = ServerOptions(repository=tmp_path, http_front=fronts, grpc_front=fronts)
    server = TritonServer(options)
    lost = server.http_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", lost))
        taken.listen()
        with server:
            assert server.http_port != lost and server.is_ready()  # ready on its new HTTP port


@pytest.mark.integration
def test_triton_own_port_picked_behind_given_public_ports_is_picked_again_when_taken(tmp_path: Path) -> None:
    """With fronts, Triton's own loopback ports are picked even when the user gives the public ones;
    another process binding one first means new ones for Triton, and the public ports stay as given."""
    given = dict(zip(("http_port", "grpc_port", "metrics_port"), free_ports(["127.0.0.1"] * 3), strict=True))
    server = TritonServer(ServerOptions(repository=tmp_path, http_front=True, grpc_front=True, **given))
    lost = server.triton_grpc_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", lost))
        taken.listen()
        with server:
            assert server.triton_grpc_port != lost and server.is_ready()
            assert (server.http_port, server.grpc_port, server.metrics_port) == tuple(given.values())


def test_a_port_lost_is_read_from_the_whole_log_not_only_the_tail_in_the_error(tmp_path: Path) -> None:
    """Triton binds its ports after loading its models, and on failing to bind it unloads them all:
    their lines push ``already in use`` out of the log tail the error carries. The port named in the
    log is picked again; a port the user gave is never picked again."""
    for grpc_given in (0, free_ports(["127.0.0.1"])[0]):
        server = TritonServer(ServerOptions(repository=tmp_path, grpc_port=grpc_given))
        unloads = [f"model_lifecycle.cc:623] successfully unloaded 'm{n}' version 1" for n in range(60)]
        server.log_path.write_text(
            f"main.cc:256] failed to start GRPC service: Unavailable - Socket "
            f"'127.0.0.1:{server.grpc_port}' already in use\n" + "\n".join(unloads) + "\n"
        )
        error = ServerError(f"tritonserver exited with 1; log:\n{server.log_tail()}")
        expected = set() if grpc_given else {server.grpc_port}
        assert server._lost_picked_ports(error) == expected
        server.terminate()


SLOW_TO_LOAD = {
    "config.pbtxt": 'name: "slow_to_load" backend: "python" max_batch_size: 0 '
    'input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] '
    'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }] '
    "instance_group [{ kind: KIND_CPU count: 1 }]",
    "1/model.py": "import os, sys, time\n"  # the stub finds numpy on the server's PYTHONPATH
    'sys.path[:0] = os.environ["PYTHONPATH"].split(os.pathsep)\n\n\n'
    "class TritonPythonModel:\n    def initialize(self, args):\n"
    "        time.sleep(4)\n\n    def execute(self, requests):\n        return []\n",
}


class Impostor(http.server.BaseHTTPRequestHandler):
    """Another server on the port: 200 to everything, the readiness probe included."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.integration
def test_another_server_answering_on_a_picked_port_is_not_taken_for_this_one(tmp_path: Path) -> None:
    """tritonserver binds its ports once its models have loaded; a server another process starts on
    one of them meanwhile answers the readiness probe (beside ``make test``, ``make perf`` once
    measured another server). It is not taken for ours (``server.ports.held_by``): ours fails to bind,
    and the start goes on, on new ports."""
    for name, text in SLOW_TO_LOAD.items():
        (tmp_path / "slow_to_load" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "slow_to_load" / name).write_text(text)
    server = TritonServer(ServerOptions(repository=tmp_path, startup_timeout_s=300))
    taken = server.http_port
    impostors: list[http.server.HTTPServer] = []

    def take_it_once_checked() -> None:  # after the pre-launch check, before Triton binds
        while server.process is None:
            time.sleep(0.001)
        impostors.append(http.server.ThreadingHTTPServer(("127.0.0.1", taken), Impostor))
        impostors[0].serve_forever()

    thread = threading.Thread(target=take_it_once_checked, daemon=True)
    thread.start()
    try:
        with server:
            assert impostors, "the other server never took the port"
            assert server.http_port != taken and held_by([server.http_port], [server.pid])
            assert httpclient.InferenceServerClient(server.http_url).get_server_metadata()["name"] == "triton"
    finally:
        if impostors:
            impostors[0].shutdown()
            impostors[0].server_close()


def test_held_by_tells_a_listener_of_ours_from_anothers() -> None:
    with socket.socket() as ours, socket.socket() as unused:
        ours.bind(("127.0.0.1", 0))
        ours.listen()
        unused.bind(("127.0.0.1", 0))  # bound, not listening: nothing answers there
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            port = ours.getsockname()[1]
            assert held_by([port], [os.getpid()])
            assert not held_by([port], [other.pid])
            assert not held_by([port, unused.getsockname()[1]], [os.getpid()])
        finally:
            other.kill()
            other.wait()


def test_malformed_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.pbtxt").write_text("max_batch_sise: 8\n")
    with pytest.raises(ServerError, match=r"broken/config.pbtxt: not a valid model config"):
        python_shm_bytes(tmp_path)


def test_leftover_shared_memory_regions_are_removed() -> None:
    prefix = f"tb_test_{os.getpid()}_"
    for index in range(2):
        Path(f"/dev/shm/{prefix}{index}").write_bytes(b"x")
    Path(f"/dev/shm/other_{os.getpid()}").write_bytes(b"x")
    try:
        assert sorted(remove_shm_regions(prefix)) == [f"{prefix}0", f"{prefix}1"]
        assert Path(f"/dev/shm/other_{os.getpid()}").exists()
    finally:
        Path(f"/dev/shm/other_{os.getpid()}").unlink()


def test_shared_memory_counts_a_variable_axis_at_its_max_shape(tmp_path: Path) -> None:
    entry = {
        "name": "seq", "source": {"onnx": "unused.onnx"}, "max_batch_size": 64,
        "inputs": [{"name": "ids", "dtype": "int64", "shape": [-1], "max_shape": [4096], "range": [0, 9]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": [-1, 8], "max_shape": [4096, 8]}],
    }  # fmt: skip
    spec = parse_spec({"models": [entry]}).model("seq")
    write_config(build_model_config(spec, 0), tmp_path / "seq")
    one_sample = 4096 * 8 + 4096 * 8 * 4  # int64 ids and fp32 outputs, both at the bound
    assert python_shm_bytes(tmp_path) >= 4 * 64 * one_sample
    write_config(build_model_config(dataclasses.replace(spec, warmup=False), 0), tmp_path / "seq")
    assert python_shm_bytes(tmp_path) < 4 * 64 * one_sample  # without warm-up shapes the bound is unknown


def test_only_the_stub_lock_abort_earns_a_second_start() -> None:
    abort = (
        "I1203 model_lifecycle.cc] loading: recommender:1\n"
        "terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
        "  what():  boost::interprocess::lock_exception\n"
    )
    assert starved_stub_abort(-signal.SIGABRT, abort)
    assert not starved_stub_abort(-signal.SIGSEGV, abort)  # another crash is the repository's to explain
    assert not starved_stub_abort(1, "E1203 failed to load 'recommender': no such file\n")
    assert not starved_stub_abort(-signal.SIGABRT, "terminate called after throwing 'std::bad_alloc'\n")
    assert not starved_stub_abort(None, abort)  # still running: a timeout, not a death


def test_launcher_hides_triton_behind_the_fronts(tmp_path: Path) -> None:
    options = ServerOptions(repository=tmp_path, http_front=True, grpc_front=True, workdir=tmp_path / "w")
    server = TritonServer(options)
    assert server.triton_http_port != server.http_port
    assert server.triton_http_url == f"127.0.0.1:{server.triton_http_port}"
    assert server.triton_grpc_url == f"127.0.0.1:{server.triton_grpc_port}" != server.grpc_url
    command = server.command()
    assert f"--grpc-port={server.triton_grpc_port}" in command and "--grpc-address=127.0.0.1" in command
    # Triton's own ports answer inference only to what the fronts pass on, and shared memory only to
    # the operator: the fronts serve it from their own table (Triton never maps a client's file)
    key = server.admin_key
    operator = f"model-repository,trace,logging,shared-memory:triton-admin-key={key}"
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        assert f"{flag}=inference:triton-front-key={key}" in command
        assert f"{flag}={operator}" in command
    trusted = TritonServer(replace(options, trusted_shared_memory=True, workdir=tmp_path / "t"))
    assert f"--http-restricted-api=inference,shared-memory:triton-front-key={trusted.admin_key}" in (
        trusted.command()
    )
    # without fronts: an in-process server's client is its own process (trusted, open on loopback)...
    plain = TritonServer(ServerOptions(repository=tmp_path, workdir=tmp_path / "p"))
    assert plain.triton_http_url == plain.http_url and plain.triton_grpc_url == plain.grpc_url
    assert not any("shared-memory" in arg for arg in plain.command())
    # ...unless told otherwise (`python -m server start --no-http-front`, the container): the operator's
    keyed = TritonServer(
        ServerOptions(repository=tmp_path, workdir=tmp_path / "k", trusted_shared_memory=False)
    )
    restricted = f"model-repository,trace,logging,shared-memory:triton-admin-key={keyed.admin_key}"
    assert f"--http-restricted-api={restricted}" in keyed.command()


def test_a_grpc_front_counts_as_started_only_once_its_port_accepts(tmp_path: Path) -> None:
    """Readiness is asked over HTTP; the gRPC front is a process of its own that may listen later (a
    busy host delays its imports). ``wait_ready`` waits for this too, so that no gRPC client meets a
    refused connection from a server said to be ready (fault matrix row 46)."""
    options = ServerOptions(repository=tmp_path, http_front=True, grpc_front=True, workdir=tmp_path / "w")
    server = TritonServer(options)
    assert not server.grpc_front_listens()
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((options.host, server.grpc_port))
        listener.listen()
        assert server.grpc_front_listens()
    without = TritonServer(ServerOptions(repository=tmp_path, http_front=True, workdir=tmp_path / "n"))
    assert without.grpc_front_listens()  # no gRPC front: nothing to wait for


class Failing(http.server.BaseHTTPRequestHandler):
    """An HTTP server that answers every probe with 500 (urllib raises ``HTTPError`` for it)."""

    def do_GET(self) -> None:
        self.send_response(500)
        self.end_headers()

    def do_POST(self) -> None:
        self.do_GET()

    def log_message(self, *args: object) -> None:
        pass


def test_the_readiness_probes_take_a_refusal_or_an_http_error_for_not_ready_yet(tmp_path: Path) -> None:
    """Before tritonserver answers, its port refuses connections or another process answers with an
    error: ``wait_ready``'s probes then say "not yet" (False, None) and keep polling, never raise."""
    server = TritonServer(ServerOptions(repository=tmp_path, workdir=tmp_path / "w"))
    assert not server.is_ready() and server._settled_failures() is None  # nothing listens
    failing = http.server.ThreadingHTTPServer(("127.0.0.1", server.http_port), Failing)
    threading.Thread(target=failing.serve_forever, daemon=True).start()
    try:
        assert not server.is_ready() and server._settled_failures() is None
    finally:
        failing.shutdown()
        failing.server_close()


def test_the_grpc_front_is_given_its_message_and_idle_times(tmp_path: Path) -> None:
    """``ServerOptions`` sets the gRPC front's message time (rows 71, 75) and its idle time: a connection
    without calls closes, a stream that sent no message ends after it (row 77); by default the front's."""
    options = ServerOptions(
        repository=tmp_path,
        grpc_front=True,
        workdir=tmp_path / "w",
        grpc_front_message_timeout_s=7.0,
        grpc_front_idle_timeout_s=9.0,
    )
    times = TritonServer(options).front_times("grpc_front")
    assert times == ["--message-timeout-s=7.0", "--idle-timeout-s=9.0"]
    default = TritonServer(ServerOptions(repository=tmp_path, grpc_front=True, workdir=tmp_path / "d"))
    assert default.front_times("grpc_front") == ["--message-timeout-s=30.0", "--idle-timeout-s=300.0"]


def test_start_gives_the_fronts_the_times_its_flags_set(tmp_path: Path) -> None:
    """``python -m server start --front-…-timeout-s`` reaches ``ServerOptions`` in the ``supervise``
    process (which gets ``start``'s own flags) and each front's command line; without them, the
    defaults of ``ServerOptions``."""
    start = ["start", "--front-body-timeout-s=3", "--front-header-timeout-s=4"]
    start += ["--front-message-timeout-s=5", "--front-idle-timeout-s=6"]
    given = supervised_options(command_parser().parse_args(["supervise", *start[1:]]))
    assert (given.http_front_body_timeout_s, given.http_front_header_timeout_s) == (3.0, 4.0)
    assert (given.grpc_front_message_timeout_s, given.grpc_front_idle_timeout_s) == (5.0, 6.0)
    server = TritonServer(replace(given, workdir=tmp_path / "w", log_path=tmp_path / "server.log"))
    assert server.front_times("http_front") == ["--body-timeout-s=3.0", "--header-timeout-s=4.0"]
    assert server.front_times("grpc_front") == ["--message-timeout-s=5.0", "--idle-timeout-s=6.0"]

    default = supervised_options(command_parser().parse_args(["supervise"]))
    fields = [name for _, name, _ in FRONT_TIMEOUTS]
    defaults = ServerOptions(repository=tmp_path)
    assert [getattr(default, name) for name in fields] == [getattr(defaults, name) for name in fields]


@pytest.mark.parametrize(
    "flag",
    [
        "--front-idle-timeout-s=0",
        "--front-message-timeout-s=-1",
        "--front-deadline-s=0",
        "--front-upstream-slots=0",
    ],
)
def test_start_refuses_a_front_time_or_share_of_zero(flag: str, capsys: pytest.CaptureFixture) -> None:
    """A front time or share of 0 would end or refuse every call: ``start`` names the flag and exits 2
    before anything starts, rather than a server that answers nobody."""
    with pytest.raises(SystemExit) as exited:
        command_parser().parse_args(["start", flag])
    assert exited.value.code == 2
    name, value = flag.split("=")
    assert f"argument {name}: '{value}' is not above 0" in capsys.readouterr().err
