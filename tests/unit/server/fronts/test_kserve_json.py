"""The fronts' checks without a server: one reading of KServe JSON, exact size checks for
both protocols, inflated bodies, and who is at the other end of a connection (the shared-memory table:
test_client_regions.py)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2

from server.fronts.allow_list import ModelSignature
from server.fronts.body_checks import inflate
from server.fronts.grpc_request import (
    TYPED_FIELDS,
    WIDER_FIELD,
    check_infer_request,
    check_request,
    model_to_check,
    parse_request,
)
from server.fronts.kserve_json import check_infer, check_register, load_json
from server.fronts.peer import peer_uid
from server.fronts.refusal import Refusal, RequestRefusedError
from server.fronts.tensor_limits import check_model_name
from server.shm_private import make_owner_only
from soak.faults import overflowing_request

NOBODY = 65534
LIMIT = 64 << 20


def _signature(name: str, batch: int, **inputs: tuple[str, list[int]]) -> ModelSignature:
    """A model's config as Triton serves it: ``input=(datatype, dims)`` for each input, one output."""
    config = {
        "max_batch_size": batch,
        "input": [{"name": n, "data_type": f"TYPE_{t}", "dims": d} for n, (t, d) in inputs.items()],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    return ModelSignature.from_config(name, config, LIMIT)


DENSE = _signature("recommender_dense", 64, dense=("FP32", [13]))
FLEX = _signature("flex", 8, dense=("FP32", [-1]))
ENCODER = _signature("text_embedding_encoder", 32, input_ids=("INT64", [-1]), attention_mask=("INT64", [-1]))


def _body(shape: list[int], parameters: dict | None = None, data: object = None) -> bytes:
    item = {"name": "dense", "shape": shape, "datatype": "FP32", "data": [0.5] * 13 if data is None else data}
    if parameters:
        item["parameters"] = parameters
        item.pop("data")
    return json.dumps({"inputs": [item]}).encode()


@contextlib.contextmanager
def _refused(match: str, kind: Refusal = Refusal.INVALID) -> Iterator[None]:
    """The block raises ``RequestRefusedError`` matching ``match``, of ``kind``."""
    with pytest.raises(RequestRefusedError, match=match) as refused:
        yield
    assert refused.value.kind == kind, refused.value


def test_duplicate_keys_are_named_wherever_they_are() -> None:
    """Python keeps the last of two keys, Triton the first; a huge first shape aborted it."""
    nested = b'{"inputs":[{"name":"dense","shape":[1099511627776],"shape":[1],"datatype":"FP32","data":[0]}]}'
    with _refused("the key 'shape' twice"):
        check_infer(nested, None, DENSE)
    top = b'{"inputs":[{"name":"d","shape":[1099511627776],"datatype":"FP32","data":[0]}],"inputs":[]}'
    with _refused("the key 'inputs' twice"):
        check_infer(top, None, DENSE)
    with _refused("the key 'key' twice"):
        check_register(b'{"key":"/a","key":"/b","byte_size":4}')


def test_json_only_one_parser_could_read_is_refused() -> None:
    with _refused("integer of 400 digits"):
        load_json(b"[" + b"9" * 400 + b"]")
    with _refused("beyond a double"):
        load_json(b"[1e400]")
    with _refused("lone UTF-16 surrogate"):
        load_json(b'{"id": "\\ud800"}')
    assert load_json(b'{"id": "\\ud83d\\ude00"}') == {"id": "\U0001f600"}  # a proper pair is fine
    with _refused("not UTF-8"):
        load_json('{"id": "x"}'.encode("utf-16"))
    with _refused("nests too deeply"):
        load_json(b"[" * 100_000)
    with _refused("not valid JSON"):
        load_json(b"hello")


def test_shapes_the_body_cannot_carry_are_refused() -> None:
    assert check_infer(_body([1, 13]), None, DENSE) == []
    with _refused(
        r"declares shape \[64, 1099511627776\] \(70368744177664 elements\) but the request carries"
    ):
        check_infer(_body([64, 2**40]), None, DENSE)
    with _refused("non-negative integers"):
        check_infer(_body([-1, 13]), None, DENSE)
    shm = {"shared_memory_region": "r", "shared_memory_byte_size": 4 * 64 * 13}
    [use] = check_infer(_body([64, 13], shm), None, DENSE)  # carried by shared memory, not the body
    assert (use.region, use.offset, use.byte_size) == ("r", 0, 3328)
    with _refused("its shared memory range carries only 3328 bytes"):
        check_infer(_body([64, 2**20], shm), None, DENSE)
    binary = _body([1, 13], {"binary_data_size": 52})
    check_infer(binary + b"\0" * 52, str(len(binary)), DENSE)  # binary tensor data after the header
    with _refused("declare 52 bytes of binary data but the body carries 10"):
        check_infer(binary + b"\0" * 10, str(len(binary)), DENSE)
    with _refused("declare 52 bytes of binary data but the body carries 60"):
        check_infer(binary + b"\0" * 60, str(len(binary)), DENSE)  # bytes after the inputs' own
    with _refused(r"shape \[1, 2305843009213693952\].*its binary data carries only 0 bytes"):
        check_infer(_body([1, 2**61], {"binary_data_size": 0}), None, DENSE)


def test_inference_header_length_has_one_reading() -> None:
    """Triton reads "+205", " 205" and "205abc" as 205 and "²" not at all; only ASCII digits pass."""
    header = _body([1, 13])
    for bad in ("²", "+5", "5abc", "0x10", "9" * 4301, str(len(header) + 1)):
        with _refused("Inference-Header-Content-Length"):
            check_infer(header, bad, DENSE)
    assert check_infer(b"\0" * 52, "0", DENSE) == []  # Triton's raw request: the body is one input's
    with _refused(r"input byte size mismatch for input 'dense' .*Expected 52, got 64"):
        check_infer(b"\0" * 64, "0", DENSE)  # shaped [1, 13] as Triton deduces it from the config
    with _refused("Raw request must only have 1 input"):
        check_infer(b"\0" * 16, "0", ENCODER)


def test_fields_triton_answers_500_for_get_400_naming_them() -> None:
    good = {"name": "dense", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1]}
    cases = [
        ({**good, "datatype": 5}, "input 'dense': 'datatype' must be a string, got 5"),
        ({**good, "shape": "x"}, "input 'dense': 'shape' must be a list"),
        ({**good, "data": "abc"}, "input 'dense': 'data' must be a list"),
        ({**good, "data": [True, 1]}, "input 'dense': FP32 data must be JSON numbers, got true"),
        ({**good, "data": [0.5]}, r"'data' holds 1 values but shape \[1, 2\] needs 2"),
        (
            {**good, "datatype": "INT64", "data": [1, 1.5]},
            r"INT64 data must be integers in \[-2\^63, 2\^63\)",
        ),
        (
            {**good, "datatype": "UINT8", "data": [1, -1]},
            r"UINT8 data must be integers in \[0, 2\^8\), got -1",
        ),
        (
            {**good, "datatype": "BYTES", "data": [42, "x"]},
            "input 'dense': BYTES data must be JSON strings, got 42",
        ),
        ({**good, "parameters": [1]}, "input 'dense': 'parameters' must be an object"),
    ]
    for item, message in cases:
        with _refused(message):
            check_infer(json.dumps({"inputs": [item]}).encode(), None, FLEX)
    requests = [
        ({"inputs": [good], "id": 5}, "request: 'id' must be a string"),
        ({"inputs": [good], "parameters": {"priority": "x"}}, "'priority' must be an integer"),
        (
            {"inputs": [good], "parameters": {"binary_data_output": 1}},
            "'binary_data_output' must be true or false",
        ),
        (
            {"inputs": [good], "outputs": [{"name": "y", "parameters": {"classification": -1}}]},
            "'classification' must be a non-negative integer, got -1",
        ),
        ({"inputs": {"a": 1}}, "request: 'inputs' must be a list"),
        ([1], "must be an object with an 'inputs' list"),
    ]
    for document, message in requests:
        with _refused(message):
            check_infer(json.dumps(document).encode(), None, FLEX)
    nested = {**good, "shape": [2, 1], "data": [[0.5], [1]]}  # any nesting Triton reads is fine
    assert check_infer(json.dumps({"inputs": [nested]}).encode(), None, FLEX) == []


