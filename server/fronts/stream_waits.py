"""The messages of one gRPC stream still waiting for their answer, each with its model's deadline
(fault matrix row 56): the gRPC front bounds how many wait and ends a stream whose message is not
answered in time, as it answers a unary call 504 / ``DEADLINE_EXCEEDED``.

Triton answers a stream's messages in the order they finish, each carrying the request's ``id``: an
answer takes the first waiting message of its id, or (no id, or none waiting with it) the oldest. The
models served here answer each request once; a decoupled model's extra answers would only free
waiting places early.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from server.fronts.deadlines import deadline_refusal
from server.fronts.refusal import Refusal, RequestRefusedError

STREAM_WATCH_S = 0.25  # how often a stream's deadlines are looked at


@dataclass(frozen=True)
class _Waiting:
    expires: float
    model: str
    deadline_s: float
    request_id: str


class StreamWaits:
    """``add`` each forwarded message, ``answered`` each answer; ``overdue()`` says when one is late."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting: list[_Waiting] = []

    def check_room(self) -> None:
        """``RequestRefusedError`` (``TOO_MANY``) when ``limit`` messages wait already: asked before a
        message is rewritten for Triton (its shared-memory inputs read), then ``add``ed."""
        if len(self.waiting) >= self.limit:
            raise RequestRefusedError(
                f"this stream already has {len(self.waiting)} requests waiting for their answer, its "
                "share; send more when those are answered",
                Refusal.TOO_MANY,
            )

    def add(self, request: service_pb2.ModelInferRequest, deadline_s: float) -> None:
        """Count ``request`` as waiting, under the id Triton will answer it with, or
        ``RequestRefusedError`` (``TOO_MANY``) when ``limit`` wait."""
        self.check_room()
        expires = time.monotonic() + deadline_s
        self.waiting.append(_Waiting(expires, request.model_name, deadline_s, request.id))

    def answered(self, raw: bytes) -> None:
        try:
            request_id = service_pb2.ModelStreamInferResponse.FromString(raw).infer_response.id
        except DecodeError:
            request_id = ""
        match = next((w for w in self.waiting if request_id and w.request_id == request_id), None)
        if match is not None:
            self.waiting.remove(match)
        elif self.waiting:
            del self.waiting[0]

    def overdue(self) -> RequestRefusedError | None:
        """The refusal for the first message past its deadline, or None."""
        now = time.monotonic()
        late = next((w for w in self.waiting if w.expires <= now), None)
        return None if late is None else deadline_refusal(late.model, late.deadline_s)
