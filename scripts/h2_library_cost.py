"""What the ``h2`` library would cost the gRPC front (docs/SERVING.md, "What the fronts cost"): the CPU of
``h2``'s server side of one unary call of the recommender's size (a relay has two). ``h2`` is not a
dependency: ``python3 -m venv /tmp/h2 && /tmp/h2/bin/pip install h2==4.1.0``, then run this with it."""

from __future__ import annotations

import argparse
import time

import h2.config
import h2.connection
import h2.events

REQUEST_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"localhost:8001"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"grpc-accept-encoding", b"identity,deflate,gzip"),
    (b"user-agent", b"grpc-c++/1.62"),
]
REQUEST = b"\0" + (600).to_bytes(4, "big") + b"x" * 600
ANSWER = b"\0" + (8).to_bytes(4, "big") + b"y" * 8
ANSWER_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def connected() -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    """A client and a server connection past the preface and SETTINGS exchange."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    client.initiate_connection()
    server.initiate_connection()
    for _ in range(2):
        server.receive_data(client.data_to_send())
        client.receive_data(server.data_to_send())
    return client, server


def _answer(server: h2.connection.H2Connection, data: bytes) -> bytes:
    for event in server.receive_data(data):
        if isinstance(event, h2.events.DataReceived):
            server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            server.send_headers(event.stream_id, ANSWER_HEADERS)
            server.send_data(event.stream_id, ANSWER)
            server.send_headers(event.stream_id, [(b"grpc-status", b"0")], end_stream=True)
    return server.data_to_send()


def cpu_per_call(calls: int) -> float:
    """This process's CPU seconds the server side spends per call, over ``calls`` calls in a row."""
    client, server = connected()
    spent, pending = 0.0, b""
    for _ in range(calls):
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, REQUEST_HEADERS)
        client.send_data(stream, REQUEST, end_stream=True)
        data = pending + client.data_to_send()
        start = time.process_time()
        answer = _answer(server, data)
        spent += time.process_time() - start
        for event in client.receive_data(answer):
            if isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        pending = client.data_to_send()
    return spent / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000, help="unary calls in a row (default 20000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is printed (default 3)")
    args = parser.parse_args()
    figures = sorted(cpu_per_call(args.calls) * 1e3 for _ in range(args.rounds))
    rounds = ", ".join(f"{figure:.3f}" for figure in figures)
    median = figures[len(figures) // 2]
    print(f"h2 {h2.__version__}: {median:.3f} ms of CPU per unary call on one connection's server side")
    print(f"  rounds (ms, sorted): {rounds}; a relay has two sides per call")


if __name__ == "__main__":
    main()
