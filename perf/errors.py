"""Exceptions of the perf package: an option the user got wrong (``OptionError``) is kept apart from a
study that failed while running (``StudyError``), so the CLI answers it before anything is measured."""

from __future__ import annotations


class PerfError(Exception):
    """Base of every error raised by ``perf``. ``hint``: a line the CLI prints after the message (where
    to find what was measured before it), set by the command that knows it."""

    hint: str = ""


class OptionError(PerfError, ValueError):
    """A study option, profile field or load parameter is invalid; the message names it."""


def check_at_least(bounds: tuple[tuple[str, float, float], ...]) -> None:
    """Each ``(option, value, least)``: an ``OptionError`` naming the first option below its least."""
    for option, value, least in bounds:
        if value < least:
            raise OptionError(f"{option} must be >= {least}, got {value}")


def comma_list(text: str | None, kind: type = str, option: str = "") -> tuple | None:
    """``"1,4,16"`` as a tuple of ``kind`` (None for no text); an ``OptionError`` naming ``option``."""
    try:
        return tuple(kind(v) for v in text.split(",") if v.strip()) if text else None
    except ValueError as error:
        raise OptionError(f"{option} {text!r}: {error}") from error


class StudyError(PerfError, RuntimeError):
    """A study could not complete (a response of the wrong shape, a phase that did not finish)."""


class ServerDiedError(StudyError):
    """The server died during a run (exit 1, never "nothing meets": no evidence about the configuration);
    ``cause`` as ``server.supervisor.death_cause`` says it; ``log_path`` is kept in the report (``kept``)."""

    def __init__(self, message: str, cause: str, log_path: str) -> None:
        super().__init__(message)
        self.cause, self.log_path, self.kept = cause, log_path, ""


# Exit statuses of ``python -m perf`` (``perf.cli.main``): 0 an answer, 1 a runtime error, 2 a usage or
# spec error, 3 nothing met the budget (a verdict, not a failure), 130 interrupted (Ctrl-C or SIGTERM).
EXIT_RUNTIME, EXIT_USAGE, EXIT_NOTHING_MEETS, EXIT_INTERRUPTED = 1, 2, 3, 130


class NothingMeetsError(PerfError):
    """Nothing measured met the latency budget: an answer, not an error, so the CLI exits
    ``EXIT_NOTHING_MEETS`` and writes no spec. ``str()`` is the verdict; ``detail`` is for the report."""

    def __init__(self, verdict: str, detail: str = "") -> None:
        super().__init__(verdict)
        self.verdict, self.detail = verdict, detail

    @classmethod
    def closest(
        cls, budget_ms: float, label: str, rate: float, p99_ms: float, behind: float | None = None,
        detail: str = "", note: str = "", failed: int = 0,
    ) -> NothingMeetsError:  # fmt: skip
        """The verdict naming the closest run measured (``behind``: what it served where it fell behind;
        ``failed``: each a miss whatever the others' p99; ``note``: why a run within budget is no answer)."""
        over = f", {p99_ms - budget_ms:,.1f} ms over the budget" if p99_ms > budget_ms else ""
        served = f", serving only {per_second(behind)} of it" if behind is not None else ""
        failures = f", {failed:,} request{'s' if failed != 1 else ''} failed" if failed else ""
        answered = f"with p99 {p99_ms:,.1f} ms{over}" if p99_ms == p99_ms else "where no request was answered"
        return cls(
            f"nothing meets p99 <= {budget_ms:g} ms here: the closest measured was {label} at "
            f"{per_second(rate)} {answered}{served}{failures}{f' ({note})' if note else ''}",
            detail,
        )


def per_second(rate: float) -> str:
    """``1,290/s``, or ``3.2/s`` under ten (a whole number would say 0 of a rate under one)."""
    return f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.1f}/s"
