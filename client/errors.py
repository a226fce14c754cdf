"""Exceptions of the client package: ``ClientError`` exits 2, ``MismatchError`` exits 1."""


class ClientError(Exception):
    """Base of every error raised by ``client``; the message says what to fix."""


class MismatchError(ClientError):
    """The served outputs differ from the torch reference by more than the precision's tolerance."""