INTEGER_RANGES = [
    ("INT8", -128, 127),
    ("UINT8", 0, 255),
    ("INT16", -(2**15), 2**15 - 1),
    ("UINT16", 0, 2**16 - 1),
    ("INT32", -(2**31), 2**31 - 1),
    ("UINT32", 0, 2**32 - 1),
    ("INT64", -(2**63), 2**63 - 1),
    ("UINT64", 0, 2**64 - 1),
]


def _narrow_body(datatype: str, *values: int) -> bytes:
    """An HTTP inference to ``_signature("narrow", 8, v=(datatype, [-1]))`` with ``values`` as JSON."""
    return json.dumps(
        {"inputs": [{"name": "v", "shape": [1, len(values)], "datatype": datatype, "data": values}]}
    ).encode()


def _narrow_typed(datatype: str, *values: int) -> service_pb2.ModelInferRequest:
    """The same inference over gRPC, ``values`` in the datatype's typed-contents field (``ValueError``
    where that field cannot hold one of them)."""
    request = service_pb2.ModelInferRequest(model_name="narrow")
    tensor = request.inputs.add(name="v", datatype=datatype, shape=[1, len(values)])
    getattr(tensor.contents, TYPED_FIELDS[datatype]).extend(values)
    return request


@pytest.mark.parametrize(("datatype", "low", "high"), INTEGER_RANGES)
def test_json_integers_beyond_their_datatype_are_refused(datatype: str, low: int, high: int) -> None:
    """Fault matrix row 68. Triton casts a JSON integer to its input's datatype unchecked (300 as UINT8
    runs as 44): the front refused only integers beyond 64 bits, so it checked 300 and Triton ran 44."""
    model = _signature("narrow", 8, v=(datatype, [-1]))
    assert check_infer(_narrow_body(datatype, low, high), None, model) == []
    for beyond in (low - 1, high + 1):
        with _refused(f"input 'v': {datatype} data must be integers in .*, got {beyond}"):
            check_infer(_narrow_body(datatype, low, beyond), None, model)


