"""Fault matrix rows 69–71, 75, 77 and 78: gRPC calls whose wire form is wrong, and clients that hold the
front's memory or, resetting their calls, Triton's work.

Measured with the gRPC front as it was: metadata outside gRPC's grammar reached Triton, which reset the
call (``INTERNAL``); metadata between Triton's 8 KiB soft and 16 KiB hard limit was run or refused at
random; two messages on a unary call, a length prefix longer than what followed and gzip that did not
unpack were ``INTERNAL``; a client that sent calls and never read grew the front by 176 MB in 30 s; and
unary calls whose message never finished were never answered and held what they had sent (six of 40 MiB:
240 MB) for their connection's life. A stream's message begun and never finished was never timed: the
stream held its slot, its Triton stream and what it had sent (four of 60 MiB: 240 MiB, every other
client's message above 16 MiB refused meanwhile) until the client's own deadline, or for 600 s without
one. One connection could open any number of streams that sent their headers alone (10,000 of them: the
front 27 MiB larger), and such a stream kept its connection open for good. A client that reset each call
once the front had read it never had a call open, so no bound applied, while Triton had the calls: of
5,000, 1,680 reached a model. grpcio sends none of these, so they are written frame by frame.
"""

from __future__ import annotations

import functools
import gzip
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from harness import GOOD_MODEL
from own_front import most_refusal_lines, own_front, refusals_logged
from slow_model import SLOW, slow_model_server, slow_request
from tritonclient.grpc import service_pb2, service_pb2_grpc

from server import TritonServer
from server.admin import headers as admin_headers
from server.fronts import h2c
from server.fronts.client_slots import MESSAGE_TIMEOUT_S, OVERDUE_TIMEOUT_S, SlotLimits
from server.fronts.grpc_wire import MAX_STREAMS, STREAMS_PER_ADDRESS
from server.watchdog import model_progress
from soak.attacks import PendingWatch, pending
from soak.invariant_fuzz import rss_mib
from soak.raw_grpc import Answers, GrpcReply, call_headers, exchange, message, send_and_reset

pytestmark = pytest.mark.integration
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
HANG_GUARD_S = 120.0  # how long an answer may take before it counts as never: not a latency bound
MIB = 1 << 20
SLOW_ASKS_S = 60.0  # what a reset call asks of ``slow`` (its most): it waits in Triton for the whole test
RESET_CALLS, RESET_BATCH = 1000, 50


def _address(server: TritonServer) -> tuple[str, int]:
    host, port = server.grpc_url.rsplit(":", 1)
    return host, int(port)


def _refused(answers: Answers) -> set[int]:
    """The streams the front refused (``RST_STREAM`` ``REFUSED_STREAM``)."""
    return {stream for stream, code in answers.resets.items() if code == h2c.REFUSED_STREAM}


def _trivial(rows: int = 1, model: str = GOOD_MODEL) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[rows, 16])
    request.raw_input_contents.append(np.ones((rows, 16), np.float32).tobytes())
    return request.SerializeToString()


@pytest.mark.parametrize(
    ("metadata", "data", "named"),
    [
        ([(b"X-Upper", b"1")], None, "metadata name 'X-Upper' is not gRPC's"),
        ([(b"x y", b"1")], None, "metadata name 'x y' is not gRPC's"),
        ([(b"x-ctl", b"a\x00b")], None, "metadata 'x-ctl' holds a byte outside printable ASCII"),
        ([(b"x-bin", b"!!!!")], None, "metadata 'x-bin' ends in -bin but its value is not base64"),
        ([(b"x-big", b"a" * 12_000)], None, "above the 4096 the front forwards"),
        ([], message(_trivial()) * 2, "a unary call carries one message, this one 2"),
        ([], b"", "a unary call carries one message, this one 0"),
        ([], message(_trivial())[:-1], "the call ended inside a message"),
        ([(b"grpc-encoding", b"gzip")], message(b"not gzip", flag=1), "does not decompress"),
    ],
)
def test_a_call_whose_wire_form_is_wrong_is_refused_naming_it(
    fault_server: TritonServer, good_traffic, metadata, data, named
) -> None:
    """Row 65: ``INVALID_ARGUMENT`` naming what is wrong, every time (the 12 KiB metadata is sent 5
    times: Triton refused it at random); other clients' calls unaffected."""
    with good_traffic():
        for _ in range(5 if named.startswith("above") else 1):
            block = call_headers(INFER, metadata, 30.0)
            reply = exchange(
                _address(fault_server), block, message(_trivial()) if data is None else data, 30.0
            )
            assert (reply.failure, reply.code) == ("", "INVALID_ARGUMENT"), reply
            assert named in reply.message


