"""One exception for every request a front (``server.fronts.http_front``, ``server.fronts.grpc_front``)
refuses, with the kind of refusal each protocol maps to its own status: the checks are written once and both
fronts answer them alike (HTTP 400 where gRPC says INVALID_ARGUMENT, and so on)."""

from __future__ import annotations

from enum import Enum


class Refusal(Enum):
    """Why a request is refused: (HTTP status, gRPC status code name)."""

    INVALID = (400, "INVALID_ARGUMENT")
    FORBIDDEN = (403, "PERMISSION_DENIED")
    NOT_FOUND = (404, "NOT_FOUND")  # Triton's words for an unknown model or shared-memory region
    ALREADY_EXISTS = (400, "ALREADY_EXISTS")  # and for a shared-memory region name registered twice
    NOT_ALLOWED = (405, "UNIMPLEMENTED")  # an HTTP method Triton's API has no route for
    TOO_LARGE = (413, "RESOURCE_EXHAUSTED")
    UNSUPPORTED = (415, "UNIMPLEMENTED")
    # a client over its share: requests in flight, regions registered, a model's overdue requests
    TOO_MANY = (429, "RESOURCE_EXHAUSTED")
    UNAVAILABLE = (503, "UNAVAILABLE")  # Triton unreachable, or the front's parsers all busy
    DEADLINE = (504, "DEADLINE_EXCEEDED")  # the model did not answer within its deadline

    def __init__(self, http_status: int, grpc_code: str) -> None:
        self.http_status, self.grpc_code = http_status, grpc_code


class RequestRefusedError(ValueError):
    """The request is refused before it reaches Triton; ``bound``: the front's bound that refused it, for
    the front's log (``refusal_log``), empty when the request itself is at fault."""

    def __init__(self, message: str, kind: Refusal = Refusal.INVALID, bound: str = "") -> None:
        super().__init__(message)
        self.kind, self.bound = kind, bound

    def __reduce__(self) -> tuple:
        """Pickled with its kind: the HTTP front checks large JSON bodies in a worker process."""
        return type(self), (str(self), self.kind, self.bound)
