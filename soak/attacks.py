"""``make soak``'s attack faults: the request kinds fault matrix rows 37–46 and 78 close, sent among the
load, each to get its one documented answer with no stub lost. The share attacks (rows 38 and 78) come
from an address of their own (``ATTACKER``), so the load's share is not theirs, and are judged by
Triton's own count of waiting requests (``PendingWatch``); ``kill -9`` of tritonserver is an outage of
every model, excused only with the fronts' restart answers."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import tritonclient.utils.shared_memory as shared_memory
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client.connection import protocol_module
from client.infer import make_inputs
from client.shm import system_region
from server.fronts import h2c
from server.fronts.client_slots import SlotLimits
from server.watchdog import model_progress
from soak import raw_grpc
from soak.faults import ENCODER, Soak, overflowing_request, registration_refused
from soak.other_uid import SERVICE
from soak.raw_http import Request, address, exchange, hang_ups
from soak.report import SERVER_KILLED, Outage

log = logging.getLogger(__name__)
HUGE = 2**62
NEVER_ANSWERED = f"declares shape [{HUGE}, 0]: a dimension above 2147483647 fits no model"
ANSWER_WITHIN_S = 60.0  # a hang guard, not a latency bound: unanswered by then counts as never
GARBAGE_FIRST_MESSAGES = (b"\xff\xff\xff\xff", b"\x0a\xff")
NOT_A_REQUEST = "ModelStreamInfer: not a valid ModelInferRequest message"
HALF_OPEN = 4  # connections per fault; half send the HTTP/2 preface and stop
HALF_OPEN_CLOSED_WITHIN_S = 30.0  # the front's handshake timeout is 10 s; grpc's own default, 60 s
# the fronts' answers while tritonserver restarts ("fronts across restarts"), and models not yet loaded
RESTART_GAP = (
    "tritonserver is not reachable", "tritonserver did not answer", "StatusCode.UNAVAILABLE",
    "Request for unknown model", "is not ready",
)  # fmt: skip
RACE_S = 3.0  # per protocol: brief, the fault matrix runs it longer
CUT_SHORT = "cut short after registration"  # the front's refusal of a region cut short (row 45)
# the statuses it comes with, as tritonclient gives them: HTTP 400, gRPC INVALID_ARGUMENT (row 45)
BAD_REQUEST = frozenset({"400", str(grpc.StatusCode.INVALID_ARGUMENT)})
READ_BACK_WITHIN_S = 5.0  # a row read back waits this long for its file to be restored
ROW_FLOATS = 16  # trivial's x and y: FP32 [1, 16]
ROW = 4 * ROW_FLOATS
UNWRITTEN = np.full((1, ROW_FLOATS), -1.0, np.float32)  # no answer of the race's: 2 * 2.5 or 2 * 0
READ_EVERY_S = 0.05  # how often a ``PendingWatch`` reads Triton's metrics
RESTART_WITHIN_S = 300.0  # the supervisor's backoff plus a start on a busy host
# the share attacks' own loopback address (all of 127.0.0.0/8 is), so the load's share is never theirs
ATTACKER = "127.0.0.9"
SHARES = SlotLimits()  # the fronts' shares, as the soak serves them
SHARE_REFUSAL = "requests waiting on tritonserver, its share"  # a share's 429 / RESOURCE_EXHAUSTED (row 38)
WAVES = 5  # bursts of a share's worth each: while the first is held in Triton, the next are refused
HANG_UP_AFTER_S = 0.2  # a wave's connections are closed this long after it was sent, answered or not
ENCODER_TOKENS = 64  # tokens of each request's rows (fewer if the encoder takes fewer)
# rows × tokens of each request (rows up to the encoder's max_batch_size): so much work that a wave still
# waits in Triton when the next comes, and a front that freed their slots at once lets Triton hold
# several waves: the waiting count then exceeds the share (rows 38 and 78)
REQUEST_TOKENS = 512
# a share attack's answers, and what each must say: served, or refused beyond the share (rows 38, 78)
SHARE_ANSWERS = {200: "", "OK": "", 429: SHARE_REFUSAL, "RESOURCE_EXHAUSTED": SHARE_REFUSAL}


def encoder_json(inputs: tuple[str, ...], shape: list[int], data: list[int]) -> Request:
    """An HTTP inference to the encoder in JSON, every input of ``shape`` holding ``data``."""
    tensors = [{"name": n, "shape": shape, "datatype": "INT64", "data": data} for n in inputs]
    body = json.dumps({"inputs": tensors}).encode()
    return Request("POST", f"/v2/models/{ENCODER}/infer", [("Content-Type", "application/json")], body)


def unanswered_shapes(soak: Soak) -> None:
    """``[2^62, 0]`` over HTTP, gRPC and a stream: refused naming the input, no stub lost (rows 37–39)."""
    inputs = soak.input_names(ENCODER)
    if inputs is None:
        return
    before = soak.stub_pids(ENCODER)
    answer = exchange(address(soak.server.http_url), encoder_json(inputs, [HUGE, 0], []), ANSWER_WITHIN_S)
    http_right = answer.status == 400 and NEVER_ANSWERED in answer.body.decode("utf-8", "replace")
    request = overflowing_request(ENCODER, inputs, (HUGE, 0))
    unary_right = soak.invalid_argument(request, NEVER_ANSWERED)
    with grpc.insecure_channel(soak.server.grpc_url) as channel:
        service = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            answers = list(service.ModelStreamInfer(iter([request]), timeout=ANSWER_WITHIN_S))
            stream_right = len(answers) == 1 and NEVER_ANSWERED in answers[0].error_message
        except grpc.RpcError as error:
            log.error("[2^62, 0] on a stream: %s", error)
            stream_right = False
    alive = before <= soak.stub_pids(ENCODER)
    checks = {"HTTP 400": http_right, "gRPC INVALID_ARGUMENT": unary_right, "stream": stream_right}
    for what, right in checks.items():
        soak.report.check(f"[2^62, 0] shapes, {what} (refused, no stub lost)").record(right and alive)


def garbage_stream(soak: Soak) -> None:
    """A stream whose first message is garbage: closed with INVALID_ARGUMENT, not hung (row 40)."""
    garbage = soak.rng.choice(GARBAGE_FIRST_MESSAGES)
    with grpc.insecure_channel(soak.server.grpc_url) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        try:
            list(stream(iter([garbage]), timeout=ANSWER_WITHIN_S))
            right = False
        except grpc.RpcError as error:
            invalid = error.code() == grpc.StatusCode.INVALID_ARGUMENT
            right = invalid and NOT_A_REQUEST in (error.details() or "")
    soak.report.check("garbage first stream messages (INVALID_ARGUMENT)").record(right)


def half_open_http2(soak: Soak) -> None:
    """Half-open HTTP/2 connections to the gRPC front: each closed by the front (row 41)."""
    connections = []
    for number in range(HALF_OPEN):
        sock = socket.create_connection(address(soak.server.grpc_url), timeout=ANSWER_WITHIN_S)
        if number % 2:
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the preface, no SETTINGS
        connections.append(sock)
    check = soak.report.check("half-open HTTP/2 connections (closed by the gRPC front)")
    threading.Thread(target=_watch_closed, args=(connections, check.record), daemon=True).start()


def _watch_closed(connections: list[socket.socket], record: Callable[[bool], None]) -> None:
    deadline = time.monotonic() + HALF_OPEN_CLOSED_WITHIN_S
    for sock in connections:
        closed = False
        while not closed and time.monotonic() < deadline:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed = sock.recv(4096) == b""
            except TimeoutError:
                break
            except OSError:
                closed = True
        sock.close()
        record(closed)


def shared_memory_identity(soak: Soak) -> None:
    """A stub's region hard-linked (refused, row 43) or renamed over a client's (row 44)."""
    name = soak.stub_region()
    if name is None:
        return
    region = Path("/dev/shm") / name
    before = soak.stub_pids()
    with soak.clients() as clients:
        for protocol, client in clients.items():
            name = f"soak_link_{protocol}_{os.getpid()}"
            link = Path("/dev/shm") / name
            os.link(region, link)
            try:
                linked = registration_refused(client, protocol, name, "has 2 links")
            finally:
                link.unlink()
            soak.report.check("hard links to a stub's region (refused)").record(linked)
            own_read = renamed_over(client, protocol, region)
            soak.report.check("stub regions renamed over a client's (its own file read)").record(own_read)
    alive = before <= soak.stub_pids()
    soak.report.check("shared-memory identity attacks (no stub lost)").record(alive)


def trivial_output(client: object, protocol: str, values: np.ndarray) -> np.ndarray:
    """``trivial``'s output for ``values`` sent inline: what a region holding them must be answered with."""
    return client.infer("trivial", make_inputs(protocol_module(protocol), {"x": values})).as_numpy("y")