def test_metadata_grpc_allows_still_reaches_triton(fault_server: TritonServer) -> None:
    metadata = [(b"x-note", b"a b~"), (b"x-note-bin", b"AAE"), (b"x-padded-bin", b"AAEC")]
    reply = exchange(_address(fault_server), call_headers(INFER, metadata, 30.0), message(_trivial()), 30.0)
    assert (reply.failure, reply.code) == ("", "OK"), reply
    compressed = exchange(
        _address(fault_server),
        call_headers(INFER, [(b"grpc-encoding", b"gzip")], 30.0),
        message(gzip.compress(_trivial()), flag=1),
        30.0,
    )
    assert (compressed.failure, compressed.code) == ("", "OK"), compressed


def _front_rss_mib(server: TritonServer) -> float:
    assert server.grpc_front is not None
    return rss_mib(server.grpc_front.pid)


def test_a_client_that_never_reads_does_not_grow_the_front(fault_server: TritonServer) -> None:
    """Row 66: a client sends up to 30,000 calls of 4 KiB (batch 64 to ``trivial``) with its windows
    open and never reads its socket. The front stops reading it once its answers back up, so the client
    cannot send them all (before: all 30,000 were read in 5 s, each answer kept for a client that never
    takes it), and the front grows by less than 48 MiB; other clients are answered meanwhile."""
    before = _front_rss_mib(fault_server)
    block, body = call_headers(INFER, [], 60.0), message(_trivial(rows=64))
    with socket.create_connection(_address(fault_server)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        open_windows = h2c.settings_frame({h2c.INITIAL_WINDOW_SIZE: h2c.MAX_WINDOW})
        sock.sendall(h2c.PREFACE + open_windows + h2c.window_update(0, h2c.MAX_WINDOW - h2c.DEFAULT_WINDOW))
        sock.settimeout(10.0)
        blocked = False
        try:
            for first in range(1, 60_000, 40):
                sock.sendall(
                    b"".join(
                        h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream, block)
                        + h2c.frame(h2c.DATA, h2c.END_STREAM, stream, body)
                        for stream in range(first, first + 40, 2)
                    )
                )
        except TimeoutError:
            blocked = True  # the front stopped reading it
        grown = _front_rss_mib(fault_server) - before
        other = exchange(_address(fault_server), call_headers(INFER, [], 30.0), message(_trivial()), 30.0)
        assert (other.failure, other.code) == ("", "OK"), other
    assert blocked, "the front read every call of a client that never read its answers"
    assert grown < 48, f"the front grew by {grown:.0f} MiB for a client that never read"


