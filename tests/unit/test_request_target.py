"""The fronts' target and shape checks without a server (fault matrix rows 35 and 37); the fault
matrix runs them against the real server (tests/faults/test_request_targets.py,
test_unanswered_requests.py)."""

from __future__ import annotations

import pytest

from server.fronts.refusal import RequestRefusedError
from server.fronts.request_target import checked_target, forwarded_target
from server.fronts.tensor_limits import ModelShapes, check_fits_model

ENCODER = ModelShapes.from_config(
    "text_embedding_encoder",
    {"max_batch_size": 32, "input": [{"name": "input_ids", "dims": ["-1"]}, {"name": "mask", "dims": [4]}]},
)


@pytest.mark.parametrize(
    "target",
    [
        "/v2/systemsharedmemory/unregister#x", "/v2/models/..%2F..", "/v2/models/%2e%2e", "/v2//x",
        "/v2/x/", "/v2/a/../b", "/v2/./b", "http://host/v2/health/ready", "/v2/a\\b", "/v2/a%zz",
        "/v2/a%25", "/v2/a%00", "/v2/a%5Cb", "/v2/a%3Fb", "/v2/a%23b", "/v3/x", "/v2x", "*", "host:80",
        "/v2/\u00e9", "/v2/a b", "/v2/a\x7f", "/v2?a=\\",
    ],
)  # fmt: skip
def test_a_target_that_is_not_plain_is_refused(target: str) -> None:
    with pytest.raises(RequestRefusedError, match=r"^request target .*; send a plain /v2/\.\.\. path$"):
        checked_target(target)


@pytest.mark.parametrize(
    ("target", "forwarded"),
    [
        ("/v2/health/ready", "/v2/health/ready"),
        ("/v2", "/v2"),
        ("/v2/models/my%20model/infer?x=1", "/v2/models/my%20model/infer?x=1"),
        ("/v2/models/a%C3%A9/config?", "/v2/models/a%C3%A9/config"),
    ],
)
def test_a_plain_target_is_forwarded_as_checked(target: str, forwarded: str) -> None:
    assert forwarded_target(*checked_target(target)) == forwarded


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ([2**62, 0], "a dimension above 2147483647 fits no model"),
        ([2**31 - 1, 2**31 - 1, 2**31 - 1, 0], "whose size overflows a 64-bit integer"),
        ([33, 4], "inference request batch-size must be <= 32 for 'text_embedding_encoder'"),
        ([1, 4, 1], "Expected [-1,-1], got [1,4,1]."),
        ([4], "Expected [-1,-1], got [4]."),
    ],
)
def test_a_shape_the_config_does_not_allow_is_refused(shape: list[int], message: str) -> None:
    with pytest.raises(RequestRefusedError) as refusal:
        check_fits_model("input_ids", shape, 8, ENCODER)
    assert message in str(refusal.value)


def test_fixed_dims_and_unknown_inputs() -> None:
    check_fits_model("input_ids", [32, 2**31 - 1], 8, ENCODER)  # variable: any length up to the bound
    check_fits_model("mask", [0, 4], 8, ENCODER)  # an empty batch is Triton's to answer
    with pytest.raises(RequestRefusedError, match=r"Expected \[-1,4\], got \[1,5\]"):
        check_fits_model("mask", [1, 5], 8, ENCODER)
    check_fits_model("unknown", [1, 2, 3], 8, ENCODER)  # Triton names an input the model lacks
    check_fits_model("input_ids", [1, 2, 3], 8, None)  # no config: only the bounds that need none