# (client, protocol, region name) -> a request reading the region, returning its output
RegionRead = Callable[[object, str, str], Callable[[], np.ndarray]]


def from_region(client: object, protocol: str, name: str) -> Callable[[], np.ndarray]:
    """A ``trivial`` request whose input is the first row of the registered region ``name``."""
    tensor = protocol_module(protocol).InferInput("x", [1, ROW_FLOATS], "FP32").set_shared_memory(name, ROW)
    return lambda: client.infer("trivial", [tensor]).as_numpy("y")


def renamed_over(client: object, protocol: str, region: Path, read: RegionRead = from_region) -> bool:
    """A stub's ``region`` renamed over a client's registered one (row 44): right only when answered from
    the client's own file; ``read`` builds the request (a test hands in wrong ones)."""
    values = np.full((1, ROW_FLOATS), 3.5, np.float32)
    with system_region(client, 4096, f"soak_renamed_{protocol}_{os.getpid()}") as (name, handle):
        shared_memory.set_shared_memory_region(handle, [values])
        expected = trivial_output(client, protocol, values)
        region.rename(Path("/dev/shm") / name)
        try:
            verdict = judge(read(client, protocol, name), [expected])
        finally:
            (Path("/dev/shm") / name).rename(region)
            Path(f"/dev/shm/{name}").write_bytes(b"\0" * 4096)  # the client's file, for its cleanup
    if verdict.wrong:
        log.error("stub region renamed over a client's, over %s: %s", protocol, verdict.wrong)
    return verdict.answered


