"""The HTTP front's target checks without a server (fault matrix row 35); the fault matrix runs them
against the real server (tests/faults/test_request_targets.py). The shape checks are in
test_allow_list.py."""

from __future__ import annotations

import pytest

from server.fronts.http_front import checked_target, forwarded_target
from server.fronts.refusal import RequestRefusedError


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
