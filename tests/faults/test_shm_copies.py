"""Fault matrix: Triton never maps a client's shared memory (rows 44, 45 and 49–52). The fronts keep
their own table of registered regions and copy each input from, and each output to, the file the
client registered; Triton gets binary tensor data.

Measured without it (Triton 2.51 mapping the client's file itself): a region registered at offset
4096 was read and written one page past its mapping, in another user's region that Triton had mapped
next (that user's tensor read, and overwritten with the model's output); a region of 512 KiB at
offset 512 KiB of a 1 MiB file made the first inference a SIGSEGV inside tritonserver; and Triton's
own shared-memory API listed and unregistered every client's regions.

Other users are played by a forked child that drops to uid 65534 (``shm_harness``; root only).
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from harness import PROTOCOLS, url
from shm_harness import a_stub_region, client_file, client_module, other_users_region, root_only, stub_pids
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer
from server.admin import ADMIN_HEADER, FRONT_HEADER, GRPC_ADMIN_HEADER, GRPC_FRONT_HEADER
from soak.attacks import race_truncation

pytestmark = pytest.mark.integration
SHM = Path("/dev/shm")
ROW = 64  # one request of trivial: x and y are FP32 [1, 16]


def _values(seed: int) -> np.ndarray:
    """A row of trivial's input no other test sends (so an answer computed from other bytes shows)."""
    return np.random.default_rng(seed).uniform(1.0, 9.0, (1, 16)).astype(np.float32)


def _expected(client, protocol: str, values: np.ndarray) -> np.ndarray:
    """trivial's answer for ``values`` sent in the request itself."""
    tensor = client_module(protocol).InferInput("x", [1, 16], "FP32")
    tensor.set_data_from_numpy(values)
    return client.infer("trivial", [tensor]).as_numpy("y")


def _infer_in_region(client, protocol: str, region: str, x_at: int, y_at: int | None) -> object:
    """trivial with x read from ``region`` at ``x_at`` and, unless None, y written there at ``y_at``."""
    module = client_module(protocol)
    tensor = module.InferInput("x", [1, 16], "FP32")
    tensor.set_shared_memory(region, ROW, offset=x_at)
    outputs = None
    if y_at is not None:
        outputs = [module.InferRequestedOutput("y")]
        outputs[0].set_shared_memory(region, ROW, offset=y_at)
    return client.infer("trivial", [tensor], outputs=outputs)


def _answered_in_region(protocol: str, result: object) -> bool:
    """The answer is Triton's for an output in shared memory: the output named, its data not sent."""
    if protocol == "http":
        return result.get_output("y") == {"name": "y", "datatype": "FP32", "shape": [1, 16]}
    return list(result.get_response().raw_output_contents) == [b""]


def _floats(path: Path, at: int) -> np.ndarray:
    return np.frombuffer(path.read_bytes()[at : at + ROW], np.float32).reshape(1, 16)


