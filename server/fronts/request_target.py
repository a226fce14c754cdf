"""The one request target the HTTP front accepts, a plain ``/v2/...`` path that Triton's libevhtp cannot
read differently (it drops ``#fragments`` and does not decode), forwarded as checked (fault matrix
row 35; docs/SERVING.md, "Request targets").
"""

from __future__ import annotations

import re

from server.fronts.refusal import RequestRefusedError

PRINTABLE = re.compile(r"[\x21-\x7e]*")
ESCAPE = re.compile(r"%(?:[0-9A-Fa-f]{2})?")
# what an escape may not stand for: a separator, a dot, the escape character itself, a control byte
FORBIDDEN_ESCAPES = {ord(c) for c in "/\\.#?%"} | set(range(0x20)) | {0x7F}
API_ROOT = "/v2"


def _refuse(target: str, why: str) -> RequestRefusedError:
    return RequestRefusedError(f"request target {target[:80]!r} {why}; send a plain /v2/... path")


def checked_target(target: str) -> tuple[str, str]:
    """``(path, query)`` of a plain origin-form ``/v2`` target, or ``RequestRefusedError``."""
    if not PRINTABLE.fullmatch(target):
        raise _refuse(target, "holds a space, control or non-ASCII character")
    if "#" in target:
        raise _refuse(target, "has a '#' fragment")
    if "\\" in target:
        raise _refuse(target, "has a backslash")
    if not target.startswith("/"):
        raise _refuse(target, "is not origin-form (a path starting with '/')")
    path, _, query = target.partition("?")
    if path != API_ROOT and not path.startswith(API_ROOT + "/"):
        raise _refuse(target, f"is outside {API_ROOT}")
    for segment in path.split("/")[1:]:
        if segment == "":
            raise _refuse(target, "has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise _refuse(target, f"has a {segment!r} segment")
    for escape in ESCAPE.finditer(path):
        if len(escape.group()) != 3:
            raise _refuse(target, "has a '%' that starts no two-digit hex escape")
        if int(escape.group()[1:], 16) in FORBIDDEN_ESCAPES:
            raise _refuse(target, f"has the escape {escape.group()!r}, a separator, dot or control character")
    return path, query


def forwarded_target(path: str, query: str) -> str:
    """The target sent to Triton: the checked path, and the query when there is one."""
    return f"{path}?{query}" if query else path