@pytest.mark.parametrize(("datatype", "low", "high"), INTEGER_RANGES)
def test_typed_contents_beyond_their_datatype_are_refused_as_json_values_are(
    datatype: str, low: int, high: int
) -> None:
    """Fault matrix row 68. ``int_contents`` is int32 for INT8 and INT16, ``uint_contents`` uint32 for
    UINT8 and UINT16, and Triton 2.51 casts a value there unchecked as it casts JSON (300 as UINT8 ran
    as 44, 40000 as INT16 as -25536): the gRPC front refuses it in the HTTP front's words, by the same
    check. The other fields hold only their datatype's values (protobuf refuses to carry more)."""
    model = _signature("narrow", 8, v=(datatype, [-1]))
    assert check_infer_request(_narrow_typed(datatype, low, high), model) == []
    carried = []
    for beyond in (low - 1, high + 1):
        try:
            request = _narrow_typed(datatype, low, beyond)
        except ValueError:  # beyond the field too (-1 in uint_contents, 2^31 in int_contents)
            continue
        carried.append(beyond)
        with pytest.raises(RequestRefusedError) as over_grpc:
            check_infer_request(request, model)
        with pytest.raises(RequestRefusedError) as over_http:
            check_infer(_narrow_body(datatype, low, beyond), None, model)
        assert str(over_grpc.value) == str(over_http.value)
        assert str(over_grpc.value).endswith(f"got {beyond}"), over_grpc.value
        assert over_grpc.value.kind == Refusal.INVALID
    assert bool(carried) == (datatype in WIDER_FIELD), f"{TYPED_FIELDS[datatype]} carries {carried}"


def test_json_numbers_beyond_fp32_are_refused_and_non_finite_literals_left_to_the_model() -> None:
    """Fault matrix row 68. Triton casts a JSON number to FP32 unchecked: 1e39 runs as infinity. NaN
    and Infinity literals both parsers read alike (the backend refuses them: row 8)."""
    model = _signature("fp32", 8, v=("FP32", [-1]))
    largest = float.fromhex("0x1.fffffep+127")
    for text in (f"{largest!r}", f"-{largest!r}", "NaN", "-Infinity", "1e-50"):
        assert (
            check_infer(
                b'{"inputs":[{"name":"v","shape":[1,1],"datatype":"FP32","data":[%s]}]}' % text.encode(),
                None,
                model,
            )
            == []
        )
    for text, shown in (("1e39", "1e+39"), ("-3.5e38", "-3.5e+38"), (str(10**39), str(10**39))):
        with _refused(f"input 'v': {re.escape(shown)} is beyond FP32"):
            check_infer(
                b'{"inputs":[{"name":"v","shape":[1,1],"datatype":"FP32","data":[%s]}]}' % text.encode(),
                None,
                model,
            )


def test_shared_memory_register_bodies() -> None:
    assert check_register(b'{"key": "/r1", "byte_size": 64}') == ("/r1", 0, 64)
    for body, message in (
        (b'{"byte_size": 64}', "'key' is missing"),
        (b'{"key": 5, "byte_size": 64}', "'key' must be a string"),
        (b'{"key": "/r", "byte_size": "a"}', "'byte_size' must be an integer"),
        (b'{"key": "/r", "byte_size": 4, "offset": -1}', "'offset' must be a non-negative integer"),
        (b"{", "not valid JSON"),
        (b"", "not valid JSON"),
    ):
        with _refused(message):
            check_register(body)


