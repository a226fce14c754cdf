"""Exceptions of the client package (the client does not borrow the exporters' errors).

``ClientError`` is what the CLI answers with "error: …" and exit code 2 (a bad ``--spec``, a model the
spec does not have); ``MismatchError`` is a served answer outside the torch model's tolerance (exit code 1).
"""


class ClientError(Exception):
    """Base of every error raised by ``client``; the message says what to fix."""


class MismatchError(ClientError):
    """The served outputs differ from the torch reference by more than the precision's tolerance."""
