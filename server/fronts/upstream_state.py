"""Whether a front's upstream (tritonserver) answers, logged once per change rather than per request.

While Triton starts, restarts or is down, every request a front forwards fails the same way; the
launcher alone polls readiness four times a second. One line when it stops answering and one when it
answers again say everything (the per-request tracebacks filled thousands of lines per start).
"""

from __future__ import annotations

import logging


class UpstreamState:
    """``down(error)`` / ``up()`` after each forwarded request; logs the transitions only."""

    def __init__(self, what: str, logger: logging.Logger, answer: str = "502/503") -> None:
        self.what, self.log, self.answer = what, logger, answer
        self.reachable: bool | None = None  # None: not tried yet

    def down(self, error: BaseException) -> None:
        if self.reachable is not False:
            self.log.warning(
                "%s is not answering (%s); clients get %s until it does", self.what, error, self.answer
            )
        self.reachable = False

    def up(self) -> None:
        if self.reachable is False:
            self.log.info("%s answers again", self.what)
        self.reachable = True
