"""``soak.attacks.judge``'s refusal (fault matrix row 45): the front's words for a region cut short count
as a refusal only with the status the matrix names, HTTP 400 or gRPC INVALID_ARGUMENT, as tritonclient
reports them. The verdict's answers from a real server are tested in tests/faults/test_soak_attacks.py;
an error with the right words and another status is one no server here gives, so it is built."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from soak.attacks import CUT_SHORT, Verdict, judge

RIGHT = np.full((1, 16), 5.0, np.float32)


def raising(status: str, message: str = f"region 'r' was {CUT_SHORT}"):
    def call() -> np.ndarray:
        raise InferenceServerException(msg=message, status=status)

    return call


@pytest.mark.parametrize("status", ["400", str(grpc.StatusCode.INVALID_ARGUMENT)])
def test_the_fronts_words_with_a_bad_request_status_are_a_refusal(status: str) -> None:
    assert judge(raising(status), [RIGHT], CUT_SHORT) == Verdict(refused=True)


@pytest.mark.parametrize("status", ["500", "503", str(grpc.StatusCode.INTERNAL), None])
def test_the_fronts_words_with_another_status_are_wrong(status: str | None) -> None:
    verdict = judge(raising(status), [RIGHT], CUT_SHORT)
    assert verdict.wrong and not verdict.refused, verdict


def test_a_bad_request_without_the_fronts_words_is_wrong() -> None:
    assert judge(raising("400", "some other complaint"), [RIGHT], CUT_SHORT).wrong