def test_compressed_bodies_are_inflated_with_a_bound() -> None:
    plain = _body([1, 13])
    assert inflate(gzip.compress(plain), "gzip", 1 << 20) == plain
    assert inflate(zlib.compress(plain), "Deflate", 1 << 20) == plain
    assert inflate(plain, None, 1 << 20) == inflate(plain, "identity", 1 << 20) == plain
    with _refused("not valid gzip data"):
        inflate(plain, "gzip", 1 << 20)  # a plain body marked gzip was a 500
    with _refused("inflates to more than 1048576 bytes", Refusal.TOO_LARGE):
        inflate(gzip.compress(b"\0" * (64 << 20)), "gzip", 1 << 20)  # a 64 KB bomb of 64 MiB
    with _refused("not one complete gzip stream"):
        inflate(gzip.compress(plain)[:-8], "gzip", 1 << 20)
    with _refused("'br' is not supported", Refusal.UNSUPPORTED):
        inflate(plain, "br", 1 << 20)


def _grpc_request(
    shape: list[int], raw: bytes | None = b"", datatype: str = "INT64"
) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="text_embedding_encoder")
    for name in ("input_ids", "attention_mask"):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=shape)
        if raw is not None:
            request.raw_input_contents.append(raw)
        else:
            tensor.contents.int64_contents.extend([1] * 2)
    return request


def test_grpc_inputs_must_carry_their_declared_bytes() -> None:
    """INT64 [1, 2**61] with empty raw contents is 97 bytes; Triton wraps 2**64 to 0."""
    overflow = overflowing_request("text_embedding_encoder", ("input_ids", "attention_mask"))
    assert overflow.ByteSize() == 97
    with _refused(r"'input_ids' declares shape \[1, 2305843009213693952\].*its raw data carries only 0"):
        check_infer_request(overflow, ENCODER)
    assert check_infer_request(_grpc_request([1, 2], b"\0" * 16), ENCODER) == []
    with _refused("its raw data carries only 15 bytes"):
        check_infer_request(_grpc_request([1, 2], b"\0" * 15), ENCODER)
    with _refused("input byte size mismatch for input 'input_ids' .*Expected 16, got 17"):
        check_infer_request(_grpc_request([1, 2], b"\0" * 17), ENCODER)
    assert check_infer_request(_grpc_request([1, 2], None), ENCODER) == []  # typed contents: 2 values each
    with _refused("its typed data carries only 2 bytes"):
        check_infer_request(_grpc_request([1, 3], None), ENCODER)
    with _refused("its typed contents hold 2 values but shape \\[1,1\\] needs 1"):
        check_infer_request(_grpc_request([1, 1], None), ENCODER)
    shm = _grpc_request([1, 2], None)
    shm.inputs[0].ClearField("contents")
    shm.inputs[0].parameters["shared_memory_region"].string_param = "r1"
    shm.inputs[0].parameters["shared_memory_byte_size"].int64_param = 16
    shm.inputs[1].ClearField("contents")
    shm.raw_input_contents.append(b"\0" * 16)  # raw contents go to the inputs without shm, in order
    [use] = check_infer_request(shm, ENCODER)
    assert (use.region, use.byte_size) == ("r1", 16)
    shm.raw_input_contents.append(b"")
    with _refused("2 raw_input_contents entries for 1 inputs sent as raw data"):
        check_infer_request(shm, ENCODER)
    named = _grpc_request([1, 2], b"\0" * 16)
    named.model_name = "recommender\x00x"
    with _refused("holds a control character"):
        check_infer_request(named, ENCODER)