def test_calls_whose_message_never_completes_are_bounded_and_answered(fault_server: TritonServer) -> None:
    """Row 67: five unary calls each sending 60 MiB of a 64 MiB message and never the rest. The front
    holds at most four such messages (the fifth: ``RESOURCE_EXHAUSTED`` at once), answers each held one
    ``DEADLINE_EXCEEDED`` once 30 s passed, and gives their memory back."""
    before = _front_rss_mib(fault_server)
    block = call_headers(INFER, [], 120.0)
    chunk = bytes(h2c.DEFAULT_FRAME)
    with socket.create_connection(_address(fault_server)) as sock:
        sock.sendall(h2c.PREFACE + h2c.settings_frame({}))
        for stream in range(1, 11, 2):
            prefix = b"\x00" + (64 * MIB - 5).to_bytes(4, "big")
            frames = [h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream, block)]
            frames.append(h2c.frame(h2c.DATA, 0, stream, prefix + chunk[5:]))
            frames += [h2c.frame(h2c.DATA, 0, stream, chunk)] * (60 * MIB // len(chunk) - 1)
            sock.sendall(b"".join(frames))
        answers = _trailers(sock, streams=5, timeout_s=MESSAGE_TIMEOUT_S + 60.0)
    codes = sorted(fields.get(b"grpc-status", b"") for fields in answers.values())
    assert codes == [b"4", b"4", b"4", b"4", b"8"], answers
    assert _front_rss_mib(fault_server) - before < 64


def test_a_stream_message_never_completed_ends_the_stream_and_frees_its_slot(
    fault_server: TritonServer, tmp_path: Path
) -> None:
    """Row 75: on a front of its own (a 2 s message time, 2 slots a connection) before the fault
    server's Triton, two streams hold the connection's slots (a third is refused); one begins a message
    and stalls. That stream ends ``DEADLINE_EXCEEDED`` naming the message time, and its slot serves a
    new stream; the other, idle between messages all that while, is served on (before: the stalled
    stream was never ended, holding its slot and its bytes)."""
    flags = ["--message-timeout-s=2", "--max-connection-requests=2"]
    log_path = tmp_path / "grpc_front.log"
    upstream, key = fault_server.triton_grpc_url, fault_server.admin_key
    with (
        own_front("server.fronts.grpc_front", upstream, log_path, flags, key) as port,
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        sock.sendall(h2c.PREFACE + h2c.settings_frame({}))
        answers = Answers(sock)
        for stream in (1, 3):
            sock.sendall(_stream_start(stream) + h2c.frame(h2c.DATA, 0, stream, message(_trivial())))
        answers.until(lambda: 1 in answers.data and 3 in answers.data)
        # a stream's first data starts its handler, which asks for a slot: refused, the connection has two
        sock.sendall(_stream_start(5) + h2c.frame(h2c.DATA, 0, 5, message(_trivial())))
        answers.until(lambda: 5 in answers.trailers)
        assert answers.status(5)[0] == b"8", answers.trailers
        sock.sendall(h2c.frame(h2c.DATA, 0, 3, message(_trivial())[:20]))  # a message begun, then nothing
        answers.until(lambda: 3 in answers.trailers)
        code, why = answers.status(3)
        assert code == b"4" and "a message of this stream was not complete within 2 s" in why, why
        sock.sendall(_stream_start(7) + h2c.frame(h2c.DATA, h2c.END_STREAM, 7, message(_trivial())))
        answers.until(lambda: 7 in answers.trailers)  # the stalled stream's slot serves another
        assert answers.status(7) == (b"0", "") and answers.data[7], answers.trailers
        sock.sendall(h2c.frame(h2c.DATA, h2c.END_STREAM, 1, message(_trivial())))
        answers.until(lambda: 1 in answers.trailers)
        assert answers.status(1) == (b"0", ""), answers.trailers
        assert len(answers.data[1]) > len(answers.data[7])  # two answers on the stream that waited


def test_streams_that_send_headers_alone_are_bounded_and_end(
    fault_server: TritonServer, tmp_path: Path
) -> None:
    """Row 77: on a front of its own (a 2 s idle time) before the fault server's Triton, one connection
    opens 1,032 streams that send their headers and nothing more. The front advertised at most 1,024
    streams a connection, and the 8 beyond are reset ``REFUSED_STREAM``; every one it took ends
    ``DEADLINE_EXCEEDED`` naming the idle time, and the connection, then without calls, is closed idle
    (``GOAWAY`` ``NO_ERROR``); another client is answered meanwhile (before: every stream taken and
    kept, the connection never closed). The front's log names the client address and counts both
    refusals, a few lines each rather than one a stream."""
    log_path = tmp_path / "grpc_front.log"
    upstream, key = fault_server.triton_grpc_url, fault_server.admin_key
    streams = range(1, 2 * (MAX_STREAMS + 8), 2)
    started = time.monotonic()
    with (
        own_front("server.fronts.grpc_front", upstream, log_path, ["--idle-timeout-s=2"], key) as port,
        socket.create_connection(("127.0.0.1", port)) as sock,
    ):
        sock.sendall(h2c.PREFACE + h2c.settings_frame({}))
        sock.sendall(b"".join(_stream_start(stream) for stream in streams))
        answers = Answers(sock)
        answers.until(lambda: len(_refused(answers)) == 8)
        other = exchange(("127.0.0.1", port), call_headers(INFER, [], 30.0), message(_trivial()), 30.0)
        assert (other.failure, other.code) == ("", "OK"), other
        answers.until(lambda: answers.goaway is not None)
        assert answers.settings[h2c.MAX_CONCURRENT_STREAMS] == MAX_STREAMS
        assert _refused(answers) == set(streams[MAX_STREAMS:])
        assert {answers.status(stream)[0] for stream in streams[:MAX_STREAMS]} == {b"4"}, answers.trailers
        assert "the stream sent no message within 2 s of its start" in answers.status(1)[1]
        assert answers.goaway[0] == h2c.NO_ERROR, answers.goaway
    most_lines = most_refusal_lines(time.monotonic() - started)  # the front has stopped: all written
    for bound, count in [
        (f"calls beyond its connection's {MAX_STREAMS} open", 8),
        ("streams without a message", MAX_STREAMS),
    ]:
        counts = refusals_logged(log_path, "127.0.0.1", bound)  # the first line at once, then folded
        assert counts[:1] == [1] and sum(counts) == count, (bound, counts, log_path.read_text()[-2000:])
        assert len(counts) <= most_lines, counts


@pytest.fixture(scope="module")
def slow_server(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """``tests/faults/slow_model.py``'s server, behind the gRPC front."""
    with slow_model_server(
        spec_data, tmp_path_factory, "rapid_reset", 2 * SLOW_ASKS_S, grpc_front=True
    ) as running:
        yield running


def _answered_right(reply: GrpcReply) -> bool:
    """A ``trivial`` call of ones answered OK with twos."""
    if (reply.failure, reply.code) != ("", "OK"):
        return False
    answer = service_pb2.ModelInferResponse.FromString(reply.payload[5:])
    return np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32), np.full(16, 2.0))


def _until_waiting(metrics_url: str) -> float:
    """The ``slow`` requests Triton has waiting, once it has one (``HANG_GUARD_S``: a hang guard, the
    caller asserts)."""
    give_up = time.monotonic() + HANG_GUARD_S
    while (waiting := pending(metrics_url, SLOW)) < 1 and time.monotonic() < give_up:
        time.sleep(0.05)
    return waiting


def _reached(metrics_url: str, seen: list[float]) -> None:
    seen.append(_until_waiting(metrics_url))


def test_calls_reset_once_sent_leave_triton_no_more_than_the_clients_share(slow_server: TritonServer) -> None:
    """Row 78 (HTTP/2 "rapid reset"): one connection sends 1,000 whole ``ModelInfer`` calls to ``slow``
    asking a minute each, 50 at a time, and resets each batch (``RST_STREAM`` ``CANCEL``) as soon as a
    PING sent after it is acknowledged: the front has read them, so their handlers have begun. Triton
    never has more of them waiting than the connection's share of slots (32): a forwarded call keeps its
    slot until Triton answers it, whatever the client does, and the calls beyond
    the share are refused. Another client's calls are answered, right, throughout (before: each reset
    freed the call's place and slot at once, and Triton had hundreds of them waiting)."""
    share = SlotLimits().per_connection
    address = _address(slow_server)
    warm = exchange(address, call_headers(INFER, [], 30.0), message(slow_request(0.0)), HANG_GUARD_S)
    assert (warm.failure, warm.code) == ("", "OK"), warm  # the front has the model's config
    block, body = call_headers(INFER, [], HANG_GUARD_S), message(slow_request(SLOW_ASKS_S))
    others, seen = [], []
    with (
        socket.create_connection(address) as sock,
        PendingWatch(slow_server.metrics_url, SLOW) as pending,
    ):
        sock.sendall(h2c.PREFACE + h2c.settings_frame({}))
        answers = Answers(sock)
        for first in range(1, 2 * RESET_CALLS, 2 * RESET_BATCH):
            batch = range(first, first + 2 * RESET_BATCH, 2)
            # the first batch is reset once Triton has some of it waiting: the loop reaches Triton, which
            # drops a reset call it has not begun (row 78), so a later batch may never show there waiting
            reached = functools.partial(_reached, slow_server.metrics_url, seen) if first == 1 else None
            send_and_reset(answers, block, body, batch, first, HANG_GUARD_S, reached)
            if first % (10 * RESET_BATCH) == 1:
                other = exchange(address, call_headers(INFER, [], 30.0), message(_trivial()), HANG_GUARD_S)
                others.append("right" if _answered_right(other) else other)
        pending.read_again()
        assert answers.goaway is None, answers.goaway
    assert others and others == ["right"] * len(others), others
    assert pending.reads > 0, "Triton's metrics never answered during the resets"
    assert seen and seen[0] > 0, "no reset call reached Triton: the loop tested nothing"
    # the share bounds what Triton holds; its waiting count alone can reach it for an instant: a call whose
    # answer the front has passed on frees its slot before Triton takes the next one from its queue
    most = max(pending.most, *seen)
    assert most <= share, f"Triton had {most:g} reset calls waiting, above its share {share}"


STREAM_RESETS = 1500  # beyond a connection's 1,024 open calls: places kept for good would lock it out
STREAM_ASKS_S = 0.2  # what a reset stream asks of ``slow``: the share forwarded drains in seconds
# a reset stream's deadline: Triton gets the front's most (``OVERDUE_TIMEOUT_S``, 600 s), beyond the hang
# guard, so within it only the front's half-close ends a forwarded stream on Triton
RESET_STREAM_DEADLINE_S = 2 * OVERDUE_TIMEOUT_S


@pytest.fixture(scope="module")
def stream_reset_server(
    spec_data: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """``slow_model.py``'s server behind the gRPC front, of its own: ``slow_server``'s Triton keeps the
    calls its test sent for a minute each."""
    with slow_model_server(spec_data, tmp_path_factory, "stream_reset", 60.0, grpc_front=True) as running:
        yield running


class _RawConnection:
    """A raw client connection to the front: new stream ids, frames sent, a PING to catch up with it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.answers, self.next_stream, self.pings = sock, Answers(sock), 1, 0
        sock.sendall(h2c.PREFACE + h2c.settings_frame({}))

    def new_streams(self, count: int) -> range:
        streams = range(self.next_stream, self.next_stream + 2 * count, 2)
        self.next_stream += 2 * count
        return streams

    def send(self, frames: list[bytes]) -> None:
        """``frames``, then a PING: back once its acknowledgement is, so the front has read them all and
        answered what it answers at once (``REFUSED_STREAM``)."""
        self.pings += 1
        self.sock.sendall(b"".join(frames) + h2c.frame(h2c.PING, 0, 0, self.pings.to_bytes(8, "big")))
        self.answers.until(lambda ping=self.pings: ping in self.answers.pings)

    def reset(self, streams: range) -> None:
        self.send([h2c.frame(h2c.RST_STREAM, 0, s, h2c.CANCEL.to_bytes(4, "big")) for s in streams])

    def refused_of(self, count: int) -> int:
        """Open ``count`` streams (headers alone, no handler, no slot), reset them: how many were refused."""
        streams = self.new_streams(count)
        self.send([_stream_start(stream) for stream in streams])
        self.reset(streams)
        return len(_refused(self.answers) & set(streams))

    def answered(self, body: bytes) -> tuple[bytes, str, service_pb2.ModelStreamInferResponse | None]:
        """One stream of ``body``'s one message, ended by the client: its status and answer."""
        stream = self.new_streams(1)[0]
        self.send([_stream_start(stream), h2c.frame(h2c.DATA, h2c.END_STREAM, stream, body)])
        self.answers.until(lambda: stream in self.answers.trailers)
        data = self.answers.data.get(stream, b"")
        answer = service_pb2.ModelStreamInferResponse.FromString(data[5:]) if data else None
        return (*self.answers.status(stream), answer)


def _executions(metrics_url: str, model: str) -> float:
    """Triton's count of ``model``'s executions, successes and failures so far: it grew, a request ran."""
    with urllib.request.urlopen(metrics_url, timeout=5) as answer:
        return model_progress(answer.read().decode(errors="replace")).get(model, (0.0, 0.0))[1]


def _output(answer: service_pb2.ModelStreamInferResponse | None) -> np.ndarray | None:
    """A stream answer's one output as FP32 (None: no answer, or an error message)."""
    if answer is None or answer.error_message:
        return None
    return np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)


@pytest.mark.parametrize(
    ("model", "body", "expected"),
    [
        (GOOD_MODEL, message(_trivial()), np.full(16, 2.0, np.float32)),  # ones doubled
        (SLOW, message(slow_request(STREAM_ASKS_S)), np.float32([STREAM_ASKS_S])),  # the seconds slept
    ],
    ids=[GOOD_MODEL, SLOW],
)
def test_streams_reset_once_forwarded_end_on_triton_and_free_their_places(
    stream_reset_server: TritonServer,
    model: str,
    body: bytes,
    expected: np.ndarray,
) -> None:
    """Row 78, a stream's path: one connection opens 1,500 ``ModelStreamInfer`` streams, 50 at a time,
    each sending one whole request (to ``trivial``, or to ``slow`` asking 0.2 s) without ending its side,
    and resets each batch (``RST_STREAM`` ``CANCEL``) once a PING after it is acknowledged. The front
    forwards what the connection's slots allow and refuses the rest; a forwarded stream's handler sends
    Triton the end of the stream, so Triton ends it once it answered, and the handler ends with it. None
    is refused ``REFUSED_STREAM`` on the way (1,500 is beyond the 1,024 a connection may have open), and
    once Triton has nothing of the model waiting, the connection takes 1,024 open streams again and a
    new connection from the same address the address's other 1,024 (counted, not timed: refused ones
    are tried again until the hang guard), and both complete a stream, answered right. A front that did
    not tell a forwarded stream's handler of the reset (so never half-closed Triton's stream) kept the 32
    it had forwarded open, each with its place and slot, until the deadline it gave Triton (600 s)."""
    address = _address(stream_reset_server)
    metrics = stream_reset_server.metrics_url
    before = _executions(metrics, model)
    with socket.create_connection(address) as first_sock:
        first = _RawConnection(first_sock)
        block = call_headers(STREAM, [], RESET_STREAM_DEADLINE_S)
        for _ in range(0, STREAM_RESETS, RESET_BATCH):
            batch = first.new_streams(RESET_BATCH)
            first.send(
                [
                    h2c.frame(h2c.HEADERS, h2c.END_HEADERS, s, block) + h2c.frame(h2c.DATA, 0, s, body)
                    for s in batch
                ]
            )
            first.reset(batch)
        assert first.answers.goaway is None, first.answers.goaway
        assert not _refused(first.answers), f"{len(_refused(first.answers))} streams refused a place"
        give_up = time.monotonic() + HANG_GUARD_S  # a hang guard: the places are counted, not timed
        while pending(metrics, model) > 0 and time.monotonic() < give_up:
            time.sleep(0.1)
        with socket.create_connection(address) as second_sock:  # the same address, a new connection
            second = _RawConnection(second_sock)
            while True:
                held = [first.refused_of(MAX_STREAMS), second.refused_of(STREAMS_PER_ADDRESS - MAX_STREAMS)]
                if not any(held) or time.monotonic() > give_up:
                    break
                time.sleep(0.5)
            assert held == [0, 0], f"places still held on the connection and the address's other: {held}"
            reached = _executions(metrics, model) - before  # the reset streams Triton ran, all answered now
            for connection in (first, second):
                code, why, answer = connection.answered(body)
                output = _output(answer)
                right = output is not None and np.array_equal(output, expected)
                assert code == b"0" and right, (code, why, answer)
            assert pending(metrics, model) == 0
    assert reached > 0, "no reset stream reached Triton: the loop tested nothing"


CANCELLED_ASKS_S = 1.0  # what a cancelled call asks of ``slow``: those Triton ran add up to seconds


def _successes(server: TritonServer, model: str) -> int:
    """The requests of ``model`` Triton ran to an answer (a request it dropped as cancelled is a failure)."""
    stats_url = f"http://{server.triton_http_url}/v2/models/{model}/stats"
    request = urllib.request.Request(stats_url, headers=admin_headers(server.admin_key))
    with urllib.request.urlopen(request, timeout=5) as answer:
        stats = json.load(answer)["model_stats"]
    return sum(int(version["inference_stats"]["success"]["count"]) for version in stats)


def test_calls_cancelled_once_forwarded_are_cancelled_on_triton(stream_reset_server: TritonServer) -> None:
    """Row 78, a client's cancel: a grpcio client sends ``slow`` its connection's share of calls (32, one
    second each) and cancels all but the first (``RST_STREAM`` ``CANCEL``) once Triton has some of them
    waiting. The front passes the cancel on, so Triton drops what it has not begun: it runs at most a few
    of the 31 (before: all 31, a second each, for a client gone). The slots stay held until Triton has
    passed the calls, here until it runs a call sent after them from another connection; then the
    first connection's next call is answered right and Triton has nothing of ``slow`` waiting."""
    share, metrics = SlotLimits().per_connection, stream_reset_server.metrics_url
    url = stream_reset_server.grpc_url
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of each channel's own
    with grpc.insecure_channel(url, options) as first, grpc.insecure_channel(url, options) as second:
        calls, later_calls = (
            service_pb2_grpc.GRPCInferenceServiceStub(c).ModelInfer for c in (first, second)
        )
        quick = service_pb2.ModelInferRequest.FromString(slow_request(0.0))
        calls(quick, timeout=HANG_GUARD_S)  # the front has the model's config when the cancels come
        before = _successes(stream_reset_server, SLOW)
        asked = service_pb2.ModelInferRequest.FromString(slow_request(CANCELLED_ASKS_S))
        running, *cancelled = [calls.future(asked, timeout=HANG_GUARD_S) for _ in range(share)]
        give_up = time.monotonic() + HANG_GUARD_S  # a hang guard: the test counts, it never times
        _until_waiting(metrics)
        for call in cancelled:
            call.cancel()
        running.result()
        assert _output_of(later_calls(quick, timeout=HANG_GUARD_S)) == [0.0]  # joined Triton after them
        assert _output_of(calls(quick, timeout=HANG_GUARD_S)) == [0.0]  # the first connection's slots freed
    while pending(metrics, SLOW) > 0 and time.monotonic() < give_up:
        time.sleep(0.1)
    ran = _successes(stream_reset_server, SLOW) - before - 3  # less the first and the two answered after
    assert pending(metrics, SLOW) == 0
    assert ran <= len(cancelled) // 4, f"Triton ran {ran} of the {len(cancelled)} calls cancelled"


def _output_of(answer: service_pb2.ModelInferResponse) -> list[float]:
    return np.frombuffer(answer.raw_output_contents[0], np.float32).tolist()


def _stream_start(stream: int) -> bytes:
    return h2c.frame(h2c.HEADERS, h2c.END_HEADERS, stream, call_headers(STREAM, [], HANG_GUARD_S))


def _trailers(sock: socket.socket, streams: int, timeout_s: float) -> dict[int, dict[bytes, bytes]]:
    """The trailers of the first ``streams`` calls answered on ``sock``, by stream."""
    answers = Answers(sock)
    answers.until(lambda: len(answers.trailers) >= streams, time.monotonic() + timeout_s)
    return answers.trailers
