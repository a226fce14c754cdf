"""The allow-list without a server (fault matrix rows 37, 53–55): what a model's config accepts, for
every carrier alike, and Triton's wording where Triton has one. The fault matrix runs it against the
real server over both protocols (tests/faults/test_allow_list.py)."""

from __future__ import annotations

import json
import math
import struct

import pytest

from server.fronts.allow_list import (
    CarriedInput,
    Carrier,
    ModelSignature,
    check_allowed,
    raw_request_input,
)
from server.fronts.kserve_json import check_generate
from server.fronts.refusal import Refusal, RequestRefusedError

LIMIT = 64 << 20
ENCODER_CONFIG = {
    "max_batch_size": 32,
    "input": [
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]},
        {"name": "mask", "data_type": "TYPE_INT64", "dims": [4]},
    ],
    "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}],
}
ENCODER = ModelSignature.from_config("text_embedding_encoder", ENCODER_CONFIG, LIMIT)
TEXT = ModelSignature.from_config(
    "text_embedding",
    {
        "max_batch_size": 32,
        "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
        "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}],
    },
    LIMIT,
)


def _binary(name: str, shape: tuple[int, ...], datatype: str = "INT64", extra: int = 0) -> CarriedInput:
    size = math.prod(shape) * (8 if datatype in ("INT64", "FP64") else 4) + extra
    return CarriedInput(name, datatype, shape, Carrier.BINARY, size)


def _encoder(ids: tuple[int, ...], mask: tuple[int, ...] | None = None) -> list[CarriedInput]:
    mask = mask if mask is not None else (ids[0], 4)
    return [_binary("input_ids", ids), _binary("mask", mask)]


def _refused(model: ModelSignature, inputs: list[CarriedInput], outputs: tuple[str, ...] = ()) -> str:
    with pytest.raises(RequestRefusedError) as refusal:
        check_allowed(model, inputs, list(outputs))
    assert refusal.value.kind == Refusal.INVALID
    return str(refusal.value)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2**62, 0), "declares shape [4611686018427387904, 0]: a dimension above 2147483647 fits no model"),
        ((2**31 - 1, 2**31 - 1, 2**31 - 1, 0), "whose size overflows a 64-bit integer"),
        ((33, 4), "inference request batch-size must be <= 32 for 'text_embedding_encoder'"),
        ((1, 4, 1), "Expected [-1,-1], got [1,4,1]."),
        ((4,), "Expected [-1,-1], got [4]."),
        (
            (0, 0),
            "has shape [0,0], outside what its config allows: [1..32,1..8388608] (a batch of at least 1)",
        ),
        ((1, 0), "a dimension may be 0 only where the config's input_min_shapes says so"),
        ((1, 8388609), "(a -1 dim without input_max_shapes: what fits in 67108864 bytes)"),
    ],
)
def test_a_shape_the_config_does_not_allow_is_refused(shape: tuple[int, ...], message: str) -> None:
    """Every dim within [1, bound]: the batch up to max_batch_size, a -1 dim up to what fits in the
    front's limit where the config declares no max; a zero dim is refused (Triton never answered
    ``[0, 0]``)."""
    assert message in _refused(ENCODER, _encoder(shape))


def test_a_request_the_config_allows_passes() -> None:
    check_allowed(ENCODER, _encoder((32, 2**20)), ["embedding"])  # the bounds themselves
    check_allowed(ENCODER, _encoder((1, 1)), [])


def test_bounds_the_config_declares() -> None:
    """``input_max_shapes`` bounds a -1 dim (the backend's message); ``input_min_shapes`` with a 0
    lets that dim be 0; a fixed dim of 0 is the config's own."""
    parameters = {
        "input_max_shapes": {"string_value": '{"input_ids": [16]}'},
        "input_min_shapes": {"string_value": '{"input_ids": [0]}'},
    }
    model = ModelSignature.from_config("enc", {**ENCODER_CONFIG, "parameters": parameters}, LIMIT)
    check_allowed(model, _encoder((2, 0)), [])
    check_allowed(model, _encoder((2, 16)), [])
    assert "has shape [2, 17], beyond its max_shape [batch, 16]" in _refused(model, _encoder((2, 17)))
    assert model.allowed("input_ids") == "[1..32,0..16]"
    fixed_zero = {**ENCODER_CONFIG, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [0]}]}
    empty = ModelSignature.from_config("empty", fixed_zero, LIMIT)
    check_allowed(empty, [CarriedInput("x", "FP32", (3, 0), Carrier.BINARY, 0)], [])


def test_names_are_exactly_the_models_inputs() -> None:
    """Triton's messages: missing, unknown, twice; an optional input may be left out."""
    ids, mask = _encoder((1, 3))
    assert _refused(ENCODER, [ids]) == (
        "expected 2 inputs but got 1 inputs for model 'text_embedding_encoder'. Got input(s) ['input_ids'], "
        "but missing required input(s) ['mask']. Please provide all required input(s)."
    )
    extra = _binary("extra", (1, 3))
    assert _refused(ENCODER, [ids, mask, extra]) == (
        "unexpected inference input 'extra' for model 'text_embedding_encoder'"
    )
    assert _refused(ENCODER, [ids, mask, ids]) == "input 'input_ids' already exists in request"
    optional = {
        **ENCODER_CONFIG,
        "input": [ENCODER_CONFIG["input"][0], {**ENCODER_CONFIG["input"][1], "optional": True}],
    }
    check_allowed(ModelSignature.from_config("opt", optional, LIMIT), [ids], [])


