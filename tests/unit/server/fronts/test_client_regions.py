"""The fronts' own shared-memory table and its copy path, without a server (the fault tests drive the
same code through the real fronts: tests/faults/test_shared_memory.py). Files live in a temporary
folder standing for /dev/shm; the table is driven as each front drives it: ``shm_http`` and
``shm_grpc`` rewrite a request as Triton gets it and Triton's answer as the client gets it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from server.fronts import shm_grpc, shm_http
from server.fronts.allow_list import ModelSignature
from server.fronts.client_regions import Client, RegionTable, RegionUse, ServerRegions
from server.fronts.refusal import Refusal, RequestRefusedError

NOBODY = 65534
ME = Client(os.getuid())
LIMIT = 64 << 20


def _model(*inputs: tuple[str, str, list[int]], outputs: tuple[str, ...] = ("y", "z")) -> ModelSignature:
    """The config of a model ``m`` without batching: ``(name, datatype, dims)`` for each input."""
    config = {
        "input": [{"name": n, "data_type": f"TYPE_{t}", "dims": d} for n, t, d in inputs],
        "output": [{"name": name, "data_type": "TYPE_FP32", "dims": [1]} for name in outputs],
    }
    return ModelSignature.from_config("m", config, LIMIT)


root_only = pytest.mark.skipif(os.getuid() != 0, reason="needs root to make a file another uid owns")


@pytest.fixture
def server(tmp_path: Path) -> ServerRegions:
    return ServerRegions("srv_", lambda: {"stub_region"}, tmp_path)


@pytest.fixture
def table(server: ServerRegions) -> Iterator[RegionTable]:
    table = RegionTable(server, max_per_client=4, max_regions=6)
    yield table
    table.close()


def _file(server: ServerRegions, name: str, data: bytes = b"\0" * 4096, uid: int | None = None) -> Path:
    path = server.directory / name
    path.write_bytes(data)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


@contextmanager
def _refused(match: str, kind: Refusal = Refusal.INVALID) -> Iterator[None]:
    with pytest.raises(RequestRefusedError, match=match) as refused:
        yield
    assert refused.value.kind == kind, refused.value.kind


def test_a_registration_keeps_the_file_it_named(server: ServerRegions, table: RegionTable) -> None:
    """The offset is applied once, by the front; a rename, a swap or an unlink of the name later
    changes nothing: every use goes through the descriptor of the file registered."""
    data = bytes(range(256)) * 32
    path = _file(server, "r1", data)
    table.register(ME, "r1", "/r1", 4096, 2048)
    assert table.read(ME, RegionUse("r1", 64, 16)) == data[4096 + 64 : 4096 + 80]
    path.rename(server.directory / "aside")
    _file(server, "r1", b"\xff" * 8192)  # another file under the registered name
    assert table.read(ME, RegionUse("r1", 0, 4)) == data[4096:4100]
    table.write(ME, RegionUse("r1", 8, 4), b"abcd")
    assert (server.directory / "aside").read_bytes()[4104:4108] == b"abcd"
    assert (server.directory / "r1").read_bytes() == b"\xff" * 8192
    (server.directory / "aside").unlink()  # the client's own file gone: its registration reads it still
    assert table.read(ME, RegionUse("r1", 8, 4)) == b"abcd"


def test_uses_stay_inside_the_region(server: ServerRegions, table: RegionTable) -> None:
    _file(server, "r1")
    table.register(ME, "r1", "/r1", 1024, 1024)
    with _refused("Invalid offset \\+ byte size for shared memory region: 'r1'"):
        table.read(ME, RegionUse("r1", 1000, 64))
    with _refused("Invalid offset \\+ byte size"):
        table.write(ME, RegionUse("r1", 1024, 1), b"x")
    with _refused("Unable to find shared memory region: 'r2'", Refusal.NOT_FOUND):
        table.read(ME, RegionUse("r2", 0, 4))
    os.truncate(server.directory / "r1", 1500)  # cut short after registration: a short read, no SIGBUS
    with _refused("holds 1500 bytes, fewer than the 2048 this input needs"):
        table.read(ME, RegionUse("r1", 0, 1024))


def test_registration_rules(server: ServerRegions, table: RegionTable) -> None:
    _file(server, "mine")
    with _refused("Unable to open shared memory region: '/gone'"):
        table.register(ME, "gone", "/gone", 0, 64)
    with _refused("exceeds the file's 4096 bytes"):
        table.register(ME, "big", "/mine", 4000, 200)
    for key in ("/../etc/passwd", "/a/b", "", "/..", 5):
        with _refused("must name one file in /dev/shm"):
            table.register(ME, "k", key, 0, 64)
    os.symlink(server.directory / "mine", server.directory / "link")
    with _refused("is a symbolic link", Refusal.FORBIDDEN):
        table.register(ME, "link", "/link", 0, 64)
    os.mkfifo(server.directory / "fifo")
    with _refused("is not a regular file", Refusal.FORBIDDEN):
        table.register(ME, "fifo", "/fifo", 0, 0)
    os.link(server.directory / "mine", server.directory / "alias")
    with _refused("has 2 links", Refusal.FORBIDDEN):
        table.register(ME, "alias", "/alias", 0, 64)
    os.unlink(server.directory / "alias")
    with _refused("needs a client on this host", Refusal.FORBIDDEN):
        table.register(Client(None), "mine", "/mine", 0, 64)
    table.register(ME, "mine", "/mine", 0, 64)
    table.register(ME, "again", "mine", 0, 64)  # a second name for one file, as Triton allows
    with _refused("'mine' already in manager", Refusal.ALREADY_EXISTS):
        table.register(ME, "mine", "/mine", 0, 64)
    assert [r.status() for r in table.status(ME)] == [
        {"name": "mine", "key": "/mine", "offset": 0, "byte_size": 64},
        {"name": "again", "key": "mine", "offset": 0, "byte_size": 64},
    ]


def test_the_servers_own_regions_are_refused(server: ServerRegions, table: RegionTable) -> None:
    """By prefix, by a live stub's name, and by device and inode once seen (a rename)."""
    for name in ("srv_0001", "stub_region"):
        _file(server, name)
        with _refused("is the server's own IPC region", Refusal.FORBIDDEN):
            table.register(ME, name, f"/{name}", 0, 64)
    server.remember()  # the fronts do this every second
    (server.directory / "srv_0001").rename(server.directory / "innocent")
    with _refused("is the server's own IPC region 'srv_0001'", Refusal.FORBIDDEN):
        table.register(ME, "innocent", "/innocent", 0, 64)