def into_region(
    client: object, protocol: str, name: str, descriptor: int, size: int
) -> Callable[[], np.ndarray]:
    """A ``trivial`` request through the region, its output read through ``descriptor`` (a mapping read
    past a cut file's end is a SIGBUS)."""
    module = protocol_module(protocol)
    tensor = module.InferInput("x", [1, ROW_FLOATS], "FP32").set_shared_memory(name, ROW)
    output = module.InferRequestedOutput("y")
    output.set_shared_memory(name, ROW, offset=size - ROW)  # InferRequestedOutput's returns None

    def request() -> np.ndarray:
        client.infer("trivial", [tensor], outputs=[output])
        deadline = time.monotonic() + READ_BACK_WITHIN_S  # a file cut short is restored soon after
        row = os.pread(descriptor, ROW, size - ROW)
        while len(row) < ROW and time.monotonic() < deadline:
            row = os.pread(descriptor, ROW, size - ROW)
        return np.frombuffer(row, np.float32).reshape(1, -1)

    return request


@dataclass(frozen=True)
class Verdict:
    """A request answered right, refused by the front as the fault matrix allows, or ``wrong``."""

    answered: bool = False
    refused: bool = False
    wrong: str = ""


def judge(
    call: Callable[[], np.ndarray], rights: Sequence[np.ndarray], refusal: str | None = None
) -> Verdict:
    """Answered when ``call``'s output is one of ``rights``; refused on a bad request saying ``refusal``."""
    try:
        output = call()
    except Exception as error:  # whatever it is, the request got it instead of an answer
        if (
            refusal is not None
            and isinstance(error, InferenceServerException)
            and error.status() in BAD_REQUEST
            and refusal in (error.message() or "")
        ):
            return Verdict(refused=True)
        return Verdict(wrong=f"{type(error).__name__}: {error}")
    if any(np.array_equal(output, right) for right in rights):
        return Verdict(answered=True)
    return Verdict(wrong=f"answered {output.tolist()}, none of {[right.tolist() for right in rights]}")