@root_only
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_offset_never_reaches_the_next_region(fault_server: TritonServer, protocol: str) -> None:
    """Fault matrix row 49: another user's region is registered just before this client registers its
    own file at offset 4096 and runs trivial on it, input and output in its region. The answer is
    this client's, written where it asked, and the other user's bytes are untouched (Triton 2.51
    alone: one page past its mapping, the other user's tensor read and overwritten)."""
    client = connect(protocol, url(fault_server, protocol))
    canary = np.full((1, 1024), 7.25, np.float32).tobytes()  # one page the other user keeps
    values, pid, stubs = _values(49), fault_server.pid, stub_pids(fault_server)
    expected = _expected(client, protocol, values)
    theirs, mine = f"canary_{protocol}_{os.getpid()}", f"offset_{protocol}_{os.getpid()}"
    with (
        other_users_region(fault_server, theirs, canary) as other,
        client_file(mine, 8192, 4096, values) as path,
    ):
        assert other.registered == 200, "the other user's own region must register"
        client.register_system_shared_memory(mine, f"/{mine}", 4096, offset=4096)
        try:
            result = _infer_in_region(client, protocol, mine, 0, ROW)
            np.testing.assert_array_equal(_floats(path, 4096 + ROW), expected)
            assert _answered_in_region(protocol, result)
            assert (SHM / theirs).read_bytes() == canary, "the other user's region was written"
        finally:
            client.unregister_system_shared_memory(mine)
    assert other.kept, "the other user's region is still registered"
    assert (fault_server.pid, stub_pids(fault_server)) == (pid, stubs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_large_offset_is_answered(fault_server: TritonServer, protocol: str) -> None:
    """Fault matrix row 50: 512 KiB at offset 512 KiB of a 1 MiB file, input at the region's start
    and output at its end: answered from the bytes at the file's offset 512 KiB (Triton 2.51 alone:
    SIGSEGV in the Python backend's copy, every model down)."""
    client = connect(protocol, url(fault_server, protocol))
    half, values = 512 * 1024, _values(50)
    name, pid, stubs = f"half_{protocol}_{os.getpid()}", fault_server.pid, stub_pids(fault_server)
    expected = _expected(client, protocol, values)
    with client_file(name, 2 * half, half, values) as path:
        client.register_system_shared_memory(name, f"/{name}", half, offset=half)
        try:
            _infer_in_region(client, protocol, name, 0, half - ROW)
            np.testing.assert_array_equal(_floats(path, 2 * half - ROW), expected)
        finally:
            client.unregister_system_shared_memory(name)
    assert (fault_server.pid, stub_pids(fault_server)) == (pid, stubs)


@pytest.mark.parametrize("swap", ["another file", "a stub's region", "nothing: unlinked"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_swapped_after_register_keeps_its_file(
    fault_server: TritonServer, good_traffic, protocol: str, swap: str
) -> None:
    """Fault matrix row 44: after registering, the client's name is made to point elsewhere (another
    file renamed over it, a stub's IPC region renamed over it, or the file unlinked). Every later use
    reads and writes the file that was registered; the stub keeps its region, untouched (before: a
    stub's region renamed there was refused by device and inode; Triton 2.51 alone maps whatever
    file the name reaches when it registers)."""
    client = connect(protocol, url(fault_server, protocol))
    values, name = _values(44), f"swapped_{protocol}_{os.getpid()}"
    pid, stubs = fault_server.pid, stub_pids(fault_server)
    expected = _expected(client, protocol, values)
    # this test's own inference runs on good traffic's model too: the server's count includes it
    with good_traffic(server_count=False), client_file(name, 4096, 0, values) as path:
        client.register_system_shared_memory(name, f"/{name}", 4096)
        stub_region = a_stub_region(fault_server) if swap == "a stub's region" else None
        try:
            if swap == "another file":
                (SHM / f"decoy_{name}").write_bytes(b"\0" * 4096)
                (SHM / f"decoy_{name}").rename(path)
            elif stub_region is not None:
                stub_region.rename(path)
            else:
                path.unlink()
            try:
                _infer_in_region(client, protocol, name, 0, ROW)
            finally:
                if stub_region is not None:
                    path.rename(stub_region)
            registered = _registered_file(fault_server, name)
            np.testing.assert_array_equal(np.frombuffer(registered[ROW : 2 * ROW], np.float32), expected[0])
        finally:
            client.unregister_system_shared_memory(name)
    assert (fault_server.pid, stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)


def _registered_file(server: TritonServer, name: str) -> bytes:
    """The bytes of the file the front registered under ``name`` (a deleted one included), read through
    the front's own descriptor of it (``/proc/<front>/fd``): what the client's process still maps."""
    for front in server.running_fronts:
        for fd in Path(f"/proc/{front.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.removesuffix(" (deleted)") == str(SHM / name):
                return fd.read_bytes()
    raise AssertionError(f"no front holds a descriptor of /dev/shm/{name}")


def _listed(client, protocol: str) -> set[str]:
    """The regions a client's status request lists (HTTP lists them, gRPC maps them by name)."""
    status = client.get_system_shared_memory_status(**({"as_json": True} if protocol == "grpc" else {}))
    return {r["name"] for r in status} if isinstance(status, list) else set(status.get("regions", {}))


@root_only
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_users_regions_are_unknown_to_another(fault_server: TritonServer, protocol: str) -> None:
    """Fault matrix row 51: another user's registered region can be neither used, listed nor
    unregistered by this client, under its name or all at once; this client's own region of the same
    name is its own file (before: listed by Triton's status to anyone; Triton 2.51 alone: used too)."""
    client = connect(protocol, url(fault_server, protocol))
    theirs = f"shared_name_{protocol}_{os.getpid()}"
    secret, values = _values(510).tobytes() + b"\0" * 4032, _values(51)
    expected = _expected(client, protocol, values)
    with other_users_region(fault_server, theirs, secret) as other:
        assert other.registered == 200
        assert theirs not in _listed(client, protocol)
        with pytest.raises(InferenceServerException) as error:
            _infer_in_region(client, protocol, theirs, 0, None)
        assert "Unable to find shared memory region" in error.value.message()
        client.unregister_system_shared_memory(theirs)  # this client has no region of that name
        client.unregister_system_shared_memory()  # every region: every region of this client
        with client_file(f"mine_{theirs}", 4096, 0, values):
            client.register_system_shared_memory(theirs, f"/mine_{theirs}", 4096)  # the same name
            try:
                np.testing.assert_array_equal(
                    _infer_in_region(client, protocol, theirs, 0, None).as_numpy("y"), expected
                )
            finally:
                client.unregister_system_shared_memory(theirs)
        assert (SHM / theirs).read_bytes() == secret
    assert other.kept, "the other user's region was unregistered by this client"


def test_tritons_own_shared_memory_api_refuses_clients(fault_server: TritonServer) -> None:
    """Fault matrix row 52: on Triton's own loopback ports its shared-memory API answers only the
    operator (the admin key), not even requests carrying the fronts' key; a region a client registers
    through a front is never registered in Triton, nor mapped by it (before: the fronts passed the
    registration on, and Triton mapped the client's file)."""
    key = fault_server.admin_key
    own_http = httpclient.InferenceServerClient(fault_server.triton_http_url)
    channel = grpc.insecure_channel(fault_server.triton_grpc_url)
    own_grpc = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    status = service_pb2.SystemSharedMemoryStatusRequest()
    names = {protocol: f"fronted_{protocol}_{os.getpid()}" for protocol in PROTOCOLS}
    with client_file(names["http"], 4096), client_file(names["grpc"], 4096):
        clients = {protocol: connect(protocol, url(fault_server, protocol)) for protocol in PROTOCOLS}
        for protocol, name in names.items():
            clients[protocol].register_system_shared_memory(name, f"/{name}", 4096)
        try:
            for headers in ({}, {FRONT_HEADER: key}):
                with pytest.raises(InferenceServerException, match="restricted"):
                    own_http.get_system_shared_memory_status(headers=headers)
                with pytest.raises(InferenceServerException, match="restricted"):
                    own_http.register_system_shared_memory("x", f"/{names['http']}", 64, headers=headers)
            for metadata in ((), ((GRPC_FRONT_HEADER, key),)):
                with pytest.raises(grpc.RpcError) as error:
                    own_grpc.SystemSharedMemoryStatus(status, metadata=metadata)
                assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value
                assert "restricted" in error.value.details()
            in_triton = set(
                own_grpc.SystemSharedMemoryStatus(status, metadata=((GRPC_ADMIN_HEADER, key),)).regions
            )
            in_triton |= {
                r["name"] for r in own_http.get_system_shared_memory_status(headers={ADMIN_HEADER: key})
            }
            assert not in_triton & set(names.values()), in_triton
            maps = Path(f"/proc/{fault_server.pid}/maps").read_text()
            assert not [name for name in names.values() if str(SHM / name) in maps], (
                "Triton maps a client's file"
            )
        finally:
            for protocol, name in names.items():
                clients[protocol].unregister_system_shared_memory(name)
            channel.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_region_truncated_while_in_use_costs_only_its_owner(
    fault_server: TritonServer, good_traffic, protocol: str
) -> None:
    """Fault matrix row 45: a client cuts its own registered region short and restores it, over and
    over, while its requests read their input from it and have their output written into its last
    bytes (``soak.attacks.race_truncation``, which ``make soak`` runs too). Each request is answered,
    or refused with the front's 400 for a region cut short; the server and every other client carry
    on (Triton 2.51 alone: SIGBUS, every model down; before: survived by a SIGBUS handler preloaded
    into tritonserver; now nothing maps the file)."""
    client = connect(protocol, url(fault_server, protocol))
    pid, stubs = fault_server.pid, stub_pids(fault_server)
    # the race runs on good traffic's model too: the server's count includes it
    with good_traffic(server_count=False):
        race = race_truncation(client, protocol, f"cut_mid_copy_{protocol}_{os.getpid()}", seconds=10.0)
    assert fault_server.process.poll() is None, f"tritonserver died during {race}"
    assert race.answered > 0 and race.wrong == [], race
    assert (fault_server.pid, stub_pids(fault_server)) == (pid, stubs)
    client.close()  # here, not in whichever thread collects it (gevent)


def test_the_trusted_option_keeps_tritons_own_mapping(spec_data, tmp_path: Path) -> None:
    """``--trusted-shared-memory`` (a server whose only client is trusted): the fronts check a
    registration as before and pass it on, and Triton maps the file and copies itself (its own
    status lists the region; its faults come back: docs/SERVING.md, Shared memory). The allow-list
    still holds: a request whose region carries what the config does not accept never reaches
    Triton (row 61)."""
    from resilience_fixtures import build_small_repository, explicit_options

    repository = build_small_repository(spec_data, tmp_path / "repository", pipeline=False)
    options = explicit_options(repository, tmp_path / "server")
    options.http_front = options.grpc_front = True
    options.trusted_shared_memory = True
    with TritonServer(options) as server:
        own = httpclient.InferenceServerClient(server.triton_http_url)
        for protocol in PROTOCOLS:
            client = connect(protocol, url(server, protocol))
            values, name = _values(53), f"trusted_{protocol}_{os.getpid()}"
            expected = _expected(client, protocol, values)
            with client_file(name, 4096, 0, values) as path:
                client.register_system_shared_memory(name, f"/{name}", 4096)
                try:
                    listed = own.get_system_shared_memory_status(headers={FRONT_HEADER: server.admin_key})
                    assert name in {r["name"] for r in listed}, listed
                    _infer_in_region(client, protocol, name, 0, ROW)
                    np.testing.assert_array_equal(_floats(path, ROW), expected)
                    wide = client_module(protocol).InferInput("x", [1, 16], "FP64")
                    wide.set_shared_memory(name, 2 * ROW)
                    with pytest.raises(InferenceServerException, match="data-type is 'FP64', but model"):
                        client.infer("trivial", [wide])
                    with pytest.raises(InferenceServerException, match="is the server's own IPC region"):
                        client.register_system_shared_memory("stub", f"/{a_stub_region(server).name}", 64)
                finally:
                    client.unregister_system_shared_memory(name)


def _stream_message(request_id: str, region: str, datatype: str, y_at: int) -> service_pb2.ModelInferRequest:
    """trivial with x read from ``region``'s start as ``datatype`` and y written there at ``y_at``."""
    request = service_pb2.ModelInferRequest(model_name="trivial", id=request_id)
    tensor = request.inputs.add(name="x", datatype=datatype, shape=[1, 16])
    output = request.outputs.add(name="y")
    for parameters, size, offset in ((tensor.parameters, 16 * (8 if datatype == "FP64" else 4), 0),
                                     (output.parameters, ROW, y_at)):  # fmt: skip
        parameters["shared_memory_region"].string_param = region
        parameters["shared_memory_byte_size"].int64_param = size
        parameters["shared_memory_offset"].int64_param = offset
    return request


def test_a_stream_in_shared_memory_gets_the_allow_list_and_its_ids(fault_server: TritonServer) -> None:
    """Rows 44 and 61 on a gRPC stream: each message is checked against the config before the front
    reads its region (one the config refuses gets the allow-list's error on the stream, under its own
    id, and the stream goes on), and the answers of the others come back under the client's ids, their
    outputs written where each asked, whatever order Triton answers them in."""
    client = connect("grpc", url(fault_server, "grpc"))
    values, name = _values(61), f"stream_{os.getpid()}"
    expected = _expected(client, "grpc", values)
    with client_file(name, 4096, 0, values) as path, grpc.insecure_channel(fault_server.grpc_url) as channel:
        client.register_system_shared_memory(name, f"/{name}", 4096)
        try:
            messages = [
                _stream_message("a", name, "FP32", ROW),
                _stream_message("b", name, "FP64", 2 * ROW),
                _stream_message("c", name, "FP32", 3 * ROW),
            ]
            stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
                iter(messages), timeout=60
            )
            answers = {answer.infer_response.id: answer for answer in stream}
        finally:
            client.unregister_system_shared_memory(name)
        assert sorted(answers) == ["a", "b", "c"], sorted(answers)
        refusal = "inference input 'x' data-type is 'FP64', but model 'trivial' expects 'FP32'"
        assert answers["b"].error_message == refusal
        for request_id, at in (("a", ROW), ("c", 3 * ROW)):
            assert answers[request_id].error_message == "", answers[request_id].error_message
            assert list(answers[request_id].infer_response.raw_output_contents) == [b""]
            np.testing.assert_array_equal(_floats(path, at), expected)
        assert path.read_bytes()[2 * ROW : 3 * ROW] == b"\0" * ROW, "the refused message's output was written"
    client.close()
