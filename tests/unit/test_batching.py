"""The batching invariants of python_backend/batching.py, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from python_backend.batching import InvalidInputError, ModelRunError, TensorInfo, run_batched, validate

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