def server_kept(soak: Soak, pid: int | None, stubs: set[int]) -> bool:
    """Whether tritonserver is still the process ``pid`` and every stub of ``stubs`` still lives."""
    return soak.server.pid == pid and stubs <= soak.stub_pids()


def truncate_race(soak: Soak) -> None:
    """A client's region cut short and restored while its requests use it (row 45); the server kept."""
    pid, before = soak.server.pid, soak.stub_pids()
    answers_right = True
    with soak.clients() as clients:
        for protocol, client in clients.items():
            answers_right &= not race_truncation(client, protocol, f"soak_cut_{protocol}_{os.getpid()}").wrong
    soak.report.check("regions truncated while in use (answered or refused, server kept)").record(
        answers_right and server_kept(soak, pid, before)
    )


@dataclass
class Race:
    """How a truncation race went: answered, refused by the front, and what else any request got."""

    answered: int = 0
    refused: int = 0
    wrong: list[str] = field(default_factory=list)

    def count(self, verdict: Verdict, protocol: str) -> None:
        self.answered += verdict.answered
        self.refused += verdict.refused
        if verdict.wrong:
            self.wrong.append(f"{protocol}: {verdict.wrong}")


def race_rights(client: object, protocol: str, values: np.ndarray) -> list[np.ndarray]:
    """``trivial``'s output for the region's ``values`` (read before a cut) or for zeros (after one)."""
    return [trivial_output(client, protocol, v) for v in (values, np.zeros_like(values))]


def race_truncation(client: object, protocol: str, name: str, seconds: float = RACE_S) -> Race:
    """Cut ``/dev/shm/name`` short and restore it for ``seconds`` while requests run through it (row 45);
    every other request runs on the whole file with its output row preset, so an unwritten output shows."""
    size = 1 << 16
    values = np.full((1, ROW_FLOATS), 2.5, np.float32)
    rights = race_rights(client, protocol, values)
    race = Race()
    with system_region(client, size, name) as (_, handle):
        shared_memory.set_shared_memory_region(handle, [values])
        descriptor = os.open(f"/dev/shm/{name}", os.O_RDWR)
        request = into_region(client, protocol, name, descriptor, size)
        stop, whole, cutting = threading.Event(), threading.Event(), threading.Lock()

        def cut_and_restore() -> None:
            while not stop.is_set():
                if whole.is_set():  # a request wants the file whole: no new cut until it is answered
                    time.sleep(0.001)
                    continue
                with cutting:
                    os.ftruncate(descriptor, 0)
                    os.ftruncate(descriptor, size)
                    os.pwrite(descriptor, values.tobytes(), 0)  # the input back, for the whole-file requests

        cutter = threading.Thread(target=cut_and_restore, daemon=True)
        try:
            cutter.start()
            deadline, racing = time.monotonic() + seconds, True
            while time.monotonic() < deadline:
                if racing:
                    race.count(judge(request, rights, CUT_SHORT), protocol)
                else:
                    whole.set()
                    try:
                        with cutting:
                            os.pwrite(descriptor, UNWRITTEN.tobytes(), size - ROW)
                            race.count(judge(request, rights[:1]), protocol)
                    finally:
                        whole.clear()
                racing = not racing
        finally:
            stop.set()
            if cutter.is_alive():
                cutter.join(timeout=10)
            os.close(descriptor)
    log.info(
        "truncate race over %s: %d answered, %d refused by the front", protocol, race.answered, race.refused
    )
    for wrong in race.wrong:
        log.error("truncate race: %s", wrong)
    return race


def kill_server(soak: Soak) -> None:
    """``kill -9`` of tritonserver; waits until the supervisor serves again, for the next fault."""
    supervisor, pid = soak.supervisor, soak.server.pid
    if supervisor is None or pid is None:
        return
    deaths = len(supervisor.record.history)
    at, epoch = time.monotonic(), time.time()
    os.kill(pid, signal.SIGKILL)
    models = sorted({*soak.models, *soak.stub_models})
    outages = [Outage(SERVER_KILLED, model, at, epoch, RESTART_GAP) for model in models]
    soak.report.outages.extend(outages)
    soak.report.server_kills.append(pid)
    log.info("killed tritonserver (pid %s)", pid)
    deadline = time.monotonic() + RESTART_WITHIN_S
    while time.monotonic() < deadline:
        history = supervisor.record.history
        if len(history) > deaths and history[-1].get("serving_again_at"):
            recovered = history[-1]["serving_again_at"] + time.monotonic() - time.time()
            for outage in outages:
                outage.detected_at, outage.recovered_at = at, recovered
            log.info("tritonserver serving again (pid %s -> %s)", pid, soak.server.pid)
            return
        time.sleep(0.5)
    log.error("tritonserver not serving again %.0f s after the kill", RESTART_WITHIN_S)


