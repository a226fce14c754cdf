"""Start and stop a real ``tritonserver``: the embedded one from the nvidia-pytriton wheel by default,
a native install or the NGC container's when present."""

from server.launcher import ServerError, ServerOptions, TritonServer, find_install

__all__ = ["ServerError", "ServerOptions", "TritonServer", "find_install"]
