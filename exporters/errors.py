"""Exceptions of the exporters package: user-input problems apart from runtime failures, so the CLI can
say "fix your spec" versus "this is a bug"."""


class ExporterError(Exception):
    """Base of every error raised by ``exporters``."""


class SpecError(ExporterError, ValueError):
    """The user's spec or config request is invalid; the message starts with the offending field path."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class ExportCheckError(ExporterError):
    """The exported artifact does not reproduce the torch model within tolerance, or is unsafe."""


class StageExportError(ExporterError):
    """Exporting a pipeline stage, or loading its artifact back, failed; the message names the stage."""
