"""The batching core of ``python_backend/batching.py`` without a server: its invariants, and its input
guards (non-finite floats and ids outside their range named, on numpy and torch alike, failing only the
culprit; inputs that share a named axis must agree)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from python_backend import batching
from python_backend.batching import (
    InvalidInputError,
    ModelRunError,
    TensorInfo,
    check_shared_axes,
    pad_concatenate,
    run_batched,
    shared_axes,
)
from tests.unit.python_backend.request_checks import validate

INPUTS = [TensorInfo("x", np.dtype(np.float32), (2,)), TensorInfo("ids", np.dtype(np.int64), (1,))]


def _request(rows: int, start: float, bad_id: bool = False) -> dict[str, np.ndarray]:
    x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + start
    ids = np.full((rows, 1), 99 if bad_id else 1, dtype=np.int64)
    return {"x": x, "ids": ids}


class CountingModel:
    """y = x.sum(1) * ids; rejects ids >= 10 like an embedding table would."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(arrays["x"].shape[0])
        if (arrays["ids"] >= 10).any():
            raise IndexError("index out of range in self")
        return {"y": arrays["x"].sum(axis=1, keepdims=True) * arrays["ids"]}


def test_one_run_for_the_whole_batch_and_outputs_in_request_order() -> None:
    model = CountingModel()
    requests = [_request(1, 0), _request(3, 100), _request(2, 1000)]
    results = run_batched(requests, INPUTS, model)
    assert model.calls == [6]
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["y"], request["x"].sum(axis=1, keepdims=True))


def test_invalid_request_gets_its_own_error_and_others_still_batch() -> None:
    model = CountingModel()
    wrong_dtype = {"x": np.zeros((1, 2), np.float64), "ids": np.ones((1, 1), np.int64)}
    results = run_batched([_request(2, 0), wrong_dtype, _request(1, 5)], INPUTS, model)
    assert isinstance(results[1], InvalidInputError) and "'x'" in str(results[1])
    assert model.calls == [3]
    assert results[0]["y"].shape == (2, 1) and results[2]["y"].shape == (1, 1)


def test_failing_batch_is_retried_per_request_so_only_the_culprit_fails() -> None:
    model = CountingModel()
    results = run_batched([_request(1, 0), _request(1, 1, bad_id=True), _request(2, 2)], INPUTS, model)
    assert model.calls == [4, 1, 1, 2]
    assert isinstance(results[1], ModelRunError) and "IndexError" in str(results[1])
    assert not isinstance(results[0], Exception) and not isinstance(results[2], Exception)


def test_read_failures_pass_through_untouched() -> None:
    failure = InvalidInputError("input 'x' is missing")
    results = run_batched([failure, _request(1, 0)], INPUTS, CountingModel())
    assert results[0] is failure and results[1]["y"].shape == (1, 1)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((1, 2), np.float32)}, "input 'ids' is missing"),
        (
            {"x": np.zeros((1, 3), np.float32), "ids": np.zeros((1, 1), np.int64)},
            "input 'x' has shape [1, 3]",
        ),
        ({"x": np.zeros((2, 2), np.float32), "ids": np.zeros((1, 1), np.int64)}, "input 'ids' has 1 rows"),
    ],
)
def test_validation_messages_name_the_input(arrays: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInputError) as error:
        validate(arrays, INPUTS)
    assert message in str(error.value)


