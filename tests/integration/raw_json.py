"""A raw KServe v2 JSON request, as ``curl`` sends it: what the tests hold the server's JSON path to."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def infer_json(http_url: str, model: str, body: dict[str, Any], timeout: float = 60) -> tuple[int, dict]:
    """The HTTP status and the decoded answer, errors included (a 400/500 body carries the message)."""
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