@root_only
def test_another_users_file_is_refused(server: ServerRegions, table: RegionTable) -> None:
    _file(server, "theirs", uid=NOBODY)
    with _refused(f"belongs to uid {NOBODY}, not to this client", Refusal.FORBIDDEN):
        table.register(ME, "theirs", "/theirs", 0, 64)
    table.register(Client(NOBODY), "theirs", "/theirs", 0, 64)


def test_clients_never_see_each_others_regions(server: ServerRegions, table: RegionTable) -> None:
    """The uid is the namespace: one uid's name is unknown to another, whatever it calls."""
    other = Client(ME.uid + 1)
    _file(server, "mine", b"\1" * 4096)
    table.register(ME, "shared_name", "/mine", 0, 64)
    with _refused("Unable to find shared memory region: 'shared_name'", Refusal.NOT_FOUND):
        table.read(other, RegionUse("shared_name", 0, 4))
    with _refused("Unable to find system shared memory region: 'shared_name'", Refusal.NOT_FOUND):
        table.status(other, "shared_name")
    assert table.status(other) == []
    table.unregister(other, "shared_name")
    table.unregister(other, None)  # "every region": every region of its own
    assert table.read(ME, RegionUse("shared_name", 0, 4)) == b"\1" * 4


def _descriptors_on(path: Path) -> int:
    """This process's open descriptors on ``path``: counting all of them would count what other threads
    of the test process (a server's log reader, a collected pipe) open and close meanwhile."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since the listing
            continue
    return count


def test_the_table_is_bounded_and_closes_what_it_forgets(server: ServerRegions, table: RegionTable) -> None:
    mine = _file(server, "mine").resolve()
    for index in range(4):
        table.register(ME, f"r{index}", "/mine", 0, 64)
    with _refused("this client has 4 regions registered", Refusal.TOO_MANY):
        table.register(ME, "r4", "/mine", 0, 64)
    assert _descriptors_on(mine) == 4
    table.unregister(ME, "r0")
    table.unregister(ME, "never")  # as Triton: unregistering an unknown name is no error
    assert _descriptors_on(mine) == 3
    table.unregister(ME, None)
    assert table.count() == 0 and _descriptors_on(mine) == 0


REGION_AT_64 = {"shared_memory_region": "r1", "shared_memory_offset": 64, "shared_memory_byte_size": 32}


def _http_infer(inputs: list[dict], outputs: list[dict], binary: bytes = b"") -> tuple[bytes, str]:
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + binary, str(len(header))


def test_http_inputs_in_regions_travel_as_binary(server: ServerRegions, table: RegionTable) -> None:
    """Shared-memory inputs are read from the client's file into the binary part, in input order,
    between the client's own binary inputs; outputs in regions are asked for as binary."""
    values = np.arange(8, dtype=np.float32)
    _file(server, "r1", b"\0" * 128 + values.tobytes() + b"\0" * 3936)
    table.register(ME, "r1", "/r1", 64, 1024)
    body, length = _http_infer(
        [
            {"name": "a", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
            {"name": "b", "shape": [8], "datatype": "FP32", "parameters": REGION_AT_64},
            {"name": "c", "shape": [1], "datatype": "INT32", "data": [7]},
            {"name": "d", "shape": [1], "datatype": "INT32", "parameters": {"binary_data_size": 4}},
        ],
        [{"name": "y", "parameters": {"shared_memory_region": "r1", "shared_memory_byte_size": 64}}],
        b"AAAAAAAA" + b"DDDD",
    )
    model = _model(("a", "INT32", [2]), ("b", "FP32", [8]), ("c", "INT32", [1]), ("d", "INT32", [1]))
    with _refused("hold 32 bytes; the front copies at most 16 bytes a request", Refusal.TOO_LARGE):
        shm_http.binary_request(table, ME, body, length, model, limit=16)  # bounded as a body is
    padded = json.loads(body[: int(length)])
    padded["id"] = "p" * (256 << 10)  # a header the front would parse on its event loop for seconds
    header = json.dumps(padded).encode()
    with _refused("a request with tensors in shared memory takes at most 262144", Refusal.TOO_LARGE):
        shm_http.binary_request(table, ME, header + body[int(length) :], str(len(header)), model, LIMIT)
    rewritten, split, outputs = shm_http.binary_request(table, ME, body, length, model, LIMIT)
    document = json.loads(rewritten[:split])
    assert document["inputs"][1]["parameters"] == {"binary_data_size": 32}
    assert document["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]
    assert rewritten[split:] == b"AAAAAAAA" + values.tobytes() + b"DDDD"
    assert outputs == {"y": RegionUse("r1", 0, 64)}


def test_http_outputs_are_written_to_the_region(server: ServerRegions, table: RegionTable) -> None:
    _file(server, "r1")
    table.register(ME, "r1", "/r1", 2048, 1024)
    answer = {"outputs": [
        {"name": "y", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
        {"name": "z", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 4}},
        {"name": "j", "datatype": "INT32", "shape": [1], "data": [3]},
    ]}  # fmt: skip
    header = json.dumps(answer).encode()
    outputs = {"y": RegionUse("r1", 16, 8)}
    payload, split = shm_http.client_response(
        table, ME, outputs, header + b"YYYYYYYY" + b"ZZZZ", str(len(header))
    )
    document = json.loads(payload[:split])
    assert document["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [2]}  # as Triton answers
    assert payload[split:] == b"ZZZZ"
    assert (server.directory / "r1").read_bytes()[2048 + 16 : 2048 + 24] == b"YYYYYYYY"
    with _refused("output 'y' \\(4 bytes\\) should be at least 8 bytes to hold the results"):
        shm_http.client_response(
            table, ME, {"y": RegionUse("r1", 0, 4)}, header + b"Y" * 8 + b"Z" * 4, str(len(header))
        )
    only, split = shm_http.client_response(
        table, ME, {"y": RegionUse("r1", 0, 8), "z": RegionUse("r1", 8, 4)}, header + b"Y" * 8 + b"Z" * 4,
        str(len(header)),
    )  # fmt: skip
    assert split is None and "parameters" not in json.loads(only)["outputs"][1]


def test_grpc_inputs_in_regions_travel_as_raw_contents(server: ServerRegions, table: RegionTable) -> None:
    """Typed contents of the other inputs become raw too: Triton reads none beside raw ones."""
    values = np.arange(4, dtype=np.float32)
    _file(server, "r1", values.tobytes() + b"\0" * 4080)
    table.register(ME, "r1", "/r1", 0, 4096)
    request = service_pb2.ModelInferRequest(model_name="m")
    typed = request.inputs.add(name="a", datatype="INT64", shape=[2])
    typed.contents.int64_contents.extend([5, -6])
    named = request.inputs.add(name="b", datatype="FP32", shape=[4])
    named.parameters["shared_memory_region"].string_param = "r1"
    named.parameters["shared_memory_byte_size"].int64_param = 16
    request.inputs.add(name="c", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hi")
    output = request.outputs.add(name="y")
    output.parameters["shared_memory_region"].string_param = "r1"
    output.parameters["shared_memory_byte_size"].int64_param = 64
    output.parameters["shared_memory_offset"].int64_param = 128
    model = _model(("a", "INT64", [2]), ("b", "FP32", [4]), ("c", "BYTES", [1]))
    raw, outputs = shm_grpc.raw_request(table, ME, request, model, LIMIT)
    request = service_pb2.ModelInferRequest.FromString(shm_grpc.wire(request, raw))  # what Triton reads
    assert list(request.raw_input_contents) == [
        np.array([5, -6], np.int64).tobytes(), values.tobytes(), b"\2\0\0\0hi",
    ]  # fmt: skip
    assert not any(tensor.HasField("contents") or tensor.parameters for tensor in request.inputs)
    assert not request.outputs[0].parameters and outputs == {"y": RegionUse("r1", 128, 64)}
    response = service_pb2.ModelInferResponse(outputs=[{"name": "y"}, {"name": "z"}])
    response.raw_output_contents.extend([b"Y" * 16, b"Z"])
    shm_grpc.client_response(table, ME, outputs, response)
    assert list(response.raw_output_contents) == [b"", b"Z"]
    assert (server.directory / "r1").read_bytes()[128:144] == b"Y" * 16


def test_raw_contents_on_the_wire_are_protobuf_fields() -> None:
    """``wire`` appends raw contents as fields rather than re-serializing them; protobuf reads them
    back in order, beside those the message kept, whatever their length (varints past one byte)."""
    request = service_pb2.ModelInferRequest(model_name="m", id="i")
    request.inputs.add(name="a")
    sizes = [0, 1, 127, 128, 300, 70_000]
    raw = [bytes([n % 251]) * n for n in sizes]
    parsed = service_pb2.ModelInferRequest.FromString(shm_grpc.wire(request, raw))
    assert (
        list(parsed.raw_input_contents) == raw and parsed.model_name == "m" and parsed.inputs[0].name == "a"
    )


def test_a_stream_finds_each_answer_by_the_fronts_id(server: ServerRegions) -> None:
    shm = shm_grpc.GrpcSharedMemory(server, LIMIT)
    _file(server, "r1")
    shm.table.register(ME, "r1", "/r1", 0, 4096)
    stream = shm_grpc.StreamOutputs(shm, lambda: ME)
    tokens = []
    for index in range(2):
        request = service_pb2.ModelInferRequest(model_name="m", id=f"client-{index}")
        output = request.outputs.add(name="y")
        output.parameters["shared_memory_region"].string_param = "r1"
        output.parameters["shared_memory_byte_size"].int64_param = 4
        output.parameters["shared_memory_offset"].int64_param = 4 * index
        forwarded = service_pb2.ModelInferRequest.FromString(stream.to_triton(request, _model()))
        assert forwarded.model_name == "m" and not forwarded.outputs[0].parameters
        tokens.append(forwarded.id)
    assert len(set(tokens)) == 2 and not set(tokens) & {"client-0", "client-1"}
    for index in (1, 0):  # answered in the other order
        answer = service_pb2.ModelStreamInferResponse()
        answer.infer_response.id = tokens[index]
        answer.infer_response.outputs.add(name="y")
        answer.infer_response.raw_output_contents.append(bytes([65 + index]) * 4)
        back = service_pb2.ModelStreamInferResponse.FromString(stream.to_client(answer.SerializeToString()))
        assert back.infer_response.id == f"client-{index}"
        assert list(back.infer_response.raw_output_contents) == [b""]
    assert (server.directory / "r1").read_bytes()[:8] == b"AAAABBBB" and not stream.pending


def _strings(*values: bytes) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def test_bytes_read_from_a_region_are_walked_by_the_allow_list(
    server: ServerRegions, table: RegionTable
) -> None:
    """Before the front reads a region, the allow-list can check only the range's size; the bytes it
    then reads pass the same walk of BYTES length prefixes as any carried bytes, on both protocols,
    before Triton sees them."""
    good = _strings(b"ab", b"cde")
    bad = _strings(b"ab")[:6] + (300).to_bytes(4, "little") + b"cde"  # the second length runs past the end
    assert len(good) == len(bad) == 13
    _file(server, "r1", good + bad + b"\0" * 4070)
    table.register(ME, "r1", "/r1", 0, 4096)
    model = _model(("s", "BYTES", [2]))
    for offset in (0, 13):
        region = {"shared_memory_region": "r1", "shared_memory_offset": offset, "shared_memory_byte_size": 13}
        body, length = _http_infer(
            [{"name": "s", "shape": [2], "datatype": "BYTES", "parameters": region}], []
        )
        request = service_pb2.ModelInferRequest(model_name="m")
        tensor = request.inputs.add(name="s", datatype="BYTES", shape=[2])
        tensor.parameters["shared_memory_region"].string_param = "r1"
        tensor.parameters["shared_memory_offset"].int64_param = offset
        tensor.parameters["shared_memory_byte_size"].int64_param = 13
        if offset == 0:
            assert shm_http.binary_request(table, ME, body, length, model, LIMIT)[0].endswith(good)
            assert shm_grpc.raw_request(table, ME, request, model, LIMIT)[0] == [good]
            continue
        with _refused("expected 2 string elements for inference input 's' for model 'm', got 1"):
            shm_http.binary_request(table, ME, body, length, model, LIMIT)
        with _refused("expected 2 string elements for inference input 's' for model 'm', got 1"):
            shm_grpc.raw_request(table, ME, request, model, LIMIT)