def pending(metrics_url: str, model: str) -> float:
    """The requests ``model`` has waiting in Triton now (those its instances run are not counted): what
    the fronts let reach Triton, whatever the clients' timing."""
    with urllib.request.urlopen(metrics_url, timeout=5) as answer:
        return model_progress(answer.read().decode(errors="replace")).get(model, (0.0, 0.0))[0]


class PendingWatch:
    """Reads Triton's metrics every ``READ_EVERY_S`` in a thread while a block runs: the most ``model``
    requests Triton had waiting, and how many reads answered (so an empty watch is not a pass)."""

    def __init__(self, metrics_url: str, model: str) -> None:
        self.metrics_url, self.model, self.most, self.reads = metrics_url, model, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PendingWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def read_again(self, guard_s: float = 60.0) -> None:
        """Wait for a read begun after this call (``guard_s``: a hang guard, not a bound), so what the block
        left waiting is counted however short it was."""
        wanted, give_up = self.reads + 2, time.monotonic() + guard_s  # the read under way began before
        while self.reads < wanted and time.monotonic() < give_up:
            time.sleep(READ_EVERY_S)

    def _watch(self) -> None:
        while not self._stop.wait(READ_EVERY_S):
            try:
                waiting = pending(self.metrics_url, self.model)
            except OSError:  # urllib's errors included: this read is lost, the next one tells
                continue
            self.reads += 1
            self.most = max(self.most, waiting)


def encoder_quiet(metrics_url: str) -> None:
    """Wait until Triton has none of the encoder's requests waiting (``ANSWER_WITHIN_S``: a hang guard)."""
    quiet_by = time.monotonic() + ANSWER_WITHIN_S
    while time.monotonic() < quiet_by:
        with contextlib.suppress(OSError):  # no read this time: the next one tells
            if pending(metrics_url, ENCODER) == 0:
                return
        time.sleep(0.1)


# a share attack: (the encoder's input names, each input's shape [rows, tokens], a read of Triton's
# count to call after each wave) -> whether every answer was right
ShareAttack = Callable[[tuple[str, ...], list[int], Callable[[], None]], bool]


