"""Exceptions of the perf package, in the shape of ``exporters.errors``.

An option or input the user got wrong (``OptionError``: a mode that does not exist, a window of 0 s)
is kept apart from a study that failed while running (``StudyError``), so the CLI can answer the first
with a usage message before anything is built or measured, and report the second as a failure.
"""


class PerfError(Exception):
    """Base of every error raised by ``perf``."""


class OptionError(PerfError, ValueError):
    """A study option, profile field or load parameter is invalid; the message names it."""


class StudyError(PerfError, RuntimeError):
    """A study could not complete (a response of the wrong shape, a phase that did not finish)."""