def test_datatype_batch_agreement_and_outputs() -> None:
    ids, mask = _encoder((1, 3))
    fp32 = CarriedInput("input_ids", "FP32", (1, 3), Carrier.BINARY, 12)
    assert _refused(ENCODER, [fp32, mask]) == (
        "inference input 'input_ids' data-type is 'FP32', but model 'text_embedding_encoder' expects 'INT64'"
    )
    # Triton reads the last input first and names the first that differs from it
    assert _refused(ENCODER, [ids, _binary("mask", (2, 4))]).startswith("input 'input_ids' batch size")
    assert _refused(ENCODER, [_binary("mask", (2, 4)), ids]).startswith("input 'mask' batch size")
    assert _refused(ENCODER, [ids, mask], ("nope",)) == (
        "unexpected inference output 'nope' for model 'text_embedding_encoder'"
    )
    assert "requested 2 times" in _refused(ENCODER, [ids, mask], ("embedding", "embedding"))


def test_what_carries_an_input_holds_exactly_what_its_shape_needs() -> None:
    _, mask = _encoder((1, 3))
    for extra, got in ((-8, 16), (8, 32)):
        assert _refused(ENCODER, [_binary("input_ids", (1, 3), extra=extra), mask]) == (
            "input byte size mismatch for input 'input_ids' for model 'text_embedding_encoder'. "
            f"Expected 24, got {got}"
        )
    json_ids = CarriedInput("input_ids", "INT64", (1, 3), Carrier.JSON, 2)
    assert "its JSON data hold 2 values but shape [1,3] needs 3" in _refused(ENCODER, [json_ids, mask])
    check_allowed(ENCODER, [CarriedInput("input_ids", "INT64", (1, 3), Carrier.TYPED, 3), mask], [])


def _strings(*texts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


def test_bytes_length_prefixes_must_walk_the_buffer_exactly() -> None:
    def text(payload: bytes, rows: int = 2) -> list[CarriedInput]:
        return [CarriedInput("text", "BYTES", (rows, 1), Carrier.BINARY, len(payload), payload)]

    check_allowed(TEXT, text(_strings(b"hello", b"")), [])
    assert _refused(TEXT, text(_strings(b"hello"))) == (
        "expected 2 string elements for inference input 'text' for model 'text_embedding', got 1"
    )
    assert "got 1" in _refused(TEXT, text(_strings(b"hello") + struct.pack("<I", 99) + b"abc"))
    assert "holds 2 bytes after the 2 BYTES elements" in _refused(TEXT, text(_strings(b"a", b"b") + b"zz"))
    assert "got 3" in _refused(TEXT, text(_strings(b"a", b"b", b"c")))
    unread = CarriedInput("text", "BYTES", (2, 1), Carrier.SHARED_MEMORY, 7)  # a range not read
    assert "too few for the length prefixes of 2 BYTES elements" in _refused(TEXT, [unread])


def test_a_raw_request_is_shaped_as_triton_deduces_it() -> None:
    single = ModelSignature.from_config(
        "one",
        {"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2, -1]}]},
        LIMIT,
    )
    assert raw_request_input(single, 24).shape == (1, 2, 3)
    with pytest.raises(RequestRefusedError, match="Raw request must only have 1 input"):
        raw_request_input(ENCODER, 24)
    assert raw_request_input(TEXT, 5).shape == (1, 1)  # one BYTES element, whatever its length


def test_the_largest_request_and_the_deadline_come_from_the_config() -> None:
    """Bodies are bounded by what the model accepts: every element at its most as JSON, plus the
    header's allowance; a BYTES input has no bound in a config, so the front's own."""
    recommender = ModelSignature.from_config(
        "recommender",
        {
            "max_batch_size": 64,
            "input": [
                {"name": "dense", "data_type": "TYPE_FP32", "dims": [13]},
                {"name": "sparse_ids", "data_type": "TYPE_INT64", "dims": [8]},
            ],
            "parameters": {"request_deadline_s": {"string_value": "2.5"}},
        },
        LIMIT,
    )
    assert recommender.largest_request_bytes() == (64 << 10) + 64 * 21 * 40
    assert recommender.deadline_s == 2.5
    assert TEXT.largest_request_bytes() == LIMIT and TEXT.deadline_s is None


def test_a_generate_request_is_shaped_as_triton_shapes_it() -> None:
    """``/generate`` takes inputs as top-level JSON values: Triton makes ``{"input_ids": []}`` the
    shape ``[1, 0]``, which reached onnxruntime as a 500; through the fronts it is the zero dim it is."""
    two = ModelSignature.from_config(
        "two",
        {
            **ENCODER_CONFIG,
            "input": [ENCODER_CONFIG["input"][0], {**ENCODER_CONFIG["input"][0], "name": "mask"}],
        },
        LIMIT,
    )
    check_generate(json.dumps({"input_ids": [1, 2], "mask": [1, 1], "temperature": 1}).encode(), two)
    with pytest.raises(RequestRefusedError, match=r"has shape \[1,0\], outside what its config allows"):
        check_generate(json.dumps({"input_ids": [], "mask": []}).encode(), two)
    with pytest.raises(RequestRefusedError, match="can not convert input 'input_ids' to tensor"):
        check_generate(json.dumps({"input_ids": [[1]], "mask": [1]}).encode(), two)
    with pytest.raises(RequestRefusedError, match="missing required input"):
        check_generate(json.dumps({"input_ids": [1]}).encode(), two)
    with pytest.raises(RequestRefusedError, match="INT64 data must be integers"):
        check_generate(json.dumps({"input_ids": [0.5], "mask": [1]}).encode(), two)
    with pytest.raises(RequestRefusedError, match="parameter 'extra' must be a string, number or boolean"):
        check_generate(json.dumps({"input_ids": [1], "mask": [1], "extra": [1]}).encode(), two)
