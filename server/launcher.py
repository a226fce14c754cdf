"""``TritonServer``: start a real tritonserver on a model repository, wait until ready, stop cleanly.
Binds 127.0.0.1 by default (2.51 has known CVEs); explicit model control with keyed admin APIs
(``server.admin``), a stub watchdog, a drain before SIGTERM, non-strict readiness (2.51 keeps it false
after one failed load); with fronts, Triton's own ports move to loopback (docs/SERVING.md)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from python_backend.atomic_files import write_text
from python_backend.dtypes import BY_TRITON
from server import ports
from server.admin import KEY_ENV, AdminError, drain, load_model, restricted_api_args
from server.admin import headers as admin_headers
from server.config_changes import mark_changed
from server.fronts.client_slots import IDLE_TIMEOUT_S, MESSAGE_TIMEOUT_S  # hpack (grpc_*) is not on the GPU
from server.fronts.process import FrontShares
from server.install import ServerError, assemble_backends, find_install
from server.ports import check_port_free, free_ports, held_by
from server.shm_private import SERVER_UMASK, make_owner_only, preload_environment
from server.start_report import StubDiedAtStartError, still_loading
from server.stubs import kill_stray_stubs
from server.watchdog import Watchdog

log = logging.getLogger(__name__)

WIDEST = 8  # bytes per element assumed for a type our dtype table lacks: never too small a region
MIB = 1 << 20
DRAIN_GRACE_S = 1.0
# After its exit timeout tritonserver still unloads and joins its stubs (seconds on a loaded host):
# SIGKILL only a server that hangs there.
EXIT_MARGIN_S = 30.0
MAX_BATCH_BYTES = 1 << 30  # the spec's bound too (exporters.schema.guards): shm per stub is 4x this
START_ATTEMPTS = 3  # starts lost to the stub-lock abort (two in a row), a stub dead at start, a port taken
STUB_LOCK_ABORT = "boost::interprocess::lock_exception"


def starved_stub_abort(returncode: int | None, log_tail: str) -> bool:
    """True when tritonserver died of 2.51's stub-lock abort: a stub starved of CPU while it started,
    a fault of the machine, not the repository, so ``start`` tries again."""
    return returncode == -signal.SIGABRT and STUB_LOCK_ABORT in log_tail


def starved_stub_load(reason: str) -> bool:
    """True when a model failed to load because a starved stub missed Triton's health check
    (``Stub process '<instance>' is not healthy``), so ``wait_ready`` loads it again."""
    return "Stub process '" in reason and "is not healthy" in reason


def remove_shm_regions(prefix: str) -> list[str]:
    """Unlink the ``/dev/shm/<prefix>*`` regions a killed stub could not remove (16 MiB or more each)."""
    removed = []
    for region in Path("/dev/shm").glob(f"{prefix}*"):
        with contextlib.suppress(OSError):
            region.unlink()
            removed.append(region.name)
    return removed


def _wait_or_kill(process: subprocess.Popen, timeout_s: float) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log.warning("%s ignored SIGTERM; killing it", Path(process.args[0]).name)
        process.kill()
        process.wait(timeout=10)


def _tee(source: IO[bytes], path: Path) -> None:
    with open(path, "wb") as log_file:
        for line in iter(source.readline, b""):
            log_file.write(line)
            log_file.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()


def python_shm_bytes(repository: Path) -> int:
    """Shared memory per Python-backend stub, sized so the largest batch never makes the region grow:
    4 × ``max_batch_size`` × one sample's input and output bytes (a variable axis at its warm-up size,
    an output's at the largest warm-up axis) + 8 MiB, for the largest model; at least 16 MiB."""
    largest = 0
    for path in Path(repository).glob("*/config.pbtxt"):
        try:
            config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        except (OSError, text_format.ParseError) as error:
            raise ServerError(f"{path}: not a valid model config: {error}") from error
        rows = max(config.max_batch_size, 1)
        warm: dict[str, list[int]] = {}
        for warmup in config.model_warmup:
            for name, tensor in warmup.inputs.items():
                known = warm.setdefault(name, list(tensor.dims))
                warm[name] = [max(a, b) for a, b in zip(known, tensor.dims, strict=False)]
        longest = max((d for dims in warm.values() for d in dims), default=1)
        per_sample = 0
        for tensor in (*config.input, *config.output):
            dims = warm.get(tensor.name, [])
            count = 1
            for axis, dim in enumerate(tensor.dims):
                count *= dim if dim > 0 else (dims[axis] if axis < len(dims) else longest)
            dtype = BY_TRITON.get(model_config_pb2.DataType.Name(tensor.data_type))
            per_sample += count * (dtype.size if dtype else WIDEST)
        if rows * per_sample > MAX_BATCH_BYTES:  # a hand-written config the spec's bound never saw
            raise ServerError(
                f"{path}: a full batch of {rows} needs {rows * per_sample // MIB} MiB of inputs and "
                f"outputs (limit {MAX_BATCH_BYTES // MIB} MiB; each Python-backend stub would map 4x "
                "that in /dev/shm); lower max_batch_size"
            )
        largest = max(largest, rows * per_sample)
    needed = 4 * largest + 8 * MIB
    return max(16 * MIB, -(-needed // MIB) * MIB)


@dataclass
class ServerOptions:
    repository: Path
    host: str = "127.0.0.1"
    http_port: int = 0  # 0: pick a free port
    grpc_port: int = 0
    metrics_port: int = 0
    load_models: list[str] = field(default_factory=list)  # empty loads "*"
    startup_timeout_s: float = 180.0
    stop_timeout_s: float = 30.0  # drain: how long admitted requests may take to finish
    exit_timeout_s: float = 30.0  # Triton's own wait after SIGTERM
    self_heal: bool = True  # run the stub watchdog
    admin_key: str | None = None  # None: a random one per start
    port_wait_s: float = 0.0  # wait this long for a port still held by a server shutting down
    log_path: Path | None = None
    workdir: Path | None = None  # backend folder and log; None: a temporary one removed on stop
    watchdog_record: Path | None = None  # None: <workdir>/watchdog.json
    extra_args: list[str] = field(default_factory=list)
    # The fronts take the public ports; Triton's own move to loopback (triton_http_url, triton_grpc_url).
    http_front: bool = False
    http_front_body_timeout_s: float = 30.0  # a body not complete by then gets 408
    http_front_header_timeout_s: float = 10.0  # headers not complete this long after their first byte: 408
    grpc_front: bool = False
    grpc_front_message_timeout_s: float = MESSAGE_TIMEOUT_S  # a message not whole by then ends its call
    grpc_front_idle_timeout_s: float = IDLE_TIMEOUT_S  # then a connection without calls closes
    front_shares: FrontShares = field(default_factory=FrontShares)  # docs/SERVING.md, client shares
    # Whether Triton may map a client's /dev/shm file, with 2.51's faults (docs/SERVING.md, Shared
    # memory); None: only without fronts (an in-process server whose client started it).
    trusted_shared_memory: bool | None = None
    echo_log: bool = False  # copy the server's log to stdout too (the container's log)


class TritonServer:
    """A running tritonserver process; ``with TritonServer(options) as server: server.http_url``."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.install = find_install()
        self.process: subprocess.Popen | None = None
        self._owns_workdir = options.workdir is None
        self._workdir = Path(options.workdir or tempfile.mkdtemp(prefix="tritonserver-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = options.log_path or self._workdir / "server.log"
        self.base_ports = ports.reserve()  # with a port base every port comes from it (server.ports)
        self._pick_ports()
        self.http_front: subprocess.Popen | None = None
        self.grpc_front: subprocess.Popen | None = None
        self.shm_prefix = f"tb{os.getpid()}_{self.http_port}_"  # this server's Python-backend regions
        self.failed_models: dict[str, str] = {}  # name -> reason, for models that did not load
        self.admin_key = options.admin_key or secrets.token_urlsafe(24)
        self.watchdog: Watchdog | None = None
        self.watchdog_path = options.watchdog_record or self._workdir / "watchdog.json"
        self.drain_finished_at: float | None = None  # time.monotonic() when stop()'s drain completed
        self.server_pid_file = self._workdir / "tritonserver.pid"  # the tritonserver the fronts follow
        # the models whose served config changed, for the fronts (server.config_changes, row 79)
        self.config_changes_file = self._workdir / "config_changes"

    def _pick_ports(self) -> None:
        """The ports given, then the port base's, else ones the OS picks free now; and their URLs."""
        options, host = self.options, self.options.host
        given = [p for p in (options.http_port, options.grpc_port, options.metrics_port) if p]
        http, grpc, metrics, own_http, own_grpc = (
            self.base_ports.all()
            if self.base_ports
            else free_ports([host] * 3 + ["127.0.0.1"] * 2, taken=given)
        )
        self.http_port = options.http_port or http
        self.triton_http_port = own_http if options.http_front else self.http_port
        self.grpc_port = options.grpc_port or grpc
        self.triton_grpc_port = own_grpc if options.grpc_front else self.grpc_port
        self.metrics_port = options.metrics_port or metrics
        picked = set() if self.base_ports else {http, grpc, metrics, own_http, own_grpc} - set(given)
        self.picked_ports = picked  # new ones replace them when another process binds one first
        self.http_url = f"{host}:{self.http_port}"
        self.grpc_url = f"{host}:{self.grpc_port}"
        self.metrics_url = f"http://{host}:{self.metrics_port}/metrics"
        # Triton's own endpoints: the fronts' upstreams where there are fronts
        self.triton_http_url = f"{'127.0.0.1' if options.http_front else host}:{self.triton_http_port}"
        self.triton_grpc_url = f"{'127.0.0.1' if options.grpc_front else host}:{self.triton_grpc_port}"

    def _lost_picked_ports(self, error: ServerError) -> set[int]:
        """The OS-picked ports another process bound first, as the port check or a log names them
        (anywhere in it: Triton's may be far above its tail); new ports cure that. A port the user gave
        or a port base holds is never among them."""
        texts = [str(error)]
        for path in [self.log_path, *map(self._front_log, self.fronts)]:
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace"))
        reports = [line for text in texts for line in text.splitlines() if "already in use" in line.lower()]
        return {int(number) for line in reports for number in re.findall(r"\d+", line)} & self.picked_ports

    def _ports_held(self) -> bool:
        """Whether the HTTP and gRPC ports listen in tritonserver or its fronts, not in another process."""
        ports = {self.http_port, self.triton_http_port, self.grpc_port, self.triton_grpc_port}
        return held_by(ports, [p for p in (self.pid, *(f.pid for f in self.fronts)) if p is not None])

    @property
    def trusts_shared_memory(self) -> bool:
        """Whether Triton maps clients' shared-memory files (``ServerOptions.trusted_shared_memory``)."""
        trusted = self.options.trusted_shared_memory
        return not (self.options.http_front or self.options.grpc_front) if trusted is None else trusted

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        options = self.options
        return [
            str(self.install.binary),
            f"--model-repository={Path(options.repository).resolve()}",
            f"--http-address={'127.0.0.1' if options.http_front else options.host}",
            f"--http-port={self.triton_http_port}",
            f"--grpc-address={'127.0.0.1' if options.grpc_front else options.host}",
            f"--grpc-port={self.triton_grpc_port}",
            f"--metrics-address={options.host}",
            f"--metrics-port={self.metrics_port}",
            "--model-control-mode=explicit",
            "--strict-readiness=false",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            f"--exit-timeout-secs={int(options.exit_timeout_s)}",
            "--exit-on-error=false",  # one model that fails to load must not take the others down
            # Every config.pbtxt we write is complete; auto-completing a Python-backend model starts a
            # stub per load only to read the model file (a torch stage's imports torch for it).
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-default-byte-size={python_shm_bytes(options.repository)}",
            f"--backend-config=python,shm-growth-byte-size={16 * MIB}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--backend-directory={assemble_backends(self.install, self._workdir / 'backends')}",
            *(f"--load-model={m}" for m in options.load_models or ["*"]),
            *restricted_api_args(
                self.admin_key, options.http_front, options.grpc_front, self.trusts_shared_memory
            ),
            *options.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """The venv's packages on ``PYTHONPATH`` (the stub does not see the venv), the wheel's libraries
        on ``LD_LIBRARY_PATH``, and the library keeping the stubs' regions private (``shm_private``)."""
        site = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        paths = [*site, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        libs = [
            *map(str, self.install.library_dirs),
            *filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)),
        ]
        added = {
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            "LD_LIBRARY_PATH": os.pathsep.join(libs),
        }
        return preload_environment(self._workdir, {**os.environ, **added})

    def start(self) -> TritonServer:
        """Launch and block until ready, again after the stub-lock abort, a stub dead at start or a port
        taken first; a dead server starts again with the same ports, key, region prefix and watchdog
        history (supervisor)."""
        restart = bool(self.running_fronts)  # a restart keeps the fronts answering (fault matrix row 46)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._launch()
                self.wait_ready()
                break
            except ServerError as error:
                returncode = self.process.poll() if self.process is not None else None
                died = isinstance(error, StubDiedAtStartError)
                starved = died or starved_stub_abort(returncode, self.log_tail())
                lost = set() if restart else self._lost_picked_ports(error)  # a restart keeps its ports
                (self.reap if restart else self.stop)()
                if not (starved or lost) or attempt == START_ATTEMPTS:
                    raise
                if lost:
                    log.warning("port %s, picked for tritonserver, was taken by another process; starting "
                                "again on new ports (%d of %d)", ", ".join(map(str, sorted(lost))),
                                attempt + 1, START_ATTEMPTS)  # fmt: skip
                    self._pick_ports()
                elif died:
                    log.warning("a stub died before its first message and tritonserver waits on it for "
                                "good; starting it again (%d of %d):\n%s", attempt + 1, START_ATTEMPTS,
                                error)  # fmt: skip
                else:
                    log.warning(
                        "tritonserver aborted while its stubs started (a starved CPU); starting it again"
                    )
            except BaseException:
                self.stop()
                raise
        make_owner_only(self.shm_prefix)  # no other user may map the stubs' IPC (server.shm_private)
        if self.options.self_heal and self.pid is not None:
            history = self.watchdog.state if self.watchdog is not None else None  # a restart keeps it
            watched = (self.pid, self.triton_http_url, self.admin_key, self.watchdog_path)
            self.watchdog = Watchdog(*watched, state=history, metrics_url=self.metrics_url).start()
        log.info("tritonserver ready (pid %s) http=%s grpc=%s", self.pid, self.http_url, self.grpc_url)
        return self

    def _launch(self) -> None:
        if not Path(self.options.repository).is_dir():
            raise ServerError(f"model repository {self.options.repository} does not exist (run `make repo`)")
        public = {self.metrics_port}  # a port our own running front holds stays with it
        public |= {self.http_port} if self.http_front is None or self.http_front.poll() is not None else set()
        public |= {self.grpc_port} if self.grpc_front is None or self.grpc_front.poll() is not None else set()
        checked = [(self.options.host, port) for port in sorted(public)]
        checked += [("127.0.0.1", self.triton_http_port)] if self.options.http_front else []
        checked += [("127.0.0.1", self.triton_grpc_port)] if self.options.grpc_front else []
        ports.hold(self.base_ports)
        for host, port in checked:
            named = self.base_ports.describe(port) if self.base_ports else str(port)
            check_port_free(host, port, self.options.port_wait_s, named)
        command = self.command()
        mark_changed(self.config_changes_file)  # the fronts held the last server's configs (row 79)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE if self.options.echo_log else log_file,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                umask=SERVER_UMASK,
            )
        if self.options.echo_log:
            threading.Thread(target=_tee, args=(self.process.stdout, self.log_path), daemon=True).start()
        write_text(self.server_pid_file, f"{self.pid}\n")
        if self.options.http_front and self.http_front not in self.running_fronts:
            self.http_front = self._launch_front("http_front", self.http_port, self.triton_http_url)
        if self.options.grpc_front and self.grpc_front not in self.running_fronts:
            self.grpc_front = self._launch_front("grpc_front", self.grpc_port, self.triton_grpc_url)

    def front_times(self, front: str) -> list[str]:
        """The front's time flags (fault matrix rows 6, 13; the gRPC front's 71, 75, 77)."""
        options = self.options
        times = (
            {"body": options.http_front_body_timeout_s, "header": options.http_front_header_timeout_s}
            if front == "http_front"
            else {"message": options.grpc_front_message_timeout_s, "idle": options.grpc_front_idle_timeout_s}
        )
        return [f"--{name}-timeout-s={seconds}" for name, seconds in times.items()]

    @property
    def fronts(self) -> list[subprocess.Popen]:
        return [front for front in (self.http_front, self.grpc_front) if front is not None]

    @property
    def running_fronts(self) -> list[subprocess.Popen]:
        """The fronts still running: across a restart they keep their ports."""
        return [front for front in self.fronts if front.poll() is None]

    def _launch_front(self, front: str, port: int, upstream: str) -> subprocess.Popen:
        """Start ``server.fronts.<front>`` on the public ``port``; the admin key travels in its
        environment, never on its command line (readable in ``/proc``)."""
        command = [
            sys.executable, "-m", f"server.fronts.{front}", f"--listen={self.options.host}:{port}",
            f"--upstream={upstream}", f"--server-pid-file={self.server_pid_file}",
            f"--owner-pid={os.getpid()}", f"--shm-prefix={self.shm_prefix}",
            f"--config-changes={self.config_changes_file}",
            *self.options.front_shares.flags(), *self.front_times(front),
            *(["--trusted-shared-memory"] if self.trusts_shared_memory else []),
        ]  # fmt: skip
        environment = {**os.environ, KEY_ENV: self.admin_key}
        with open(self.log_path.with_name(f"{front}.log"), "wb") as log_file:
            return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=environment)

    def _front_log(self, front: subprocess.Popen) -> Path:
        """Where a front writes: its module's name beside the server's log."""
        return self.log_path.with_name(f"{front.args[2].rsplit('.', 1)[1]}.log")

    def _log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self._log_lines()[-lines:]) if self.log_path.exists() else "(no server log)"

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except (OSError, http.client.HTTPException):  # not HTTP: not ours (urllib's errors are OSErrors)
            return False

    def model_log_lines(self, name: str, limit: int = 12) -> list[str]:
        """The server log's lines about model ``name`` (Triton quotes model names: ``'name'``)."""
        return [line for line in self._log_lines() if f"'{name}'" in line or f"{name}:" in line][-limit:]

    def _settled_failures(self) -> dict[str, str] | None:
        """``{name: reason}`` of the models that failed to load once every model is READY or
        UNAVAILABLE; None while any is still loading or the server does not answer."""
        request = urllib.request.Request(
            f"http://{self.triton_http_url}/v2/repository/index",
            data=b"{}",
            method="POST",
            headers=admin_headers(self.admin_key),
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                index = json.loads(response.read())
        except (OSError, ValueError):
            return None
        if not index or any(m.get("state") not in ("READY", "UNAVAILABLE") for m in index):
            return None
        return {m["name"]: m.get("reason", "") for m in index if m.get("state") == "UNAVAILABLE"}

    def _load_starved_again(self, failed: dict[str, str]) -> dict[str, str]:
        """Load each model of ``failed`` whose stub was found unhealthy again, up to ``START_ATTEMPTS``
        loads in all; the models still failed, with their last reason (fault matrix row 64)."""
        client = httpclient.InferenceServerClient(
            self.triton_http_url, network_timeout=self.options.startup_timeout_s
        )
        remaining = {}
        for name, reason in failed.items():
            for attempt in range(2, START_ATTEMPTS + 1):
                if not starved_stub_load(reason):
                    break
                log.warning("model %s failed to load: %s; loading it again (%d of %d)", name, reason.strip(),
                            attempt, START_ATTEMPTS)  # fmt: skip
                try:
                    log.info(load_model(client, self.admin_key, name, changes=self.config_changes_file))
                    reason = ""
                except AdminError as error:
                    reason = str(error)
            if reason:
                remaining[name] = reason
        return remaining

    def describe_failures(self) -> str:
        """One paragraph per failed model: its reason and its own log lines."""
        return "\n".join(
            f"model {name!r} failed to load: {reason}\n    "
            + ("\n    ".join(self.model_log_lines(name)) or "(no log lines name it)")
            for name, reason in sorted(self.failed_models.items())
        )

    def grpc_front_listens(self) -> bool:
        """Whether the gRPC front (where there is one) accepts connections yet: readiness is asked over
        HTTP, and a gRPC client must not meet ``Connection refused`` after it (fault matrix row 46)."""
        if not self.options.grpc_front:
            return True
        try:
            with socket.create_connection((self.options.host, self.grpc_port), timeout=2):
                return True
        except OSError:
            return False

    def wait_ready(self) -> None:
        """Until ready, or until every model has settled with some failed (named; the rest serve);
        ``ServerError`` if the process or a front dies or the timeout passes."""
        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with {self.process.returncode}; log:\n{self.log_tail()}"
                )
            for front in self.fronts:
                if front.poll() is not None:
                    front_log = self._front_log(front)
                    text = front_log.read_text(errors="replace")
                    raise ServerError(f"{front_log.stem} exited with {front.returncode}:\n{text[-2000:]}")
            if self.grpc_front_listens():
                ready = self.is_ready() and self.process is not None and self.process.poll() is None
                ready = ready and self._ports_held()  # not another process's answer on a picked port
                failed = self._settled_failures()
                if ready or failed:
                    self.failed_models = self._load_starved_again(failed or {})
                    if self.failed_models:
                        log.error("%s", self.describe_failures())
                    return
            time.sleep(0.25)
        waiting, died = still_loading(self.pid, self._log_lines())
        raise (StubDiedAtStartError if died else ServerError)(
            f"tritonserver not ready after {self.options.startup_timeout_s:.0f}s; "
            + (f"{waiting}\n" if waiting else "")
            + f"log:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Drain through Triton's own endpoint (while the front still forwards), then ``terminate``."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.process is not None and self.process.poll() is None and self.is_ready():
            try:
                drain(self.triton_http_url, self.admin_key, self.options.stop_timeout_s, self.pid)
                self.drain_finished_at = time.monotonic()
            except Exception as error:  # still stop; say what was not drained
                log.warning("drain incomplete, stopping anyway: %s", error)
            # a request on its way when the drain ended is refused (NOT_FOUND) in this grace; after
            # SIGTERM, 2.51's gRPC frontend would answer it CANCELLED instead
            time.sleep(DRAIN_GRACE_S)
        self.terminate()

    def terminate(self) -> None:
        """``stop()`` without the drain: the fronts, the server (``reap``), its ports and work folder."""
        self.stop_fronts()
        self.reap()
        ports.release(self.base_ports)
        if self._owns_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def reap(self) -> None:
        """SIGTERM the server (SIGKILL ``EXIT_MARGIN_S`` past its exit timeout), then remove its stray
        stubs and regions; the fronts stay, answering 503 / ``UNAVAILABLE`` (fault matrix row 46)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            _wait_or_kill(self.process, self.options.exit_timeout_s + EXIT_MARGIN_S)
        if self.process is not None:
            kill_stray_stubs(self.shm_prefix)
            remove_shm_regions(self.shm_prefix)

    def stop_fronts(self) -> None:
        """Each front stops listening, finishes its requests and closes its kept-alive upstream
        connections, which would otherwise hold Triton's exit."""
        running = self.running_fronts
        for front in running:
            front.terminate()
        for front in running:
            _wait_or_kill(front, self.options.stop_timeout_s)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
