"""The HTTP front's forwarded headers act on the client's header whatever case its name was sent in
(docs/SERVING.md, "One reading of every request"); the same against the real server, under both of
aiohttp's parsers: tests/faults/test_header_casing.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp.test_utils import make_mocked_request

from server.fronts.http_front import forwarded_headers
from server.fronts.refusal import RequestRefusedError

# every header the front sets, replaces or drops before Triton gets the request
SET_BY_THE_FRONT = ("Content-Type", "Accept-Encoding", "Content-Encoding", "Inference-Header-Content-Length")
CASINGS: tuple[Callable[[str], str], ...] = (str, str.lower, str.upper)


@pytest.mark.parametrize("casing", CASINGS, ids=["canonical", "lower", "upper"])
@pytest.mark.parametrize("name", SET_BY_THE_FRONT)
def test_what_the_front_sets_replaces_the_clients_header(name: str, casing: Callable[[str], str]) -> None:
    """make_mocked_request keeps each name as given, as aiohttp's pure-Python parser does."""
    headers = forwarded_headers(make_mocked_request("POST", "/v2/models/m/infer", {casing(name): "client's"}))
    headers[name] = "front's"
    assert [value for key, value in headers.items() if key.lower() == name.lower()] == ["front's"]
    assert headers.pop(name, None) == "front's" and name not in headers


@pytest.mark.parametrize("casing", CASINGS[1:], ids=["lower", "upper"])
def test_a_header_sent_twice_in_two_cases_is_refused(casing: Callable[[str], str]) -> None:
    name = "Inference-Header-Content-Length"
    request = make_mocked_request("POST", "/v2/models/m/infer", [(name, "10"), (casing(name), "20")])
    with pytest.raises(RequestRefusedError, match="header 'inference-header-content-length' is sent 2 times"):
        forwarded_headers(request)
