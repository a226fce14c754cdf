"""The one request target the HTTP front accepts: a plain origin-form ``/v2/...`` path, so that the route
the front checks is exactly the route Triton runs (fault matrix row 35).

Triton 2.51's HTTP server (libevhtp) splits a target its own way: it drops a ``#fragment``, and it
matches its routes on the raw path without decoding it. A front that read ``/v2/.../unregister#x``
as a path ending in ``#x`` applied no route check while Triton ran the unregister; the same gap let a
huge declared shape through. Rather than imitate one parser with another, the front refuses every
target on which two readings could differ, and forwards the path it checked, never the raw target:

* only ``/v2`` or ``/v2/`` followed by segments (absolute-form ``http://host/v2/...``, authority-form
  ``host:port`` and ``*`` are refused; aiohttp's parser already refuses the last two, and control or
  non-ASCII bytes);
* no ``#`` anywhere, no backslash, no empty segment (``//``, a trailing ``/``), no ``.`` or ``..``
  segment;
* a ``%`` must start a two-digit hex escape, and the escape must not stand for a character that
  separates or rewrites a path (``/ \\ . # ? %``) or a control character: ``%2F``, ``%5C``, ``%2E``,
  ``%23``, ``%3F``, ``%25``, ``%00``–``%1F``, ``%7F`` are refused; other escapes (``%20``, ``%C3%A9``)
  pass, and Triton, which does not decode them, reads the same bytes we checked;
* the query (after the first ``?``) is forwarded as it came if it holds only printable ASCII without
  ``#`` or a backslash; Triton's v2 routes read no query.
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


def _check_escapes(target: str, text: str) -> None:
    for escape in ESCAPE.finditer(text):
        if len(escape.group()) != 3:
            raise _refuse(target, "has a '%' that starts no two-digit hex escape")
        if int(escape.group()[1:], 16) in FORBIDDEN_ESCAPES:
            raise _refuse(target, f"has the escape {escape.group()!r}, a separator, dot or control character")


def checked_target(target: str) -> tuple[str, str]:
    """``(path, query)`` of a plain origin-form ``/v2`` target (``query`` without its ``?``, empty when
    none), or ``RequestRefusedError`` naming what is not plain about it."""
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
    _check_escapes(target, path)
    return path, query


def forwarded_target(path: str, query: str) -> str:
    """The target sent to Triton: the checked path, and the query when there is one."""
    return f"{path}?{query}" if query else path
