"""Fault matrix: bad input (wrong dtype/shape/batch, empty batch, missing input, malformed JSON) and
the input guards (row 8: NaN/±Inf, ids outside the declared range), on a model and on its pipeline,
over HTTP and gRPC, with good traffic alongside."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from harness import PROTOCOLS, exchange, raw_request, url
from tritonclient.utils import InferenceServerException

from client.connection import connect
from server import TritonServer

pytestmark = pytest.mark.integration
MODELS = ("recommender", "recommender_pipeline")
STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def _inputs(protocol: str, dtype="FP32", rows=1, width=13, id_rows=None, ids=1, value=0.5) -> list:
    module = httpclient if protocol == "http" else grpcclient
    dense = module.InferInput("dense", [rows, width], dtype)
    dense.set_data_from_numpy(np.full((rows, width), value, np.float64 if dtype == "FP64" else np.float32))
    id_rows = rows if id_rows is None else id_rows
    sparse = module.InferInput("sparse_ids", [id_rows, 8], "INT64")
    sparse.set_data_from_numpy(np.full((id_rows, 8), ids, np.int64))
    return [dense, sparse]


# (case, inputs, the exact message with {model} for the model named in the request)
CASES = [
    ("wrong_dtype", {"dtype": "FP64"},
     "inference input 'dense' data-type is 'FP64', but model '{model}' expects 'FP32'"),
    ("wrong_shape", {"width": 12},
     "unexpected shape for input 'dense' for model '{model}'. Expected [-1,13], got [1,12]."),
    ("batch_above_max", {"rows": 65}, "inference request batch-size must be <= 64 for '{model}'"),
    ("empty_batch", {"rows": 0},
     "input 'dense' for model '{model}' has shape [0,13], outside what its config allows: [1..64,13] "
     "(a batch of at least 1)"),
    ("rows_disagree", {"id_rows": 2}, "input 'dense' batch size does not match other inputs for '{model}'"),
    ("nan", {"value": np.nan},
     "input 'dense' holds 13 non-finite value(s) (NaN or Inf); the model takes finite numbers only"),
    ("inf", {"value": -np.inf},
     "input 'dense' holds 13 non-finite value(s) (NaN or Inf); the model takes finite numbers only"),
    ("negative_id", {"ids": -1}, "input 'sparse_ids' holds -1, outside its declared range [0, 10000)"),
    ("id_above_range", {"ids": 10**9},
     "input 'sparse_ids' holds 1000000000, outside its declared range [0, 10000)"),
    # inside the declared range, beyond the smallest table (10 rows): the pipeline's stage answered 500
    # (fault matrix row 63)
    ("id_beyond_a_table", {"ids": 50}, "input 'sparse_ids' holds a value the model rejects"),
]  # fmt: skip


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", MODELS)
def test_bad_input_gets_the_exact_error(fault_server: TritonServer, good_traffic, protocol, model) -> None:
    """Every case, one after another, while good requests flow; each answer names the problem."""
    client = connect(protocol, url(fault_server, protocol))
    with good_traffic():
        for case, changes, message in CASES:
            with pytest.raises(InferenceServerException) as error:
                client.infer(model, _inputs(protocol, **changes))
            assert error.value.status() == STATUS[protocol], (case, error.value.message())
            assert message.format(model=model) in error.value.message(), case
        good = client.infer(model, _inputs(protocol)).as_numpy("probability")
        assert good.shape == (1, 1) and np.isfinite(good).all()


def test_missing_input_is_named(fault_server: TritonServer) -> None:
    for protocol in PROTOCOLS:
        client = connect(protocol, url(fault_server, protocol))
        with pytest.raises(InferenceServerException) as error:
            client.infer("recommender", _inputs(protocol)[:1])
        assert error.value.status() == STATUS[protocol]
        assert "missing required input(s) ['sparse_ids']" in error.value.message()


def _post(server: TritonServer, body: bytes) -> tuple[int, dict]:
    [(status, answer)] = exchange(server, raw_request(body))
    return status, json.loads(answer)


def test_json_bodies(fault_server: TritonServer, good_traffic) -> None:
    """Malformed JSON gets a 400 from the HTTP front (Triton 2.51 alone answers 500); a bare NaN
    literal, which Triton's parser accepts, reaches the model's guard: 400, not a NaN answer."""
    nan_literal = (
        b'{"inputs":[{"name":"dense","shape":[1,13],"datatype":"FP32","data":[NaN,1,1,1,1,1,1,1,1,1,1,1,1]},'
        b'{"name":"sparse_ids","shape":[1,8],"datatype":"INT64","data":[1,1,1,1,1,1,1,1]}]}'
    )
    invalid = "request body is not valid JSON: "
    truncated = invalid + "Expecting property name enclosed in double quotes: line 1 column 32 (char 31)"
    with good_traffic():
        assert _post(fault_server, b'{"inputs": [ {"name": "dense", ') == (400, {"error": truncated})
        assert _post(fault_server, b"hello") == (
            400,
            {"error": invalid + "Expecting value: line 1 column 1 (char 0)"},
        )
        status, answer = _post(fault_server, nan_literal)
        assert status == 400
        assert answer["error"] == (
            "input 'dense' holds 1 non-finite value(s) (NaN or Inf); the model takes finite numbers only"
        )


def test_paths_outside_the_api_are_refused(fault_server: TritonServer) -> None:
    """Path traversal through the URL reaches no file: the HTTP front refuses any target that is not a
    plain /v2 path (fault matrix row 35), 400 naming the problem."""
    for path in (
        "/v2/models/..%2F..%2Fetc%2Fpasswd",
        "/v2/models/../../etc/passwd/infer",
        "/v2/models/%2e%2e",
    ):
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"http://{fault_server.http_url}{path}", timeout=10)
        assert error.value.code == 400, path
        assert json.loads(error.value.read())["error"].startswith(f"request target {path!r}"), path