def within_share(soak: Soak, what: str, share: int, attack: ShareAttack) -> None:
    """Record ``what`` (when the encoder is served): right when ``attack`` got only right answers, Triton
    never had more than ``share`` of the encoder's requests waiting (and was read at all), and the
    server was kept. It begins and ends with none of the encoder's requests waiting in Triton."""
    inputs = soak.input_names(ENCODER)
    if inputs is None:
        return
    config = soak.client.get_model_config(ENCODER)
    longest = json.loads(config.get("parameters", {}).get("input_max_shapes", {}).get("string_value", "{}"))
    tokens = min([ENCODER_TOKENS, *(dims[-1] for dims in longest.values())])
    shape = [max(1, min(config.get("max_batch_size", 1), REQUEST_TOKENS // tokens)), tokens]
    pid, stubs = soak.server.pid, soak.stub_pids()
    encoder_quiet(soak.server.metrics_url)  # none waiting first: what is counted is this run's
    with PendingWatch(soak.server.metrics_url, ENCODER) as watch:
        answers_right = attack(inputs, shape, watch.read_again)
        watch.read_again()
    encoder_quiet(soak.server.metrics_url)  # and none after: the next fault finds no queue of theirs
    soak.report.waited(what, watch.most, share, shape)
    within = watch.reads > 0 and watch.most <= share
    if not within:
        log.error("%s: Triton had %g waiting (share %d, %d reads)", what, watch.most, share, watch.reads)
    soak.report.check(what).record(answers_right and within and server_kept(soak, pid, stubs))


def share_answer(status: int | str, text: str) -> bool:
    """Whether a share attack may be answered ``status`` (HTTP's, or gRPC's name) saying ``text``."""
    return status in SHARE_ANSWERS and SHARE_ANSWERS[status] in text


def hung_up_inferences(soak: Soak) -> None:
    """Waves of encoder inferences over HTTP from ``ATTACKER``, a share's worth each, every connection
    closed once sent (fault matrix row 38): a forwarded inference keeps its slot until Triton answers."""
    share, front = SHARES.per_address, address(soak.server.http_url)

    def attack(inputs: tuple[str, ...], shape: list[int], read: Callable[[], None]) -> bool:
        raw = encoder_json(inputs, shape, [1] * shape[0] * shape[1]).raw()
        replies = []
        for _ in range(WAVES):
            replies += hang_ups(front, raw, share, HANG_UP_AFTER_S, ATTACKER)
            read()
        wrong = [r for r in replies if not share_answer(r.status, r.body.decode("utf-8", "replace"))]
        for reply in wrong[:3]:
            log.error("HTTP hang-ups: answered %s %r %s", reply.status, reply.body[:200], reply.failure)
        return not wrong

    what = "HTTP inferences hung up once sent (200 or the share's 429, server kept)"
    within_share(soak, what, share, attack)


def reset_calls(soak: Soak) -> None:
    """Waves of encoder calls on one gRPC connection from ``ATTACKER``, each reset once the front read it
    (fault matrix row 78): nothing else may be reset or sent ``GOAWAY``."""
    block = raw_grpc.call_headers(SERVICE + "ModelInfer", [], ANSWER_WITHIN_S)
    front, wave = address(soak.server.grpc_url), 2 * SHARES.per_address  # a client's streams are odd

    def attack(inputs: tuple[str, ...], shape: list[int], read: Callable[[], None]) -> bool:
        request = service_pb2.ModelInferRequest(model_name=ENCODER)
        for name in inputs:
            request.inputs.add(name=name, datatype="INT64", shape=shape)
            request.raw_input_contents.append(np.ones(shape, np.int64).tobytes())
        data = raw_grpc.message(request.SerializeToString())
        # one call answered first: the front has the encoder's config when the resets come, as the fault
        # test has it (a front still fetching it saw calls reset before it forwarded them)
        warm = raw_grpc.exchange(front, block, data, ANSWER_WITHIN_S, ATTACKER)
        try:
            with socket.create_connection(front, ANSWER_WITHIN_S, (ATTACKER, 0)) as sock:
                sock.sendall(h2c.PREFACE + h2c.settings_frame({}))
                answers = raw_grpc.Answers(sock)
                for first in range(1, WAVES * wave, wave):
                    calls = range(first, first + wave, 2)
                    raw_grpc.send_and_reset(answers, block, data, calls, first, ANSWER_WITHIN_S)
                    read()
        except OSError as error:  # the front closed the connection, or never acknowledged a PING
            log.error("gRPC resets: %r", error)
            return False
        statuses = [(warm.code, warm.message)]
        statuses += [
            (raw_grpc.status_name(code), text) for code, text in map(answers.status, answers.trailers)
        ]
        wrong = [(code, text) for code, text in statuses if not share_answer(code, text)]
        if wrong or answers.resets or answers.goaway:
            log.error(
                "gRPC resets: answered %s, reset %s, GOAWAY %s", wrong[:3], answers.resets, answers.goaway
            )
        return not (wrong or answers.resets or answers.goaway)

    what = "gRPC calls reset once sent (OK or the share's RESOURCE_EXHAUSTED, server kept)"
    within_share(soak, what, SHARES.per_connection, attack)


ATTACKS: dict[str, Callable[[Soak], None]] = {
    "unanswered": unanswered_shapes,
    "garbage-stream": garbage_stream,
    "half-open": half_open_http2,
    "shm-identity": shared_memory_identity,
    "kill-server": kill_server,
    "truncate-race": truncate_race,
    "hang-ups": hung_up_inferences,
    "resets": reset_calls,
}