def test_grpc_calls_are_checked_by_method() -> None:
    """Each method gets the checks of its message; an inference call's shared-memory ranges are
    returned for the front to copy."""
    with _refused("ModelInfer: not a valid ModelInferRequest message"):
        parse_request("ModelInfer", b"\xff\xff")
    assert parse_request("NoSuchMethod", b"\xff") is None  # not the service's: forwarded as it is
    request = parse_request("ModelInfer", _grpc_request([1, 2], b"\0" * 16).SerializeToString())
    assert model_to_check("ModelInfer", request) == ("text_embedding_encoder", "")
    assert model_to_check("ModelMetadata", service_pb2.ModelMetadataRequest(name="x")) is None
    request.model_name = "recommender\x00x"
    with _refused("holds a control character"):
        model_to_check("ModelInfer", request)  # before its name is sent to Triton to ask for a config

    assert check_request("ModelInfer", _grpc_request([1, 2], b"\0" * 16), ENCODER) == []
    with pytest.raises(ValueError, match="checked against its model's config"):
        check_request("ModelInfer", _grpc_request([1, 2], b"\0" * 16))  # never without a config
    with _refused("holds a control character"):
        check_request("ModelMetadata", service_pb2.ModelMetadataRequest(name="a\x00b"))


def test_model_names_with_control_characters_are_refused() -> None:
    check_model_name("recommender")
    check_model_name("")  # statistics of every model: Triton's to judge
    for name in ("recommender\x00x", "a\nb", "a\x7f"):
        with _refused("holds a control character"):
            check_model_name(name)


def test_stub_regions_are_made_owner_only(tmp_path: Path) -> None:
    for name, mode in (("tb1_a", 0o644), ("tb1_b", 0o600), ("other", 0o644)):
        (tmp_path / name).write_bytes(b"")
        os.chmod(tmp_path / name, mode)
    assert make_owner_only("tb1_", tmp_path) == ["tb1_a"]
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {
        "tb1_a": 0o600, "tb1_b": 0o600, "other": 0o644,
    }  # fmt: skip


def test_peer_uid_finds_the_local_client(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()):
            connection, address = listener.accept()
            with connection:
                assert peer_uid(address, connection.getsockname()) == os.getuid()
                assert peer_uid(("10.1.2.3", 4242), connection.getsockname()) is None
    with socket.socket(socket.AF_INET6) as listener:  # dual-stack: an IPv4 client's addresses are mapped
        listener.bind(("::", 0))
        listener.listen()
        with socket.create_connection(("127.0.0.1", listener.getsockname()[1])):
            connection, address = listener.accept()
            with connection:
                assert address[0] == "::ffff:127.0.0.1"
                assert peer_uid(address[:2], connection.getsockname()[:2]) == os.getuid()
                assert peer_uid(("127.0.0.1", address[1]), connection.getsockname()[:2]) == os.getuid()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another uid")
def test_peer_uid_tells_users_apart() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        child = os.fork()
        if child == 0:  # another user's client: connect and stay connected until killed
            os.setuid(NOBODY)
            client = socket.socket()
            client.connect(listener.getsockname())
            time.sleep(600)
            os._exit(0)
        try:
            connection, address = listener.accept()
            with connection:
                assert peer_uid(address, connection.getsockname()) == NOBODY
        finally:  # once looked at: a child that left on a timer could be gone before the look
            os.kill(child, 9)
            os.waitpid(child, 0)


@pytest.mark.parametrize(
    ("asked", "refused"),
    [
        ({"binary_data": True}, "binary_data"),
        ({"classification": 1}, "classification"),
        ({"classification": 0}, "classification"),  # Triton refuses the parameter's presence
        ({"binary_data": False}, None),  # Triton takes it: the output goes to the region
    ],
)
def test_an_output_in_shared_memory_asks_for_nothing_else(asked: dict, refused: str | None) -> None:
    """Fault matrix row 76: an output in a region that also asks for binary data or a classification is
    refused in Triton's words, over HTTP (both) and gRPC (classification: gRPC has no binary data, and
    Triton ignores the parameter there); before, the front answered both, writing a classification's
    strings into the region."""
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    body = json.loads(_body([1, 13]))
    body["outputs"] = [{"name": "y", "parameters": {**region, **asked}}]
    request = _grpc_request([1, 2], b"\0" * 16)
    output = request.outputs.add(name="y")
    output.parameters["shared_memory_region"].string_param = "r"
    output.parameters["shared_memory_byte_size"].int64_param = 4
    for key, value in asked.items():
        if isinstance(value, bool):
            output.parameters[key].bool_param = value
        else:
            output.parameters[key].int64_param = value
    if refused is None:
        assert len(check_infer(json.dumps(body).encode(), None, DENSE)) == 1
    else:
        with _refused(f"Output 'y' can't set both 'shared_memory_region' and '{refused}'"):
            check_infer(json.dumps(body).encode(), None, DENSE)
    if refused == "classification":
        with _refused("output 'y' can't set both 'shared_memory_region' and 'classification'"):
            check_infer_request(request, ENCODER)
    else:
        assert len(check_infer_request(request, ENCODER)) == 1
