"""Served configs the invariant fuzz's unit tests draw from (the text encoder as Triton serves it, a
BYTES model, and ``NARROW``, a model of narrow integer inputs), and the fronts' allow-list applied to
what the fuzz would send: the tests of ``soak.request_space`` and ``soak.fuzz_wire`` judge their
requests by the fronts' own rules. And a printed case read back, as ``INVARIANT_FUZZ_CASE`` replays it."""

from __future__ import annotations

import json

from server.fronts.allow_list import CarriedInput, Carrier, ModelSignature, check_allowed
from soak.fuzz_headers import HeaderCase
from soak.fuzz_wire import carried
from soak.request_space import Case, ModelSpace, OutputCase, Registration, ShmRange, TensorCase

LIMIT = 64 << 20
# the text encoder as Triton serves it: two INT64 [-1, -1] inputs sharing a sequence axis of at most 16
ENCODER = {
    "name": "encoder",
    "max_batch_size": 32,
    "input": [
        {"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["-1"]},
        {"name": "attention_mask", "data_type": "TYPE_INT64", "dims": ["-1"]},
    ],
    "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": ["384"]}],
    "parameters": {
        "input_max_shapes": {"string_value": json.dumps({"input_ids": [16], "attention_mask": [16]})},
        "input_ranges": {"string_value": json.dumps({"input_ids": [0, 30522], "attention_mask": [0, 2]})},
    },
}
TEXT = {
    "name": "text",
    "max_batch_size": 8,
    "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "embedding", "data_type": "TYPE_FP32", "dims": [384]}],
}
# narrow integer inputs, whose typed-contents fields (uint_contents, int_contents) are wider than they are
NARROW = {
    "name": "narrow",
    "max_batch_size": 4,
    "input": [
        {"name": "level", "data_type": "TYPE_UINT8", "dims": ["-1"]},
        {"name": "offset", "data_type": "TYPE_INT16", "dims": ["2"]},
    ],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["1"]}],
    "parameters": {"input_max_shapes": {"string_value": json.dumps({"level": [8]})}},
}
SPACES = [ModelSpace.from_config(c["name"], c, LIMIT, 60.0) for c in (ENCODER, TEXT)]


def allowed(space: ModelSpace, tensors: tuple[TensorCase, ...], seed: int) -> None:
    """``check_allowed`` of the fronts on what the fuzz would send for ``tensors`` (binary data)."""
    rules = {rule.name: rule for rule in space.inputs}
    signature = ModelSignature.from_config(space.name, ENCODER if space is SPACES[0] else TEXT, LIMIT)
    carried_inputs = [
        CarriedInput(t.name, t.datatype, t.shape, Carrier.BINARY, len(data.raw), data.raw)
        for t, data in zip(tensors, (carried(t, rules[t.name], seed) for t in tensors), strict=True)
    ]
    check_allowed(signature, carried_inputs, [])


def replayed(text: str) -> Case:
    """A case as hypothesis printed it (``Case(model=..., ...)``), built again from the case types alone."""
    names = {
        kind.__name__: kind for kind in (Case, TensorCase, OutputCase, ShmRange, Registration, HeaderCase)
    }
    return eval(text, {"__builtins__": {}}, names)  # the fuzz's own printed repr, nothing else