def test_a_model_that_changes_the_batch_size_fails_every_request_instead_of_splitting_wrong() -> None:
    def summing(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": arrays["x"].sum(axis=0, keepdims=True)}  # one row for the whole batch

    results = run_batched([_request(2, 0), _request(1, 5)], INPUTS, summing)
    assert all(isinstance(r, ModelRunError) and "rows for a batch of 3" in str(r) for r in results)


# --- value guards: once on the batch, per request only to name the culprits ------------------------

GUARDED = [
    TensorInfo("x", np.dtype(np.float32), (2,), finite=True),
    TensorInfo("ids", np.dtype(np.int64), (1,), bounds=(0, 10)),
]


class KeepingModel(CountingModel):
    """``CountingModel`` that keeps each output it returns, to tell views from copies."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[np.ndarray] = []

    def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = super().__call__(arrays)
        self.outputs.append(outputs["y"])
        return outputs


def _expected(request: dict[str, np.ndarray]) -> np.ndarray:
    return request["x"].sum(axis=1, keepdims=True) * request["ids"]


def test_a_bad_value_in_the_middle_fails_alone_named_and_the_rest_run_once_exactly() -> None:
    model = KeepingModel()
    nan = _request(2, 10)
    nan["x"][1, 0] = np.nan
    requests = [_request(1, 0), _request(3, 100), nan, _request(2, 1000), _request(1, 5)]
    results = run_batched(requests, GUARDED, model)
    assert isinstance(results[2], InvalidInputError)
    assert str(results[2]) == (
        "input 'x' holds 1 non-finite value(s) (NaN or Inf); the model takes finite numbers only"
    )
    assert model.calls == [7]  # the four good requests, one batch, the culprit left out
    for index in (0, 1, 3, 4):
        np.testing.assert_array_equal(results[index]["y"], _expected(requests[index]))


def test_several_culprits_each_get_their_own_error() -> None:
    model = CountingModel()
    inf, outside = _request(1, 0), _request(2, 0)
    inf["x"][0, 1] = np.inf
    outside["ids"][1, 0] = -4
    requests = [inf, _request(2, 3), outside, _request(1, 7)]
    results = run_batched(requests, GUARDED, model)
    assert "input 'x' holds 1 non-finite" in str(results[0])
    assert str(results[2]) == "input 'ids' holds -4, outside its declared range [0, 10)"
    assert model.calls == [3]
    np.testing.assert_array_equal(results[1]["y"], _expected(requests[1]))
    np.testing.assert_array_equal(results[3]["y"], _expected(requests[3]))


def test_every_request_bad_runs_nothing_and_a_lone_culprit_too() -> None:
    model = CountingModel()
    bad = _request(1, 0)
    bad["ids"][0, 0] = 10
    results = run_batched([bad, dict(bad)], GUARDED, model)
    assert all("holds 10, outside" in str(r) for r in results) and model.calls == []
    assert "holds 10, outside" in str(run_batched([bad], GUARDED, model)[0]) and model.calls == []


def test_values_are_checked_once_per_batch_not_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[int] = []
    original = batching._check_values

    def counting(array: np.ndarray, info: TensorInfo) -> None:
        checked.append(array.shape[0])
        original(array, info)

    monkeypatch.setattr(batching, "_check_values", counting)
    run_batched([_request(1, 0), _request(2, 0), _request(3, 0)], GUARDED, CountingModel())
    assert checked == [6, 6]  # each guarded input once, on the batch of six rows


def test_outputs_are_views_of_the_batch_output_in_request_order() -> None:
    model = KeepingModel()
    requests = [_request(2, 0), _request(1, 50), _request(3, 500)]
    results = run_batched(requests, GUARDED, model)
    (output,) = model.outputs
    rows = 0
    for request, result in zip(requests, results, strict=True):
        assert result["y"].base is output and result["y"].flags.c_contiguous  # a view, no copy
        np.testing.assert_array_equal(result["y"], output[rows : rows + len(request["x"])])
        rows += len(request["x"])


def test_padding_outside_a_range_is_not_blamed_on_any_request() -> None:
    """Ragged requests are zero-padded after the per-request checks; a range that excludes zero holds for
    every request's own values, so the batch runs whole (the padding is ours, not the client's)."""
    info = TensorInfo("tokens", np.dtype(np.int64), (-1,), bounds=(1, 100))
    requests = [{"tokens": np.array([[5, 6, 7]])}, {"tokens": np.array([[8]])}]
    results = run_batched(requests, [info], lambda b: {"n": b["tokens"].sum(1)}, pad_concatenate)
    assert [r["n"].tolist() for r in results] == [[18], [8]]


def test_torch_batch_with_a_culprit_in_the_middle() -> None:
    info = TensorInfo("v", torch.float32, (1,), finite=True)
    requests = [
        {"v": torch.ones(2, 1)},
        {"v": torch.tensor([[float("nan")]])},
        {"v": torch.full((1, 1), 3.0)},
    ]
    results = run_batched(requests, [info], lambda b: {"w": b["v"] * 2}, concatenate=torch.cat)
    assert "input 'v' holds 1 non-finite" in str(results[1])
    assert results[0]["w"].tolist() == [[2.0], [2.0]] and results[2]["w"].tolist() == [[6.0]]


DENSE = TensorInfo("dense", np.dtype(np.float32), (3,), finite=True)


IDS = TensorInfo("ids", np.dtype(np.int64), (2,), bounds=(0, 10))


def test_non_finite_floats_and_ids_outside_the_range_are_named() -> None:
    good = {"dense": np.zeros((2, 3), np.float32), "ids": np.ones((2, 2), np.int64)}
    assert validate(good, [DENSE, IDS]) == 2
    with pytest.raises(InvalidInputError, match=r"input 'dense' holds 2 non-finite value\(s\)"):
        validate({**good, "dense": np.array([[np.nan, 0, np.inf], [0, 0, 0]], np.float32)}, [DENSE, IDS])
    with pytest.raises(
        InvalidInputError, match=r"input 'ids' holds -1, outside its declared range \[0, 10\)"
    ):
        validate({**good, "ids": np.array([[1, -1], [2, 3]])}, [DENSE, IDS])
    with pytest.raises(InvalidInputError, match=r"holds 10, outside"):
        validate({**good, "ids": np.array([[1, 10], [2, 3]])}, [DENSE, IDS])
    unguarded = TensorInfo("dense", np.dtype(np.float32), (3,))
    assert validate({"dense": np.full((1, 3), np.nan, np.float32)}, [unguarded]) == 1


def test_guards_work_on_torch_tensors_and_fail_only_the_culprit() -> None:
    info = TensorInfo("ids", torch.int64, (2,), bounds=(0, 10))
    requests = [{"ids": torch.ones(1, 2, dtype=torch.int64)}, {"ids": torch.tensor([[1, -3]])}]
    results = run_batched(requests, [info], lambda batch: {"out": batch["ids"] * 2}, concatenate=torch.cat)
    assert torch.equal(results[0]["out"], torch.full((1, 2), 2))
    assert isinstance(results[1], InvalidInputError) and "holds -3" in str(results[1])
    finite = TensorInfo("x", torch.float32, (1,), finite=True)
    with pytest.raises(InvalidInputError, match="non-finite"):
        validate({"x": torch.tensor([[float("inf")]])}, [finite])


def test_inputs_sharing_a_named_axis_must_agree() -> None:
    """The text encoder's ``input_ids`` and ``attention_mask`` share ONNX axis ``sequence``: a direct
    request with 2 ids and 3 mask values is the client's fault (onnxruntime alone: a 500)."""
    inputs = [SimpleNamespace(name=n, shape=["batch", "sequence"]) for n in ("input_ids", "attention_mask")]
    inputs.append(SimpleNamespace(name="dense", shape=["batch", 13]))
    axes = shared_axes(inputs)
    assert axes == {
        "batch": [("input_ids", 0), ("attention_mask", 0), ("dense", 0)],
        "sequence": [("input_ids", 1), ("attention_mask", 1)],
    }
    good = {"input_ids": np.zeros((1, 2)), "attention_mask": np.zeros((1, 2)), "dense": np.zeros((1, 13))}
    check_shared_axes(good, axes)
    with pytest.raises(
        InvalidInputError, match="agree on axis 'sequence': 'attention_mask' 3, 'input_ids' 2"
    ):
        check_shared_axes({**good, "attention_mask": np.zeros((1, 3))}, axes)
